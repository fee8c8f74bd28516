//! `taskbroker`: the command line. Flags (and their environment variables)
//! override the config file, which overrides the defaults; the
//! subcommands and their settings are in the library's `cli` module.

use std::process::ExitCode;

use clap::Parser;
use taskbroker::cli::{self, Cli};
use taskbroker::{logging, traces};

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.command.log_filter());
    // Before the runtime: the exporter's blocking HTTP client must not be
    // made inside it.
    let exporting = match cli
        .command
        .trace_settings()
        .as_ref()
        .map(traces::export::start)
    {
        Some(Err(e)) => return cli::fail(&e),
        Some(Ok(exporting)) => exporting,
        None => None,
    };
    if let Some(exporting) = &exporting {
        tracing::info!(
            endpoint = exporting.endpoint(),
            "exporting traces over OTLP/HTTP"
        );
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return cli::fail(&anyhow::anyhow!("cannot start the async runtime: {e}")),
    };
    let code = match runtime.block_on(cli::run(cli.command)) {
        Ok(code) => code,
        Err(e) => cli::fail(&e),
    };
    // The spans of the last moments (a run that ended as the process
    // stopped) go out before it exits.
    if let Some(exporting) = exporting {
        exporting.shutdown();
    }
    code
}
