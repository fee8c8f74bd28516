-- The order of the queue (issue 27): priorities, delayed starts, and turns
-- between requestors.
-- * A job's priority is set from its tool's config and the call (higher
--   runs first), and a job may be queued to start later (run_after in the
--   future).
-- * Within a priority, requestors take turns: each job gets a turn number
--   when it is queued, one after its owner's last queued job of the same
--   tool, and no earlier than the lowest turn of that tool's due jobs (so a
--   newcomer neither jumps a long-waiting backlog nor waits behind it).
--   Claims take the lowest turn first, then the oldest: a requestor with
--   10,000 jobs queued and one with a single job alternate.
-- * Claims walk queued jobs by priority (highest first), turn and age: the
--   index is rebuilt in that order so the walk needs no sort; two small
--   partial indexes find an owner's last turn and a tool's lowest.
-- * A task whose job waits for its start says so: "queued: starts at
--   <time>" (after a requeue, the error instead, as before), and
--   tasks_as_served gives the job's priority and that start time (NULL once
--   due) for listings.

ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN turn BIGINT NOT NULL DEFAULT 0;
UPDATE jobs SET owner = (SELECT owner FROM tasks WHERE tasks.seq = jobs.task_seq);

DROP INDEX jobs_queued;
CREATE INDEX jobs_queued ON jobs (priority DESC, turn, task_seq, tool, run_after) WHERE state = 'queued';
CREATE INDEX jobs_queued_owner_turn ON jobs (tool, owner, turn) WHERE state = 'queued';
CREATE INDEX jobs_queued_tool_turn ON jobs (tool, turn, run_after) WHERE state = 'queued';

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
