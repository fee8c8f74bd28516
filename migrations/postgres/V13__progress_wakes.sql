-- Progress wakes by its own payload (issue 26): a commit that added
-- task_progress rows notifies channel taskbroker_changes with the payload
-- 'progress' (other changes keep the empty payload). A broker's feed then
-- reads task_progress only after a commit that added some, instead of after
-- every status change of any process. Notifications with different
-- payloads are not folded, so a transaction that adds both sends two.

CREATE FUNCTION taskbroker_notify_progress() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM changed) THEN
        PERFORM pg_notify('taskbroker_changes', 'progress');
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER task_progress_notify ON task_progress;
CREATE TRIGGER task_progress_notify AFTER INSERT ON task_progress
REFERENCING NEW TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION taskbroker_notify_progress();

COMMENT ON FUNCTION taskbroker_notify_progress() IS 'Notifies taskbroker_changes with payload ''progress'' at commit when a statement added task_progress rows (a feed reads task_progress only then).';
