//! Logging to stderr that never takes the process down.
//!
//! A broker's stderr is often a pipe (a supervisor, a log shipper, `| cat`)
//! whose reader may go away first: Ctrl-C in a terminal stops both ends of
//! `taskbroker serve 2>&1 | cat`. Writing a log line must then lose that line,
//! never panic: a panicking task would be the one running graceful shutdown.
//! (tracing-subscriber reports a failed write with `eprintln!`, which panics
//! on a broken stderr; [`LossyStderr`] never reports one.)

use std::io::{self, Write};

use tracing_subscriber::EnvFilter;

/// The filter when `RUST_LOG` is unset: the program's own events at info;
/// sqlx's per-statement lines and refinery's per-migration lines (the
/// broker logs one line of its own for a migration) only when they warn;
/// the OpenTelemetry crates' notes too (`opentelemetry` covers the SDK's
/// and the exporter's targets; a failed export is a warning).
pub const DEFAULT_FILTER: &str = "info,sqlx=warn,refinery_core=warn,opentelemetry=warn";

/// Install the global subscriber: `RUST_LOG` if set and valid, else
/// `default_filter`; colours only when stderr is a terminal.
pub fn init(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LossyStderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .log_internal_errors(false)
        .init();
}

/// Standard error, where a write that fails (EPIPE, EBADF, a full disk
/// behind a redirect) drops the bytes and reports success.
#[derive(Debug, Clone, Copy)]
pub struct LossyStderr;

impl Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

/// Print a line on stdout for scripts (such as the listen address), losing
/// it rather than panicking when stdout is closed.
pub fn stdout_line(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
