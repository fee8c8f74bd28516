//! The PostgreSQL statements of the group commit: a creation, a fenced
//! completion and a claim one at a time, and creations and completions
//! grouped (the two passes, the savepoints and the fan-out are shared:
//! `taskbroker_storage::batch`); and the batches that are one statement
//! committed on their own (a claim; creations and completions, with a
//! claim after them as a second statement).
//! The grouped statements read their rows from one JSON document with
//! `jsonb_to_recordset`, or from arrays with `unnest`; a completion locks
//! its jobs before its tasks, in the order of their keys (the crate doc's
//! row order).

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use serde_json::{Value, json};
use sqlx::{PgConnection, Postgres};
use taskbroker_storage::batch::{Done, GroupCommit, GroupedJob, new_tasks_json};
use taskbroker_storage::text::{self, TaskText};
use taskbroker_storage::{
    ClaimedJob, NewJob, NewTask, StoreError, TaskOutcome, TaskRow, ToolQuota, Write, Written,
    as_served,
};

use crate::{PostgresStore, TOOL_LOCK_CLASS};

/// Hands `$then!` the CTEs that create tasks and their jobs (one text for
/// every statement that creates so): `c`, the rows of `$2 -> 'create'`;
/// `t`, the tasks inserted; `j`, their jobs, each with its queue turn (the
/// owner's next turn, never behind the tool's running or first queued
/// job). After the literals it was given, before the rest.
macro_rules! creation_ctes {
    ($($lits:literal,)* $then:ident!($($rest:tt)*)) => {
        $then!($($lits,)* r#"c AS (SELECT * FROM jsonb_to_recordset($2::jsonb -> 'create')
                      AS c(task_id text, owner text, tool text, arguments text,
                           ttl_ms bigint, expires_at bigint, poll_interval_ms bigint,
                           progress_token text, session_id text,
                           client_capabilities text, idempotency_key text,
                           retain_completed_ms bigint, retain_failed_ms bigint,
                           retain_cancelled_ms bigint, archive boolean,
                           traceparent text, tracestate text, max_attempts bigint,
                           priority bigint, run_after bigint)),
                t AS (INSERT INTO tasks (task_id, owner, tool, arguments, status,
                                         created_at, updated_at, ttl_ms, expires_at,
                                         poll_interval_ms, progress_token, session_id,
                                         client_capabilities, idempotency_key,
                                         retain_completed_ms, retain_failed_ms,
                                         retain_cancelled_ms, archive, traceparent,
                                         tracestate)
                      SELECT c.task_id, c.owner, c.tool, c.arguments, 'working', $1, $1,
                             c.ttl_ms, c.expires_at, c.poll_interval_ms,
                             c.progress_token, c.session_id, c.client_capabilities,
                             c.idempotency_key, c.retain_completed_ms,
                             c.retain_failed_ms, c.retain_cancelled_ms, c.archive,
                             c.traceparent, c.tracestate
                        FROM c
                      RETURNING seq, task_id, owner, tool, arguments, status,
                                status_message, created_at, updated_at, ttl_ms,
                                expires_at, poll_interval_ms, progress_token, result,
                                result_kind, tool_error),
                j AS (INSERT INTO jobs (task_seq, tool, owner, max_attempts, priority,
                                        run_after, turn)
                      SELECT t.seq, t.tool, t.owner, c.max_attempts, c.priority,
                             c.run_after,
                             GREATEST(COALESCE((SELECT max(turn) + 1 FROM jobs q
                                                 WHERE q.priority = c.priority
                                                   AND q.owner = c.owner
                                                   AND q.state = 'queued'
                                                   AND q.run_after <= $1), 0),
                                      COALESCE((SELECT max(turn) FROM jobs q
                                                 WHERE q.tool = c.tool
                                                   AND q.priority = c.priority
                                                   AND q.state = 'running'),
                                               (SELECT min(turn) FROM jobs q
                                                 WHERE q.tool = c.tool
                                                   AND q.priority = c.priority
                                                   AND q.state = 'queued'
                                                   AND q.run_after <= $1), 0))
                             + row_number() OVER (PARTITION BY c.owner, c.priority
                                                  ORDER BY t.seq) - 1
                        FROM t JOIN c ON c.task_id = t.task_id)"#, $($rest)*)
    };
}

