-- A job's own history (claims, requeues with their reason, the end), the
-- time of each job change taken from the caller's clock like every other
-- stored time, and a task's queued state visible to its client.

-- When the job last changed state, ms: set by every statement that moves a
-- job, so triggers below stamp history with the caller's `now`.
ALTER TABLE jobs ADD COLUMN changed_at INTEGER NOT NULL DEFAULT 0;

-- One row per job state change, written only by the trigger below.
--   claimed    a worker took the job (worker = who, attempt = this run)
--   requeued   back in the queue, the reason says why: released by a
--              stopping worker or claimed by a pool that stopped before
--              starting it (neither counts as an attempt), or its lease
--              expired (counts)
--   finished   done: outcome recorded, cancelled, or no attempts left
CREATE TABLE job_events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    task_seq INTEGER NOT NULL,
    attempt  INTEGER NOT NULL,
    event    TEXT    NOT NULL CHECK (event IN ('claimed', 'requeued', 'finished')),
    worker   TEXT,
    reason   TEXT,
    at       INTEGER NOT NULL
) STRICT;

CREATE INDEX job_events_task ON job_events (task_seq, id);

CREATE TRIGGER jobs_history AFTER UPDATE OF state ON jobs
WHEN OLD.state <> NEW.state
BEGIN
    INSERT INTO job_events (task_seq, attempt, event, worker, reason, at)
    VALUES (NEW.task_seq,
            CASE WHEN NEW.state = 'running' THEN NEW.attempt ELSE OLD.attempt END,
            CASE WHEN NEW.state = 'running' THEN 'claimed'
                 WHEN NEW.state = 'queued' THEN 'requeued'
                 ELSE 'finished' END,
            COALESCE(NEW.lease_owner, OLD.lease_owner),
            CASE WHEN NEW.state = 'running' THEN NULL
                 WHEN NEW.state = 'done' THEN COALESCE(NEW.last_error, 'outcome recorded')
                 ELSE NEW.last_error END,
            NEW.changed_at);
END;

CREATE TRIGGER job_events_no_update BEFORE UPDATE ON job_events
BEGIN
    SELECT RAISE(ABORT, 'job_events is append-only');
END;

-- A job back in the queue starts afresh on its next run, whoever runs it:
-- what the interrupted run asked the client is abandoned, a task left
-- input_required is working again, and the old run's statusMessage is
-- gone. Replaces V6's trigger, which did this at the next claim with the
-- wall clock; this one uses the caller's time.
DROP TRIGGER jobs_new_attempt;

CREATE TRIGGER jobs_requeued AFTER UPDATE OF state ON jobs
WHEN OLD.state = 'running' AND NEW.state = 'queued'
BEGIN
    UPDATE task_messages SET state = 'abandoned'
     WHERE task_seq = NEW.task_seq AND state = 'pending';
    UPDATE tasks SET status = 'working',
                     status_message = NULL,
                     updated_at = MAX(updated_at, NEW.changed_at)
     WHERE seq = NEW.task_seq AND status IN ('working', 'input_required');
END;

DROP TRIGGER tasks_purge;

CREATE TRIGGER tasks_purge AFTER DELETE ON tasks
BEGIN
    DELETE FROM jobs WHERE task_seq = OLD.seq;
    DELETE FROM job_events WHERE task_seq = OLD.seq;
    DELETE FROM task_events WHERE task_seq = OLD.seq;
    DELETE FROM task_progress WHERE task_seq = OLD.seq;
    DELETE FROM task_messages WHERE task_seq = OLD.seq;
END;

-- A task as the broker serves it: while its job waits in the queue the
-- statusMessage says so (and why, after a requeue), computed when read so
-- that waiting costs no writes; once a worker runs it, the tool's own.
CREATE VIEW tasks_as_served AS
SELECT t.seq, t.task_id, t.owner, t.tool, t.arguments, t.status,
       CASE WHEN t.status = 'working' AND j.state = 'queued'
            THEN 'queued' || COALESCE(': ' || j.last_error, '')
            ELSE t.status_message END AS status_message,
       t.created_at, t.updated_at, t.ttl_ms, t.expires_at, t.poll_interval_ms,
       t.progress_token, t.result, t.result_kind
  FROM tasks t LEFT JOIN jobs j ON j.task_seq = t.seq;

CREATE VIEW v_job_history AS
SELECT e.id,
       t.task_id,
       t.tool,
       e.attempt,
       e.event,
       e.worker,
       e.reason,
       strftime('%Y-%m-%dT%H:%M:%fZ', e.at / 1000.0, 'unixepoch') AS at
  FROM job_events e JOIN tasks t ON t.seq = e.task_seq;

-- jobs_running counted from the jobs table (the workers row's own count
-- lags by up to a heartbeat).
DROP VIEW v_workers;

CREATE VIEW v_workers AS
SELECT w.worker_id,
       w.kind,
       w.host,
       w.pid,
       w.state,
       w.concurrency,
       (SELECT count(*) FROM jobs j WHERE j.lease_owner = w.worker_id AND j.state = 'running') AS jobs_running,
       w.lease_ms,
       strftime('%Y-%m-%dT%H:%M:%fZ', w.started_at / 1000.0, 'unixepoch') AS started,
       strftime('%Y-%m-%dT%H:%M:%fZ', w.heartbeat_at / 1000.0, 'unixepoch') AS last_heartbeat,
       CASE WHEN w.stopped_at IS NULL THEN NULL
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', w.stopped_at / 1000.0, 'unixepoch') END AS stopped
  FROM workers w;
