//! What the config file says of one upstream server (`[[upstream]]`): how to
//! reach it, which of its tools to serve under which names, and how the
//! broker runs them (the same settings as command tools, plus whether a
//! call lost with its worker may be sent again).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::{HttpSpec, StdioSpec};
use crate::tools::{QueueSettings, RetentionSettings, TaskSupport};

/// Whether a call that may have reached the upstream, and whose worker was
/// then lost, is sent again by the next run of its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retry {
    /// Never (the default): the task fails with a message that says why.
    /// Only a call that was certainly never sent is made again; a call the
    /// upstream runs as its own task is followed, not made again.
    #[default]
    Never,
    /// Send it again: the tool is safe to repeat.
    Always,
}

impl Retry {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::Always => "always",
        }
    }
}

/// How the broker runs an upstream tool; unset settings fall back to the
/// upstream's, then to the defaults.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolSettings {
    /// `execution.taskSupport` served (default optional: the broker makes
    /// any call a durable task).
    pub task_support: Option<TaskSupport>,
    /// Longest call, waiting for a down upstream included (default none).
    pub timeout: Option<Duration>,
    /// Runs allowed when workers are lost (default 3).
    pub max_attempts: Option<i64>,
    /// Calls at once in one process (default: the process's cap).
    pub concurrency: Option<usize>,
    /// Calls at once across every process on the database.
    pub global_concurrency: Option<u32>,
    /// Whether a lost call is sent again (default never).
    pub retry: Option<Retry>,
    /// Priorities and start delays of its calls.
    pub queue: QueueSettings,
    /// What becomes of its tasks past their ttl.
    pub retention: RetentionSettings,
}

impl ToolSettings {
    /// `self`, with what it leaves unset taken from `fallback`.
    pub fn or(&self, fallback: &ToolSettings) -> ToolSettings {
        ToolSettings {
            task_support: self.task_support.or(fallback.task_support),
            timeout: self.timeout.or(fallback.timeout),
            max_attempts: self.max_attempts.or(fallback.max_attempts),
            concurrency: self.concurrency.or(fallback.concurrency),
            global_concurrency: self.global_concurrency.or(fallback.global_concurrency),
            retry: self.retry.or(fallback.retry),
            queue: self.queue.or(fallback.queue),
            retention: self.retention.or(fallback.retention),
        }
    }
}

/// Runs allowed for an upstream tool's task when workers are lost, unless
/// the config says otherwise (as for command tools).
pub const DEFAULT_MAX_ATTEMPTS: i64 = 3;

/// How an upstream is reached.
#[derive(Debug, Clone)]
pub enum Transport {
    /// A program the broker starts, speaking over its stdin/stdout.
    Stdio(StdioSpec),
    /// A server at a URL (Streamable HTTP).
    Http(HttpSpec),
}

/// One `[[upstream]]`.
#[derive(Debug, Clone)]
pub struct UpstreamSpec {
    /// Unique name (logs, errors, metrics, `taskbroker upstreams`).
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
    /// Put before each tool's name when served (`""`: none).
    pub prefix: String,
    /// Serve only these of its tools (by the upstream's names); None: all.
    pub include: Option<Vec<String>>,
    /// Never serve these.
    pub exclude: Vec<String>,
    /// Settings of every tool of this upstream.
    pub defaults: ToolSettings,
    /// Settings of one tool (by the upstream's name), over `defaults`.
    pub tools: BTreeMap<String, ToolSettings>,
    /// The principals that may see and call its tools; None: every client.
    pub principals: Option<Vec<String>>,
}

impl UpstreamSpec {
    /// Whether `principal` (None: a client without a token) may see and
    /// call its tools.
    pub fn allows(&self, principal: Option<&str>) -> bool {
        match (&self.principals, principal) {
            (None, _) => true,
            (Some(allowed), Some(p)) => allowed.iter().any(|a| a == p),
            (Some(_), None) => false,
        }
    }

    /// Whether the upstream's tool `name` is served.
    pub fn serves(&self, name: &str) -> bool {
        self.include
            .as_ref()
            .is_none_or(|only| only.iter().any(|n| n == name))
            && !self.exclude.iter().any(|n| n == name)
    }

    /// The settings of the upstream's tool `name`.
    pub fn settings(&self, name: &str) -> ToolSettings {
        match self.tools.get(name) {
            Some(own) => own.or(&self.defaults),
            None => self.defaults.clone(),
        }
    }

    /// The name the broker serves the upstream's tool `name` under.
    pub fn served_name(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }
}

/// The members of an upstream's `Tool` object served as they are, besides
/// those the broker sets itself (name, description, schemas, execution).
pub(crate) fn passed_through(
    tool: &serde_json::Map<String, Value>,
) -> serde_json::Map<String, Value> {
    tool.iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "name" | "description" | "inputSchema" | "outputSchema" | "execution"
            )
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}
