//! Command-line arguments of `taskbroker call` and `taskbroker tasks`.

use clap::{Args, Subcommand, ValueEnum};
use reqwest::Url;
use serde_json::{Map, Value};

use super::DEFAULT_URL;
use crate::mcp::{DELAY_META, IDEMPOTENCY_KEY_META, PRIORITY_META};
use crate::store::TaskStatus;

const SESSION_HELP: &str = "Without tokens, tasks belong to the MCP session that created them \
(with tokens, to the token's principal). `taskbroker call` and `taskbroker tasks` share one \
session per broker URL (and token), kept in $XDG_STATE_HOME/taskbroker/cli.json (else \
~/.local/state/taskbroker/cli.json), so these commands see the tasks `taskbroker call --task` \
started, across invocations and broker restarts. --session ID looks at another session's tasks \
instead.";

const EXIT_HELP: &str = "Exit codes: 0 success; 1 the tool failed (isError, task failed or \
cancelled, JSON-RPC error); 2 usage error (bad --args JSON, bad URL, a question of the tool \
without a terminal or --input, an --input that does not fit); 3 server unreachable or \
protocol error; 130 interrupted (Ctrl-C).";

/// Where the broker is, and which session to use.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// MCP endpoint of the broker (http:// only).
    #[arg(long, env = "TASKBROKER_URL", default_value = DEFAULT_URL, value_parser = parse_url)]
    pub url: Url,
    /// Use this MCP session (its Mcp-Session-Id). Otherwise `call` and
    /// `tasks` use the session they keep for this broker in their state
    /// file, and `bench` opens one per client.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Bearer token, when the broker requires one (`taskbroker token create`).
    #[arg(long, env = "TASKBROKER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// `--protocol`, of `call` and `tasks`.
#[derive(Debug, Clone, Copy, Args)]
pub struct ProtocolArg {
    /// Which MCP generation to speak: 2025-11-25 (a session; tasks/list,
    /// tasks/result) or 2026-07-28 (stateless, the tasks extension: no
    /// session, no tasks/list; without tokens the task id alone reaches
    /// the task).
    #[arg(
        long,
        global = true,
        env = "TASKBROKER_PROTOCOL",
        value_enum,
        default_value = "2025-11-25"
    )]
    pub protocol: Protocol,
}

/// The MCP generations the client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    /// Sessions (initialize), `params.task`, tasks/result, tasks/list.
    #[value(name = "2025-11-25")]
    V2025,
    /// Stateless requests and the tasks extension.
    #[value(name = "2026-07-28")]
    V2026,
}

/// `taskbroker call TOOL ...`.
#[derive(Debug, Clone, Args)]
#[command(after_help = EXIT_HELP)]
pub struct CallArgs {
    /// The tool to call.
    pub tool: String,
    /// The tool's arguments: a JSON object.
    #[arg(long, value_name = "JSON", default_value = "{}", value_parser = parse_json_object)]
    pub args: Map<String, Value>,
    /// Run the call as a task: print the task id to stderr, poll it, then
    /// fetch its result. Ctrl-C asks whether to cancel it.
    #[arg(long)]
    pub task: bool,
    /// With --task: print the task id on stdout and return at once; look
    /// at it later with `taskbroker tasks get|result|cancel ID`.
    #[arg(long, requires = "task")]
    pub detach: bool,
    /// Requested task lifetime in milliseconds (the server may clamp it).
    #[arg(long, value_name = "MS", requires = "task", value_parser = clap::value_parser!(u64).range(1..))]
    pub ttl: Option<u64>,
    /// With --task: a key of yours for this call (up to 255 bytes). The
    /// same call sent again with the same key (after a timeout, a dropped
    /// connection) gets the task the first one made instead of running
    /// the tool twice, while that task is kept; with other arguments it is
    /// refused.
    #[arg(long, value_name = "KEY", requires = "task")]
    pub idempotency_key: Option<String>,
    /// With --task: the job's priority, a name (lowest, low, normal, high,
    /// highest) or a number from -100 to 100, higher first; up to what the
    /// tool's config allows (max_priority).
    #[arg(long, value_name = "PRIORITY", requires = "task", value_parser = parse_priority)]
    pub priority: Option<Value>,
    /// With --task: start the job this long from now at the earliest
    /// (`90s`, `10m`, `2h`); the task says `queued: starts at ...` until
    /// then.
    #[arg(long, value_name = "DURATION", requires = "task")]
    pub delay: Option<humantime::Duration>,
    /// Print the whole result as JSON instead of its text content.
    #[arg(long)]
    pub json: bool,
    /// The answer to the tool's questions (elicitation), as a JSON object
    /// that must fit each question's schema, e.g. '{"approved": true}'.
    /// Without it, questions are asked on the terminal (an error when stdin
    /// is not one).
    #[arg(long, value_name = "JSON", value_parser = parse_json_object)]
    pub input: Option<Map<String, Value>>,
    /// Broker and session.
    #[command(flatten)]
    pub conn: Connection,
    /// The MCP generation.
    #[command(flatten)]
    pub protocol: ProtocolArg,
}

/// `taskbroker tasks ...`.
#[derive(Debug, Clone, Args)]
#[command(after_help = SESSION_HELP)]
pub struct TasksArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: TasksCommand,
    /// The MCP generation.
    #[command(flatten)]
    pub protocol: ProtocolArg,
}

