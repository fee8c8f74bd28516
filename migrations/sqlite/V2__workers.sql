-- Worker pools (embedded in `serve`, or `taskbroker worker` processes), for
-- operators: who runs what, and who is gone.

CREATE TABLE workers (
    worker_id    TEXT    PRIMARY KEY,
    pid          INTEGER NOT NULL,
    host         TEXT    NOT NULL,
    kind         TEXT    NOT NULL CHECK (kind IN ('embedded', 'process')),
    concurrency  INTEGER NOT NULL CHECK (concurrency >= 1),
    lease_ms     INTEGER NOT NULL CHECK (lease_ms > 0),
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    jobs_running INTEGER NOT NULL DEFAULT 0 CHECK (jobs_running >= 0),
    -- live: claiming; stopping: finishing its jobs after SIGTERM;
    -- stopped: exited cleanly; dead: stopped heartbeating (killed, hung).
    state        TEXT    NOT NULL DEFAULT 'live' CHECK (state IN ('live', 'stopping', 'stopped', 'dead')),
    stopped_at   INTEGER
) STRICT;

CREATE INDEX workers_live ON workers (heartbeat_at) WHERE state IN ('live', 'stopping');

CREATE VIEW v_workers AS
SELECT w.worker_id,
       w.kind,
       w.host,
       w.pid,
       w.state,
       w.concurrency,
       w.jobs_running,
       w.lease_ms,
       strftime('%Y-%m-%dT%H:%M:%fZ', w.started_at / 1000.0, 'unixepoch') AS started,
       strftime('%Y-%m-%dT%H:%M:%fZ', w.heartbeat_at / 1000.0, 'unixepoch') AS last_heartbeat,
       CASE WHEN w.stopped_at IS NULL THEN NULL
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', w.stopped_at / 1000.0, 'unixepoch') END AS stopped,
       (SELECT count(*) FROM jobs j WHERE j.lease_owner = w.worker_id AND j.state = 'running') AS leases_held
  FROM workers w;
