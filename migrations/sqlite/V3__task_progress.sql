-- Progress of running tasks (T-32): an append-only feed the server tails to
-- send notifications/progress with the task's original progressToken for
-- its whole life. Written only while the task is not terminal; old rows are
-- pruned by maintenance, and a purged task takes its rows with it.

CREATE TABLE task_progress (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    task_seq INTEGER NOT NULL,
    task_id  TEXT    NOT NULL,
    progress REAL    NOT NULL,
    total    REAL,
    message  TEXT,
    at       INTEGER NOT NULL
) STRICT;

CREATE INDEX task_progress_task ON task_progress (task_seq, id);
CREATE INDEX task_progress_at ON task_progress (at);

DROP TRIGGER tasks_purge;

CREATE TRIGGER tasks_purge AFTER DELETE ON tasks
BEGIN
    DELETE FROM jobs WHERE task_seq = OLD.seq;
    DELETE FROM task_events WHERE task_seq = OLD.seq;
    DELETE FROM task_progress WHERE task_seq = OLD.seq;
END;
