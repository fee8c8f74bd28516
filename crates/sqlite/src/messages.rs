//! SQL for `task_messages`: requests a running task sends its client
//! (input_required), and the answers.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::{BEGIN_IMMEDIATE, SqliteStore};

#[async_trait]
impl MessageStore for SqliteStore {
    /// Ask the client something for a running task: the request is stored
    /// and the task moves to input_required (T-24), fenced by the lease.
    async fn task_message_ask(
        &self,
        task_seq: i64,
        lease_token: &str,
        message: &TaskMessage,
        now: i64,
    ) -> Result<(), StoreError> {
        let _turn = self.take_turn().await;
        let mut tx = self.write.begin_with(BEGIN_IMMEDIATE).await?;
        let status_message = format!("waiting for the client to answer {}", message.method);
        let moved = sqlx::query!(
            "UPDATE tasks SET status = 'input_required', status_message = ?, updated_at = MAX(updated_at, ?)
              WHERE seq = ? AND status IN ('working', 'input_required')
                AND EXISTS (SELECT 1 FROM jobs WHERE task_seq = ? AND lease_token = ? AND state = 'running')",
            status_message,
            now,
            task_seq,
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
             VALUES (?, ?, ?, ?, ?, ?)",
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
              WHERE task_seq = (SELECT seq FROM tasks WHERE task_id = ?) AND state = 'pending'
              ORDER BY id",
            task_id
        )
        .fetch_all(&self.read)
        .await?;
        Ok(rows)
    }

    /// One request by id.
    async fn task_message_get(&self, request_id: &str) -> Result<Option<TaskMessage>, StoreError> {
        let row = sqlx::query_as!(
            TaskMessage,
            "SELECT request_id, task_id, method, params, response FROM task_messages WHERE request_id = ?",
            request_id
        )
        .fetch_optional(&self.read)
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
        let _turn = self.take_turn().await;
        let mut tx = self.write.begin_with(BEGIN_IMMEDIATE).await?;
        let found = sqlx::query_scalar!(
            r#"SELECT m.task_seq AS "task_seq!" FROM task_messages m JOIN tasks t ON t.seq = m.task_seq
                WHERE m.request_id = ? AND t.owner = ? AND m.state = 'pending'"#,
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
            "UPDATE task_messages SET state = 'answered', response = ?, answered_at = ? WHERE request_id = ?",
            response,
            now,
            request_id
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query!(
            "UPDATE tasks SET status = 'working', status_message = 'the client answered; working',
                    updated_at = MAX(updated_at, ?)
              WHERE seq = ? AND status = 'input_required'
                AND NOT EXISTS (SELECT 1 FROM task_messages WHERE task_seq = ? AND state = 'pending')",
            now,
            task_seq,
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
                WHERE t.seq = ?"#,
            task_seq
        )
        .fetch_optional(&self.read)
        .await?;
        Ok(caps.flatten())
    }
}
