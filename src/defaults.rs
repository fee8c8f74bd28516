//! The default of every setting of `taskbroker serve` and `taskbroker
//! worker`, in one place; flags, environment variables and the config file
//! override them. The limits' defaults were each picked from a measurement
//! on a 2-core machine, named beside each and in README's "Limits" table:
//! they serve 16 local clients creating tasks as fast as they can, one
//! session enqueueing 10,000 tasks in a burst, and 100 clients polling at
//! the suggested interval, with no 429 and no refusal (tests/default_limits.rs).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

/// Jobs one pool (`--workers`, `--concurrency`) runs at once, all tools
/// together. MCP tools mostly wait (on APIs, subprocesses, people), so the
/// cap is not the number of cores: a running in-process job costs a few KB,
/// a command tool's run one process (command tools have their own lower
/// default below, and a CPU-heavy tool sets its own `concurrency`).
pub const CONCURRENCY: usize = 256;

/// Runs of one command tool at once in one process, unless its `[[tool]]`
/// says otherwise: ten 20-second shell tasks submitted at once start at
/// once on any machine.
pub const COMMAND_CONCURRENCY: usize = 32;

/// SQLite file.
pub const DB: &str = "taskbroker.db";
/// Where the server listens: loopback only.
pub const LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8808));
/// Job lease: a worker silent this long is presumed dead.
pub const LEASE: Duration = Duration::from_secs(30);
/// How long the row of a worker pool that stopped or died is kept (for
/// `taskbroker workers --all` and the console) before maintenance forgets
/// it; the job history keeps its id.
pub const WORKER_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often the keys that sign MCP 2026-07-28 request states rotate: a
/// state is accepted for at least this long and at most twice it (long
/// enough for a person to answer a question; every broker on the database
/// shares the keys). Not a setting: the stored keys are numbered by it.
pub const REQUEST_STATE_KEY_PERIOD: Duration = Duration::from_secs(24 * 3600);
/// How long a worker process started on a database that does not exist
/// yet, or is not migrated yet, waits for a broker (or `taskbroker
/// migrate`) to create and migrate it while nothing changes (the file does
/// not appear, the schema version does not move) before it gives up.
pub const SCHEMA_WAIT: Duration = Duration::from_secs(5);
/// The longest a worker waits for a migration that goes on moving: the
/// deadline of a migration that races another (SQLite), so a worker waits
/// out any broker that is still migrating.
pub const SCHEMA_WAIT_LONGEST: Duration = Duration::from_secs(60);
/// On shutdown, how long running jobs may finish.
pub const GRACE: Duration = Duration::from_secs(10);
/// Longest task ttl; requested ttls are clamped.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The furthest ahead a call may put its task's start unless its tool's
/// config says otherwise (`max_delay`); a start past the task's ttl is
/// refused whatever this says.
pub const MAX_START_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Tasks past their ttl one purge transaction looks at, and as many kept
/// ones now due (keeps each write lock short; a million expired rows go in
/// 2,000 transactions, not one).
pub const PURGE_BATCH: i64 = 500;
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

