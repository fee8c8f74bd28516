//! `[[upstream]]`: MCP servers people already run, served by the broker as
//! durable tasks. Checked at start like `[[tool]]`: every refusal names the
//! file, the line and the reason. What cannot be known until the server
//! answers (its tools, their names and schemas) is a state at run time,
//! never a refusal to start.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use super::{Config, ConfigError, DurationValue};
use crate::upstream::{
    HttpProtocol, HttpSpec, Retry, StdioSpec, ToolSettings, Transport, UpstreamSpec,
};

/// How long a stdio upstream gets between TERM and KILL, unless set.
const DEFAULT_KILL_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// One `[[upstream]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    /// Unique name.
    pub name: Spanned<String>,
    /// A stdio server: argv (no shell), relative to the config's folder.
    pub command: Option<Spanned<Vec<String>>>,
    /// A Streamable HTTP server: its MCP endpoint.
    pub url: Option<Spanned<String>>,
    /// Headers sent to an HTTP server with every request.
    pub headers: Option<Spanned<BTreeMap<String, String>>>,
    /// The environment variable holding the HTTP server's bearer token
    /// (the token itself is never in the file).
    pub bearer_token_env: Option<Spanned<String>>,
    /// The MCP revision spoken to an HTTP server: "2025-11-25",
    /// "2026-07-28" (default: asked with `server/discover`).
    pub protocol: Option<Spanned<String>>,
    /// Environment added for a stdio server.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory of a stdio server (default: the config's folder).
    pub working_dir: Option<PathBuf>,
    /// Wait between TERM and KILL when a stdio server is stopped.
    pub kill_grace: Option<Spanned<DurationValue>>,
    /// Put before each of its tools' names.
    pub prefix: Option<Spanned<String>>,
    /// Serve only these of its tools.
    pub include: Option<Vec<String>>,
    /// Never serve these.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Settings of all its tools: forbidden | optional | required.
    pub task_support: Option<Spanned<String>>,
    /// Longest call.
    pub timeout: Option<Spanned<DurationValue>>,
    /// Runs allowed when workers are lost.
    pub max_attempts: Option<Spanned<i64>>,
    /// Calls at once in one process.
    pub concurrency: Option<Spanned<i64>>,
    /// Calls at once across every process.
    pub global_concurrency: Option<Spanned<i64>>,
    /// never | always: whether a call lost with its worker is sent again.
    pub retry: Option<Spanned<String>>,
    /// Priority of its tools' calls: a name or a number.
    pub priority: Option<Spanned<toml::Value>>,
    /// The highest priority a call may ask for.
    pub max_priority: Option<Spanned<toml::Value>>,
    /// The furthest ahead a call may put its start.
    pub max_delay: Option<Spanned<DurationValue>>,
    /// Kept this long after completing, past its ttl.
    pub retain_completed: Option<Spanned<DurationValue>>,
    /// Kept this long after failing, past its ttl.
    pub retain_failed: Option<Spanned<DurationValue>>,
    /// Kept this long after being cancelled, past its ttl.
    pub retain_cancelled: Option<Spanned<DurationValue>>,
    /// Moved to the archive table instead of deleted.
    pub archive: Option<bool>,
    /// Settings of one tool, by the upstream's name for it.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolSettingsSection>,
    /// The principals (token names) that may see and call its tools;
    /// absent: every client.
    pub principals: Option<Spanned<Vec<String>>>,
}

impl UpstreamSection {
    /// The settings of all its tools, as a tool's table.
    fn settings(&self) -> ToolSettingsSection {
        ToolSettingsSection {
            task_support: self.task_support.clone(),
            timeout: self.timeout.clone(),
            max_attempts: self.max_attempts.clone(),
            concurrency: self.concurrency.clone(),
            global_concurrency: self.global_concurrency.clone(),
            retry: self.retry.clone(),
            priority: self.priority.clone(),
            max_priority: self.max_priority.clone(),
            max_delay: self.max_delay.clone(),
            retain_completed: self.retain_completed.clone(),
            retain_failed: self.retain_failed.clone(),
            retain_cancelled: self.retain_cancelled.clone(),
            archive: self.archive,
        }
    }
}

