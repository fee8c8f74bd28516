-- The input_required side channel (T-24..T-27): requests a running task
-- sends to its client (elicitation/create, sampling/createMessage), and the
-- client's answers. Durable, so a restarted server delivers a pending
-- request again (same request id) and the answer still reaches the tool.

CREATE TABLE task_messages (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_seq    INTEGER NOT NULL,
    task_id     TEXT    NOT NULL,
    -- The JSON-RPC id of the request sent to the client.
    request_id  TEXT    NOT NULL UNIQUE,
    method      TEXT    NOT NULL,
    -- The request's params (with related-task _meta), JSON.
    params      TEXT    NOT NULL CHECK (json_valid(params)),
    -- abandoned: the attempt that asked was lost; a new attempt asks anew.
    state       TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'answered', 'abandoned')),
    -- The client's whole JSON-RPC response (result or error), JSON.
    response    TEXT    CHECK (response IS NULL OR json_valid(response)),
    created_at  INTEGER NOT NULL,
    answered_at INTEGER,
    CHECK ((state = 'answered') = (response IS NOT NULL))
) STRICT;

CREATE INDEX task_messages_task ON task_messages (task_seq, id);

-- Answers are final.
CREATE TRIGGER task_messages_answer_once BEFORE UPDATE ON task_messages
WHEN OLD.state <> 'pending'
BEGIN
    SELECT RAISE(ABORT, 'a task message is answered (or abandoned) once');
END;

DROP TRIGGER tasks_purge;

CREATE TRIGGER tasks_purge AFTER DELETE ON tasks
BEGIN
    DELETE FROM jobs WHERE task_seq = OLD.seq;
    DELETE FROM task_events WHERE task_seq = OLD.seq;
    DELETE FROM task_progress WHERE task_seq = OLD.seq;
    DELETE FROM task_messages WHERE task_seq = OLD.seq;
END;

CREATE VIEW v_task_messages AS
SELECT m.id,
       m.task_id,
       m.request_id,
       m.method,
       m.state,
       strftime('%Y-%m-%dT%H:%M:%fZ', m.created_at / 1000.0, 'unixepoch') AS asked,
       CASE WHEN m.answered_at IS NULL THEN NULL
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', m.answered_at / 1000.0, 'unixepoch') END AS answered
  FROM task_messages m;
