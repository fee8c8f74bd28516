-- What happened, in no protocol's terms; the same change as SQLite's V14:
-- * a task whose tool returned a result it flagged as an error (isError)
--   failed; tool_error says so, with the result stored as the tool gave it
--   (MCP 2025-11-25 clients are shown failed, MCP 2026-07-28 clients
--   completed with the result), so no front end looks into the outcome;
-- * an error outcome is an error record {"code"?, "message", "data"?}; a
--   failure of the broker itself (a worker lost too often) has no code;
-- * requests to the client are stored as the tool gave them (no related-task
--   _meta), and answers as {"result": ...} or {"error": ...} (no JSON-RPC
--   envelope).
-- Existing rows are moved to that form, with the guards that keep terminal
-- rows and answers unchangeable lifted for the move.

ALTER TABLE tasks ADD COLUMN tool_error BOOLEAN NOT NULL DEFAULT false;

ALTER TABLE tasks DISABLE TRIGGER tasks_terminal_immutable;
ALTER TABLE task_messages DISABLE TRIGGER task_messages_answer_once;

UPDATE tasks SET tool_error = true WHERE status = 'failed' AND result_kind = 'result';

UPDATE task_messages
   SET params = (params::jsonb #- '{_meta,io.modelcontextprotocol/related-task}')::text
 WHERE params::jsonb #> '{_meta,io.modelcontextprotocol/related-task}' IS NOT NULL;

UPDATE task_messages SET params = (params::jsonb - '_meta')::text
 WHERE params::jsonb -> '_meta' = '{}'::jsonb;

UPDATE task_messages SET response = (response::jsonb - 'jsonrpc' - 'id')::text
 WHERE response IS NOT NULL;

ALTER TABLE tasks ENABLE TRIGGER tasks_terminal_immutable;
ALTER TABLE task_messages ENABLE TRIGGER task_messages_answer_once;

ALTER TABLE tasks ADD CONSTRAINT tasks_tool_error_failed
    CHECK (NOT tool_error OR (status = 'failed' AND result_kind = 'result'));

CREATE OR REPLACE VIEW tasks_as_served AS
SELECT t.seq, t.task_id, t.owner, t.tool, t.arguments, t.status,
       CASE WHEN t.status = 'working' AND j.state = 'queued'
            THEN 'queued' || COALESCE(': ' || j.last_error, '')
            ELSE t.status_message END AS status_message,
       t.created_at, t.updated_at, t.ttl_ms, t.expires_at, t.poll_interval_ms,
       t.progress_token, t.result, t.result_kind, t.tool_error
  FROM tasks t LEFT JOIN jobs j ON j.task_seq = t.seq;

CREATE OR REPLACE VIEW v_tasks AS
SELECT t.seq,
       t.task_id,
       t.owner,
       t.tool,
       t.status,
       t.status_message,
       ms_to_iso(t.created_at) AS created,
       ms_to_iso(t.updated_at) AS updated,
       t.ttl_ms,
       ms_to_iso(t.expires_at) AS expires,
       j.state AS job_state,
       j.attempt,
       j.max_attempts,
       t.result_kind,
       t.tool_error
  FROM tasks t LEFT JOIN jobs j ON j.task_seq = t.seq;

COMMENT ON COLUMN tasks.result IS 'Outcome, JSON: the tool''s result as it gave it (result_kind result) or an error record {"code"?, "message", "data"?} (result_kind error).';
COMMENT ON COLUMN tasks.tool_error IS 'The task failed with a result its tool flagged as an error (isError), stored as the tool gave it.';
COMMENT ON COLUMN task_messages.params IS 'The request''s params as the tool gave them, JSON (no protocol _meta).';
COMMENT ON COLUMN task_messages.response IS 'The client''s answer, JSON: {"result": ...} or {"error": {...}}.';
