-- The feed order is taken at commit (issue 26).
--
-- Feed ids must become visible in id order (V1, "Feed order"): a
-- transaction draws its task_events ids under the advisory lock 'tbk_feed'
-- and holds it until it has committed. Until now the status history was
-- written by AFTER ... FOR EACH ROW triggers as each statement changed a
-- task, so a transaction took the lock at its first status change and held
-- it across every later statement and the client's round trips to COMMIT:
-- every creation and completion of every process queued behind whichever
-- transaction held it, for as many network round trips as it had left.
--
-- Now the two history triggers are deferred constraint triggers: PostgreSQL
-- fires them inside COMMIT, after the transaction's last statement, with
-- the row as each change left it (OLD and NEW of that change, in the order
-- of the changes). Their INSERT into task_events takes the lock (the
-- statement trigger task_events_feed_order, unchanged), so the lock is held
-- from the first history row to the end of the commit, on the server, with
-- no round trip of the client in between. A transaction waiting for the
-- lock there holds row locks, but the holder waits for no row: it only
-- appends history, so no cycle can form.
--
-- Nothing else changes: the same rows, written by the same functions, in
-- the same order within a transaction; task_progress keeps taking the lock
-- when its rows are inserted. A transaction reads no history it wrote
-- itself before it commits (no statement of the broker does).
DROP TRIGGER tasks_history_insert ON tasks;
DROP TRIGGER tasks_history_update ON tasks;

CREATE CONSTRAINT TRIGGER tasks_history_insert AFTER INSERT ON tasks
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION tasks_history_insert();

CREATE CONSTRAINT TRIGGER tasks_history_update AFTER UPDATE OF status ON tasks
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (OLD.status <> NEW.status)
EXECUTE FUNCTION tasks_history_update();

COMMENT ON FUNCTION taskbroker_feed_order() IS 'Feed order: takes advisory lock 8386383513601271140 (''tbk_feed'') until the transaction ends, so that feed ids (task_events, task_progress) become visible in id order. Status history is written at commit (deferred triggers tasks_history_insert, tasks_history_update), so the lock is held only while a transaction commits.';
