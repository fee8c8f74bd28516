//! Group commit: many writes in one transaction, so k task creations and
//! completions cost one commit (one WAL flush) instead of k.
//!
//! Every statement is a round trip to the server, so a batch is first
//! tried *grouped*: all its creations in two statements and all its
//! completions in two, whatever their number (the rows travel as one JSON
//! document read with `jsonb_to_recordset`, or as arrays read with
//! `unnest`). A lost lease is not an error there (the fenced `UPDATE` just
//! leaves that row out). Should a grouped statement fail (a trigger
//! refusing one row, say), the transaction rolls back and the batch runs
//! again *one by one*, each write in a savepoint of its own, so the failing
//! write is rolled back alone and the rest commit. The same two passes as
//! the SQLite driver, with the same results.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use sqlx::PgConnection;
use taskbroker_storage::text::{self, TaskText};
use taskbroker_storage::{NewJob, NewTask, StoreError, TaskOutcome, TaskRow, Write, Written};

use crate::jobs::{claim_in, complete_in};
use crate::tasks::{as_served, create_in};
use crate::{PostgresStore, lock_feed};

/// What one write came to, before the commit.
type Done = Result<Written, StoreError>;

impl PostgresStore {
    /// Run `writes` in one transaction: grouped first, one by one if a
    /// grouped statement failed. Outer error: nothing committed.
    pub(crate) async fn run_write_batch(
        &self,
        writes: &[Write],
        now: i64,
    ) -> Result<Vec<Done>, StoreError> {
        let done = match self.run_batch(writes, now, true).await {
            Ok(done) => done,
            Err(e) => {
                tracing::debug!(error = %e, writes = writes.len(), "grouped writes failed; one by one");
                self.run_batch(writes, now, false).await?
            }
        };
        let claimed: HashSet<i64> = done
            .iter()
            .filter_map(|d| match d {
                Ok(Written::Claimed(jobs)) => Some(jobs.iter().map(|j| j.task_seq)),
                _ => None,
            })
            .flatten()
            .collect();
        Ok(writes
            .iter()
            .zip(done)
            .map(|(write, d)| match (write, d) {
                (Write::Create { job, .. }, Ok(Written::Created(row))) => {
                    let queued = job.is_some() && !claimed.contains(&row.seq);
                    Ok(Written::Created(as_served(row, queued)))
                }
                (_, d) => d,
            })
            .collect())
    }

    /// One transaction over `writes`, grouped or one by one; the outcome of
    /// each in order, valid only because the commit succeeded.
    async fn run_batch(
        &self,
        writes: &[Write],
        now: i64,
        grouped: bool,
    ) -> Result<Vec<Done>, StoreError> {
        let mut tx = self.pool.begin().await?;
        // Creations and completions write tasks (and the feed): the feed
        // lock first. A batch of claims alone touches jobs only.
        if writes.iter().any(|w| !matches!(w, Write::Claim { .. })) {
            lock_feed(&mut tx).await?;
        }
        let done = if grouped {
            grouped_writes(&mut tx, writes, now).await?
        } else {
            let mut done = Vec::with_capacity(writes.len());
            for write in writes {
                done.push(one_write(&mut tx, write, now).await?);
            }
            done
        };
        tx.commit().await?;
        Ok(done)
    }
}

/// One write in a savepoint of its own: rolled back alone when it fails.
async fn one_write(conn: &mut PgConnection, op: &Write, now: i64) -> Result<Done, StoreError> {
    let mut sp = sqlx::Connection::begin(&mut *conn).await?;
    let (ok, done) = match op {
        Write::Create {
            new, job, outcome, ..
        } => {
            let r = create_in(&mut sp, new, *job, outcome.as_ref(), now).await;
            (r.is_ok(), r.map(Written::Created))
        }
        Write::Complete {
            task_seq,
            lease_token,
            outcome,
            ..
        } => {
            let r = complete_in(&mut sp, *task_seq, lease_token, outcome, now).await;
            (r.is_ok(), r.map(Written::Completed))
        }
        Write::Claim {
            worker,
            lease_token,
            quotas,
            limit,
            lease_ms,
            ..
        } => {
            let r = claim_in(&mut sp, worker, lease_token, quotas, *limit, *lease_ms, now).await;
            (r.is_ok(), r.map(Written::Claimed))
        }
    };
    if ok {
        sp.commit().await?;
    } else {
        sp.rollback().await?;
    }
    Ok(done)
}

