//! Group commit: many writes in one `BEGIN IMMEDIATE` transaction, so k
//! task creations and completions cost one fsync instead of k.
//!
//! Every statement through sqlx is a round trip to the connection's thread
//! (tens of microseconds), and the writer is a single queue, so a batch is
//! first tried *grouped*: all its creations in two statements and all its
//! completions in two, whatever their number (the rows travel as one JSON
//! array read with `json_each`). A lost lease is not an error there (the
//! fenced `UPDATE` just leaves that row out). Should a grouped statement
//! fail (a trigger refusing one row, say), the transaction rolls back and
//! the batch runs again *one by one*, each write in a savepoint of its own,
//! so the failing write is rolled back alone and the rest commit.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use sqlx::SqliteConnection;
use taskbroker_storage::text::{self, TaskText};
use taskbroker_storage::{NewJob, NewTask, StoreError, TaskOutcome, TaskRow, Write, Written};

use crate::jobs::{claim_in, complete_in};
use crate::tasks::{as_served, create_in};
use crate::{BEGIN_IMMEDIATE, SqliteStore};

/// What one write came to, before the commit.
type Done = Result<Written, StoreError>;

impl SqliteStore {
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
        let mut tx = self.write.begin_with(BEGIN_IMMEDIATE).await?;
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
async fn one_write(conn: &mut SqliteConnection, op: &Write, now: i64) -> Result<Done, StoreError> {
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
    conn: &mut SqliteConnection,
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
/// rows by task id.
async fn create_many(
    conn: &mut SqliteConnection,
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
    let tasks = Value::Array(tasks).to_string();
    let rows = sqlx::query_as!(
        TaskText,
        r#"INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at,
                              ttl_ms, expires_at, poll_interval_ms, progress_token, session_id,
                              client_capabilities)
           SELECT value ->> 'task_id', value ->> 'owner', value ->> 'tool', value ->> 'arguments',
                  'working', ?1, ?1, value ->> 'ttl_ms', value ->> 'expires_at',
                  value ->> 'poll_interval_ms', value ->> 'progress_token', value ->> 'session_id',
                  value ->> 'client_capabilities'
             FROM json_each(?2) ORDER BY key
           RETURNING seq AS "seq!", task_id AS "task_id!", owner AS "owner!", tool AS "tool!",
                     arguments AS "arguments!", status AS "status!",
                     status_message AS "status_message?", created_at AS "created_at!",
                     updated_at AS "updated_at!", ttl_ms AS "ttl_ms?", expires_at AS "expires_at?",
                     poll_interval_ms AS "poll_interval_ms?", progress_token AS "progress_token?",
                     result AS "result?", result_kind AS "result_kind?",
                     tool_error AS "tool_error!: bool""#,
        now,
        tasks
    )
    .fetch_all(&mut *conn)
    .await?;
    let rows: Vec<TaskRow> = text::rows(rows)?;
    let job_of: HashMap<&str, NewJob> = items
        .iter()
        .map(|(t, j)| (t.task_id.as_str(), *j))
        .collect();
    let mut jobs = Vec::with_capacity(rows.len());
    for row in &rows {
        let job = job_of
            .get(row.task_id.as_str())
            .ok_or_else(|| StoreError::Batch("a grouped insert returned a stranger".into()))?;
        jobs.push(json!({
            "seq": row.seq,
            "tool": row.tool,
            "max_attempts": job.max_attempts,
            "priority": job.priority,
        }));
    }
    let jobs = Value::Array(jobs).to_string();
    let inserted = sqlx::query!(
        "INSERT INTO jobs (task_seq, tool, max_attempts, priority, run_after)
         SELECT value ->> 'seq', value ->> 'tool', value ->> 'max_attempts', value ->> 'priority', ?1
           FROM json_each(?2)",
        now,
        jobs
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
    conn: &mut SqliteConnection,
    items: &[(i64, &str, &TaskOutcome)],
    now: i64,
) -> Result<HashMap<i64, bool>, StoreError> {
    if items.is_empty() {
        return Ok(HashMap::new());
    }
    let leases: Vec<Value> = items
        .iter()
        .map(|(seq, token, _)| json!({ "seq": seq, "token": token }))
        .collect();
    let leases = Value::Array(leases).to_string();
    let fenced: HashSet<i64> = sqlx::query_scalar!(
        r#"UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
                  finished_at = ?1, changed_at = ?1, last_error = NULL
             FROM (SELECT value ->> 'seq' AS seq, value ->> 'token' AS token FROM json_each(?2)) AS c
            WHERE jobs.task_seq = c.seq AND jobs.lease_token = c.token AND jobs.state = 'running'
           RETURNING task_seq AS "task_seq!""#,
        now,
        leases
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
    let outcomes = Value::Array(outcomes).to_string();
    let updated = sqlx::query_scalar!(
        r#"UPDATE tasks SET status = c.status, status_message = c.message, result = c.result,
                  result_kind = c.kind, tool_error = c.tool_error,
                  updated_at = MAX(updated_at, ?1)
             FROM (SELECT value ->> 'seq' AS seq, value ->> 'status' AS status,
                          value ->> 'message' AS message, value ->> 'result' AS result,
                          value ->> 'kind' AS kind, value ->> 'tool_error' AS tool_error
                     FROM json_each(?2)) AS c
            WHERE tasks.seq = c.seq AND tasks.status IN ('working', 'input_required')
           RETURNING seq AS "seq!""#,
        now,
        outcomes
    )
    .fetch_all(&mut *conn)
    .await?;
    for seq in updated {
        took.insert(seq, true);
    }
    Ok(took)
}
