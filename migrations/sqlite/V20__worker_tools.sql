-- A queued job names only worker processes that serve its tool (issue 26;
-- the naming is the queuing process's, `claimers.rs`).
-- * tools: the names of the tools a worker pool claims (a JSON array of
--   strings), as it last reported them (it does when it starts and
--   whenever the set changes: upstream servers' tools come and go). NULL:
--   not reported (a pool of an older version, or one that has not yet):
--   named for any tool.
-- * jobs_running (no change of the column): from this version on, the
--   slots the pool's running jobs held at its last heartbeat (a job
--   waiting for its client's answer holds none; v_workers.jobs_running
--   counts the jobs leased); a worker process is named by its room,
--   concurrency less this.
ALTER TABLE workers ADD COLUMN tools TEXT
    CHECK (tools IS NULL OR (json_valid(tools) AND json_type(tools) = 'array'));
