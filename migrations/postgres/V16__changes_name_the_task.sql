-- A status change names its task and owner (issue 26).
--
-- Until now every commit that added status history notified
-- 'taskbroker_changes' with an empty payload, and every broker read its
-- feed after it, whoever's task it was: with three brokers each task was
-- read three times over, by brokers with no client waiting for it.
--
-- Now the history rows notify from the functions that write them, with the
-- payload 'task:' followed by the task id, a space and the task's owner
-- ('task:<task_id> <owner>'): a broker reads its feed at once only for a
-- change it acts on (a client of its own waits for that task, or holds a
-- GET stream of that owner, or a console follows every change) and catches
-- up on the others at leisure. A payload that would not fit (8,000 bytes)
-- is sent empty, which every broker reads. One notification per changed
-- task and status, not per transaction: PostgreSQL folds only identical
-- payloads.
--
-- The statement trigger that notified for task_events inserts is dropped:
-- only these two functions write task_events. Progress ('progress') and
-- task_messages (empty payload) notify as before.
CREATE FUNCTION taskbroker_notify_task_changed(changed_task_id text, changed_owner text)
RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    payload text := 'task:' || changed_task_id || ' ' || changed_owner;
BEGIN
    IF octet_length(payload) >= 8000 THEN
        payload := '';
    END IF;
    PERFORM pg_notify('taskbroker_changes', payload);
END;
$$;

CREATE OR REPLACE FUNCTION tasks_history_insert() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO task_events (task_seq, task_id, from_status, to_status, message, at)
    VALUES (NEW.seq, NEW.task_id, NULL, NEW.status, NEW.status_message, NEW.created_at);
    PERFORM taskbroker_notify_task_changed(NEW.task_id, NEW.owner);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION tasks_history_update() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO task_events (task_seq, task_id, from_status, to_status, message, at)
    VALUES (NEW.seq, NEW.task_id, OLD.status, NEW.status, NEW.status_message, NEW.updated_at);
    PERFORM taskbroker_notify_task_changed(NEW.task_id, NEW.owner);
    RETURN NULL;
END;
$$;

DROP TRIGGER task_events_notify ON task_events;

COMMENT ON FUNCTION taskbroker_notify_task_changed(text, text) IS 'Notifies taskbroker_changes with payload ''task:<task_id> <owner>'' (empty when 8,000 bytes or more): a broker reads its feed at once only for the tasks and owners it serves.';
