-- The same as the SQLite migration V15 (migrations/sqlite).
--
-- Upstream MCP servers the broker serves tools of ([[upstream]] in the
-- config file), one row per name, written by whichever process runs its
-- link: the state of its connection (starting, ready, down) with the last
-- error and the number of restarts, and the last tools/list it answered
-- (served while it is unreachable: its tools stay listed across restarts).
-- `tools` is the listing as the upstream gave it (a JSON array), `served`
-- the names the broker serves from it (a JSON array).
CREATE TABLE upstreams (
    name       TEXT PRIMARY KEY,
    state      TEXT NOT NULL CHECK (state IN ('starting', 'ready', 'down')),
    last_error TEXT,
    state_at   BIGINT  NOT NULL,
    restarts   BIGINT  NOT NULL DEFAULT 0 CHECK (restarts >= 0),
    tools      TEXT CHECK (tools IS NULL OR json_valid(tools)),
    served     TEXT CHECK (served IS NULL OR json_valid(served)),
    listed_at  BIGINT
);

-- For people using psql: times as ISO 8601 text, served names as a list.
CREATE VIEW v_upstreams AS
SELECT name,
       state,
       ms_to_iso(state_at) AS since,
       restarts,
       (SELECT string_agg(value, ' ') FROM json_array_elements_text(served::json)) AS served,
       ms_to_iso(listed_at) AS listed,
       last_error
  FROM upstreams;

-- Where a job's run had got to, kept across its attempts: a tool that can
-- resume (an upstream call that became an upstream task keeps that task's
-- id) reads it back when the job is claimed again after a crash.
ALTER TABLE jobs ADD COLUMN checkpoint TEXT;
