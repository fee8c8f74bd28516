//! Group commit, for the drivers: many writes in one transaction, so k
//! task creations and completions cost one commit (one fsync) instead of k.
//!
//! Every statement is a round trip (to SQLite's connection thread, or to
//! the PostgreSQL server), and the writer is a single queue, so a batch is
//! first tried *grouped*: all its creations in two statements and all its
//! completions in two, whatever their number (the rows travel as one JSON
//! document, or as arrays). A lost lease is not an error there (the fenced
//! `UPDATE` just leaves that row out). Should a grouped statement fail (a
//! trigger refusing one row, say), the transaction rolls back and the batch
//! runs again *one by one*, each write in a savepoint of its own, so the
//! failing write is rolled back alone and the rest commit.
//!
//! The two passes, the savepoints and the fan-out of results are here,
//! once; a driver supplies its statements through [`GroupCommit`].

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use serde_json::{Value, json};
use sqlx::Connection as _;

use crate::{
    ClaimedJob, NewJob, NewTask, StoreError, TaskOutcome, TaskRow, ToolQuota, Write, Written,
    as_served,
};

/// What one write came to, before the commit.
pub type Done = Result<Written, StoreError>;

/// A driver's connection, as the group commit sees it.
pub type Conn<D> = <<D as GroupCommit>::Database as sqlx::Database>::Connection;

/// One job of a grouped insert: its task's `seq` (just assigned), its tool
/// and how it runs.
#[derive(Debug, Clone, Copy)]
pub struct GroupedJob<'a> {
    /// The new task's seq.
    pub task_seq: i64,
    /// The tool (the job's copy of the task's).
    pub tool: &'a str,
    /// Whose task it is (the job's copy, for turns between requestors).
    pub owner: &'a str,
    /// Attempts, priority, start.
    pub job: NewJob,
}

/// The statements of one driver that a group commit runs. Each runs on the
/// batch's connection, inside its transaction.
#[async_trait]
pub trait GroupCommit: Sync {
    /// The driver's database.
    type Database: sqlx::Database;

    /// Open the batch's transaction, taking whatever lock the driver's
    /// writes need (SQLite `BEGIN IMMEDIATE`; PostgreSQL none: its rows
    /// are locked as they are written).
    async fn begin_batch(&self) -> Result<sqlx::Transaction<'static, Self::Database>, StoreError>;

    /// One creation, as `TaskStore::task_create` does it.
    async fn create_one(
        conn: &mut Conn<Self>,
        new: &NewTask,
        job: Option<NewJob>,
        outcome: Option<&TaskOutcome>,
        now: i64,
    ) -> Result<TaskRow, StoreError>;

    /// One fenced completion, as `JobStore::job_complete` does it.
    async fn complete_one(
        conn: &mut Conn<Self>,
        task_seq: i64,
        lease_token: &str,
        outcome: &TaskOutcome,
        now: i64,
    ) -> Result<bool, StoreError>;

    /// One claim, as `JobStore::job_claim_available` does it.
    async fn claim(
        conn: &mut Conn<Self>,
        worker: &str,
        lease_token: &str,
        quotas: &[ToolQuota],
        limit: i64,
        lease_ms: i64,
        now: i64,
    ) -> Result<Vec<ClaimedJob>, StoreError>;

    /// Insert every task of `tasks` (a JSON array of the objects
    /// [`new_tasks_json`] builds) in one statement, status working; the new
    /// rows as stored, in any order.
    async fn insert_tasks(
        conn: &mut Conn<Self>,
        tasks: Value,
        now: i64,
    ) -> Result<Vec<TaskRow>, StoreError>;

    /// Insert every job of `jobs` in one statement; how many rows it wrote.
    async fn insert_jobs(
        conn: &mut Conn<Self>,
        jobs: &[GroupedJob<'_>],
        now: i64,
    ) -> Result<u64, StoreError>;

    /// Close every running job of `leases` (`(task_seq, lease_token)`)
    /// whose lease still holds, in one statement; the seqs it closed.
    async fn finish_jobs(
        conn: &mut Conn<Self>,
        leases: &[(i64, &str)],
        now: i64,
    ) -> Result<Vec<i64>, StoreError>;

    /// Record every outcome of `outcomes` (a JSON array of the objects
    /// [`outcomes_json`] builds) on its task unless the task is terminal
    /// already, in one statement; the seqs of the tasks that took theirs.
    async fn record_outcomes(
        conn: &mut Conn<Self>,
        outcomes: Value,
        now: i64,
    ) -> Result<Vec<i64>, StoreError>;
}

/// Run `writes` in one transaction: grouped first, one by one if a grouped
/// statement failed. Outer error: nothing committed. Each creation comes
/// back as served (a job left waiting says so).
pub async fn write_batch<D: GroupCommit>(
    driver: &D,
    writes: &[Write],
    now: i64,
) -> Result<Vec<Done>, StoreError> {
    let done = match run_batch(driver, writes, now, true).await {
        Ok(done) => done,
        Err(e) => {
            tracing::debug!(error = %e, writes = writes.len(), "grouped writes failed; one by one");
            run_batch(driver, writes, now, false).await?
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
async fn run_batch<D: GroupCommit>(
    driver: &D,
    writes: &[Write],
    now: i64,
    grouped: bool,
) -> Result<Vec<Done>, StoreError> {
    let mut tx = driver.begin_batch().await?;
    let done = if grouped {
        grouped_writes::<D>(&mut tx, writes, now).await?
    } else {
        let mut done = Vec::with_capacity(writes.len());
        for write in writes {
            done.push(one_write::<D>(&mut tx, write, now).await?);
        }
        done
    };
    tx.commit().await?;
    Ok(done)
}

/// One write in a savepoint of its own: rolled back alone when it fails.
async fn one_write<D: GroupCommit>(
    conn: &mut Conn<D>,
    op: &Write,
    now: i64,
) -> Result<Done, StoreError> {
    let mut sp = conn.begin().await?;
    let done = match op {
        Write::Create {
            new, job, outcome, ..
        } => D::create_one(&mut sp, new, *job, outcome.as_ref(), now)
            .await
            .map(Written::Created),
        Write::Complete {
            task_seq,
            lease_token,
            outcome,
            ..
        } => D::complete_one(&mut sp, *task_seq, lease_token, outcome, now)
            .await
            .map(Written::Completed),
        Write::Claim {
            worker,
            lease_token,
            quotas,
            limit,
            lease_ms,
            ..
        } => D::claim(&mut sp, worker, lease_token, quotas, *limit, *lease_ms, now)
            .await
            .map(Written::Claimed),
    };
    if done.is_ok() {
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
async fn grouped_writes<D: GroupCommit>(
    conn: &mut Conn<D>,
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
            } => new_tasks.push((&**new, *job)),
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
    let mut created = create_many::<D>(conn, &new_tasks, now).await?;
    let took = complete_many::<D>(conn, &completions, now).await?;
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
            Write::Create { .. } => one_write::<D>(conn, op, now).await?,
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
                D::claim(conn, worker, lease_token, quotas, *limit, *lease_ms, now).await?,
            )),
        });
    }
    Ok(done)
}