/// Hands `$then!` the CTEs that complete jobs (one text for every
/// statement that completes so): `d`, the rows of `$2 -> 'complete'`;
/// `fenced`, each job closed if its lease holds; `took`, its task's outcome
/// recorded unless the task is terminal already. After the literals it
/// was given, before the rest.
macro_rules! completion_ctes {
    ($($lits:literal,)* $then:ident!($($rest:tt)*)) => {
        $then!($($lits,)* r#"d AS (SELECT * FROM jsonb_to_recordset($2::jsonb -> 'complete')
                      AS d(seq bigint, token text, status text, message text,
                           result text, kind text, tool_error boolean)),
                fenced AS (UPDATE jobs SET state = 'done', lease_token = NULL,
                                  lease_expires_at = NULL, finished_at = $1,
                                  changed_at = $1, last_error = NULL
                             FROM d
                            WHERE jobs.task_seq = d.seq AND jobs.lease_token = d.token
                              AND jobs.state = 'running'
                           RETURNING jobs.task_seq),
                took AS (UPDATE tasks SET status = d.status, status_message = d.message,
                                result = d.result, result_kind = d.kind,
                                tool_error = d.tool_error,
                                updated_at = GREATEST(tasks.updated_at, $1)
                           FROM d JOIN fenced f ON f.task_seq = d.seq
                          WHERE tasks.seq = d.seq
                            AND tasks.status IN ('working', 'input_required')
                         RETURNING tasks.seq)"#, $($rest)*)
    };
}

/// `WITH` the CTEs handed over, then the final `SELECT`, as one checked
/// query (`as T`: `query_as!` into `T`).
macro_rules! query_with {
    ($first:literal, $($more:literal,)* ; as $ty:ident, $select:literal, $($arg:expr),* $(,)?) => {
        sqlx::query_as!($ty, "WITH " + $first $(+ ", " + $more)* + " " + $select, $($arg),*)
    };
    ($first:literal, $($more:literal,)* ; $select:literal, $($arg:expr),* $(,)?) => {
        sqlx::query!("WITH " + $first $(+ ", " + $more)* + " " + $select, $($arg),*)
    };
}

impl PostgresStore {
    /// A batch that is one claim of tools without a global limit, run as
    /// one statement committed on its own: one round trip instead of three
    /// (`BEGIN`, the claim, `COMMIT`). The statement is atomic by itself;
    /// only a global limit needs a transaction (its tool lock is held until
    /// the claim commits). None: not such a batch.
    pub(crate) async fn claim_alone(
        &self,
        writes: &[Write],
        now: i64,
    ) -> Option<Result<Vec<ClaimedJob>, StoreError>> {
        let [
            Write::Claim {
                worker,
                lease_token,
                quotas,
                limit,
                lease_ms,
            },
        ] = writes
        else {
            return None;
        };
        if needs_transaction(quotas) {
            return None;
        }
        Some(
            async {
                let mut conn = self.pool.acquire().await?;
                <Self as GroupCommit>::claim(
                    &mut conn,
                    worker,
                    lease_token,
                    quotas,
                    *limit,
                    *lease_ms,
                    now,
                )
                .await
            }
            .await,
        )
    }
    /// A batch of creations (each with its job and no outcome), completions
    /// (of distinct jobs) and at most one claim that needs no transaction:
    /// what a broker with its own workers commits under load. The creations
    /// and completions are one statement committed on its own (the tasks
    /// and their jobs inserted; each job closed if its lease holds, then its
    /// task's outcome recorded unless the task is terminal already), then
    /// the claim is another: two round trips instead of seven. The claim
    /// comes last whatever its place in the batch (it can only gain: it
    /// sees the new jobs, and the slots and running counts the completions
    /// freed). None: not such a batch, or a claim alone (`claim_alone`). An
    /// error means nothing was written: the caller goes the general way,
    /// which tells each write's own error. A failed claim after the first
    /// statement is that write's own error.
    pub(crate) async fn write_alone(
        &self,
        writes: &[Write],
        now: i64,
    ) -> Option<Result<Vec<Done>, StoreError>> {
        let plain = Plain::of(writes)?;
        let written = match self.create_and_complete(&plain, now).await {
            Ok(written) => written,
            Err(e) => return Some(Err(e)),
        };
        // Committed: from here every write is told its own result (never
        // None, which would send the caller the general way and write them
        // again).
        let mut claimed = match plain.claim {
            Some(claim) => Some(
                match self.claim_alone(std::slice::from_ref(claim), now).await {
                    Some(claimed) => claimed.map(Written::Claimed),
                    None => Err(StoreError::Batch("the claim needs a transaction".into())),
                },
            ),
            None => None,
        };
        // A new task whose job the claim took is served as running, not
        // queued (as if the claim were in its commit).
        let taken: HashSet<i64> = match &claimed {
            Some(Ok(Written::Claimed(jobs))) => jobs.iter().map(|j| j.task_seq).collect(),
            _ => HashSet::new(),
        };
        let (mut created, took) = written;
        Some(Ok(writes
            .iter()
            .map(|write| match write {
                Write::Create { new, .. } => created
                    .remove(&new.task_id)
                    .map(|row| {
                        let queued = !taken.contains(&row.seq);
                        Ok(Written::Created(as_served(row, queued)))
                    })
                    .unwrap_or_else(|| {
                        Err(StoreError::Batch("a grouped insert lost a row".into()))
                    }),
                Write::Complete { task_seq, .. } => match took.get(task_seq) {
                    Some(took) => Ok(Written::Completed(*took)),
                    None => Err(StoreError::LeaseLost),
                },
                _ => claimed
                    .take()
                    .unwrap_or_else(|| Err(StoreError::Batch("a second claim".into()))),
            })
            .collect()))
    }