/// The whole batch in at most four statements, plus one per claim (and one
/// savepoint-guarded write per creation that records an immediate outcome,
/// which is rare).
/// Any error means: roll back and go one by one.
async fn grouped_writes(
    conn: &mut PgConnection,
    ops: &[Write],
    now: i64,
) -> Result<Vec<Done>, StoreError> {
    let mut new_tasks = Vec::new();
    let mut completions = Vec::new();
    let mut seqs = HashSet::new();
    for op in ops {
        match op {
            Write::Create {
                new,
                job: Some(job),
                outcome: None,
                ..
            } => new_tasks.push((new, *job)),
            Write::Create { .. } => {}
            Write::Complete {
                task_seq,
                lease_token,
                outcome,
                ..
            } => {
                // The same job twice in one batch: only one by one tells
                // which of the two holds the lease.
                if !seqs.insert(*task_seq) {
                    return Err(StoreError::Batch("one job completed twice".into()));
                }
                completions.push((*task_seq, lease_token.as_str(), outcome));
            }
            Write::Claim { .. } => {}
        }
    }
    let mut created = create_many(conn, &new_tasks, now).await?;
    let took = complete_many(conn, &completions, now).await?;
    let mut done = Vec::with_capacity(ops.len());
    for op in ops {
        done.push(match op {
            Write::Create {
                new,
                job: Some(_),
                outcome: None,
                ..
            } => created
                .remove(&new.task_id)
                .map(Written::Created)
                .ok_or_else(|| StoreError::Batch("a grouped insert lost a row".into())),
            Write::Create { .. } => one_write(conn, op, now).await?,
            Write::Complete { task_seq, .. } => match took.get(task_seq) {
                Some(took) => Ok(Written::Completed(*took)),
                None => Err(StoreError::LeaseLost),
            },
            // After the creations: a claim sees the batch's new jobs.
            Write::Claim {
                worker,
                lease_token,
                quotas,
                limit,
                lease_ms,
                ..
            } => Ok(Written::Claimed(
                claim_in(conn, worker, lease_token, quotas, *limit, *lease_ms, now).await?,
            )),
        });
    }
    Ok(done)
}

/// Insert tasks and their jobs, two statements for all of them; the new
/// rows (as stored) by task id.
async fn create_many(
    conn: &mut PgConnection,
    items: &[(&NewTask, NewJob)],
    now: i64,
) -> Result<HashMap<String, TaskRow>, StoreError> {
    if items.is_empty() {
        return Ok(HashMap::new());
    }
    let tasks: Vec<Value> = items
        .iter()
        .map(|(t, _)| {
            json!({
                "task_id": t.task_id,
                "owner": t.owner,
                "tool": t.tool,
                "arguments": t.arguments,
                "ttl_ms": t.ttl_ms,
                "expires_at": t.ttl_ms.map(|ttl| now.saturating_add(ttl)),
                "poll_interval_ms": t.poll_interval_ms,
                "progress_token": t.progress_token,
                "session_id": t.session_id,
                "client_capabilities": t.client_capabilities,
            })
        })
        .collect();
    let rows = sqlx::query_as!(
        TaskText,
        r#"INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at,
                              ttl_ms, expires_at, poll_interval_ms, progress_token, session_id,
                              client_capabilities)
           SELECT c.task_id, c.owner, c.tool, c.arguments, 'working', $1, $1, c.ttl_ms,
                  c.expires_at, c.poll_interval_ms, c.progress_token, c.session_id,
                  c.client_capabilities
             FROM jsonb_to_recordset($2::jsonb)
                  AS c(task_id text, owner text, tool text, arguments text, ttl_ms bigint,
                       expires_at bigint, poll_interval_ms bigint, progress_token text,
                       session_id text, client_capabilities text)
           RETURNING seq, task_id, owner, tool, arguments, status, status_message, created_at,
                     updated_at, ttl_ms, expires_at, poll_interval_ms, progress_token, result,
                     result_kind, tool_error"#,
        now,
        Value::Array(tasks)
    )
    .fetch_all(&mut *conn)
    .await?;
    let rows: Vec<TaskRow> = text::rows(rows)?;
    let job_of: HashMap<&str, NewJob> = items
        .iter()
        .map(|(t, j)| (t.task_id.as_str(), *j))
        .collect();
    let mut seqs = Vec::with_capacity(rows.len());
    let mut tools = Vec::with_capacity(rows.len());
    let mut max_attempts = Vec::with_capacity(rows.len());
    let mut priorities = Vec::with_capacity(rows.len());
    for row in &rows {
        let job = job_of
            .get(row.task_id.as_str())
            .ok_or_else(|| StoreError::Batch("a grouped insert returned a stranger".into()))?;
        seqs.push(row.seq);
        tools.push(row.tool.clone());
        max_attempts.push(job.max_attempts);
        priorities.push(job.priority);
    }
    let inserted = sqlx::query!(
        "INSERT INTO jobs (task_seq, tool, max_attempts, priority, run_after)
         SELECT c.seq, c.tool, c.max_attempts, c.priority, $1
           FROM unnest($2::bigint[], $3::text[], $4::bigint[], $5::bigint[])
                AS c(seq, tool, max_attempts, priority)",
        now,
        &seqs,
        &tools,
        &max_attempts,
        &priorities
    )
    .execute(&mut *conn)
    .await?;
    if rows.len() != items.len() || inserted.rows_affected() != items.len() as u64 {
        return Err(StoreError::Batch(format!(
            "grouped insert wrote {} tasks and {} jobs for {}",
            rows.len(),
            inserted.rows_affected(),
            items.len()
        )));
    }
    Ok(rows.into_iter().map(|r| (r.task_id.clone(), r)).collect())
}

