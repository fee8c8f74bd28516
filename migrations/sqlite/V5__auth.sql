-- Bearer tokens (H-13) and principals (T-36). Only a hash of each token's
-- secret is stored. With any row here, every request must carry a valid
-- token, and tasks and sessions belong to the token's principal.

CREATE TABLE tokens (
    -- The public part of the token (tbk_<token_id>_<secret>).
    token_id     TEXT    PRIMARY KEY,
    principal    TEXT    NOT NULL CHECK (length(principal) BETWEEN 1 AND 200),
    -- SHA-256 of the secret part.
    secret_hash  BLOB    NOT NULL CHECK (length(secret_hash) = 32),
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER,
    revoked_at   INTEGER,
    last_used_at INTEGER
) STRICT;

-- The principal a session was opened by (NULL without authentication).
ALTER TABLE sessions ADD COLUMN principal TEXT;

-- The session that created a task: its client is the one a running task
-- may ask for input, whoever (session or principal) owns the task.
ALTER TABLE tasks ADD COLUMN session_id TEXT;

-- Counting an owner's open tasks (the per-principal limit) reads only these.
CREATE INDEX tasks_owner_open ON tasks (owner) WHERE status IN ('working', 'input_required');

CREATE VIEW v_tokens AS
SELECT token_id,
       principal,
       strftime('%Y-%m-%dT%H:%M:%fZ', created_at / 1000.0, 'unixepoch') AS created,
       CASE WHEN expires_at IS NULL THEN NULL
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', expires_at / 1000.0, 'unixepoch') END AS expires,
       CASE WHEN revoked_at IS NULL THEN NULL
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', revoked_at / 1000.0, 'unixepoch') END AS revoked,
       CASE WHEN last_used_at IS NULL THEN NULL
            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', last_used_at / 1000.0, 'unixepoch') END AS last_used
  FROM tokens;