/// The tasks of a grouped insert as one JSON array: per task its
/// `task_id`, `owner`, `tool`, `arguments`, `ttl_ms`, `expires_at`,
/// `poll_interval_ms`, `progress_token`, `session_id`,
/// `client_capabilities`, `idempotency_key`, its retention rule
/// (`retain_completed_ms`, `retain_failed_ms`, `retain_cancelled_ms`,
/// `archive`) and trace context (`traceparent`, `tracestate`), in the
/// batch's order.
pub fn new_tasks_json(items: &[(&NewTask, NewJob)], now: i64) -> Value {
    items
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
                "idempotency_key": t.idempotency_key,
                "retain_completed_ms": t.retention.completed_ms,
                "retain_failed_ms": t.retention.failed_ms,
                "retain_cancelled_ms": t.retention.cancelled_ms,
                "archive": t.retention.archive,
                "traceparent": t.traceparent,
                "tracestate": t.tracestate,
            })
        })
        .collect()
}

/// The outcomes of a grouped completion as one JSON array: per task its
/// `seq`, `status`, `message`, `result` and `kind`.
pub fn outcomes_json<'a>(items: impl Iterator<Item = (i64, &'a TaskOutcome)>) -> Value {
    items
        .map(|(seq, o)| {
            json!({
                "seq": seq,
                "status": o.status.as_str(),
                "message": o.status_message,
                "result": o.result,
                "kind": o.result_kind.as_str(),
                "tool_error": o.tool_error,
            })
        })
        .collect()
}

/// Insert tasks and their jobs, two statements for all of them; the new
/// rows (as stored) by task id.
async fn create_many<D: GroupCommit>(
    conn: &mut Conn<D>,
    items: &[(&NewTask, NewJob)],
    now: i64,
) -> Result<HashMap<String, TaskRow>, StoreError> {
    if items.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = D::insert_tasks(conn, new_tasks_json(items, now), now).await?;
    let job_of: HashMap<&str, NewJob> = items
        .iter()
        .map(|(t, j)| (t.task_id.as_str(), *j))
        .collect();
    let mut jobs = Vec::with_capacity(rows.len());
    for row in &rows {
        let job = job_of
            .get(row.task_id.as_str())
            .ok_or_else(|| StoreError::Batch("a grouped insert returned a stranger".into()))?;
        jobs.push(GroupedJob {
            task_seq: row.seq,
            tool: &row.tool,
            owner: &row.owner,
            job: *job,
        });
    }
    let inserted = D::insert_jobs(conn, &jobs, now).await?;
    if rows.len() != items.len() || inserted != items.len() as u64 {
        return Err(StoreError::Batch(format!(
            "grouped insert wrote {} tasks and {} jobs for {}",
            rows.len(),
            inserted,
            items.len()
        )));
    }
    Ok(rows.into_iter().map(|r| (r.task_id.clone(), r)).collect())
}

/// Finish jobs (fenced by their lease tokens) and record their tasks'
/// outcomes, two statements for all of them. For each job whose lease
/// held: whether its task took the outcome (false when already terminal).
/// A job missing from the answer lost its lease.
async fn complete_many<D: GroupCommit>(
    conn: &mut Conn<D>,
    items: &[(i64, &str, &TaskOutcome)],
    now: i64,
) -> Result<HashMap<i64, bool>, StoreError> {
    if items.is_empty() {
        return Ok(HashMap::new());
    }
    let leases: Vec<(i64, &str)> = items.iter().map(|(seq, token, _)| (*seq, *token)).collect();
    let fenced: HashSet<i64> = D::finish_jobs(conn, &leases, now)
        .await?
        .into_iter()
        .collect();
    let mut took: HashMap<i64, bool> = fenced.iter().map(|seq| (*seq, false)).collect();
    if fenced.is_empty() {
        return Ok(took);
    }
    let outcomes = outcomes_json(
        items
            .iter()
            .filter(|(seq, _, _)| fenced.contains(seq))
            .map(|(seq, _, o)| (*seq, *o)),
    );
    for seq in D::record_outcomes(conn, outcomes, now).await? {
        took.insert(seq, true);
    }
    Ok(took)
}
