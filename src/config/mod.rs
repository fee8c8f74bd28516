//! The config file, `taskbroker.toml`: server and worker settings, and
//! command tools. Flags and environment override the file; the file
//! overrides the defaults.
//!
//! Every refusal names the file, the line and the reason.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::tools::{
    CommandSpec, CommandTool, QueuePolicy, QueueSettings, RetentionSettings, TaskSupport, Tool,
    ToolDefinition,
};
use crate::upstream::UpstreamSpec;

mod upstream;

pub use upstream::{ToolSettingsSection, UpstreamSection};

/// A config file that could not be used.
#[derive(Debug)]
pub struct ConfigError {
    /// The file.
    pub file: String,
    /// 1-based line (0 when the whole file is concerned).
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            0 => write!(f, "{}: {}", self.file, self.reason),
            line => write!(f, "{}:{line}: {}", self.file, self.reason),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A duration: a number of seconds, or text such as "90s", "2h", "500ms".
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum DurationValue {
    /// Seconds.
    Seconds(f64),
    /// humantime text.
    Text(String),
}

impl DurationValue {
    /// The value as the file writes it: `"1d"`, `90`.
    fn as_written(&self) -> String {
        match self {
            Self::Seconds(s) => s.to_string(),
            Self::Text(t) => format!("{t:?}"),
        }
    }

    fn to_duration(&self) -> Result<Duration, String> {
        match self {
            Self::Seconds(s) => {
                Duration::try_from_secs_f64(*s).map_err(|_| format!("{s} is not a duration"))
            }
            Self::Text(t) => {
                humantime::parse_duration(t).map_err(|e| format!("'{t}' is not a duration: {e}"))
            }
        }
    }
}

/// `[server]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// SQLite file.
    pub db: Option<PathBuf>,
    /// Listen address.
    pub listen: Option<SocketAddr>,
    /// Embedded workers.
    pub workers: Option<usize>,
    /// Job lease.
    pub lease: Option<Spanned<DurationValue>>,
    /// Longest ttl.
    pub max_ttl: Option<Spanned<DurationValue>>,
    /// ttl when none is asked for.
    pub default_ttl: Option<Spanned<DurationValue>>,
    /// pollInterval.
    pub poll_interval: Option<Spanned<DurationValue>>,
    /// tasks/list page size.
    pub page_size: Option<u64>,
    /// Largest POST body.
    pub max_body: Option<usize>,
    /// Extra allowed origins.
    pub allowed_origins: Option<Vec<String>>,
    /// full | normal.
    pub durability: Option<String>,
    /// Serve echo, sleep, sleep_as_task, fail (default true).
    pub demo_tools: Option<bool>,
    /// Serve the conformance fixture tools (default false).
    pub conformance_tools: Option<bool>,
    /// Graceful-shutdown period for running jobs.
    pub grace: Option<Spanned<DurationValue>>,
    /// Non-terminal tasks per requestor.
    pub max_open_tasks: Option<i64>,
    /// Largest tool arguments, bytes.
    pub max_argument_bytes: Option<usize>,
    /// Requests per second per principal, or per session without tokens
    /// (0 = unlimited).
    pub rate: Option<f64>,
    /// Burst above the rate.
    pub rate_burst: Option<f64>,
    /// Without tokens, initialize requests per second per client address.
    pub initialize_rate: Option<f64>,
    /// Burst above the initialize rate.
    pub initialize_burst: Option<f64>,
    /// Live sessions at most.
    pub max_sessions: Option<i64>,
    /// Unused this long, a session expires.
    pub session_idle: Option<Spanned<DurationValue>>,
    /// Open SSE streams at most.
    pub max_sse_streams: Option<usize>,
    /// Request head deadline.
    pub header_timeout: Option<Spanned<DurationValue>>,
    /// Request body deadline.
    pub body_timeout: Option<Spanned<DurationValue>>,
    /// Idle kept-alive connection deadline.
    pub idle_timeout: Option<Spanned<DurationValue>>,
    /// Open connections at most.
    pub max_connections: Option<u32>,
    /// How long a closing connection's further bytes are read and thrown
    /// away.
    pub linger_time: Option<Spanned<DurationValue>>,
    /// How many bytes of a closing connection are read and thrown away.
    pub linger_bytes: Option<u64>,
    /// Refuse 2026-07-28 requests lacking any header the spec requires.
    pub strict_headers: Option<bool>,
    /// Every tool's tasks: kept this long after completing, past its ttl.
    pub retain_completed: Option<Spanned<DurationValue>>,
    /// Kept this long after failing, past its ttl.
    pub retain_failed: Option<Spanned<DurationValue>>,
    /// Kept this long after being cancelled, past its ttl.
    pub retain_cancelled: Option<Spanned<DurationValue>>,
    /// Moved to the archive table instead of deleted.
    pub archive: Option<bool>,
}

