-- A queued job names as many worker processes as it takes to run the
-- jobs queued, not one per job (issue 26).
--
-- Since V15 the 'taskbroker_queued' notification named one live worker
-- process per job queued (at most 8), at random. Each named process claims
-- every job it has room for, so when a commit queued 3 jobs, the first of
-- the 3 named claimed all of them and the other two claimed nothing: with
-- 8 worker processes, about one claim statement per task, against one per
-- commit with one process.
--
-- Now the processes are taken in a random order, those with room first (by
-- the count of running jobs each reported at its last heartbeat; one that
-- reported itself full comes last), and named until their room (their
-- concurrency less their running jobs, at least 1) covers the jobs queued;
-- at most 8. A commit that queues fewer jobs than a process has room for
-- names one. The payload ('claim:' and the ids) and the rest of V15 are
-- unchanged: a process not named looks a moment later if the named ones
-- left jobs behind.
CREATE OR REPLACE FUNCTION taskbroker_announce_queued(queued bigint, now_ms bigint) RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    named text;
BEGIN
    SELECT string_agg(worker_id, ' ' ORDER BY room_before) INTO named
      FROM (SELECT worker_id,
                   sum(room) OVER (ORDER BY full_, r ROWS UNBOUNDED PRECEDING) - room AS room_before
              FROM (SELECT worker_id,
                           greatest(concurrency - jobs_running, 1) AS room,
                           jobs_running >= concurrency AS full_,
                           random() AS r
                      FROM workers
                     WHERE kind = 'process' AND state = 'live'
                       AND heartbeat_at + lease_ms / 2 > now_ms) live
             ORDER BY room_before
             LIMIT 8) w
     WHERE room_before < queued;
    PERFORM pg_notify('taskbroker_queued', COALESCE('claim:' || named, ''));
END;
$$;

COMMENT ON FUNCTION taskbroker_announce_queued(bigint, bigint) IS 'The taskbroker_queued notification for queued claimable jobs: ''claim:'' and the ids of live worker processes (fresh heartbeat) in a random order, those with room first, until their room (concurrency less running jobs, at least 1) covers the jobs queued, at most 8; empty when there is none.';
