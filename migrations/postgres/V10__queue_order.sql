-- The order of the queue (issue 27): priorities, delayed starts, and turns
-- between requestors.
-- * A job's priority is set from its tool's config and the call (higher
--   runs first), and a job may be queued to start later (run_after in the
--   future).
-- * Within a priority, requestors take turns: each job gets a turn number
--   when it is queued, one after its owner's last due job of the same
--   priority (any tool: one requestor's jobs keep their order), and no
--   earlier than the turn the job's tool and priority has
--   reached (the highest turn running, else the lowest due one), so a
--   newcomer neither jumps a long-waiting backlog nor waits behind it, and
--   a job that waited for its start or was given back does not pull the
--   turns back. Claims take the lowest turn first, then the oldest: a
--   requestor with 10,000 jobs queued and one with a single job alternate.
-- * Claims walk queued jobs by priority (highest first), turn and age: the
--   index is rebuilt in that order so the walk needs no sort; small partial
--   indexes find an owner's last turn, a tool's lowest waiting turn and its
--   highest running one (jobs_running_tool, which holds priority and turn
--   now and still counts a tool's running jobs for its global limit).
-- * A task whose job waits for its start says so: "queued: starts at
--   <time>" (after a requeue, the error instead, as before), and
--   tasks_as_served gives the job's priority and that start time (NULL once
--   due) for listings.

ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN turn BIGINT NOT NULL DEFAULT 0;
UPDATE jobs SET owner = (SELECT owner FROM tasks WHERE tasks.seq = jobs.task_seq);

DROP INDEX jobs_queued;
CREATE INDEX jobs_queued ON jobs (priority DESC, turn, task_seq, tool, run_after) WHERE state = 'queued';
CREATE INDEX jobs_queued_owner_turn ON jobs (priority, owner, turn, run_after) WHERE state = 'queued';
CREATE INDEX jobs_queued_tool_turn ON jobs (tool, priority, turn, run_after) WHERE state = 'queued';
DROP INDEX jobs_running_tool;
CREATE INDEX jobs_running_tool ON jobs (tool, priority, turn) WHERE state = 'running';

CREATE OR REPLACE VIEW tasks_as_served AS
SELECT t.seq, t.task_id, t.owner, t.tool, t.arguments, t.status,
       CASE WHEN t.status = 'working' AND j.state = 'queued'
            THEN CASE WHEN j.last_error IS NULL
                           AND j.run_after > (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                      THEN 'queued: starts at ' || ms_to_iso(j.run_after)
                      ELSE 'queued' || COALESCE(': ' || j.last_error, '') END
            ELSE t.status_message END AS status_message,
       t.created_at, t.updated_at, t.ttl_ms, t.expires_at, t.poll_interval_ms,
       t.progress_token, t.result, t.result_kind, t.tool_error,
       j.priority,
       CASE WHEN j.state = 'queued'
                 AND j.run_after > (extract(epoch FROM clock_timestamp()) * 1000)::bigint
            THEN j.run_after END AS starts_at
  FROM tasks t LEFT JOIN jobs j ON j.task_seq = t.seq;

COMMENT ON VIEW tasks_as_served IS 'A task as the broker serves it: while its job is queued the statusMessage says so (when it starts, if later; why, after a requeue); the job''s priority and its start while that is to come.';

-- A job queued to start later wakes no claimer at its commit (none could
-- take it); the broker that queued it notifies at its start.
CREATE OR REPLACE FUNCTION taskbroker_notify_queued() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM changed
                WHERE state = 'queued'
                  AND run_after <= (extract(epoch FROM clock_timestamp()) * 1000)::bigint) THEN
        PERFORM pg_notify('taskbroker_queued', '');
    END IF;
    RETURN NULL;
END;
$$;
