//! The core stores what happened, in no protocol's terms: no JSON-RPC
//! envelope, related-task `_meta` or wire error code is built outside the
//! front ends (`src/server/`, the wire vocabulary in `src/mcp/`, the CLI
//! client in `src/client/`, the client of upstream MCP servers in
//! `src/upstream/`). The storage drivers, the broker, the worker and
//! the operator rooms hand plain values to the front ends, which map them
//! (a 2025-11-25 `failed` for a tool error, an error object, `_meta`).
//!
//! Reads the source (not the binary): this is a rule about where code
//! lives. Test modules (`#[cfg(test)]` onwards) are not held to it.

use std::fs;
use std::path::{Path, PathBuf};

/// Marks of a wire shape: the JSON-RPC envelope, the 2025-11-25
/// related-task `_meta`, the internal-error code written as a value.
const WIRE_MARKS: &[&str] = &[
    "\"jsonrpc\"",
    "RELATED_TASK_META",
    "related_task_meta",
    "io.modelcontextprotocol/related-task",
    "-32603",
    "error_response(",
    "success_response(",
];

/// The rooms that may speak the wire: to the broker's clients, and (as a
/// client) to upstream servers.
const FRONT_ENDS: &[&str] = &["src/server", "src/mcp", "src/client", "src/upstream"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The non-test code of a file, with `//` comments removed.
fn code_of(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn issue24_no_wire_shape_below_the_front_ends() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    for driver in [
        "crates/storage/src",
        "crates/sqlite/src",
        "crates/postgres/src",
    ] {
        rust_files(&root.join(driver), &mut files);
    }
    let mut checked = 0;
    let mut found = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(root).expect("under the root");
        if FRONT_ENDS.iter().any(|f| relative.starts_with(f)) {
            continue;
        }
        checked += 1;
        let text = fs::read_to_string(file).expect("readable source");
        let code = code_of(&text);
        for mark in WIRE_MARKS {
            if code.contains(mark) {
                found.push(format!("{}: {mark}", relative.display()));
            }
        }
    }
    // The walk found the core (broker, worker, drivers...), not nothing.
    assert!(checked > 40, "only {checked} files checked");
    assert!(
        found.is_empty(),
        "wire shapes outside the front ends:\n{}",
        found.join("\n")
    );
}

#[test]
fn issue24_the_check_sees_a_wire_shape_where_there_is_one() {
    // The same check over a front end finds what it looks for, so the
    // test above cannot pass by reading nothing.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = fs::read_to_string(root.join("src/server/dispatch.rs")).expect("readable source");
    let code = code_of(&text);
    assert!(WIRE_MARKS.iter().any(|m| code.contains(m)));
}