    /// The one statement of [`Self::write_alone`]: the creations' rows as
    /// stored, by task id, and for each completion whose lease held whether
    /// its task took the outcome (absent: the lease was lost).
    async fn create_and_complete(
        &self,
        plain: &Plain<'_>,
        now: i64,
    ) -> Result<(HashMap<String, TaskRow>, HashMap<i64, bool>), StoreError> {
        let mut tasks = new_tasks_json(&plain.creations, now);
        if let Value::Array(rows) = &mut tasks {
            for (row, (_, job)) in rows.iter_mut().zip(&plain.creations) {
                if let Value::Object(row) = row {
                    row.insert("max_attempts".into(), job.max_attempts.into());
                    row.insert("priority".into(), job.priority.into());
                    row.insert(
                        "run_after".into(),
                        job.run_after.map_or(now, |at| at.max(now)).into(),
                    );
                }
            }
        }
        let completions: Value = plain
            .completions
            .iter()
            .map(|(seq, token, o)| {
                json!({
                    "seq": seq,
                    "token": token,
                    "status": o.status.as_str(),
                    "message": o.status_message,
                    "result": o.result,
                    "kind": o.result_kind.as_str(),
                    "tool_error": o.tool_error,
                })
            })
            .collect();
        let doc = json!({ "create": tasks, "complete": completions });
        let mut created = HashMap::with_capacity(plain.creations.len());
        let mut took = HashMap::with_capacity(plain.completions.len());
        let mut keep = |row: TaskRow| {
            created.insert(row.task_id.clone(), row);
        };
        match (plain.creations.is_empty(), plain.completions.is_empty()) {
            // One kind only: the statement without the other's CTEs (a
            // larger plan costs the server more per statement even when
            // half of it has no rows: 0.1 ms per task with worker
            // processes, measured).
            (false, true) => {
                let rows = creation_ctes!(query_with!(; as TaskText,
                    r#"SELECT seq AS "seq!", task_id AS "task_id!", owner AS "owner!",
                              tool AS "tool!", arguments AS "arguments!", status AS "status!",
                              status_message, created_at AS "created_at!",
                              updated_at AS "updated_at!", ttl_ms, expires_at, poll_interval_ms,
                              progress_token, result, result_kind, tool_error AS "tool_error!"
                         FROM t"#,
                    now,
                    doc
                ))
                .fetch_all(&self.pool)
                .await?;
                for row in rows {
                    keep(row.try_into()?);
                }
            }
            (true, false) => {
                let rows = completion_ctes!(query_with!(;
                    r#"SELECT f.task_seq AS "seq!", (k.seq IS NOT NULL) AS "took!"
                         FROM fenced f LEFT JOIN took k ON k.seq = f.task_seq"#,
                    now,
                    doc
                ))
                .fetch_all(&self.pool)
                .await?;
                took.extend(rows.into_iter().map(|r| (r.seq, r.took)));
            }
            // Creation rows carry their task; completion rows only `seq`
            // and `took` (a column no creation row sets).
            _ => {
                let rows = creation_ctes!(completion_ctes!(query_with!(;
                    r#"SELECT seq AS "seq!", task_id AS "task_id?", owner AS "owner?",
                              tool AS "tool?", arguments AS "arguments?", status AS "status?",
                              status_message AS "status_message?", created_at AS "created_at?",
                              updated_at AS "updated_at?", ttl_ms AS "ttl_ms?",
                              expires_at AS "expires_at?", poll_interval_ms AS "poll_interval_ms?",
                              progress_token AS "progress_token?", result AS "result?",
                              result_kind AS "result_kind?", tool_error AS "tool_error?",
                              NULL::boolean AS "took?"
                         FROM t
                       UNION ALL
                       SELECT f.task_seq, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                              NULL, NULL, NULL, NULL, NULL, NULL, (k.seq IS NOT NULL)
                         FROM fenced f LEFT JOIN took k ON k.seq = f.task_seq"#,
                    now,
                    doc
                )))
                .fetch_all(&self.pool)
                .await?;
                for r in rows {
                    if let Some(t) = r.took {
                        took.insert(r.seq, t);
                        continue;
                    }
                    let missing = || StoreError::Batch("a created row came back incomplete".into());
                    keep(
                        TaskText {
                            seq: r.seq,
                            task_id: r.task_id.ok_or_else(missing)?,
                            owner: r.owner.ok_or_else(missing)?,
                            tool: r.tool.ok_or_else(missing)?,
                            arguments: r.arguments.ok_or_else(missing)?,
                            status: r.status.ok_or_else(missing)?,
                            status_message: r.status_message,
                            created_at: r.created_at.ok_or_else(missing)?,
                            updated_at: r.updated_at.ok_or_else(missing)?,
                            ttl_ms: r.ttl_ms,
                            expires_at: r.expires_at,
                            poll_interval_ms: r.poll_interval_ms,
                            progress_token: r.progress_token,
                            result: r.result,
                            result_kind: r.result_kind,
                            tool_error: r.tool_error.ok_or_else(missing)?,
                        }
                        .try_into()?,
                    );
                }
            }
        }
        Ok((created, took))
    }
}

