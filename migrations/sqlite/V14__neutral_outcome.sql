-- What happened, in no protocol's terms (each front end maps it to its own
-- wire shape when it serves it):
-- * a task whose tool returned a result it flagged as an error (isError)
--   failed; tool_error = 1 says so, with the result stored as the tool gave
--   it (MCP 2025-11-25 clients are shown failed, MCP 2026-07-28 clients
--   completed with the result), so no front end looks into the outcome;
-- * an error outcome is an error record {"code"?, "message", "data"?}; a
--   failure of the broker itself (a worker lost too often) has no code;
-- * requests to the client are stored as the tool gave them (no related-task
--   _meta), and answers as {"result": ...} or {"error": ...} (no JSON-RPC
--   envelope).
-- Existing rows are moved to that form; the guards that keep terminal rows
-- and answers unchangeable are lifted for the move and restored.

ALTER TABLE tasks ADD COLUMN tool_error INTEGER NOT NULL DEFAULT 0
    CHECK (tool_error IN (0, 1) AND (tool_error = 0 OR (status = 'failed' AND result_kind = 'result')));

DROP TRIGGER tasks_terminal_immutable;
DROP TRIGGER task_messages_answer_once;

UPDATE tasks SET tool_error = 1 WHERE status = 'failed' AND result_kind = 'result';

UPDATE task_messages
   SET params = json_remove(params, '$._meta."io.modelcontextprotocol/related-task"')
 WHERE json_extract(params, '$._meta."io.modelcontextprotocol/related-task"') IS NOT NULL;

UPDATE task_messages SET params = json_remove(params, '$._meta')
 WHERE json_extract(params, '$._meta') = '{}';

UPDATE task_messages SET response = json_remove(response, '$.jsonrpc', '$.id')
 WHERE response IS NOT NULL;

CREATE TRIGGER tasks_terminal_immutable BEFORE UPDATE ON tasks
WHEN OLD.status IN ('completed', 'failed', 'cancelled')
BEGIN
    SELECT RAISE(ABORT, 'task is in a terminal status and cannot change (T-11)');
END;

CREATE TRIGGER task_messages_answer_once BEFORE UPDATE ON task_messages
WHEN OLD.state <> 'pending'
BEGIN
    SELECT RAISE(ABORT, 'a task message is answered (or abandoned) once');
END;
DROP VIEW tasks_as_served;

CREATE VIEW tasks_as_served AS
SELECT t.seq, t.task_id, t.owner, t.tool, t.arguments, t.status,
       CASE WHEN t.status = 'working' AND j.state = 'queued'
            THEN 'queued' || COALESCE(': ' || j.last_error, '')
            ELSE t.status_message END AS status_message,
       t.created_at, t.updated_at, t.ttl_ms, t.expires_at, t.poll_interval_ms,
       t.progress_token, t.result, t.result_kind, t.tool_error
  FROM tasks t LEFT JOIN jobs j ON j.task_seq = t.seq;

DROP VIEW v_tasks;

CREATE VIEW v_tasks AS
SELECT t.seq,
       t.task_id,
       t.owner,
       t.tool,
       t.status,
       t.status_message,
       strftime('%Y-%m-%dT%H:%M:%fZ', t.created_at / 1000.0, 'unixepoch') AS created,
       strftime('%Y-%m-%dT%H:%M:%fZ', t.updated_at / 1000.0, 'unixepoch') AS updated,
       t.ttl_ms,
       CASE WHEN t.expires_at IS NULL THEN NULL
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', t.expires_at / 1000.0, 'unixepoch') END AS expires,
       j.state AS job_state,
       j.attempt,
       j.max_attempts,
       t.result_kind,
       t.tool_error
  FROM tasks t LEFT JOIN jobs j ON j.task_seq = t.seq;
