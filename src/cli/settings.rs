//! The rules the `serve` and `worker` settings share: which of flag,
//! config file and default wins, the ranges of durations, and which tools
//! a process serves.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, DurationValue};
use crate::store::Durability;
use crate::tools::{Tool, conformance_tools, demo_tools};

/// Seconds from 0 to a day, as a flag gives them.
pub(super) fn secs(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && (0.0..=86_400.0).contains(&v) {
        Ok(v)
    } else {
        Err("must be a number of seconds from 0 to 86400".into())
    }
}

pub(super) fn positive_secs(s: &str) -> Result<f64, String> {
    let v = secs(s)?;
    if v > 0.0 {
        Ok(v)
    } else {
        Err("must be a number of seconds above 0".into())
    }
}

/// A duration in the config file, if set.
pub(super) type FileDuration = Option<toml::Spanned<DurationValue>>;

/// A duration setting: the flag if given, else the first config key that is
/// set, else `default`.
pub(super) fn duration_setting(
    config: &Config,
    flag: Option<Duration>,
    keys: &[&FileDuration],
    default: Duration,
) -> anyhow::Result<Duration> {
    if let Some(d) = flag {
        return Ok(d);
    }
    for key in keys {
        if let Some(d) = config.duration(key)? {
            return Ok(d);
        }
    }
    Ok(default)
}

/// A deadline of 0 would close every connection at once.
pub(super) fn positive_setting(name: &str, value: Duration) -> anyhow::Result<Duration> {
    anyhow::ensure!(!value.is_zero(), "{name} must be above 0");
    Ok(value)
}

/// Leases shorter than this would expire between heartbeats.
pub(super) fn lease_setting(lease: Duration) -> anyhow::Result<Duration> {
    anyhow::ensure!(
        lease >= Duration::from_millis(100),
        "lease must be at least 100 ms"
    );
    Ok(lease)
}

pub(super) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(super) fn load_config(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Ok(Config::load(p)?),
        None => Ok(Config::default()),
    }
}

/// Demo tools (unless turned off), conformance fixtures (if asked), then
/// the config's command tools, none of which may take a built-in's name.
pub(super) fn tools(
    config: &Config,
    no_demo: bool,
    conformance: bool,
) -> anyhow::Result<Vec<Arc<dyn Tool>>> {
    let mut tools = Vec::new();
    if !no_demo && config.file.server.demo_tools.unwrap_or(true) {
        let demo = demo_tools();
        config.check_reserved(
            demo.iter().map(|t| t.definition().name.as_str()),
            "a built-in demo tool",
        )?;
        tools.extend(demo);
    }
    if conformance || config.file.server.conformance_tools.unwrap_or(false) {
        let fixtures = conformance_tools();
        config.check_reserved(
            fixtures.iter().map(|t| t.definition().name.as_str()),
            "a conformance fixture tool",
        )?;
        tools.extend(fixtures);
    }
    tools.extend(config.tools.iter().cloned());
    Ok(tools)
}

pub(super) fn durability(
    flag: Option<Durability>,
    file: &Option<String>,
) -> anyhow::Result<Durability> {
    match (flag, file) {
        (Some(d), _) => Ok(d),
        (None, Some(text)) => text
            .parse()
            .map_err(|e: String| anyhow::anyhow!("config: durability: {e}")),
        (None, None) => Ok(Durability::default()),
    }
}
