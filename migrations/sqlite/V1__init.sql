-- taskbroker schema, version 1.
--
-- Times are integer milliseconds since the Unix epoch (UTC). Views at the end
-- show them as ISO 8601 for people using the sqlite3 shell.
--
-- The lifecycle rules of MCP tasks (T-9, T-11, T-22) are enforced here, by
-- triggers, so that no code path and no operator with a sqlite3 shell can
-- break them.

-- MCP sessions (Mcp-Session-Id), kept so a restarted server accepts them.
CREATE TABLE sessions (
    session_id          TEXT    PRIMARY KEY,
    protocol_version    TEXT    NOT NULL,
    client_info         TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(client_info)),
    client_capabilities TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(client_capabilities)),
    created_at          INTEGER NOT NULL,
    last_seen_at        INTEGER NOT NULL,
    ended_at            INTEGER
) STRICT;

-- One row per task. seq is the row key: it orders tasks/list and is what a
-- cursor encodes. AUTOINCREMENT so a purged row's key is never handed out
-- again (a cursor never lands on a different task).
CREATE TABLE tasks (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id          TEXT    NOT NULL UNIQUE,
    owner            TEXT    NOT NULL,
    tool             TEXT    NOT NULL,
    arguments        TEXT    NOT NULL CHECK (json_valid(arguments)),
    status           TEXT    NOT NULL DEFAULT 'working'
                     CHECK (status IN ('working', 'input_required', 'completed', 'failed', 'cancelled')),
    status_message   TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL CHECK (updated_at >= created_at),
    ttl_ms           INTEGER CHECK (ttl_ms IS NULL OR ttl_ms >= 0),
    expires_at       INTEGER,
    poll_interval_ms INTEGER CHECK (poll_interval_ms IS NULL OR poll_interval_ms > 0),
    progress_token   TEXT    CHECK (progress_token IS NULL OR json_valid(progress_token)),
    -- The outcome of the underlying request: a JSON-RPC result object
    -- (result_kind 'result') or a JSON-RPC error object ('error').
    result           TEXT    CHECK (result IS NULL OR json_valid(result)),
    result_kind      TEXT    CHECK (result_kind IN ('result', 'error')),
    CHECK ((result IS NULL) = (result_kind IS NULL)),
    CHECK (result IS NULL OR status IN ('completed', 'failed')),
    CHECK ((ttl_ms IS NULL) = (expires_at IS NULL))
) STRICT;

CREATE INDEX tasks_owner_seq ON tasks (owner, seq);
CREATE INDEX tasks_expires_at ON tasks (expires_at) WHERE expires_at IS NOT NULL;

-- Status history: one row per transition, written only by the triggers on
-- tasks below. Its id is the change feed the server tails.
CREATE TABLE task_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_seq    INTEGER NOT NULL,
    task_id     TEXT    NOT NULL,
    from_status TEXT,
    to_status   TEXT    NOT NULL,
    message     TEXT,
    at          INTEGER NOT NULL
) STRICT;

CREATE INDEX task_events_task ON task_events (task_seq, id);

-- Execution state of a task-augmented call: one job per task.
CREATE TABLE jobs (
    task_seq         INTEGER PRIMARY KEY REFERENCES tasks (seq) ON DELETE CASCADE,
    state            TEXT    NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'done')),
    attempt          INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     INTEGER NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    priority         INTEGER NOT NULL DEFAULT 0,
    run_after        INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_token      TEXT,
    lease_expires_at INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    last_error       TEXT,
    finished_at      INTEGER,
    CHECK ((state = 'running') = (lease_token IS NOT NULL)),
    CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL))
) STRICT;

-- Claims read only queued rows: the partial index stays small however many
-- finished jobs are kept.
CREATE INDEX jobs_queued ON jobs (priority, task_seq) WHERE state = 'queued';
CREATE INDEX jobs_running ON jobs (lease_expires_at) WHERE state = 'running';

-- Lifecycle rules -----------------------------------------------------------

-- T-9: a task starts working.
CREATE TRIGGER tasks_insert_working BEFORE INSERT ON tasks
WHEN NEW.status <> 'working'
BEGIN
    SELECT RAISE(ABORT, 'a task must start in status working (T-9)');
END;

-- T-11: terminal tasks never change.
CREATE TRIGGER tasks_terminal_immutable BEFORE UPDATE ON tasks
WHEN OLD.status IN ('completed', 'failed', 'cancelled')
BEGIN
    SELECT RAISE(ABORT, 'task is in a terminal status and cannot change (T-11)');
