//! MCP sessions (H-5): made by initialize, stored in the database so a
//! restarted server (or another server on the same database) still accepts
//! them, cached in memory for the hot path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

use serde_json::{Map, Value};

use crate::broker::records::SessionRecords;
use crate::broker::{Owner, SessionExpiry};
use crate::clock::now_ms;
use crate::store::{NewSession, StoreError};
use crate::tools::LogLevel;

/// Cached sessions before the first pruning of idle ones.
const PRUNE_FIRST: usize = 1024;
/// How long (ms) a cached session is trusted before its row is read again,
/// so that what other servers on the database did to it (ended it, used
/// it) is seen here within this time.
const RECHECK_EVERY_MS: i64 = 1_000;

/// A live session.
#[derive(Debug)]
pub struct Session {
    /// The Mcp-Session-Id.
    pub id: String,
    /// Negotiated protocol version.
    pub protocol_version: String,
    /// What the client declared in initialize.
    pub client_capabilities: Value,
    /// The principal that opened it (None without authentication).
    pub principal: Option<String>,
    last_touch: AtomicI64,
    /// When its row was last read (or written) here.
    checked_at: AtomicI64,
    /// Least severe log level the client wants (logging/setLevel), as an
    /// index into `LogLevel::ALL`.
    log_level: AtomicU8,
}

impl Session {
    fn with(
        id: String,
        protocol_version: String,
        client_capabilities: Value,
        last_touch: i64,
        principal: Option<String>,
    ) -> Self {
        Self {
            principal,
            id,
            protocol_version,
            client_capabilities,
            last_touch: AtomicI64::new(last_touch),
            checked_at: AtomicI64::new(now_ms()),
            log_level: AtomicU8::new(1), // info until the client says
        }
    }

    /// Whether a log message of `level` goes to this client.
    pub fn wants_log(&self, level: LogLevel) -> bool {
        let min = LogLevel::ALL[usize::from(self.log_level.load(Ordering::Relaxed)).min(7)];
        level >= min
    }

    /// logging/setLevel.
    pub fn set_log_level(&self, level: LogLevel) {
        let index = LogLevel::ALL.iter().position(|l| *l == level).unwrap_or(1);
        self.log_level.store(index as u8, Ordering::Relaxed);
    }

    /// Whether the client declared the capability needed to receive
    /// `method` (sampling, elicitation in its mode).
    pub fn client_supports(&self, method: &str, params: &Value) -> bool {
        crate::mcp::client_supports(&self.client_capabilities, method, params)
    }

    /// The owner recorded on this session's tasks: the principal with
    /// authentication (T-36), else the session itself (T-37).
    pub fn owner(&self) -> Owner {
        match &self.principal {
            Some(p) => Owner::principal(p),
            None => Owner::session(&self.id),
        }
    }
}

/// Session table with a read-through cache.
#[derive(Debug)]
pub struct Sessions {
    store: SessionRecords,
    /// When a session expires (the broker's rule).
    expiry: SessionExpiry,
    /// The cache is pruned of idle sessions when it reaches
    /// this size (then twice what is left, at least [`PRUNE_FIRST`]), so
    /// sessions that clients never use again do not stay in memory.
    prune_at: std::sync::atomic::AtomicUsize,
    cache: RwLock<HashMap<String, Arc<Session>>>,
}

impl Sessions {
    /// Sessions stored in `store`.
    pub fn new(store: SessionRecords, idle: std::time::Duration) -> Self {
        Self {
            store,
            expiry: SessionExpiry::new(idle),
            prune_at: std::sync::atomic::AtomicUsize::new(PRUNE_FIRST),
            cache: RwLock::new(HashMap::new()),
        }
    }

    /// The expiry rule these sessions follow.
    pub fn expiry(&self) -> SessionExpiry {
        self.expiry
    }

