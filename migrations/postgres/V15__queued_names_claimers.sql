-- A queued job wakes a few worker processes, not every one (issue 26).
--
-- Until now a commit that queued claimable jobs notified
-- 'taskbroker_queued' with no payload, and every idle worker process ran a
-- claim: with 8 of them, 1.7 claim statements per task, all but one
-- finding nothing.
--
-- Now the notification names the worker processes asked to claim at once:
-- as many as jobs were queued (at most 8), taken at random among the live
-- worker processes whose heartbeat is fresh (within half their lease: one
-- that was killed drops out before its lease is given up). The payload is
-- 'claim:' followed by their worker ids, separated by spaces. A worker
-- process that is not named looks a moment later (50 ms) unless something
-- wakes it first: a named one may be busy, or not serve the job's tool, or
-- be gone. With no live worker process to name, the payload is empty, and
-- every claimer wakes, as before (so are a freed slot and a start that
-- came, announced by the broker with an empty payload). Embedded pools do
-- not claim on this signal (their server hands them its own jobs) and are
-- never named.
CREATE OR REPLACE FUNCTION taskbroker_notify_queued() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    now_ms  bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    queued  bigint;
    named   text;
BEGIN
    SELECT count(*) INTO queued FROM changed
     WHERE state = 'queued' AND run_after <= now_ms;
    IF queued > 0 THEN
        SELECT string_agg(worker_id, ' ') INTO named
          FROM (SELECT worker_id FROM workers
                 WHERE kind = 'process' AND state = 'live'
                   AND heartbeat_at + lease_ms / 2 > now_ms
                 ORDER BY random()
                 LIMIT least(queued, 8)) w;
        PERFORM pg_notify('taskbroker_queued', COALESCE('claim:' || named, ''));
    END IF;
    RETURN NULL;
END;
$$;
