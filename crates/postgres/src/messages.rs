//! SQL for `task_messages`: requests a running task sends its client
//! (input_required), and the answers.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::{PostgresStore, begin_feed};

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
        let mut tx = begin_feed(&self.pool).await?;
        let status_message = format!("waiting for the client to answer {}", message.method);
        let moved = sqlx::query!(
            "UPDATE tasks SET status = 'input_required', status_message = $1, updated_at = GREATEST(updated_at, $2)
              WHERE seq = $3 AND status IN ('working', 'input_required')
                AND EXISTS (SELECT 1 FROM jobs WHERE task_seq = $3 AND lease_token = $4 AND state = 'running')",
            status_message,
            now,
            task_seq,
            lease_token
        )
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() == 0 {
            tx.rollback().await?;
            return Err(StoreError::LeaseLost);
        }
        sqlx::query!(
            "INSERT INTO task_messages (task_seq, task_id, request_id, method, params, created_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
            task_seq,
            message.task_id,
            message.request_id,
            message.method,
            message.params,
            now
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
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
        let mut tx = begin_feed(&self.pool).await?;
        let found = sqlx::query_scalar!(
            "SELECT m.task_seq FROM task_messages m JOIN tasks t ON t.seq = m.task_seq
              WHERE m.request_id = $1 AND t.owner = $2 AND m.state = 'pending'",
            request_id,
            owner
        )
        .fetch_optional(&mut *tx)
        .await?;
        let Some(task_seq) = found else {
            tx.rollback().await?;
            return Ok(AnswerOutcome::Unknown);
        };
        sqlx::query!(
            "UPDATE task_messages SET state = 'answered', response = $1, answered_at = $2 WHERE request_id = $3",
            response,
            now,
            request_id
        )
        .execute(&mut *tx)
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
