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
    state_at   INTEGER NOT NULL,
    restarts   INTEGER NOT NULL DEFAULT 0 CHECK (restarts >= 0),
    tools      TEXT CHECK (tools IS NULL OR json_valid(tools)),
    served     TEXT CHECK (served IS NULL OR json_valid(served)),
    listed_at  INTEGER
) STRICT;

-- For people using sqlite3: times as ISO 8601 text, served names as a list.
CREATE VIEW v_upstreams AS
SELECT name,
       state,
       strftime('%Y-%m-%dT%H:%M:%fZ', state_at / 1000.0, 'unixepoch') AS since,
       restarts,
       (SELECT group_concat(value, ' ') FROM json_each(served)) AS served,
       CASE WHEN listed_at IS NULL THEN NULL
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', listed_at / 1000.0, 'unixepoch') END AS listed,
       last_error
  FROM upstreams;

-- Where a job's run had got to, kept across its attempts: a tool that can
-- resume (an upstream call that became an upstream task keeps that task's
-- id) reads it back when the job is claimed again after a crash.
ALTER TABLE jobs ADD COLUMN checkpoint TEXT;
