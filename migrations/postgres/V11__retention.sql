-- Retention (issue 27 item 3): what becomes of a task once its ttl has
-- passed.
-- * Each task carries the rule it was created under, like its ttl: how
--   long after it finished a completed, failed or cancelled task is kept
--   (retain_*_ms, NULL: not past its ttl), and whether it is then moved to
--   tasks_archive rather than deleted (archive).
-- * Past its ttl a task is never served again; a rule keeps its row for
--   operators only. The purge looks at each expired task once: one to keep
--   gets keep_until, set once and only on a terminal task, and leaves the
--   ttl index (tasks_expires_at holds only undecided rows), so later passes
--   read only what is due (tasks_keep_until).
-- * Terminal tasks stay immutable in every other column.
-- * tasks_archive holds archived tasks with their status history as a JSON
--   array; v_tasks_archive reads it with times as text.

ALTER TABLE tasks
    ADD COLUMN retain_completed_ms bigint
        CHECK (retain_completed_ms IS NULL OR retain_completed_ms >= 0),
    ADD COLUMN retain_failed_ms bigint
        CHECK (retain_failed_ms IS NULL OR retain_failed_ms >= 0),
    ADD COLUMN retain_cancelled_ms bigint
        CHECK (retain_cancelled_ms IS NULL OR retain_cancelled_ms >= 0),
    ADD COLUMN archive boolean NOT NULL DEFAULT false,
    ADD COLUMN keep_until bigint;

DROP INDEX tasks_expires_at;
CREATE INDEX tasks_expires_at ON tasks (expires_at)
    WHERE expires_at IS NOT NULL AND keep_until IS NULL;
CREATE INDEX tasks_keep_until ON tasks (keep_until) WHERE keep_until IS NOT NULL;

-- T-11 still: a terminal task changes in no column but keep_until.
DROP TRIGGER tasks_terminal_immutable ON tasks;
CREATE TRIGGER tasks_terminal_immutable
BEFORE UPDATE OF seq, task_id, owner, tool, arguments, status, status_message, created_at,
                 updated_at, ttl_ms, expires_at, poll_interval_ms, progress_token, result,
                 result_kind, session_id, client_capabilities, tool_error, idempotency_key,
                 retain_completed_ms, retain_failed_ms, retain_cancelled_ms, archive ON tasks
FOR EACH ROW WHEN (OLD.status IN ('completed', 'failed', 'cancelled'))
EXECUTE FUNCTION tasks_guard_update();

CREATE FUNCTION tasks_keep_until_once() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'keep_until is set once, on a terminal task'
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$;

CREATE TRIGGER tasks_keep_until_once BEFORE UPDATE OF keep_until ON tasks
FOR EACH ROW WHEN (OLD.keep_until IS NOT NULL OR NEW.keep_until IS NULL
                   OR OLD.status NOT IN ('completed', 'failed', 'cancelled'))
EXECUTE FUNCTION tasks_keep_until_once();

CREATE TABLE tasks_archive (
    seq            bigint  PRIMARY KEY,
    task_id        text    NOT NULL UNIQUE,
    owner          text    NOT NULL,
    tool           text    NOT NULL,
    arguments      text    NOT NULL,
    status         text    NOT NULL,
    status_message text,
    created_at     bigint  NOT NULL,
    updated_at     bigint  NOT NULL,
    ttl_ms         bigint,
    result         text,
    result_kind    text,
    tool_error     boolean NOT NULL,
    -- [{"from": ..., "to": ..., "message": ..., "at": ms}, ...], oldest first.
    history        jsonb   NOT NULL,
    archived_at    bigint  NOT NULL
);
CREATE INDEX tasks_archive_archived_at ON tasks_archive (archived_at);
CREATE INDEX tasks_archive_owner ON tasks_archive (owner, seq);

CREATE VIEW v_tasks_archive AS
SELECT seq, task_id, owner, tool, status, status_message,
       ms_to_iso(created_at) AS created,
       ms_to_iso(updated_at) AS updated,
       ms_to_iso(archived_at) AS archived,
       ttl_ms, arguments, result_kind, tool_error, result, history
  FROM tasks_archive;