/// Finish jobs (fenced by their lease tokens) and record their tasks'
/// outcomes, two statements for all of them. For each job whose lease
/// held: whether its task took the outcome (false when already terminal).
/// A job missing from the answer lost its lease.
async fn complete_many(
    conn: &mut PgConnection,
    items: &[(i64, &str, &TaskOutcome)],
    now: i64,
) -> Result<HashMap<i64, bool>, StoreError> {
    if items.is_empty() {
        return Ok(HashMap::new());
    }
    let seqs: Vec<i64> = items.iter().map(|(seq, _, _)| *seq).collect();
    let tokens: Vec<String> = items.iter().map(|(_, t, _)| (*t).to_owned()).collect();
    let fenced: HashSet<i64> = sqlx::query_scalar!(
        "UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
                finished_at = $1, changed_at = $1, last_error = NULL
           FROM unnest($2::bigint[], $3::text[]) AS c(seq, token)
          WHERE jobs.task_seq = c.seq AND jobs.lease_token = c.token AND jobs.state = 'running'
         RETURNING jobs.task_seq",
        now,
        &seqs,
        &tokens
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .collect();
    let outcomes: Vec<Value> = items
        .iter()
        .filter(|(seq, _, _)| fenced.contains(seq))
        .map(|(seq, _, o)| {
            json!({
                "seq": seq,
                "status": o.status.as_str(),
                "message": o.status_message,
                "result": o.result,
                "kind": o.result_kind.as_str(),
                "tool_error": o.tool_error,
            })
        })
        .collect();
    let mut took: HashMap<i64, bool> = fenced.iter().map(|seq| (*seq, false)).collect();
    if outcomes.is_empty() {
        return Ok(took);
    }
    let updated = sqlx::query_scalar!(
        "UPDATE tasks SET status = c.status, status_message = c.message, result = c.result,
                result_kind = c.kind, tool_error = c.tool_error,
                updated_at = GREATEST(tasks.updated_at, $1)
           FROM jsonb_to_recordset($2::jsonb)
                AS c(seq bigint, status text, message text, result text, kind text,
                     tool_error boolean)
          WHERE tasks.seq = c.seq AND tasks.status IN ('working', 'input_required')
         RETURNING tasks.seq",
        now,
        Value::Array(outcomes)
    )
    .fetch_all(&mut *conn)
    .await?;
    for seq in updated {
        took.insert(seq, true);
    }
    Ok(took)
}