/// `[upstream.tools.NAME]`: the run settings of one upstream tool.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSettingsSection {
    /// forbidden | optional | required.
    pub task_support: Option<Spanned<String>>,
    /// Longest call.
    pub timeout: Option<Spanned<DurationValue>>,
    /// Runs allowed when workers are lost.
    pub max_attempts: Option<Spanned<i64>>,
    /// Calls at once in one process.
    pub concurrency: Option<Spanned<i64>>,
    /// Calls at once across every process.
    pub global_concurrency: Option<Spanned<i64>>,
    /// never | always: whether a call lost with its worker is sent again.
    pub retry: Option<Spanned<String>>,
    /// Priority of its calls: a name or a number.
    pub priority: Option<Spanned<toml::Value>>,
    /// The highest priority a call may ask for.
    pub max_priority: Option<Spanned<toml::Value>>,
    /// The furthest ahead a call may put its start.
    pub max_delay: Option<Spanned<DurationValue>>,
    /// Kept this long after completing, past its ttl.
    pub retain_completed: Option<Spanned<DurationValue>>,
    /// Kept this long after failing, past its ttl.
    pub retain_failed: Option<Spanned<DurationValue>>,
    /// Kept this long after being cancelled, past its ttl.
    pub retain_cancelled: Option<Spanned<DurationValue>>,
    /// Moved to the archive table instead of deleted.
    pub archive: Option<bool>,
}

impl Config {
    /// Every `[[upstream]]`, checked.
    pub(super) fn build_upstreams(&self) -> Result<Vec<UpstreamSpec>, ConfigError> {
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut upstreams = Vec::new();
        for section in &self.file.upstreams {
            let line = self.line_of(section.name.span().start);
            let name = section.name.get_ref().clone();
            if !super::is_tool_name(&name) {
                return Err(self.error(
                    line,
                    format!("upstream name '{name}': use 1-128 of A-Z a-z 0-9 _ - ."),
                ));
            }
            if let Some(first) = seen.insert(name.clone(), line) {
                return Err(self.error(
                    line,
                    format!("duplicate upstream name '{name}' (first defined on line {first})"),
                ));
            }
            let what = format!("upstream '{name}'");
            let transport = self.upstream_transport(section, &name, &what, line)?;
            let prefix = match &section.prefix {
                None => String::new(),
                Some(p) if p.get_ref().is_empty() || super::is_tool_name(p.get_ref()) => {
                    p.get_ref().clone()
                }
                Some(p) => {
                    return Err(self.error(
                        self.line_of(p.span().start),
                        format!("{what}: prefix '{}': use A-Z a-z 0-9 _ - .", p.get_ref()),
                    ));
                }
            };
            let defaults = self.tool_settings(&section.settings(), &what)?;
            let mut tools = BTreeMap::new();
            for (tool, settings) in &section.tools {
                let tool_what = format!("{what}, tool '{tool}'");
                tools.insert(tool.clone(), self.tool_settings(settings, &tool_what)?);
            }
            let principals = match &section.principals {
                None => None,
                Some(list) if list.get_ref().is_empty() => {
                    return Err(self.error(
                        self.line_of(list.span().start),
                        format!("{what}: principals = [] would hide its tools from every client (leave it out to serve them to all)"),
                    ));
                }
                Some(list) => match list.get_ref().iter().find(|p| p.trim().is_empty()) {
                    Some(_) => {
                        return Err(self.error(
                            self.line_of(list.span().start),
                            format!("{what}: principals: an empty name"),
                        ));
                    }
                    None => Some(list.get_ref().clone()),
                },
            };
            upstreams.push(UpstreamSpec {
                transport,
                name,
                prefix,
                include: section.include.clone(),
                exclude: section.exclude.clone(),
                defaults,
                tools,
                principals,
            });
        }
        Ok(upstreams)
    }

