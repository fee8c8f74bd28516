-- The web console (/ui): tokens marked as operator may open it and see
-- every principal's tasks; and the overview's throughput by tool is counted
-- from the index of finished tasks, which now holds the tool too (an
-- index-only search, no table rows read).

ALTER TABLE tokens ADD COLUMN operator INTEGER NOT NULL DEFAULT 0 CHECK (operator IN (0, 1));

DROP VIEW v_tokens;
CREATE VIEW v_tokens AS
SELECT token_id,
       principal,
       strftime('%Y-%m-%dT%H:%M:%fZ', created_at / 1000.0, 'unixepoch') AS created,
       CASE WHEN expires_at IS NULL THEN NULL
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', expires_at / 1000.0, 'unixepoch') END AS expires,
       CASE WHEN revoked_at IS NULL THEN NULL
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', revoked_at / 1000.0, 'unixepoch') END AS revoked,
       CASE WHEN last_used_at IS NULL THEN NULL
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', last_used_at / 1000.0, 'unixepoch') END AS last_used,
       operator
  FROM tokens;

DROP INDEX tasks_finished;
CREATE INDEX tasks_finished ON tasks (status, updated_at, tool) WHERE status IN ('completed', 'failed', 'cancelled');
