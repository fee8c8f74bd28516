//! A custom MCP task broker: your own Rust tools, served by the taskbroker
//! library with its storage, workers and MCP endpoint.
//!
//!     cargo run --example custom_tools
//!
//! then call `word_count` (as a task, or plainly) on http://127.0.0.1:8808/mcp.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use taskbroker::app::{self, ServeConfig};
use taskbroker::tools::{
    LogLevel, TaskSupport, Tool, ToolContext, ToolDefinition, ToolFuture, ToolOutcome, demo_tools,
};

/// Counts the words of a text, slowly, reporting progress per line and
/// stopping early when cancelled.
struct WordCount {
    def: ToolDefinition,
}

impl WordCount {
    fn new() -> Self {
        Self {
            def: ToolDefinition {
                name: "word_count".into(),
                description: "Count the words of a text, one line every 100 ms".into(),
                input_schema: json!({
                    "type": "object",
                    "properties": { "text": { "type": "string" } },
                    "required": ["text"]
                }),
                output_schema: Some(json!({
                    "type": "object",
                    "properties": { "words": { "type": "integer" }, "lines": { "type": "integer" } }
                })),
                task_support: TaskSupport::Optional,
                max_attempts: 3,
                concurrency: None,
                global_concurrency: None,
                queue: Default::default(),
                retention: Default::default(),
                extra: Default::default(),
            },
        }
    }
}

impl Tool for WordCount {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }

    fn call(&self, arguments: Value, ctx: ToolContext) -> ToolFuture<'_> {
        Box::pin(async move {
            let text = arguments["text"].as_str().unwrap_or_default().to_owned();
            let lines: Vec<&str> = text.lines().collect();
            ctx.log(
                LogLevel::Info,
                json!(format!("counting {} lines", lines.len())),
            );
            let mut words = 0;
            for (i, line) in lines.iter().enumerate() {
                tokio::select! {
                    _ = ctx.cancelled().cancelled() => return ToolOutcome::tool_error("cancelled"),
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                words += line.split_whitespace().count();
                ctx.progress(
                    (i + 1) as f64,
                    Some(lines.len() as f64),
                    Some(format!("line {}", i + 1)),
                );
            }
            ToolOutcome::Result(json!({
                "content": [{ "type": "text", "text": format!("{words} words in {} lines", lines.len()) }],
                "structuredContent": { "words": words, "lines": lines.len() }
            }))
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let mut tools: Vec<Arc<dyn Tool>> = demo_tools();
    tools.push(Arc::new(WordCount::new()));
    app::serve(ServeConfig::new("custom_tools.db", tools)).await
}
