-- `taskbroker stats` counts tasks by status from indexes, never by reading
-- every task: unfinished tasks by status, and finished ones by status and
-- finish time (a finished task never changes again, so its entry is
-- written once). Queries name each index's WHERE clause word for word, as
-- SQLite requires to use a partial index.

CREATE INDEX tasks_open_status ON tasks (status) WHERE status IN ('working', 'input_required');
CREATE INDEX tasks_finished ON tasks (status, updated_at) WHERE status IN ('completed', 'failed', 'cancelled');