END;

-- T-11: only the transitions the spec allows.
CREATE TRIGGER tasks_transition_allowed BEFORE UPDATE OF status ON tasks
WHEN OLD.status <> NEW.status
 AND NOT (OLD.status = 'working' AND NEW.status IN ('input_required', 'completed', 'failed', 'cancelled'))
 AND NOT (OLD.status = 'input_required' AND NEW.status IN ('working', 'completed', 'failed', 'cancelled'))
BEGIN
    SELECT RAISE(ABORT, 'illegal task status transition (T-11)');
END;

-- Identity and creation data are fixed.
CREATE TRIGGER tasks_identity_immutable BEFORE UPDATE OF seq, task_id, owner, tool, arguments, created_at, ttl_ms, expires_at ON tasks
WHEN NEW.seq IS NOT OLD.seq OR NEW.task_id IS NOT OLD.task_id OR NEW.owner IS NOT OLD.owner
  OR NEW.tool IS NOT OLD.tool OR NEW.arguments IS NOT OLD.arguments
  OR NEW.created_at IS NOT OLD.created_at OR NEW.ttl_ms IS NOT OLD.ttl_ms
  OR NEW.expires_at IS NOT OLD.expires_at
BEGIN
    SELECT RAISE(ABORT, 'task identity columns are immutable');
END;

-- T-13: lastUpdatedAt moves with every change (never backwards).
CREATE TRIGGER tasks_updated_at_monotonic BEFORE UPDATE ON tasks
WHEN NEW.updated_at < OLD.updated_at
BEGIN
    SELECT RAISE(ABORT, 'updated_at cannot move backwards');
END;

-- History ------------------------------------------------------------------

CREATE TRIGGER tasks_history_insert AFTER INSERT ON tasks
BEGIN
    INSERT INTO task_events (task_seq, task_id, from_status, to_status, message, at)
    VALUES (NEW.seq, NEW.task_id, NULL, NEW.status, NEW.status_message, NEW.created_at);
END;

CREATE TRIGGER tasks_history_update AFTER UPDATE OF status ON tasks
WHEN OLD.status <> NEW.status
BEGIN
    INSERT INTO task_events (task_seq, task_id, from_status, to_status, message, at)
    VALUES (NEW.seq, NEW.task_id, OLD.status, NEW.status, NEW.status_message, NEW.updated_at);
END;

-- History is append-only while its task exists; purging a task removes it.
CREATE TRIGGER task_events_no_update BEFORE UPDATE ON task_events
BEGIN
    SELECT RAISE(ABORT, 'task_events is append-only');
END;

CREATE TRIGGER task_events_no_delete BEFORE DELETE ON task_events
WHEN EXISTS (SELECT 1 FROM tasks WHERE seq = OLD.task_seq)
BEGIN
    SELECT RAISE(ABORT, 'task_events of an existing task cannot be deleted');
END;

-- Deleting a task (ttl purge) takes its job and history with it, whether or
-- not the connection enabled foreign keys.
CREATE TRIGGER tasks_purge AFTER DELETE ON tasks
BEGIN
    DELETE FROM jobs WHERE task_seq = OLD.seq;
    DELETE FROM task_events WHERE task_seq = OLD.seq;
END;

-- Views for people ---------------------------------------------------------

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
       t.result_kind
  FROM tasks t LEFT JOIN jobs j ON j.task_seq = t.seq;

CREATE VIEW v_task_history AS
SELECT e.id,
       e.task_id,
       e.from_status,
       e.to_status,
       e.message,
       strftime('%Y-%m-%dT%H:%M:%fZ', e.at / 1000.0, 'unixepoch') AS at
  FROM task_events e;

CREATE VIEW v_queue AS
SELECT j.task_seq,
       t.task_id,
       t.tool,
       j.state,
       j.attempt,
       j.max_attempts,
       j.priority,
       strftime('%Y-%m-%dT%H:%M:%fZ', j.run_after / 1000.0, 'unixepoch') AS run_after,
       j.lease_owner,
       CASE WHEN j.lease_expires_at IS NULL THEN NULL
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', j.lease_expires_at / 1000.0, 'unixepoch') END AS lease_expires,
       j.cancel_requested,
       j.last_error
  FROM jobs j JOIN tasks t ON t.seq = j.task_seq
 WHERE j.state <> 'done';
