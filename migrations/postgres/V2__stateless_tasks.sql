-- MCP 2026-07-28 requests have no session: the client capabilities a task's
-- tool may rely on (elicitation, sampling) travel with the request that
-- created it and are kept on the task. NULL for tasks created in a
-- 2025-11-25 session, whose capabilities stay on the session row.

ALTER TABLE tasks ADD COLUMN client_capabilities TEXT
    CHECK (client_capabilities IS NULL OR json_valid(client_capabilities));
