//! `taskbroker`: the command line. Flags (and their environment variables)
//! override the config file, which overrides the defaults; the
//! subcommands and their settings are in the library's `cli` module.

use std::process::ExitCode;

use clap::Parser;
use taskbroker::cli::{self, Cli};
use taskbroker::logging;

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.command.log_filter());
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return cli::fail(&anyhow::anyhow!("cannot start the async runtime: {e}")),
    };
    match runtime.block_on(cli::run(cli.command)) {
        Ok(code) => code,
        Err(e) => cli::fail(&e),
    }
}