/// `[worker]`: settings of `taskbroker worker`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    /// Jobs run at once.
    pub concurrency: Option<usize>,
    /// Job lease.
    pub lease: Option<Spanned<DurationValue>>,
    /// Graceful-shutdown period.
    pub grace: Option<Spanned<DurationValue>>,
}

/// One `[[tool]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSection {
    /// Unique name.
    pub name: Spanned<String>,
    /// For people and models.
    pub description: String,
    /// argv (no shell).
    pub command: Spanned<Vec<String>>,
    /// forbidden | optional | required (default optional).
    pub task_support: Option<Spanned<String>>,
    /// Longest run.
    pub timeout: Option<Spanned<DurationValue>>,
    /// Runs allowed when workers are lost (default 3; 1 = never twice).
    pub max_attempts: Option<Spanned<i64>>,
    /// JSON Schema of the arguments (default: any object).
    pub input_schema: Option<Spanned<toml::Value>>,
    /// JSON Schema of structuredContent.
    pub output_schema: Option<Spanned<toml::Value>>,
    /// Extra environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the config file's folder).
    pub working_dir: Option<PathBuf>,
    /// Bytes of stdout kept (default 1 MiB).
    pub max_output: Option<usize>,
    /// Wait between TERM and KILL (default 5 s).
    pub kill_grace: Option<Spanned<DurationValue>>,
    /// Runs at once in one process (default
    /// [`crate::defaults::COMMAND_CONCURRENCY`]).
    pub concurrency: Option<Spanned<i64>>,
    /// Runs at once across every process on the database (default: none).
    pub global_concurrency: Option<Spanned<i64>>,
    /// Priority of its calls: a name or a number (default normal).
    pub priority: Option<Spanned<toml::Value>>,
    /// The highest priority a call may ask for (default: `priority`).
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

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// `[server]`.
    #[serde(default)]
    pub server: ServerSection,
    /// `[worker]`.
    #[serde(default)]
    pub worker: WorkerSection,
    /// `[[tool]]`.
    #[serde(default, rename = "tool")]
    pub tools: Vec<ToolSection>,
    /// `[[upstream]]`.
    #[serde(default, rename = "upstream")]
    pub upstreams: Vec<UpstreamSection>,
}

/// A loaded config: the sections, the tools built from it, and where it
/// came from.
#[derive(Default)]
pub struct Config {
    /// The parsed file (defaults when there is none).
    pub file: ConfigFile,
    /// Command tools, validated.
    pub tools: Vec<Arc<dyn Tool>>,
    /// Upstream servers, validated.
    pub upstreams: Vec<UpstreamSpec>,
    /// The file as named on the command line (for messages).
    given: Option<PathBuf>,
    /// The same, absolute: relative paths inside resolve against its folder.
    path: Option<PathBuf>,
    text: String,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("path", &self.path)
            .field("tools", &self.tools.len())
            .finish()
    }
}

const DEFAULT_MAX_OUTPUT: usize = 1024 * 1024;
const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);

