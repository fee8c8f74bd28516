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

ALTER TABLE tasks ADD COLUMN retain_completed_ms INTEGER
    CHECK (retain_completed_ms IS NULL OR retain_completed_ms >= 0);
ALTER TABLE tasks ADD COLUMN retain_failed_ms INTEGER
    CHECK (retain_failed_ms IS NULL OR retain_failed_ms >= 0);
ALTER TABLE tasks ADD COLUMN retain_cancelled_ms INTEGER
    CHECK (retain_cancelled_ms IS NULL OR retain_cancelled_ms >= 0);
ALTER TABLE tasks ADD COLUMN archive INTEGER NOT NULL DEFAULT 0 CHECK (archive IN (0, 1));
ALTER TABLE tasks ADD COLUMN keep_until INTEGER;

DROP INDEX tasks_expires_at;
CREATE INDEX tasks_expires_at ON tasks (expires_at)
    WHERE expires_at IS NOT NULL AND keep_until IS NULL;
CREATE INDEX tasks_keep_until ON tasks (keep_until) WHERE keep_until IS NOT NULL;

-- T-11 still: a terminal task changes in no column but keep_until.
DROP TRIGGER tasks_terminal_immutable;
CREATE TRIGGER tasks_terminal_immutable
BEFORE UPDATE OF seq, task_id, owner, tool, arguments, status, status_message, created_at,
                 updated_at, ttl_ms, expires_at, poll_interval_ms, progress_token, result,
                 result_kind, session_id, client_capabilities, tool_error, idempotency_key,
                 retain_completed_ms, retain_failed_ms, retain_cancelled_ms, archive ON tasks
WHEN OLD.status IN ('completed', 'failed', 'cancelled')
BEGIN
    SELECT RAISE(ABORT, 'task is in a terminal status and cannot change (T-11)');
END;

CREATE TRIGGER tasks_keep_until_once BEFORE UPDATE OF keep_until ON tasks
WHEN OLD.keep_until IS NOT NULL OR NEW.keep_until IS NULL
  OR OLD.status NOT IN ('completed', 'failed', 'cancelled')
BEGIN
    SELECT RAISE(ABORT, 'keep_until is set once, on a terminal task');
END;

CREATE TABLE tasks_archive (
    seq            INTEGER PRIMARY KEY,
    task_id        TEXT    NOT NULL UNIQUE,
    owner          TEXT    NOT NULL,
    tool           TEXT    NOT NULL,
    arguments      TEXT    NOT NULL,
    status         TEXT    NOT NULL,
    status_message TEXT,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    ttl_ms         INTEGER,
    result         TEXT,
    result_kind    TEXT,
    tool_error     INTEGER NOT NULL,
    -- [{"from": ..., "to": ..., "message": ..., "at": ms}, ...], oldest first.
    history        TEXT    NOT NULL CHECK (json_valid(history)),
    archived_at    INTEGER NOT NULL
) STRICT;
CREATE INDEX tasks_archive_archived_at ON tasks_archive (archived_at);
CREATE INDEX tasks_archive_owner ON tasks_archive (owner, seq);

CREATE VIEW v_tasks_archive AS
SELECT seq, task_id, owner, tool, status, status_message,
       strftime('%Y-%m-%dT%H:%M:%fZ', created_at / 1000.0, 'unixepoch') AS created,
       strftime('%Y-%m-%dT%H:%M:%fZ', updated_at / 1000.0, 'unixepoch') AS updated,
       strftime('%Y-%m-%dT%H:%M:%fZ', archived_at / 1000.0, 'unixepoch') AS archived,
       ttl_ms, arguments, result_kind, tool_error, result, history
  FROM tasks_archive;
