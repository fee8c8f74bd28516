//! The example config of the README's quickstart works as documented.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::Server;
use serde_json::json;

const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/taskbroker.toml");

/// checksum (plain call, structuredContent) and countdown (task with
/// progress) from examples/taskbroker.toml.
#[tokio::test]
async fn example_config_tools_work() {
    let server = Server::start(&["--config", CONFIG]);
    let mut c = server.client().await;
    let tools = c.ok("tools/list", json!({})).await;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"checksum") && names.contains(&"countdown"),
        "{names:?}"
    );

    let file = server.dir.join("data.txt");
    std::fs::write(&file, "hello\n").unwrap();
    let r = c
        .ok(
            "tools/call",
            json!({"name": "checksum", "arguments": {"path": file.display().to_string()}}),
        )
        .await;
    assert_eq!(
        r["structuredContent"]["sha256"],
        "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
    );
    assert_eq!(r["structuredContent"]["bytes"], 6);
    let r = c
        .ok(
            "tools/call",
            json!({"name": "checksum", "arguments": {"path": "/no/such/file"}}),
        )
        .await;
    assert_eq!(r["isError"], true);

    let t = c.call_task("countdown", json!({"seconds": 2})).await;
    let id = t["taskId"].as_str().unwrap();
    let done = c.wait_terminal(id, Duration::from_secs(15)).await;
    assert_eq!(done["status"], "completed");
    let r = c.ok("tasks/result", json!({"taskId": id})).await;
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("countdown from 2 finished"), "{text}");
    assert!(text.contains(id), "{text}");
}
