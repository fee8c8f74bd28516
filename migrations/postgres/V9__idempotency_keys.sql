-- Idempotent creation (issue 27): a client-supplied key on a task call
-- makes a repeated call return the same task instead of a new one, for the
-- same owner (principal or session) and tool, while the task is kept (its
-- ttl). The unique index is the rule, across every broker on the
-- database; NULL (no key) never collides.
ALTER TABLE tasks ADD COLUMN idempotency_key text;
CREATE UNIQUE INDEX tasks_idempotency_key ON tasks (owner, tool, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
