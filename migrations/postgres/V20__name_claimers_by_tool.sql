-- A queued job names only worker processes that serve its tool (issue 26).
--
-- Since V19 the 'taskbroker_queued' notification named live worker
-- processes by their room alone: where processes serve different tools
-- (each its own config), a job could be named for one that cannot run it,
-- and waited for the others' look a moment later (50 to 250 ms).
--
-- * workers.tools: the names of the tools a worker pool claims, as it last
--   reported them (it does when it starts and whenever the set changes:
--   upstream servers' tools come and go). NULL: not reported (a pool of an
--   older version, or one that has not yet): named for any tool.
-- * taskbroker_announce_queued now takes the tool of each queued job: for
--   each tool, the processes serving it are taken in a random order (one
--   order for all tools), those with room first, until their room covers
--   that tool's jobs; the union of them, at most 8, is named: the first
--   for each tool before the others, so that a commit of many tools names
--   one for each of them. A process serving several of the tools counts
--   its room for each. When no live process serves any of them, the
--   payload is empty (every claimer looks), as when none is live.
ALTER TABLE workers ADD COLUMN tools text[];

COMMENT ON COLUMN workers.jobs_running IS 'The slots the pool''s running jobs held at its last heartbeat (a job waiting for its client''s answer holds none; v_workers.jobs_running counts the jobs leased): claim signals name a worker process by its room, concurrency less this.';

COMMENT ON COLUMN workers.tools IS 'The tools the pool claims, as it last reported them (at start and when they change); NULL: not reported, any tool.';

CREATE FUNCTION taskbroker_announce_queued(queued_tools text[], now_ms bigint)
    RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    named text;
BEGIN
    WITH live AS MATERIALIZED (
            SELECT worker_id, tools,
                   greatest(concurrency - jobs_running, 1) AS room,
                   jobs_running >= concurrency AS full_,
                   random() AS r
              FROM workers
             WHERE kind = 'process' AND state = 'live'
               AND heartbeat_at + lease_ms / 2 > now_ms),
         ranked AS (
            SELECT l.worker_id, q.n,
                   sum(l.room) OVER (PARTITION BY q.tool ORDER BY l.full_, l.r
                                     ROWS UNBOUNDED PRECEDING) - l.room AS room_before,
                   row_number() OVER (PARTITION BY q.tool ORDER BY l.full_, l.r) AS nth,
                   l.full_, l.r
              FROM (SELECT tool, count(*) AS n FROM unnest(queued_tools) AS tool
                     GROUP BY tool) q
              JOIN live l ON l.tools IS NULL OR q.tool = ANY (l.tools))
    SELECT string_agg(worker_id, ' ' ORDER BY full_, r) INTO named
      FROM (SELECT worker_id, bool_and(full_) AS full_, min(r) AS r
              FROM ranked
             WHERE room_before < n
             GROUP BY worker_id
             ORDER BY min(nth) > 1, bool_and(full_), min(r)
             LIMIT 8) w;
    PERFORM pg_notify('taskbroker_queued', COALESCE('claim:' || named, ''));
END;
$$;

COMMENT ON FUNCTION taskbroker_announce_queued(text[], bigint) IS 'The taskbroker_queued notification for claimable jobs queued (the tool of each): ''claim:'' and the ids of live worker processes (fresh heartbeat) serving those tools (or that did not say which they serve), for each tool in one random order, those with room first, until their room (concurrency less jobs_running, the slots its jobs held at its last heartbeat, at least 1) covers its jobs; at most 8, the first for each tool before the others; empty when there is none.';

-- Jobs inserted: the queued notification, with their tools.
CREATE OR REPLACE FUNCTION taskbroker_notify_queued() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    now_ms  bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    q_tools text[];
BEGIN
    SELECT array_agg(tool) INTO q_tools FROM changed
     WHERE state = 'queued' AND run_after <= now_ms;
    IF q_tools IS NOT NULL THEN
        PERFORM taskbroker_announce_queued(q_tools, now_ms);
    END IF;
    RETURN NULL;
END;
$$;

-- Jobs updated: their history (as in V18) and the queued notification,
-- with their tools.
CREATE OR REPLACE FUNCTION jobs_updated() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    now_ms  bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    q_tools text[];
BEGIN
    WITH history AS (
        INSERT INTO job_events (task_seq, attempt, event, worker, reason, at)
        SELECT n.task_seq,
               CASE WHEN n.state = 'running' THEN n.attempt ELSE o.attempt END,
               CASE WHEN n.state = 'running' THEN 'claimed'
                    WHEN n.state = 'queued' THEN 'requeued'
                    ELSE 'finished' END,
               COALESCE(n.lease_owner, o.lease_owner),
               CASE WHEN n.state = 'running' THEN NULL
                    WHEN n.state = 'done' THEN COALESCE(n.last_error, 'outcome recorded')
                    ELSE n.last_error END,
               n.changed_at
          FROM old_jobs o JOIN changed n ON n.task_seq = o.task_seq
         WHERE o.state <> n.state
         ORDER BY n.task_seq)
    SELECT array_agg(tool) INTO q_tools FROM changed
     WHERE state = 'queued' AND run_after <= now_ms;
    IF q_tools IS NOT NULL THEN
        PERFORM taskbroker_announce_queued(q_tools, now_ms);
    END IF;
    RETURN NULL;
END;
$$;

DROP FUNCTION taskbroker_announce_queued(bigint, bigint);
