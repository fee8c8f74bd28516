//! SQL for `task_messages`: requests a running task sends its client
//! (input_required), and the answers.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::PostgresStore;

#[async_trait]
impl MessageStore for PostgresStore {
    /// Ask the client something for a running task: the request is stored
    /// and the task moves to input_required (T-24), fenced by the lease.
    async fn task_message_ask(
        &self,
        task_seq: i64,
        lease_token: &str,
        message: &TaskMessage,
        now: i64,
    ) -> Result<(), StoreError> {
        // One statement: the job's row is locked first (FOR SHARE), then
        // the task's; a requeue of the job either committed before (the
        // lease is gone here) or waits for this one.
        let status_message = format!("waiting for the client to answer {}", message.method);
        let asked = sqlx::query!(
            "WITH lease AS (SELECT 1 FROM jobs
                             WHERE task_seq = $3 AND lease_token = $4 AND state = 'running'
                               FOR SHARE),
                  moved AS (UPDATE tasks SET status = 'input_required', status_message = $1,
                                   updated_at = GREATEST(updated_at, $2)
                             WHERE seq = $3 AND status IN ('working', 'input_required')
                               AND EXISTS (SELECT 1 FROM lease)
                            RETURNING seq)
             INSERT INTO task_messages (task_seq, task_id, request_id, method, params, created_at)
             SELECT seq, $5, $6, $7, $8, $2 FROM moved",
            status_message,
            now,
            task_seq,
            lease_token,
            message.task_id,
            message.request_id,
            message.method,
            message.params,
        )
        .execute(&self.pool)
        .await?;
        if asked.rows_affected() == 0 {
            return Err(StoreError::LeaseLost);
        }
        Ok(())
    }

    /// The unanswered requests of a task, oldest first (by the task's seq,
    /// which the messages' index leads with).
    async fn task_messages_pending(&self, task_id: &str) -> Result<Vec<TaskMessage>, StoreError> {
        let rows = sqlx::query_as!(
            TaskMessage,
            "SELECT request_id, task_id, method, params, response FROM task_messages
              WHERE task_seq = (SELECT seq FROM tasks WHERE task_id = $1) AND state = 'pending'
              ORDER BY id",
            task_id
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// One request by id.
    async fn task_message_get(&self, request_id: &str) -> Result<Option<TaskMessage>, StoreError> {
        let row = sqlx::query_as!(
            TaskMessage,
            "SELECT request_id, task_id, method, params, response FROM task_messages WHERE request_id = $1",
            request_id
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row)
    }

    /// Store the client's answer to a request of `owner`'s task; when no
    /// other request of the task is pending, the task goes back to working
    /// (T-27). One transaction.
    async fn task_message_answer(
        &self,
        request_id: &str,
        owner: &str,
        response: &str,
        now: i64,
    ) -> Result<AnswerOutcome, StoreError> {
        // The request's row, then the task's (the crate doc's row order).
        // A request answered or abandoned meanwhile is found so when its
        // row is free, and is not answered twice.
        let mut tx = self.pool.begin().await?;
        let answered = sqlx::query_scalar!(
            "UPDATE task_messages SET state = 'answered', response = $1, answered_at = $2
              WHERE request_id = $3 AND state = 'pending'
                AND task_seq IN (SELECT seq FROM tasks WHERE owner = $4)
             RETURNING task_seq",
            response,
            now,
            request_id,
            owner
        )
        .fetch_optional(&mut *tx)
        .await?;
        let Some(task_seq) = answered else {
            tx.rollback().await?;
            return Ok(AnswerOutcome::Unknown);
        };
        // Locked before the requests are counted: the count then sees every
        // answer to the task's other requests committed before this one.
        sqlx::query!("SELECT seq FROM tasks WHERE seq = $1 FOR UPDATE", task_seq)
            .fetch_optional(&mut *tx)
            .await?;
        sqlx::query!(
            "UPDATE tasks SET status = 'working', status_message = 'the client answered; working',
                    updated_at = GREATEST(updated_at, $1)
              WHERE seq = $2 AND status = 'input_required'
                AND NOT EXISTS (SELECT 1 FROM task_messages WHERE task_seq = $2 AND state = 'pending')",
            now,
            task_seq
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(AnswerOutcome::Stored)
    }

    /// The capabilities (JSON text) the client that created a task
    /// declared: with its request (2026-07-28), else in its session; None
    /// when neither is known.
    async fn task_client_capabilities(&self, task_seq: i64) -> Result<Option<String>, StoreError> {
        let caps = sqlx::query_scalar!(
            r#"SELECT COALESCE(t.client_capabilities, s.client_capabilities) AS "caps?"
                 FROM tasks t LEFT JOIN sessions s ON s.session_id = t.session_id
                WHERE t.seq = $1"#,
            task_seq
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(caps.flatten())
    }
}
