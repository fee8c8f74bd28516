-- Priorities and delayed starts (issue 27): a job's priority is set from its
-- tool's config and the call (higher runs first), and a job may be queued to
-- start later (run_after in the future).
-- * Claims walk queued jobs by priority, highest first, then age: the index
--   is rebuilt in that order so the walk needs no sort.
-- * A task whose job waits for its start says so: "queued: starts at
--   <time>" (after a requeue, the error instead, as before), and
--   tasks_as_served gives the job's priority and that start time (NULL once
--   due) for listings.

DROP INDEX jobs_queued;
CREATE INDEX jobs_queued ON jobs (priority DESC, task_seq, tool, run_after) WHERE state = 'queued';

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
