-- Limits per tool are enforced in the claim: a job knows its tool, so a
-- claim can take jobs tool by tool up to each tool's free slots, and count
-- a tool's running jobs across every process for its global limit.

ALTER TABLE jobs ADD COLUMN tool TEXT NOT NULL DEFAULT '';

UPDATE jobs SET tool = (SELECT tool FROM tasks WHERE seq = jobs.task_seq);

-- Claims walk queued jobs by priority then age, skipping tools that have no
-- free slot: the index holds what that walk reads (no row look-ups).
DROP INDEX jobs_queued;
CREATE INDEX jobs_queued ON jobs (priority, task_seq, tool, run_after) WHERE state = 'queued';

-- A tool's running jobs, for its global limit.
CREATE INDEX jobs_running_tool ON jobs (tool) WHERE state = 'running';