    /// How `section` is reached: a command (stdio) or a url (HTTP),
    /// exactly one, with only the settings of that kind.
    fn upstream_transport(
        &self,
        section: &UpstreamSection,
        name: &str,
        what: &str,
        line: usize,
    ) -> Result<Transport, ConfigError> {
        match (&section.command, &section.url) {
            (Some(_), Some(url)) => Err(self.error(
                self.line_of(url.span().start),
                format!("{what}: give either command (a stdio server) or url (an HTTP server), not both"),
            )),
            (None, None) => Err(self.error(
                line,
                format!("{what}: give the server's command (argv), e.g. command = [\"npx\", \"-y\", \"@modelcontextprotocol/server-everything\"], or its url"),
            )),
            (Some(command), None) => {
                if let Some(h) = &section.headers {
                    return Err(self.error(
                        self.line_of(h.span().start),
                        format!("{what}: headers apply to an HTTP server (url), not to a command"),
                    ));
                }
                if let Some(b) = &section.bearer_token_env {
                    return Err(self.error(
                        self.line_of(b.span().start),
                        format!("{what}: bearer_token_env applies to an HTTP server (url), not to a command"),
                    ));
                }
                if let Some(p) = &section.protocol {
                    return Err(self.error(
                        self.line_of(p.span().start),
                        format!("{what}: protocol applies to an HTTP server (url); over stdio the broker speaks MCP 2025-11-25"),
                    ));
                }
                let argv = self.resolve_command(
                    command.get_ref(),
                    self.line_of(command.span().start),
                    what,
                )?;
                let working_dir = match &section.working_dir {
                    Some(dir) if dir.is_relative() => Some(self.base_dir().join(dir)),
                    Some(dir) => Some(dir.clone()),
                    None => Some(self.base_dir()),
                };
                Ok(Transport::Stdio(StdioSpec {
                    name: name.to_owned(),
                    argv,
                    env: section.env.clone(),
                    working_dir,
                    kill_grace: self
                        .duration(&section.kill_grace)?
                        .unwrap_or(DEFAULT_KILL_GRACE),
                }))
            }
            (None, Some(url)) => {
                let url_line = self.line_of(url.span().start);
                if !section.env.is_empty()
                    || section.working_dir.is_some()
                    || section.kill_grace.is_some()
                {
                    return Err(self.error(
                        url_line,
                        format!("{what}: env, working_dir and kill_grace apply to a command, not to an HTTP server (url)"),
                    ));
                }
                let parsed = reqwest::Url::parse(url.get_ref())
                    .ok()
                    .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
                let Some(parsed) = parsed else {
                    return Err(self.error(
                        url_line,
                        format!("{what}: url '{}' is not an http:// or https:// URL", url.get_ref()),
                    ));
                };
                let bearer_token = match &section.bearer_token_env {
                    None => None,
                    Some(var) => match std::env::var(var.get_ref()) {
                        Ok(token) if !token.trim().is_empty() => Some(token.trim().to_owned()),
                        _ => {
                            return Err(self.error(
                                self.line_of(var.span().start),
                                format!("{what}: bearer_token_env: the environment variable {} is not set", var.get_ref()),
                            ));
                        }
                    },
                };
                let headers = section
                    .headers
                    .as_ref()
                    .map(|h| h.get_ref().clone())
                    .unwrap_or_default();
                if let Some((bad, _)) = headers.iter().find(|(k, v)| {
                    reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
                        || reqwest::header::HeaderValue::from_str(v).is_err()
                }) {
                    return Err(self.error(
                        section
                            .headers
                            .as_ref()
                            .map_or(url_line, |h| self.line_of(h.span().start)),
                        format!("{what}: header '{bad}' is not a valid HTTP header"),
                    ));
                }
                let protocol = match &section.protocol {
                    None => HttpProtocol::Discover,
                    Some(p) => HttpProtocol::parse(p.get_ref()).ok_or_else(|| {
                        self.error(
                            self.line_of(p.span().start),
                            format!("{what}: protocol '{}' is not one this broker speaks to servers: give \"2025-11-25\" or \"2026-07-28\" (or leave it out to ask the server)", p.get_ref()),
                        )
                    })?,
                };
                Ok(Transport::Http(HttpSpec {
                    name: name.to_owned(),
                    url: parsed,
                    headers,
                    bearer_token,
                    protocol,
                }))
            }
        }
    }

    fn tool_settings(
        &self,
        section: &ToolSettingsSection,
        what: &str,
    ) -> Result<ToolSettings, ConfigError> {
        let retry = match section
            .retry
            .as_ref()
            .map(|r| (r.get_ref().as_str(), r.span()))
        {
            None => None,
            Some(("never", _)) => Some(Retry::Never),
            Some(("always", _)) => Some(Retry::Always),
            Some((other, span)) => {
                return Err(self.error(
                    self.line_of(span.start),
                    format!("{what}: retry '{other}' (expected never or always)"),
                ));
            }
        };
        Ok(ToolSettings {
            task_support: self.task_support(&section.task_support, what)?,
            timeout: self.duration(&section.timeout)?,
            max_attempts: self.max_attempts(&section.max_attempts, what)?,
            concurrency: self.positive(&section.concurrency, what, "concurrency")?,
            global_concurrency: self
                .positive(&section.global_concurrency, what, "global_concurrency")?
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
            retry,
            queue: self.queue_settings(
                &section.priority,
                &section.max_priority,
                &section.max_delay,
                what,
            )?,
            retention: self.retention_settings(
                &section.retain_completed,
                &section.retain_failed,
                &section.retain_cancelled,
                section.archive,
            )?,
        })
    }
}
