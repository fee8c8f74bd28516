//! taskbroker: a durable task broker for the Model Context Protocol
//! (MCP 2025-11-25 tasks, and MCP 2026-07-28 with its tasks extension, on
//! one endpoint).
//!
//! MCP clients call tools as tasks over Streamable HTTP; every task, its
//! status history and its result are rows in SQLite or PostgreSQL, so a killed and
//! restarted server goes on answering `tasks/get`, `tasks/result` and
//! `tasks/list`. Workers claim jobs in transactions under leases; a worker
//! that dies loses nothing.
//!
//! # Layout
//! Data flows top to bottom; each module has one job.
//! - [`cli`]: the `taskbroker` command line: subcommands, the settings
//!   flags, config file and defaults make, and the one-line failure.
//! - [`app`]: assembles a broker process (store, feed, workers, HTTP) and
//!   shuts it down; `app::McpEndpoint` is the `/mcp` router alone, in
//!   process.
//! - [`server`]: the `/mcp` endpoint: its checks as axum middleware
//!   (origin, token, rate), the POST body as an extractor, sessions, SSE,
//!   dispatch of methods; the 2025-11-25 front end at its top, the
//!   2026-07-28 one in `server::modern`. No SQL.
//! - [`mcp`]: the wire format (JSON-RPC framing, MCP shapes, log levels).
//!   No I/O.
//! - [`broker`]: the task rules (create, get, result, list, cancel, ttl,
//!   cursors, when a session expires), what a task's outcome and a client's
//!   answer are in no protocol's terms, the change feed, and the
//!   purge/rescue services. No HTTP, no SQL, no wire shape.
//! - [`worker`]: the pool that claims jobs, heartbeats leases and records
//!   outcomes with fenced writes.
//! - [`tools`]: the `Tool` trait, the registry that validates arguments, the
//!   catalog of the tools served now (fixed ones and each upstream's), and
//!   the demo tools.
//! - [`upstream`]: the broker as an MCP client of the servers people
//!   already run: a connection carried by a stdio server's process or by
//!   Streamable HTTP, the 2025-11-25 session (handshake, `tools/list`, calls whose progress and
//!   questions reach their handler, cancel, the upstream's own tasks), the
//!   link that keeps each connection up and its tools served, and the
//!   `Tool` each upstream tool becomes.
//! - [`child_process`]: the process groups of the programs the broker
//!   starts (command tools, stdio upstreams), their kill, and line reading.
//! - [`store`]: opens the database of either driver (the `taskbroker-sqlite`
//!   and `taskbroker-postgres` crates hold every SQL statement and their
//!   migrations, behind the `taskbroker-storage` traits).
//! - [`config`]: the `taskbroker.toml` file: settings, command tools and
//!   upstream servers.
//! - [`defaults`]: the default of every setting, and of every limit the
//!   measurement it was picked from.
//! - [`logging`]: stderr logging that loses lines, never the process, when
//!   stderr is closed.
//! - [`console`]: the web console at `/ui` (pages, its JSON and its live
//!   events), for operators.
//! - [`traces`]: OpenTelemetry spans of a task's life across processes,
//!   the W3C trace context a task carries, and their OTLP export (off
//!   unless asked).
//! - [`metrics`]: Prometheus metrics (`/metrics`) and readiness (`/readyz`).
//! - [`clock`]: wall-clock milliseconds, the unit of every stored time.
//! - [`ops`]: the operator commands (`taskbroker stats`, `workers`,
//!   `upstreams`, `tasks list --db`, `backup`), which read the database
//!   directly.
//! - [`client`]: the command-line MCP client (`taskbroker call`, `taskbroker
//!   tasks`) over Streamable HTTP, and the text tables all commands
//!   print. Talks to a broker only through `/mcp`.

pub mod app;
pub mod broker;
pub mod child_process;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod console;
pub mod defaults;
pub mod logging;
pub mod mcp;
pub mod metrics;
pub mod ops;
pub mod server;
pub mod store;
pub mod tools;
pub mod traces;
pub mod upstream;
pub mod worker;
