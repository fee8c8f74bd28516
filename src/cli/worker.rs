//! `taskbroker worker`: its flags, and the worker process's settings they
//! make with the config file (`[worker]`, then `[server]`) and the defaults.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clap::builder::BoolishValueParser;

use super::settings::{
    FileDuration, durability, duration_setting, lease_setting, load_config, positive_secs, secs,
    tools,
};
use crate::app::WorkConfig;
use crate::defaults;
use crate::store::Durability;

/// The flags of `taskbroker worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Config file (taskbroker.toml): the same tools as the server.
    #[arg(long, env = "TASKBROKER_CONFIG")]
    config: Option<PathBuf>,
    /// Where spans of the runs go.
    #[command(flatten)]
    pub(super) traces: super::TraceArgs,
    /// The database: a SQLite file or a postgres://user@host/dbname URL; it must
    /// have the current schema [default: taskbroker.db].
    #[arg(long, env = "TASKBROKER_DB")]
    db: Option<PathBuf>,
    /// Jobs run at once, all tools together (a tool's own `concurrency` may
    /// be lower) [default: 256].
    #[arg(long, env = "TASKBROKER_CONCURRENCY", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    concurrency: Option<u64>,
    /// Job lease in seconds [default: 30].
    #[arg(long, env = "TASKBROKER_LEASE", value_parser = positive_secs)]
    lease: Option<f64>,
    /// On SIGTERM/SIGINT, seconds running jobs may finish before their
    /// leases are released to other workers [default: 10].
    #[arg(long, env = "TASKBROKER_GRACE", value_parser = secs)]
    grace: Option<f64>,
    /// Commit durability: full or normal [default: full].
    #[arg(long, env = "TASKBROKER_DURABILITY")]
    durability: Option<Durability>,
    /// Do not serve the demo tools (echo, sleep, sleep_as_task, fail, approve).
    #[arg(long, env = "TASKBROKER_NO_DEMO_TOOLS", value_parser = BoolishValueParser::new())]
    no_demo_tools: bool,
    /// Serve this process's Prometheus metrics (/metrics, /readyz, /healthz)
    /// on ADDR, e.g. 127.0.0.1:9809 [default: off].
    #[arg(long, env = "TASKBROKER_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
}

impl WorkerArgs {
    /// The worker process's settings: each flag, else the config file, else the default.
    pub fn into_config(self) -> anyhow::Result<WorkConfig> {
        let config = load_config(self.config.as_ref())?;
        let (s, w) = (&config.file.server, &config.file.worker);
        let setting = |flag: Option<Duration>, keys: &[&FileDuration], default: Duration| {
            duration_setting(&config, flag, keys, default)
        };
        // [worker] first, then [server].
        let lease = lease_setting(setting(
            self.lease.map(Duration::from_secs_f64),
            &[&w.lease, &s.lease],
            defaults::LEASE,
        )?)?;
        let grace = setting(
            self.grace.map(Duration::from_secs_f64),
            &[&w.grace, &s.grace],
            defaults::GRACE,
        )?;
        Ok(WorkConfig {
            db: self
                .db
                .or(s.db.clone())
                .unwrap_or_else(|| defaults::DB.into()),
            concurrency: self
                .concurrency
                .map(|c| c as usize)
                .or(w.concurrency)
                .unwrap_or(defaults::CONCURRENCY),
            lease,
            grace,
            durability: durability(self.durability, &s.durability)?,
            tools: tools(&config, self.no_demo_tools, false)?,
            upstreams: config.upstreams.clone(),
            metrics_listen: self.metrics_listen,
        })
    }
}