/// The writes of a batch that [`PostgresStore::write_alone`] commits in
/// one statement (and a claim after it), split by kind.
struct Plain<'a> {
    creations: Vec<(&'a NewTask, NewJob)>,
    completions: Vec<(i64, &'a str, &'a TaskOutcome)>,
    claim: Option<&'a Write>,
}

impl<'a> Plain<'a> {
    /// None when any write is of another kind (a creation without a job or
    /// with an outcome, a second completion of one job, a second claim, a
    /// claim that needs a transaction, anything else), or when there is
    /// nothing but a claim.
    fn of(writes: &'a [Write]) -> Option<Self> {
        let mut plain = Plain {
            creations: Vec::new(),
            completions: Vec::new(),
            claim: None,
        };
        let mut seqs = HashSet::new();
        for write in writes {
            match write {
                Write::Create {
                    new,
                    job: Some(job),
                    outcome: None,
                } => plain.creations.push((&**new, *job)),
                Write::Complete {
                    task_seq,
                    lease_token,
                    outcome,
                    ..
                } if seqs.insert(*task_seq) => {
                    plain
                        .completions
                        .push((*task_seq, lease_token.as_str(), outcome))
                }
                Write::Claim { quotas, .. }
                    if plain.claim.is_none() && !needs_transaction(quotas) =>
                {
                    plain.claim = Some(write);
                }
                _ => return None,
            }
        }
        if plain.creations.is_empty() && plain.completions.is_empty() {
            return None;
        }
        // In the order of their keys, as the general way locks them.
        plain.completions.sort_unstable_by_key(|(seq, _, _)| *seq);
        Some(plain)
    }
}

