-- Traces (issue 27 item 5): the W3C trace context a task runs under, so the
-- process that claims it (any broker or worker process, after any restart)
-- continues the trace of the call that created it.
-- * traceparent: `00-<trace id>-<parent span id>-<flags>` (55 characters):
--   the creating span's when the broker exports traces, else the client's
--   as it came (params._meta or the HTTP header). NULL: no trace.
-- * tracestate: the vendors' entries that came with it, if any.
-- * Terminal tasks stay immutable in these columns too.
-- Nullable columns without a default, and checks NOT VALID: no table
-- rewrite and no scan under the lock (every existing row holds NULL, which
-- passes; new and changed rows are checked).

ALTER TABLE tasks ADD COLUMN traceparent text, ADD COLUMN tracestate text;
ALTER TABLE tasks
    ADD CONSTRAINT tasks_traceparent_length
        CHECK (traceparent IS NULL OR length(traceparent) = 55) NOT VALID,
    ADD CONSTRAINT tasks_tracestate_length
        CHECK (tracestate IS NULL OR length(tracestate) <= 512) NOT VALID;

DROP TRIGGER tasks_terminal_immutable ON tasks;
CREATE TRIGGER tasks_terminal_immutable
BEFORE UPDATE OF seq, task_id, owner, tool, arguments, status, status_message, created_at,
                 updated_at, ttl_ms, expires_at, poll_interval_ms, progress_token, result,
                 result_kind, session_id, client_capabilities, tool_error, idempotency_key,
                 retain_completed_ms, retain_failed_ms, retain_cancelled_ms, archive,
                 traceparent, tracestate ON tasks
FOR EACH ROW WHEN (OLD.status IN ('completed', 'failed', 'cancelled'))
EXECUTE FUNCTION tasks_guard_update();

-- An archived task keeps its context, to find its trace.
ALTER TABLE tasks_archive ADD COLUMN traceparent text;
DROP VIEW v_tasks_archive;
CREATE VIEW v_tasks_archive AS
SELECT seq, task_id, owner, tool, status, status_message,
       ms_to_iso(created_at) AS created,
       ms_to_iso(updated_at) AS updated,
       ms_to_iso(archived_at) AS archived,
       ttl_ms, arguments, result_kind, tool_error, result, history,
       substr(traceparent, 4, 32) AS trace_id
  FROM tasks_archive;