impl Config {
    /// Load and validate `path`. Relative paths inside the file (commands,
    /// working directories) are resolved here, once, against the file's own
    /// folder made absolute, so what the start-up check verified is exactly
    /// what runs, whatever the working directory of the tool.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let unreadable = |reason: String| ConfigError {
            file: path.display().to_string(),
            line: 0,
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            unreadable(match e.kind() {
                std::io::ErrorKind::NotFound => "no such file".to_owned(),
                std::io::ErrorKind::IsADirectory => "is a directory, not a config file".to_owned(),
                _ => format!("cannot read: {e}"),
            })
        })?;
        let absolute = std::path::absolute(path).map_err(|e| unreadable(e.to_string()))?;
        let mut config = Self {
            file: ConfigFile::default(),
            tools: Vec::new(),
            upstreams: Vec::new(),
            given: Some(path.to_owned()),
            path: Some(absolute),
            text,
        };
        config.file = toml::from_str(&config.text).map_err(|e| {
            let line = e.span().map(|s| config.line_of(s.start)).unwrap_or(0);
            config.error(line, e.message().trim().to_owned())
        })?;
        config.tools = config.build_tools()?;
        config.upstreams = config.build_upstreams()?;
        Ok(config)
    }

    /// Refuse a command tool named like a built-in tool that will be
    /// served beside it (`kind` says which, e.g. "a built-in demo tool").
    pub fn check_reserved<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
        kind: &str,
    ) -> Result<(), ConfigError> {
        for name in names {
            if let Some(section) = self.file.tools.iter().find(|t| t.name.get_ref() == name) {
                let line = self.line_of(section.name.span().start);
                return Err(self.error(line, format!("duplicate tool name '{name}' ({kind})")));
            }
        }
        Ok(())
    }

    fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .matches('\n')
            .count()
            + 1
    }

    fn error(&self, line: usize, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self
                .given
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "<none>".into()),
            line,
            reason: reason.into(),
        }
    }

    /// The folder relative paths are resolved against.
    fn base_dir(&self) -> PathBuf {
        self.path
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."))
    }

    /// A duration setting, with the file's line on error.
    pub fn duration(
        &self,
        value: &Option<Spanned<DurationValue>>,
    ) -> Result<Option<Duration>, ConfigError> {
        match value {
            None => Ok(None),
            Some(v) => v
                .get_ref()
                .to_duration()
                .map(Some)
                .map_err(|e| self.error(self.line_of(v.span().start), e)),
        }
    }

    fn build_tools(&self) -> Result<Vec<Arc<dyn Tool>>, ConfigError> {
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        for section in &self.file.tools {
            let line = self.line_of(section.name.span().start);
            let name = section.name.get_ref().clone();
            if !is_tool_name(&name) {
                return Err(self.error(
                    line,
                    format!("tool name '{name}': use 1-128 of A-Z a-z 0-9 _ - ."),
                ));
            }
            if let Some(first) = seen.insert(name.clone(), line) {
                return Err(self.error(
                    line,
                    format!("duplicate tool name '{name}' (first defined on line {first})"),
                ));
            }
            let argv = section.command.get_ref();
            let command_line = self.line_of(section.command.span().start);
            let what = format!("tool '{name}'");
            let argv = self.resolve_command(argv, command_line, &what)?;
            let task_support = self
                .task_support(&section.task_support, &what)?
                .unwrap_or(TaskSupport::Optional);
            let max_attempts = self
                .max_attempts(&section.max_attempts, &what)?
                .unwrap_or(3);
            let concurrency = self.positive(&section.concurrency, &what, "concurrency")?;
            let global_concurrency =
                self.positive(&section.global_concurrency, &what, "global_concurrency")?;
            let input_schema = self
                .schema(&section.input_schema, &name, "input_schema")?
                .unwrap_or_else(|| serde_json::json!({ "type": "object" }));
            if input_schema.get("type").and_then(serde_json::Value::as_str) != Some("object") {
                let at = section
                    .input_schema
                    .as_ref()
                    .map(|s| self.line_of(s.span().start))
                    .unwrap_or(line);
                return Err(self.error(
                    at,
                    format!("tool '{name}': input_schema must have type = \"object\""),
                ));
            }
            let output_schema = self.schema(&section.output_schema, &name, "output_schema")?;
            let working_dir = match &section.working_dir {
                Some(dir) if dir.is_relative() => Some(self.base_dir().join(dir)),
                Some(dir) => Some(dir.clone()),
                None => Some(self.base_dir()),
            };
            let spec = CommandSpec {
                argv,
                env: section.env.clone(),
                working_dir,
                timeout: self.duration(&section.timeout)?,
                max_output: section.max_output.unwrap_or(DEFAULT_MAX_OUTPUT),
                kill_grace: self
                    .duration(&section.kill_grace)?
                    .unwrap_or(DEFAULT_KILL_GRACE),
            };
            let queue = self
                .queue_settings(
                    &section.priority,
                    &section.max_priority,
                    &section.max_delay,
                    &what,
                )?
                .policy();
            let retention = self.retention_settings(
                &section.retain_completed,
                &section.retain_failed,
                &section.retain_cancelled,
                section.archive,
            )?;
            let def = ToolDefinition {
                name,
                description: section.description.clone(),
                input_schema,
                output_schema,
                task_support,
                max_attempts,
                concurrency: Some(concurrency.unwrap_or(crate::defaults::COMMAND_CONCURRENCY)),
                global_concurrency: global_concurrency
                    .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
                queue,
                retention,
                extra: Default::default(),
            };
            tools.push(Arc::new(CommandTool::new(def, spec)));
        }
        Ok(tools)
    }

    /// `task_support`, with the line on error (`what`: "tool 'x'", ...).
    fn task_support(
        &self,
        value: &Option<Spanned<String>>,
        what: &str,
    ) -> Result<Option<TaskSupport>, ConfigError> {
        match value.as_ref().map(|s| (s.get_ref().as_str(), s.span())) {
            None => Ok(None),
            Some(("optional", _)) => Ok(Some(TaskSupport::Optional)),
            Some(("forbidden", _)) => Ok(Some(TaskSupport::Forbidden)),
            Some(("required", _)) => Ok(Some(TaskSupport::Required)),
            Some((other, span)) => Err(self.error(
                self.line_of(span.start),
                format!(
                    "{what}: task_support '{other}' (expected forbidden, optional or required)"
                ),
            )),
        }
    }

    /// `retain_completed`, `retain_failed`, `retain_cancelled` and
    /// `archive` of one section (durations checked; whether they are long
    /// enough for the ttl is [`Config::check_retention`]'s).
    fn retention_settings(
        &self,
        completed: &Option<Spanned<DurationValue>>,
        failed: &Option<Spanned<DurationValue>>,
        cancelled: &Option<Spanned<DurationValue>>,
        archive: Option<bool>,
    ) -> Result<RetentionSettings, ConfigError> {
        Ok(RetentionSettings {
            completed: self.duration(completed)?,
            failed: self.duration(failed)?,
            cancelled: self.duration(cancelled)?,
            archive,
        })
    }

    /// `[server]`'s retention settings: every tool's, unless its own
    /// section says otherwise.
    pub fn server_retention(&self) -> Result<RetentionSettings, ConfigError> {
        let s = &self.file.server;
        self.retention_settings(
            &s.retain_completed,
            &s.retain_failed,
            &s.retain_cancelled,
            s.archive,
        )
    }

    /// Refuse a retention shorter than `max_ttl`, the longest ttl a task
    /// may be given: a task is kept at least its ttl (T-33; the purge reads
    /// only tasks past it), so such a rule would keep nothing for a task
    /// with a long ttl: a mistake worth saying at start.
    pub fn check_retention(&self, max_ttl: Duration) -> Result<(), ConfigError> {
        let s = &self.file.server;
        let mut sections = vec![(
            "[server]".to_owned(),
            [&s.retain_completed, &s.retain_failed, &s.retain_cancelled],
        )];
        for t in &self.file.tools {
            sections.push((
                format!("tool '{}'", t.name.get_ref()),
                [&t.retain_completed, &t.retain_failed, &t.retain_cancelled],
            ));
        }
        for u in &self.file.upstreams {
            let name = u.name.get_ref();
            sections.push((
                format!("upstream '{name}'"),
                [&u.retain_completed, &u.retain_failed, &u.retain_cancelled],
            ));
            for (tool, t) in &u.tools {
                sections.push((
                    format!("upstream '{name}' tool '{tool}'"),
                    [&t.retain_completed, &t.retain_failed, &t.retain_cancelled],
                ));
            }
        }
        for (what, values) in sections {
            for (key, value) in ["retain_completed", "retain_failed", "retain_cancelled"]
                .into_iter()
                .zip(values)
            {
                let Some(value) = value else { continue };
                let line = self.line_of(value.span().start);
                let keep = value
                    .get_ref()
                    .to_duration()
                    .map_err(|e| self.error(line, e))?;
                if keep < max_ttl {
                    return Err(self.error(
                        line,
                        format!(
                            "{what}: {key} = {} is shorter than max_ttl ({}): a task is kept \
                             at least its ttl, which may be up to max_ttl, so this rule would \
                             keep nothing for such tasks; raise {key} or lower max_ttl",
                            value.get_ref().as_written(),
                            humantime::format_duration(max_ttl)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `priority`, `max_priority` and `max_delay` of one section, checked
    /// (known names, numbers in range, a maximum not below the default),
    /// with the line on error.
    fn queue_settings(
        &self,
        priority: &Option<Spanned<toml::Value>>,
        max_priority: &Option<Spanned<toml::Value>>,
        max_delay: &Option<Spanned<DurationValue>>,
        what: &str,
    ) -> Result<QueueSettings, ConfigError> {
        let settings = QueueSettings {
            priority: self.priority(priority, what, "priority")?,
            max_priority: self.priority(max_priority, what, "max_priority")?,
            max_delay: self.duration(max_delay)?,
        };
        // Without a priority of its own the section's calls get the default
        // (normal); an enclosing section's is checked where it is written.
        let p = settings.priority.unwrap_or(QueuePolicy::default().priority);
        if let (Some(max), Some(at)) = (settings.max_priority, max_priority)
            && max < p
        {
            return Err(self.error(
                self.line_of(at.span().start),
                format!(
                    "{what}: max_priority {} is below priority {}",
                    crate::tools::describe_priority(max),
                    crate::tools::describe_priority(p)
                ),
            ));
        }
        Ok(settings)
    }

    /// A priority setting (a name or a number), with the line on error.
    fn priority(
        &self,
        value: &Option<Spanned<toml::Value>>,
        what: &str,
        key: &str,
    ) -> Result<Option<i64>, ConfigError> {
        let Some(value) = value else {
            return Ok(None);
        };
        let json = match value.get_ref() {
            toml::Value::String(s) => serde_json::Value::from(s.as_str()),
            toml::Value::Integer(n) => serde_json::Value::from(*n),
            toml::Value::Float(x) => serde_json::json!(x),
            other => serde_json::Value::from(other.to_string()),
        };
        crate::tools::parse_priority(&json).map(Some).map_err(|e| {
            self.error(
                self.line_of(value.span().start),
                format!("{what}: {key}: {e}"),
            )
        })
    }

    /// `max_attempts`: at least 1, with the line on error.
    fn max_attempts(
        &self,
        value: &Option<Spanned<i64>>,
        what: &str,
    ) -> Result<Option<i64>, ConfigError> {
        match value {
            None => Ok(None),
            Some(n) if *n.get_ref() >= 1 => Ok(Some(*n.get_ref())),
            Some(n) => Err(self.error(
                self.line_of(n.span().start),
                format!("{what}: max_attempts must be at least 1"),
            )),
        }
    }

    /// `argv` with its program made absolute (relative to the config
    /// file's folder) or checked on PATH; `what` names the owner in errors.
    fn resolve_command(
        &self,
        argv: &[String],
        line: usize,
        what: &str,
    ) -> Result<Vec<String>, ConfigError> {
        let Some(program) = argv.first().filter(|p| !p.is_empty()) else {
            return Err(self.error(line, format!("{what}: command is empty")));
        };
        let path = if program.contains('/') {
            let p = PathBuf::from(program);
            let p: PathBuf = if p.is_relative() {
                // "./tools/x.py" -> "<folder>/tools/x.py": absolute, tidy.
                let inside = p
                    .components()
                    .filter(|c| *c != std::path::Component::CurDir);
                self.base_dir().components().chain(inside).collect()
            } else {
                p
            };
            if !is_executable(&p) {
                return Err(self.error(
                    line,
                    format!(
                        "{what}: command {} is missing or not executable",
                        p.display()
                    ),
                ));
            }
            p.display().to_string()
        } else {
            let found = std::env::var_os("PATH")
                .map(|paths| {
                    std::env::split_paths(&paths).any(|dir| is_executable(&dir.join(program)))
                })
                .unwrap_or(false);
            if !found {
                return Err(self.error(line, format!("{what}: command '{program}' is not on PATH")));
            }
            program.clone()
        };
        let mut argv = argv.to_vec();
        argv[0] = path;
        Ok(argv)
    }

    /// A count of at least 1 (and at most 100,000), with the line on error.
    fn positive(
        &self,
        value: &Option<Spanned<i64>>,
        what: &str,
        key: &str,
    ) -> Result<Option<usize>, ConfigError> {
        match value {
            None => Ok(None),
            Some(v) => match usize::try_from(*v.get_ref()) {
                Ok(n) if (1..=100_000).contains(&n) => Ok(Some(n)),
                _ => Err(self.error(
                    self.line_of(v.span().start),
                    format!("{what}: {key} must be a whole number from 1 to 100000"),
                )),
            },
        }
    }

    fn schema(
        &self,
        value: &Option<Spanned<toml::Value>>,
        name: &str,
        key: &str,
    ) -> Result<Option<serde_json::Value>, ConfigError> {
        let Some(value) = value else { return Ok(None) };
        let line = self.line_of(value.span().start);
        let json = serde_json::to_value(value.get_ref())
            .map_err(|e| self.error(line, format!("tool '{name}': {key} is not JSON: {e}")))?;
        jsonschema::validator_for(&json).map_err(|e| {
            self.error(
                line,
                format!("tool '{name}': {key} is not a valid JSON Schema: {e}"),
            )
        })?;
        Ok(Some(json))
    }
}

/// 1-128 of A-Z a-z 0-9 _ - . (MCP's advice for tool names).
fn is_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("taskbroker.toml");
        std::fs::write(&path, text).unwrap();
        Config::load(&path)
    }

    #[test]
    fn refusals_name_the_line_and_reason() {
        let err = |text: &str| load(text).err().map(|e| (e.line, e.reason)).unwrap();
        let (line, reason) = err("[server]\nlisten = \"127.0.0.1:1\"\nbogus = 1\n");
        assert_eq!(line, 3, "{reason}");
        assert!(reason.contains("unknown field"), "{reason}");
        let two = "[[tool]]\nname = \"a\"\ndescription = \"d\"\ncommand = [\"true\"]\n\n[[tool]]\nname = \"a\"\ndescription = \"d\"\ncommand = [\"true\"]\n";
        let (line, reason) = err(two);
        assert_eq!(line, 7);
        assert!(
            reason.contains("duplicate tool name 'a' (first defined on line 2)"),
            "{reason}"
        );
        let (line, reason) = err(
            "[[tool]]\nname = \"a\"\ndescription = \"d\"\ncommand = [\"no-such-program-xyz\"]\n",
        );
        assert_eq!(line, 4);
        assert!(reason.contains("not on PATH"), "{reason}");
        let (line, reason) = err(
            "[[tool]]\nname = \"a\"\ndescription = \"d\"\ncommand = [\"true\"]\ninput_schema = { type = \"object\", properties = 3 }\n",
        );
        assert_eq!(line, 5);
        assert!(reason.contains("not a valid JSON Schema"), "{reason}");
        let (_, reason) = err(
            "[[tool]]\nname = \"a\"\ndescription = \"d\"\ncommand = [\"true\"]\ntimeout = \"soon\"\n",
        );
        assert!(reason.contains("not a duration"), "{reason}");
        let (_, reason) = err(
            "[[tool]]\nname = \"a\"\ndescription = \"d\"\ncommand = [\"true\"]\ntask_support = \"sometimes\"\n",
        );
        assert!(reason.contains("task_support"), "{reason}");
    }

    #[test]
    fn a_good_file_builds_tools() {
        let c = load(
            "[server]\nlease = \"10s\"\n[[tool]]\nname = \"t\"\ndescription = \"d\"\ncommand = [\"sh\", \"-c\", \"cat\"]\ntask_support = \"required\"\nmax_attempts = 1\ntimeout = \"2h\"\n",
        )
        .unwrap();
        assert_eq!(c.tools.len(), 1);
        let def = c.tools[0].definition();
        assert_eq!(def.task_support, TaskSupport::Required);
        assert_eq!(def.max_attempts, 1);
        assert_eq!(
            c.duration(&c.file.server.lease).unwrap(),
            Some(Duration::from_secs(10))
        );
    }
}
