//! The default of every setting of `taskbroker serve` and `taskbroker
//! worker`, in one place; flags, environment variables and the config file
//! override them.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

/// SQLite file.
pub const DB: &str = "taskbroker.db";
/// Where the server listens: loopback only.
pub const LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8808));
/// Job lease: a worker silent this long is presumed dead.
pub const LEASE: Duration = Duration::from_secs(30);
/// On shutdown, how long running jobs may finish.
pub const GRACE: Duration = Duration::from_secs(10);
/// Longest task ttl; requested ttls are clamped.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// ttl of a task whose request names none.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);
/// pollInterval suggested on every task.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Tasks per tasks/list page.
pub const PAGE_SIZE: u64 = 100;
/// Largest POST body, bytes.
pub const MAX_BODY: usize = 4 * 1024 * 1024;
/// Largest tool arguments, bytes of JSON.
pub const MAX_ARGUMENT_BYTES: usize = 1024 * 1024;

/// Non-terminal tasks one requestor may have.
pub const MAX_OPEN_TASKS: i64 = 1000;
/// Requests per second per requestor (principal, or session without
/// tokens).
pub const RATE: f64 = 50.0;
/// Burst above [`RATE`].
pub const RATE_BURST: f64 = 100.0;
/// initialize requests (and requests naming no live session) per second
/// per client address, without tokens.
pub const INITIALIZE_RATE: f64 = 20.0;
/// Burst above [`INITIALIZE_RATE`].
pub const INITIALIZE_BURST: f64 = 200.0;
/// Live sessions at most.
pub const MAX_SESSIONS: i64 = 10_000;
/// Open SSE streams at most.
pub const MAX_SSE_STREAMS: usize = 1_000;
