-- Wake-ups by kind, so a commit wakes only the processes that act on it
-- (the SQLite store has one wake file per kind instead: `<db>-wake`,
-- `<db>-queue`, `<db>-control`).
--
-- Three channels, each notified at commit (once per transaction: identical
-- notifications are folded):
--   taskbroker_changes  statuses, progress, input requests: servers' feeds
--                       (unchanged, but jobs no longer notify it: claims,
--                       heartbeats and lease changes concern no waiter);
--   taskbroker_queued   a job is queued (created, given back, rescued):
--                       claimers;
--   taskbroker_control  a task was cancelled, or went back to working after
--                       its client answered: the worker processes running
--                       tasks.
DROP TRIGGER jobs_notify_insert ON jobs;
DROP TRIGGER jobs_notify_update ON jobs;

CREATE FUNCTION taskbroker_notify_queued() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM changed WHERE state = 'queued') THEN
        PERFORM pg_notify('taskbroker_queued', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_queued_insert AFTER INSERT ON jobs
REFERENCING NEW TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION taskbroker_notify_queued();

CREATE TRIGGER jobs_notify_queued_update AFTER UPDATE ON jobs
REFERENCING NEW TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION taskbroker_notify_queued();

CREATE FUNCTION taskbroker_notify_control() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM changed
                WHERE to_status = 'cancelled'
                   OR (to_status = 'working' AND from_status = 'input_required')) THEN
        PERFORM pg_notify('taskbroker_control', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER task_events_notify_control AFTER INSERT ON task_events
REFERENCING NEW TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION taskbroker_notify_control();