    /// Make and store a session for an initialize request.
    pub async fn create(
        &self,
        protocol_version: &str,
        client_capabilities: &Map<String, Value>,
        client_info: &Map<String, Value>,
        principal: Option<&str>,
    ) -> Result<Arc<Session>, StoreError> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let now = now_ms();
        self.store
            .session_create(
                &NewSession {
                    session_id: id.clone(),
                    protocol_version: protocol_version.to_owned(),
                    client_info: Value::Object(client_info.clone()).to_string(),
                    client_capabilities: Value::Object(client_capabilities.clone()).to_string(),
                    principal: principal.map(str::to_owned),
                },
                now,
            )
            .await?;
        let session = Arc::new(Session::with(
            id.clone(),
            protocol_version.to_owned(),
            Value::Object(client_capabilities.clone()),
            now,
            principal.map(str::to_owned),
        ));
        self.remember(id, session.clone());
        Ok(session)
    }

    /// Cache `session`; prune sessions unused for the idle time once the
    /// cache has grown (a pruned session is read again from the database,
    /// and expires there, at its next use).
    fn remember(&self, id: String, session: Arc<Session>) {
        let mut cache = self.write_cache();
        cache.insert(id, session);
        if cache.len() >= self.prune_at.load(Ordering::Relaxed) {
            let now = now_ms();
            cache.retain(|_, s| {
                !self
                    .expiry
                    .is_idle(s.last_touch.load(Ordering::Relaxed), now)
            });
            self.prune_at
                .store((cache.len() * 2).max(PRUNE_FIRST), Ordering::Relaxed);
        }
    }

    /// A live session by id; None when unknown, ended or expired (-> 404).
    /// A session unused for the idle time expires here, at its next use,
    /// unless it owns a task whose ttl has not run out; the sweeper ends
    /// the ones never used again. A cached session's row is read again
    /// every [`RECHECK_EVERY_MS`], and before it expires here: another
    /// server on the database may have ended it or used it since.
    pub async fn lookup(&self, id: &str) -> Result<Option<Arc<Session>>, StoreError> {
        let cached = self.read_cache().get(id).cloned();
        let now = now_ms();
        let (session, fresh) = match cached {
            Some(s) if now - s.checked_at.load(Ordering::Relaxed) <= RECHECK_EVERY_MS => (s, false),
            cached => match self.reread(id, cached, now).await? {
                Some(s) => (s, true),
                None => return Ok(None),
            },
        };
        let mut last = session.last_touch.load(Ordering::Relaxed);
        if self.expiry.is_idle(last, now) && !fresh {
            let Some(s) = self.reread(id, Some(session.clone()), now).await? else {
                return Ok(None);
            };
            last = s.last_touch.load(Ordering::Relaxed);
        }
        if self.expiry.expired(&self.store, id, last, now).await? {
            tracing::info!(session = id, "session expired: idle");
            self.end(id).await?;
            return Ok(None);
        }
        if self.expiry.touch_due(last, now) {
            session.last_touch.store(now, Ordering::Relaxed);
            self.store.session_touch(id, now).await?;
        }
        Ok(Some(session))
    }

    /// Read a session's row: None (and out of the cache) when unknown or
    /// ended; else the cached session brought up to date (its last use
    /// through any server), or a new one cached.
    async fn reread(
        &self,
        id: &str,
        cached: Option<Arc<Session>>,
        now: i64,
    ) -> Result<Option<Arc<Session>>, StoreError> {
        let row = match self.store.session_get(id).await? {
            Some(row) if row.ended_at.is_none() => row,
            _ => {
                if cached.is_some() {
                    self.write_cache().remove(id);
                }
                return Ok(None);
            }
        };
        if let Some(session) = cached {
            session
                .last_touch
                .fetch_max(row.last_seen_at, Ordering::Relaxed);
            session.checked_at.store(now, Ordering::Relaxed);
            return Ok(Some(session));
        }
        let session = Arc::new(Session::with(
            row.session_id.clone(),
            row.protocol_version,
            serde_json::from_str(&row.client_capabilities).unwrap_or(Value::Object(Map::new())),
            row.last_seen_at,
            row.principal,
        ));
        self.remember(row.session_id, session.clone());
        Ok(Some(session))
    }

    /// End a session (DELETE); false when it was not live.
    pub async fn end(&self, id: &str) -> Result<bool, StoreError> {
        self.write_cache().remove(id);
        self.store.session_end(id, now_ms()).await
    }

    fn read_cache(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Session>>> {
        self.cache.read().unwrap_or_else(|p| p.into_inner())
    }
    fn write_cache(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<Session>>> {
        self.cache.write().unwrap_or_else(|p| p.into_inner())
    }
}
