-- The web console (/ui): tokens marked as operator may open it and see
-- every principal's tasks; and the overview's throughput by tool is counted
-- from the index of finished tasks, which now holds the tool too. The same
-- change as SQLite's V12.

ALTER TABLE tokens ADD COLUMN operator BOOLEAN NOT NULL DEFAULT false;
COMMENT ON COLUMN tokens.operator IS 'May open the web console (/ui), which shows every principal''s tasks.';

CREATE OR REPLACE VIEW v_tokens AS
SELECT token_id,
       principal,
       ms_to_iso(created_at) AS created,
       ms_to_iso(expires_at) AS expires,
       ms_to_iso(revoked_at) AS revoked,
       ms_to_iso(last_used_at) AS last_used,
       operator
  FROM tokens;

DROP INDEX tasks_finished;
CREATE INDEX tasks_finished ON tasks (status, updated_at, tool) WHERE status IN ('completed', 'failed', 'cancelled');
