-- A job's new attempt starts afresh, whoever starts it: what an earlier
-- attempt asked the client is abandoned, and a task left input_required by
-- a lost worker is working again. A trigger, so that a claim is one UPDATE
-- statement (no transaction around it) and no code path can forget it.
CREATE TRIGGER jobs_new_attempt AFTER UPDATE OF attempt ON jobs
WHEN NEW.attempt > OLD.attempt AND NEW.attempt > 1
BEGIN
    UPDATE task_messages SET state = 'abandoned'
     WHERE task_seq = NEW.task_seq AND state = 'pending';
    UPDATE tasks SET status = 'working',
                     status_message = 'running again (attempt ' || NEW.attempt || ')',
                     updated_at = MAX(updated_at,
                                      CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))
     WHERE seq = NEW.task_seq AND status = 'input_required';
END;
