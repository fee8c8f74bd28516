-- Traces (issue 27 item 5): the W3C trace context a task runs under, so the
-- process that claims it (any broker or worker process, after any restart)
-- continues the trace of the call that created it.
-- * traceparent: `00-<trace id>-<parent span id>-<flags>` (55 characters):
--   the creating span's when the broker exports traces, else the client's
--   as it came (params._meta or the HTTP header). NULL: no trace.
-- * tracestate: the vendors' entries that came with it, if any.
-- * Terminal tasks stay immutable in these columns too.

ALTER TABLE tasks ADD COLUMN traceparent TEXT
    CHECK (traceparent IS NULL OR length(traceparent) = 55);
ALTER TABLE tasks ADD COLUMN tracestate TEXT
    CHECK (tracestate IS NULL OR length(tracestate) <= 512);

DROP TRIGGER tasks_terminal_immutable;
CREATE TRIGGER tasks_terminal_immutable
BEFORE UPDATE OF seq, task_id, owner, tool, arguments, status, status_message, created_at,
                 updated_at, ttl_ms, expires_at, poll_interval_ms, progress_token, result,
                 result_kind, session_id, client_capabilities, tool_error, idempotency_key,
                 retain_completed_ms, retain_failed_ms, retain_cancelled_ms, archive,
                 traceparent, tracestate ON tasks
WHEN OLD.status IN ('completed', 'failed', 'cancelled')
BEGIN
    SELECT RAISE(ABORT, 'task is in a terminal status and cannot change (T-11)');
END;

-- An archived task keeps its context, to find its trace.
ALTER TABLE tasks_archive ADD COLUMN traceparent TEXT;
DROP VIEW v_tasks_archive;
CREATE VIEW v_tasks_archive AS
SELECT seq, task_id, owner, tool, status, status_message,
       strftime('%Y-%m-%dT%H:%M:%fZ', created_at / 1000.0, 'unixepoch') AS created,
       strftime('%Y-%m-%dT%H:%M:%fZ', updated_at / 1000.0, 'unixepoch') AS updated,
       strftime('%Y-%m-%dT%H:%M:%fZ', archived_at / 1000.0, 'unixepoch') AS archived,
       ttl_ms, arguments, result_kind, tool_error, result, history,
       substr(traceparent, 4, 32) AS trace_id
  FROM tasks_archive;