#[async_trait]
impl GroupCommit for PostgresStore {
    type Database = Postgres;

    /// No lock first: the status history, and with it the feed order, is
    /// written at commit (migration V14).
    async fn begin_batch(&self) -> Result<sqlx::Transaction<'static, Postgres>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    /// The statements of one creation (`Write::Create`), inside the caller's
    /// transaction. The row as stored: the caller
    /// applies [`as_served`].
    async fn create_one(
        conn: &mut PgConnection,
        new: &NewTask,
        job: Option<NewJob>,
        outcome: Option<&TaskOutcome>,
        now: i64,
    ) -> Result<TaskRow, StoreError> {
        let expires_at = new.ttl_ms.map(|ttl| now.saturating_add(ttl));
        let seq = sqlx::query_scalar!(
            r#"INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at,
                              ttl_ms, expires_at, poll_interval_ms, progress_token, session_id,
                              client_capabilities, idempotency_key, retain_completed_ms,
                              retain_failed_ms, retain_cancelled_ms, archive, traceparent,
                              tracestate)
           VALUES ($1, $2, $3, $4, 'working', $5, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                   $15, $16, $17, $18)
           RETURNING seq"#,
            new.task_id,
            new.owner,
            new.tool,
            new.arguments,
            now,
            new.ttl_ms,
            expires_at,
            new.poll_interval_ms,
            new.progress_token,
            new.session_id,
            new.client_capabilities,
            new.idempotency_key,
            new.retention.completed_ms,
            new.retention.failed_ms,
            new.retention.cancelled_ms,
            new.retention.archive,
            new.traceparent,
            new.tracestate,
        )
        .fetch_one(&mut *conn)
        .await?;
        if let Some(job) = job {
            let run_after = job.run_after.map_or(now, |at| at.max(now));
            sqlx::query!(
                "INSERT INTO jobs (task_seq, tool, owner, max_attempts, priority, run_after, turn)
                 VALUES ($1, $2, $3, $4, $5, $6,
                         GREATEST(COALESCE((SELECT max(turn) + 1 FROM jobs
                                             WHERE priority = $5 AND owner = $3
                                               AND state = 'queued' AND run_after <= $7), 0),
                                  COALESCE((SELECT max(turn) FROM jobs
                                             WHERE tool = $2 AND priority = $5 AND state = 'running'),
                                           (SELECT min(turn) FROM jobs
                                             WHERE tool = $2 AND priority = $5 AND state = 'queued'
                                               AND run_after <= $7), 0)))",
                seq,
                new.tool,
                new.owner,
                job.max_attempts,
                job.priority,
                run_after,
                now
            )
            .execute(&mut *conn)
            .await?;
        }
        if let Some(outcome) = outcome {
            sqlx::query!(
                "UPDATE tasks SET status = $1, status_message = $2, result = $3, result_kind = $4,
                              tool_error = $5, updated_at = $6
              WHERE seq = $7",
                outcome.status.as_str(),
                outcome.status_message,
                outcome.result,
                outcome.result_kind.as_str(),
                outcome.tool_error,
                now,
                seq
            )
            .execute(&mut *conn)
            .await?;
        }
        stored_task(conn, seq).await
    }

    /// The statements of one completion (`Write::Complete`), inside the
    /// caller's transaction: the job, then the task. `LeaseLost` (and
    /// nothing written) when the token no longer holds the job.
    async fn complete_one(
        conn: &mut PgConnection,
        task_seq: i64,
        lease_token: &str,
        outcome: &TaskOutcome,
        now: i64,
    ) -> Result<bool, StoreError> {
        let fenced = sqlx::query!(
            "UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
                finished_at = $1, changed_at = $1, last_error = NULL
          WHERE task_seq = $2 AND lease_token = $3 AND state = 'running'",
            now,
            task_seq,
            lease_token
        )
        .execute(&mut *conn)
        .await?;
        if fenced.rows_affected() == 0 {
            return Err(StoreError::LeaseLost);
        }
        let updated = sqlx::query!(
            "UPDATE tasks SET status = $1, status_message = $2, result = $3, result_kind = $4,
                tool_error = $5, updated_at = GREATEST(updated_at, $6)
          WHERE seq = $7 AND status IN ('working', 'input_required')",
            outcome.status.as_str(),
            outcome.status_message,
            outcome.result,
            outcome.result_kind.as_str(),
            outcome.tool_error,
            now,
            task_seq
        )
        .execute(&mut *conn)
        .await?;
        Ok(updated.rows_affected() == 1)
    }

    /// The statement of one claim (`Write::Claim`), inside the group commit's
    /// transaction.
    ///
    /// Each tool may take `min(free, global - running)` jobs (`cap`). The claim
    /// walks the due jobs, highest priority first then oldest, over tools whose cap is above zero
    /// only, reading at most `4 * limit` jobs (the `head`, locked with `FOR
    /// UPDATE SKIP LOCKED`: jobs another claim holds are passed over, and the
    /// head's rows stay locked until this transaction ends), and takes from it
    /// up to each tool's cap: a tool at its limit is skipped in the index, so
    /// it delays no other tool; each claim takes at least the head's first job,
    /// so every tool with room is reached within a few claims. A globally
    /// limited tool's running jobs are counted under that tool's advisory lock,
    /// held until the claim commits, so the global limit holds whatever the
    /// number of processes.
    async fn claim(
        conn: &mut PgConnection,
        worker: &str,
        lease_token: &str,
        quotas: &[ToolQuota],
        limit: i64,
        lease_ms: i64,
        now: i64,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        if limit <= 0 || quotas.iter().all(|q| q.free <= 0) {
            return Ok(Vec::new());
        }
        // In one order (the keys sorted), so that two claims never wait for
        // each other's locks in a cycle.
        let mut keys: Vec<i32> = quotas
            .iter()
            .filter(|q| q.free > 0 && q.global.is_some())
            .map(|q| tool_lock_key(&q.tool))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        for key in keys {
            sqlx::query!("SELECT pg_advisory_xact_lock($1, $2)", TOOL_LOCK_CLASS, key)
                .execute(&mut *conn)
                .await?;
        }
        // Candidates are locked (SKIP LOCKED) until this transaction commits, so
        // other claimers skip them: lock no more than this claim can take. Only
        // when a tool's quota may bind does the claim need a wider window (4x)
        // to find jobs of other tools behind the capped one's.
        let binding = quotas
            .iter()
            .any(|q| q.free > 0 && (q.free < limit || q.global.is_some()));
        let head = if binding {
            limit.saturating_mul(4)
        } else {
            limit
        };
        let lease_expires_at = now + lease_ms;
        let quotas = Value::Array(
            quotas
                .iter()
                .filter(|q| q.free > 0)
                .map(|q| json!({ "tool": q.tool, "free": q.free, "global_limit": q.global }))
                .collect(),
        );
        let mut jobs = sqlx::query_as!(
            ClaimedJob,
            r#"WITH quota AS (SELECT tool, free, global_limit
                            FROM jsonb_to_recordset($6::jsonb)
                                 AS q(tool text, free bigint, global_limit bigint)),
                running AS (SELECT r.tool, count(*) AS n
                              FROM jobs r JOIN tasks t ON t.seq = r.task_seq
                             WHERE r.state = 'running' AND t.status = 'working'
                               AND r.tool IN (SELECT tool FROM quota WHERE global_limit IS NOT NULL)
                             GROUP BY r.tool),
                cap AS (SELECT q.tool,
                               LEAST(q.free, COALESCE(q.global_limit - COALESCE(r.n, 0), q.free)) AS n
                          FROM quota q LEFT JOIN running r ON r.tool = q.tool),
                head AS (SELECT task_seq, priority, turn, tool FROM jobs
                          WHERE state = 'queued' AND run_after <= $4
                            AND tool IN (SELECT tool FROM cap WHERE n > 0)
                          ORDER BY priority DESC, turn, task_seq LIMIT $7
                          FOR UPDATE SKIP LOCKED),
                ranked AS (SELECT task_seq, priority, turn, tool,
                                  row_number() OVER (PARTITION BY tool ORDER BY priority DESC, turn, task_seq) AS rn
                             FROM head),
                picked AS (SELECT k.task_seq FROM ranked k JOIN cap c ON c.tool = k.tool
                            WHERE k.rn <= c.n
                            ORDER BY k.priority DESC, k.turn, k.task_seq LIMIT $5)
           UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_owner = $1,
                  lease_token = $2, lease_expires_at = $3, changed_at = $4
             FROM tasks t
            WHERE jobs.task_seq IN (SELECT task_seq FROM picked) AND jobs.state = 'queued'
              AND t.seq = jobs.task_seq
           RETURNING jobs.task_seq AS "task_seq!", t.task_id AS "task_id!", jobs.tool AS "tool!",
                     t.arguments AS "arguments!", t.progress_token AS "progress_token?",
                     jobs.attempt AS "attempt!", jobs.max_attempts AS "max_attempts!",
                     jobs.priority AS "priority!", jobs.lease_token AS "lease_token!",
                     jobs.checkpoint AS "checkpoint?", t.traceparent AS "traceparent?",
                     t.tracestate AS "tracestate?", jobs.run_after AS "runnable_since!""#,
            worker,
            lease_token,
            lease_expires_at,
            now,
            limit,
            quotas,
            head
        )
        .fetch_all(&mut *conn)
        .await?;
        jobs.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.task_seq));
        Ok(jobs)
    }

    async fn insert_tasks(
        conn: &mut PgConnection,
        tasks: Value,
        now: i64,
    ) -> Result<Vec<TaskRow>, StoreError> {
        let rows = sqlx::query_as!(
            TaskText,
            r#"INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at,
                              ttl_ms, expires_at, poll_interval_ms, progress_token, session_id,
                              client_capabilities, idempotency_key, retain_completed_ms,
                              retain_failed_ms, retain_cancelled_ms, archive, traceparent,
                              tracestate)
           SELECT c.task_id, c.owner, c.tool, c.arguments, 'working', $1, $1, c.ttl_ms,
                  c.expires_at, c.poll_interval_ms, c.progress_token, c.session_id,
                  c.client_capabilities, c.idempotency_key, c.retain_completed_ms,
                  c.retain_failed_ms, c.retain_cancelled_ms, c.archive, c.traceparent,
                  c.tracestate
             FROM jsonb_to_recordset($2::jsonb)
                  AS c(task_id text, owner text, tool text, arguments text, ttl_ms bigint,
                       expires_at bigint, poll_interval_ms bigint, progress_token text,
                       session_id text, client_capabilities text, idempotency_key text,
                       retain_completed_ms bigint, retain_failed_ms bigint,
                       retain_cancelled_ms bigint, archive boolean, traceparent text,
                       tracestate text)
           RETURNING seq, task_id, owner, tool, arguments, status, status_message, created_at,
                     updated_at, ttl_ms, expires_at, poll_interval_ms, progress_token, result,
                     result_kind, tool_error"#,
            now,
            tasks
        )
        .fetch_all(conn)
        .await?;
        text::rows(rows)
    }

    async fn insert_jobs(
        conn: &mut PgConnection,
        jobs: &[GroupedJob<'_>],
        now: i64,
    ) -> Result<u64, StoreError> {
        let seqs: Vec<i64> = jobs.iter().map(|j| j.task_seq).collect();
        let tools: Vec<String> = jobs.iter().map(|j| j.tool.to_owned()).collect();
        let max_attempts: Vec<i64> = jobs.iter().map(|j| j.job.max_attempts).collect();
        let priorities: Vec<i64> = jobs.iter().map(|j| j.job.priority).collect();
        let run_after: Vec<i64> = jobs
            .iter()
            .map(|j| j.job.run_after.map_or(now, |at| at.max(now)))
            .collect();
        let owners: Vec<String> = jobs.iter().map(|j| j.owner.to_owned()).collect();
        let inserted = sqlx::query!(
            "INSERT INTO jobs (task_seq, tool, owner, max_attempts, priority, run_after, turn)
         SELECT c.seq, c.tool, c.owner, c.max_attempts, c.priority, c.run_after,
                GREATEST(COALESCE((SELECT max(turn) + 1 FROM jobs j
                                    WHERE j.priority = c.priority AND j.owner = c.owner
                                      AND j.state = 'queued' AND j.run_after <= $7), 0),
                         COALESCE((SELECT max(turn) FROM jobs j
                                    WHERE j.tool = c.tool AND j.priority = c.priority AND j.state = 'running'),
                                  (SELECT min(turn) FROM jobs j
                                    WHERE j.tool = c.tool AND j.priority = c.priority AND j.state = 'queued'
                                      AND j.run_after <= $7), 0))
                + row_number() OVER (PARTITION BY c.owner, c.priority ORDER BY c.seq) - 1
           FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[])
                AS c(seq, tool, owner, max_attempts, priority, run_after)",
            &seqs,
            &tools,
            &owners,
            &max_attempts,
            &priorities,
            &run_after,
            now
        )
        .execute(conn)
        .await?;
        Ok(inserted.rows_affected())
    }

    async fn finish_jobs(
        conn: &mut PgConnection,
        leases: &[(i64, &str)],
        now: i64,
    ) -> Result<Vec<i64>, StoreError> {
        // In the order of their keys, as a rescue locks expired jobs: two
        // transactions never hold one each of the other's.
        let mut leases = leases.to_vec();
        leases.sort_unstable_by_key(|(seq, _)| *seq);
        let seqs: Vec<i64> = leases.iter().map(|(seq, _)| *seq).collect();
        let tokens: Vec<String> = leases.iter().map(|(_, t)| (*t).to_owned()).collect();
        Ok(sqlx::query_scalar!(
            "UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
                finished_at = $1, changed_at = $1, last_error = NULL
           FROM unnest($2::bigint[], $3::text[]) AS c(seq, token)
          WHERE jobs.task_seq = c.seq AND jobs.lease_token = c.token AND jobs.state = 'running'
         RETURNING jobs.task_seq",
            now,
            &seqs,
            &tokens
        )
        .fetch_all(conn)
        .await?)
    }

    async fn record_outcomes(
        conn: &mut PgConnection,
        outcomes: Value,
        now: i64,
    ) -> Result<Vec<i64>, StoreError> {
        Ok(sqlx::query_scalar!(
            "UPDATE tasks SET status = c.status, status_message = c.message, result = c.result,
                result_kind = c.kind, tool_error = c.tool_error,
                updated_at = GREATEST(tasks.updated_at, $1)
           FROM jsonb_to_recordset($2::jsonb)
                AS c(seq bigint, status text, message text, result text, kind text,
                     tool_error boolean)
          WHERE tasks.seq = c.seq AND tasks.status IN ('working', 'input_required')
         RETURNING tasks.seq",
            now,
            outcomes
        )
        .fetch_all(conn)
        .await?)
    }
}

/// The second key of a tool's advisory lock: FNV-1a of its name (a
/// collision only makes two tools' claims take turns).
fn tool_lock_key(tool: &str) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in tool.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    i32::from_ne_bytes(hash.to_ne_bytes())
}

/// A task as stored (not as served: see [`as_served`]).
async fn stored_task(conn: &mut PgConnection, seq: i64) -> Result<TaskRow, StoreError> {
    let row = sqlx::query_as!(
        TaskText,
        "SELECT seq, task_id, owner, tool, arguments, status, status_message,
                created_at, updated_at, ttl_ms, expires_at, poll_interval_ms,
                progress_token, result, result_kind, tool_error
           FROM tasks WHERE seq = $1",
        seq
    )
    .fetch_one(conn)
    .await?;
    row.try_into()
}

/// Whether a claim of `quotas` needs a transaction of its own: a tool
/// limited across processes holds its lock until the claim commits.
fn needs_transaction(quotas: &[ToolQuota]) -> bool {
    quotas.iter().any(|q| q.free > 0 && q.global.is_some())
}
