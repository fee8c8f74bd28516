-- Progress names its task and owner too (issue 26).
--
-- Since V13 a commit that added task_progress rows notified
-- 'taskbroker_changes' with the payload 'progress', and every broker read
-- task_progress (and its status feed) after it, whoever's task reported:
-- with tools that report progress, each broker's reads grew with every
-- other broker's tasks. Now the statement trigger notifies once per task
-- that reported, with the payload 'progress:' followed by the task id, a
-- space and the task's owner ('progress:<task_id> <owner>'), as status
-- changes do since V16: a broker reads progress only for a task one of its
-- clients waits on, an owner one of its GET streams follows, or while a
-- console follows every change. A payload that would not fit (8,000 bytes)
-- is sent as 'progress', which every broker reads.
--
-- Brokers started before this schema hear the new payload as a status
-- change and read no progress: restart them after migrating (a newer
-- taskbroker refuses nothing here; an older one refuses this schema when it
-- starts).
CREATE OR REPLACE FUNCTION taskbroker_notify_progress() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    reported record;
    payload text;
BEGIN
    FOR reported IN
        SELECT DISTINCT t.task_id, t.owner
          FROM changed c
          JOIN tasks t ON t.seq = c.task_seq
    LOOP
        payload := 'progress:' || reported.task_id || ' ' || reported.owner;
        IF octet_length(payload) >= 8000 THEN
            payload := 'progress';
        END IF;
        PERFORM pg_notify('taskbroker_changes', payload);
    END LOOP;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION taskbroker_notify_progress() IS 'Notifies taskbroker_changes at commit once per task a statement added task_progress rows for, with payload ''progress:<task_id> <owner>'' (''progress'' when 8,000 bytes or more): a broker reads task_progress only for the tasks and owners it serves.';
