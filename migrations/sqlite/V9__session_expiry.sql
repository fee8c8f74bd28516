-- Sessions expire after an idle period unless they own a task whose ttl
-- has not run out: the live count and the sweeper look up idle sessions by
-- last use, and a session's tasks by the session that created them.

CREATE INDEX sessions_live ON sessions (last_seen_at) WHERE ended_at IS NULL;
CREATE INDEX tasks_session ON tasks (session_id) WHERE session_id IS NOT NULL;