/// Non-terminal tasks one requestor may have. Measured: a task takes about
/// 0.75 KB of database and `sleep 0` tasks drain at about 1,000/s with the
/// default pool on 2 cores; 100,000 open tasks are ~75 MB and under 2 min
/// of such a queue, and hold ten 10,000-task batches.
pub const MAX_OPEN_TASKS: i64 = 100_000;
/// Requests per second per requestor (principal, or session without
/// tokens). Measured: a client creating tasks one after another reaches
/// ~520/s; a `tasks/get` loop with no pause ~5,500/s (13,700/s with 32 in
/// flight). At 1,000/s the first is never slowed, a loop that polls
/// without pausing is.
pub const RATE: f64 = 1_000.0;
/// Burst above [`RATE`]: a 10,000-task batch fits in a full bucket however
/// fast the machine (one session with 32 in flight creates 2,500-4,900
/// tasks/s here).
pub const RATE_BURST: f64 = 10_000.0;
/// initialize requests (and requests naming no live session) per second
/// per client address, without tokens. Measured: one client opening
/// sessions back to back reaches ~950/s; 20/s is far above an agent
/// platform opening a session per conversation, and slows a flood 50-fold.
pub const INITIALIZE_RATE: f64 = 20.0;
/// Burst above [`INITIALIZE_RATE`]: 100 clients starting at once fit,
/// twice over.
pub const INITIALIZE_BURST: f64 = 200.0;
/// Live sessions at most.
pub const MAX_SESSIONS: i64 = 10_000;
/// A session unused this long expires unless it owns a task whose ttl has
/// not run out: an hour, like the default task ttl. A person's pause
/// between two prompts is shorter; a client that went away without DELETE
/// stops counting against `MAX_SESSIONS` within the hour; a client that
/// comes back later gets 404 and initializes again, as the transport says.
pub const SESSION_IDLE: Duration = Duration::from_secs(3600);
/// Open SSE streams at most.
pub const MAX_SSE_STREAMS: usize = 1_000;

/// From accept (or a reused connection's first byte) to the end of a
/// request's head. A real client sends its head in one packet; 10 s covers
/// a slow mobile link and still frees a half-sent connection's descriptor
/// well before the next flood fills the cap.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// From a request's head to the end of its body: [`MAX_BODY`] (4 MiB)
/// arrives in 30 s at ~140 KB/s, far below any link an agent runs on.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// A kept-alive connection with no request in flight: longer than the
/// suggested [`POLL_INTERVAL`] many times over, so a polling client keeps
/// its connection; an open SSE response is never idle.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// After its last answer (a refusal that left a body unread, say), the
/// broker reads and throws away what a client still sends for at most this
/// long before closing, so that a client that writes its whole body before
/// reading gets the answer instead of a reset. 16 MiB on a 20 Mbit/s link
/// take ~7 s.
pub const LINGER_TIME: Duration = Duration::from_secs(10);
/// ... and at most this many bytes: a body four times the size the issue
/// was reported with (16 MiB), sixteen times [`MAX_BODY`]. Beyond, the
/// connection is reset: nobody makes the broker read without end.
pub const LINGER_BYTES: u64 = 64 * 1024 * 1024;
/// Connections beyond [`MAX_CONNECTIONS`] that may linger at once (their
/// 503 sent, their requests read and thrown away); beyond, a refused
/// connection is closed at once. Few, as each holds a descriptor outside
/// the cap: 64 refusals of [`LINGER_TIME`] at most.
pub const LINGERING_REFUSALS: usize = 64;
/// Open connections at most; beyond, a new one is refused at once (503).
/// Half of the 20,000 descriptors of a usual service limit: the other half
/// covers SQLite (the file, its WAL and shm per pooled connection), command
/// tools (three pipes per run, a few hundred runs at most) and headroom,
/// so that a flood is refused instead of making accept fail for everyone.
/// It holds [`MAX_SSE_STREAMS`] ten times over.
pub const MAX_CONNECTIONS: u32 = 10_000;

/// How long the broker waits for an upstream MCP server's answer to a
/// request that has a bound: `initialize`, `tools/list`, `tasks/get`,
/// `tasks/cancel`, task creation. These answer at once in any working
/// server (server-everything: under 50 ms; a cold `npx` start is spent
/// before `initialize` is sent, not in it); 30 s is MCP SDKs' own usual
/// request timeout, long enough for a loaded machine, short enough that a
/// hung upstream is reported while someone still waits. Tool calls and
/// `tasks/result` have none: they last as long as the tool.
pub const UPSTREAM_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a starting broker or worker waits for its upstream servers'
/// first answers before it serves (a server slower than this, or down, is
/// served from the tool list kept in the database and joins when ready).
/// server-everything over npx starts in about a second here.
pub const UPSTREAM_START_WAIT: Duration = Duration::from_secs(10);
