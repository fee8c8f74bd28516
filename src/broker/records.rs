//! Bookkeeping the front ends and the worker pool keep through the broker:
//! sessions and tokens (HTTP), and a pool's own rows and leases. Each
//! handle gives its holder what it needs of storage and nothing else, so
//! neither the HTTP layer nor the pool holds the whole store.

use std::ops::Deref;

use crate::store::{
    HeartbeatOutcome, NewWorker, SessionStore, Store, StoreError, TaskMessage, TokenStore,
    WorkerState,
};

/// Sessions (2025-11-25): create, look up, touch, end, count.
#[derive(Clone, Debug)]
pub struct SessionRecords(Store);

impl SessionRecords {
    pub(super) fn new(store: Store) -> Self {
        Self(store)
    }
}

impl Deref for SessionRecords {
    type Target = dyn SessionStore;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

/// Bearer tokens: create, look up, list, revoke, note a use.
#[derive(Clone, Debug)]
pub struct TokenRecords(Store);

impl TokenRecords {
    pub(super) fn new(store: Store) -> Self {
        Self(store)
    }
}

impl Deref for TokenRecords {
    type Target = dyn TokenStore;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

/// What a worker pool writes and reads besides claims and completions
/// (those go through the writer): its registration and heartbeats, its
/// leases, and what its running tasks say and ask. Every write about a job
/// names its lease token: `LeaseLost` means another worker owns it now.
#[derive(Clone, Debug)]
pub struct PoolRecords(Store);

impl PoolRecords {
    pub(super) fn new(store: Store) -> Self {
        Self(store)
    }

    /// Record a starting pool.
    pub async fn worker_register(&self, w: &NewWorker, now: i64) -> Result<(), StoreError> {
        self.0.worker_register(w, now).await
    }

    /// The pool is alive and runs `running` jobs.
    pub async fn worker_heartbeat(
        &self,
        id: &str,
        running: i64,
        now: i64,
    ) -> Result<(), StoreError> {
        self.0.worker_heartbeat(id, running, now).await
    }

    /// The tools the pool claims.
    pub async fn worker_serves(&self, id: &str, tools: &[String]) -> Result<(), StoreError> {
        self.0.worker_serves(id, tools).await
    }

    /// The pool is stopping or stopped.
    pub async fn worker_set_state(
        &self,
        id: &str,
        state: WorkerState,
        now: i64,
    ) -> Result<(), StoreError> {
        self.0.worker_set_state(id, state, now).await
    }

    /// Whether a claim that finds nothing costs no more than this look
    /// (see `Storage::empty_claim_is_cheap`).
    pub fn empty_claim_is_cheap(&self) -> bool {
        self.0.empty_claim_is_cheap()
    }

    /// Whether any job could be claimed now.
    pub async fn job_any_runnable(&self, now: i64) -> Result<bool, StoreError> {
        self.0.job_any_runnable(now).await
    }

    /// Extend a lease; says whether the task was cancelled.
    pub async fn job_heartbeat(
        &self,
        task_seq: i64,
        lease: &str,
        lease_ms: i64,
        now: i64,
    ) -> Result<HeartbeatOutcome, StoreError> {
        self.0.job_heartbeat(task_seq, lease, lease_ms, now).await
    }

    /// Keep where a running job has got to, for its later attempts.
    pub async fn job_checkpoint(
        &self,
        task_seq: i64,
        lease: &str,
        checkpoint: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.0
            .job_checkpoint(task_seq, lease, checkpoint, now)
            .await
    }

    /// Give back a job claimed but never started (no attempt used).
    pub async fn job_unclaim(
        &self,
        task_seq: i64,
        lease: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        self.0.job_unclaim(task_seq, lease, now).await
    }

    /// A stopping pool gives back a running job (no attempt used).
    pub async fn job_release(
        &self,
        task_seq: i64,
        lease: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        self.0.job_release(task_seq, lease, now).await
    }

    /// Close the job of a cancelled task.
    pub async fn job_finish_cancelled(
        &self,
        task_seq: i64,
        lease: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.0.job_finish_cancelled(task_seq, lease, now).await
    }

    /// The capabilities (JSON text) of the client that created the task.
    pub async fn task_client_capabilities(
        &self,
        task_seq: i64,
    ) -> Result<Option<String>, StoreError> {
        self.0.task_client_capabilities(task_seq).await
    }

    /// Ask the client something (the task turns input_required).
    pub async fn task_message_ask(
        &self,
        task_seq: i64,
        lease: &str,
        message: &TaskMessage,
        now: i64,
    ) -> Result<(), StoreError> {
        self.0.task_message_ask(task_seq, lease, message, now).await
    }

    /// One request, with its answer once given.
    pub async fn task_message_get(
        &self,
        request_id: &str,
    ) -> Result<Option<TaskMessage>, StoreError> {
        self.0.task_message_get(request_id).await
    }

    /// What the running task says it is doing.
    pub async fn task_set_status_message(
        &self,
        task_seq: i64,
        lease: &str,
        message: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.0
            .task_set_status_message(task_seq, lease, message, now)
            .await
    }

    /// A progress report of the running task.
    pub async fn task_record_progress(
        &self,
        task_seq: i64,
        lease: &str,
        progress: f64,
        total: Option<f64>,
        message: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.0
            .task_record_progress(task_seq, lease, progress, total, message, now)
            .await
    }
}