/// The `tasks` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum TasksCommand {
    /// One line per task of the session: taskId, status, tool (for tasks
    /// this client started; "-" otherwise), lastUpdatedAt, statusMessage
    /// (newest first).
    #[command(after_help = SESSION_HELP)]
    List {
        /// Page through every task (tasks/list nextCursor), not just the first page.
        #[arg(long)]
        all: bool,
        /// Broker and session.
        #[command(flatten)]
        conn: Connection,
        /// Operators: read the database directly.
        #[command(flatten)]
        operator: TaskListArgs,
    },
    /// Print a task (tasks/get) as JSON.
    #[command(after_help = SESSION_HELP)]
    Get {
        /// The task id.
        id: String,
        /// Broker and session.
        #[command(flatten)]
        conn: Connection,
    },
    /// Wait for a task to end and print its result (tasks/result) as JSON;
    /// exits 1 when the result has isError or is an error.
    #[command(after_help = SESSION_HELP)]
    Result {
        /// The task id.
        id: String,
        /// The answer to the task's questions (elicitation), as for `call`.
        #[arg(long, value_name = "JSON", value_parser = parse_json_object)]
        input: Option<Map<String, Value>>,
        /// Broker and session.
        #[command(flatten)]
        conn: Connection,
    },
    /// Cancel a task (tasks/cancel) and print it as JSON.
    #[command(after_help = SESSION_HELP)]
    Cancel {
        /// The task id.
        id: String,
        /// Broker and session.
        #[command(flatten)]
        conn: Connection,
    },
}

/// An `http://` URL with a host (this build has no TLS).
fn parse_url(s: &str) -> Result<Url, String> {
    let url = Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "http" if url.host().is_some() => Ok(url),
        "http" => Err("the URL has no host".into()),
        "https" => Err("https is not supported by this build (no TLS); use http://".into()),
        other => Err(format!("unsupported scheme '{other}'; use http://")),
    }
}

impl CallArgs {
    /// The `_meta` of a task call: its idempotency key, priority and
    /// delay, when given.
    pub fn task_meta(&self) -> Option<Value> {
        let mut meta = Map::new();
        if let Some(key) = &self.idempotency_key {
            meta.insert(IDEMPOTENCY_KEY_META.into(), Value::from(key.as_str()));
        }
        if let Some(priority) = &self.priority {
            meta.insert(PRIORITY_META.into(), priority.clone());
        }
        if let Some(delay) = self.delay {
            meta.insert(DELAY_META.into(), Value::from(delay.as_secs_f64()));
        }
        (!meta.is_empty()).then_some(Value::Object(meta))
    }
}

/// A priority as the broker checks it: a name or a number.
fn parse_priority(s: &str) -> Result<Value, String> {
    let value = match s.parse::<i64>() {
        Ok(n) => Value::from(n),
        Err(_) => Value::from(s),
    };
    crate::tools::parse_priority(&value).map(|_| value)
}

/// A JSON object, for `--args`.
fn parse_json_object(s: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str::<Value>(s) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("must be a JSON object, e.g. '{\"seconds\": 1}'".into()),
        Err(e) => Err(format!("not valid JSON: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_http_with_a_host() {
        assert!(parse_url("http://127.0.0.1:8808/mcp").is_ok());
        assert!(parse_url("https://example.com/mcp").is_err());
        assert!(parse_url("ftp://example.com/").is_err());
        assert!(parse_url("not a url").is_err());
    }

    #[test]
    fn args_must_be_a_json_object() {
        assert!(parse_json_object("{}").is_ok());
        assert!(parse_json_object(r#"{"seconds": 1}"#).is_ok());
        assert!(parse_json_object("[1]").is_err());
        assert!(parse_json_object("{seconds: 1}").is_err());
    }
}

/// The operator flags of `taskbroker tasks list`: with `--db`, the list
/// reads the database directly instead of asking a broker.
#[derive(Debug, Clone, Default, Args)]
pub struct TaskListArgs {
    /// Operators: read this database directly (a SQLite file or a
    /// postgres:// URL) and list every owner's tasks, instead of asking
    /// a broker for one session's. Needs access to the database.
    #[arg(long, value_name = "DB")]
    pub db: Option<std::path::PathBuf>,
    /// With --db: only tasks in this status (repeatable, or a comma list):
    /// working, input_required, completed, failed, cancelled.
    #[arg(long, value_name = "STATUS", value_delimiter = ',', requires = "db", value_parser = parse_status)]
    pub status: Vec<TaskStatus>,
    /// With --db: only tasks of this tool.
    #[arg(long, value_name = "TOOL", requires = "db")]
    pub tool: Option<String>,
    /// With --db: only tasks of this owner (a principal, or a session id
    /// without tokens).
    #[arg(long, value_name = "OWNER", requires = "db")]
    pub owner: Option<String>,
    /// With --db: tasks per page [default: 50].
    #[arg(long, value_name = "N", requires = "db", value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub limit: Option<i64>,
    /// With --db: the page after the one that printed this cursor (tasks
    /// older than it).
    #[arg(long, value_name = "CURSOR", requires = "db", conflicts_with = "all")]
    pub before: Option<i64>,
    /// With --db: print a JSON array of tasks instead of lines.
    #[arg(long, requires = "db")]
    pub json: bool,
}

fn parse_status(s: &str) -> Result<TaskStatus, String> {
    s.trim().parse()
}
