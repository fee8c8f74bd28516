//! Printing results: text for people, JSON for scripts.

use std::io::Write;

use serde_json::Value;

use super::{EXIT_FAILURE, EXIT_OK};

/// Whether a CallToolResult says the tool failed.
pub fn is_error(result: &Value) -> bool {
    result.get("isError").and_then(Value::as_bool) == Some(true)
}

/// Print a CallToolResult and return the exit code (1 when `isError`).
///
/// With `json` the whole result goes to stdout, pretty. Otherwise each text
/// item goes on its own line: to stdout, or to stderr when `isError` (it is
/// the error message then). Other content types are mentioned on stderr; a
/// result with no content prints its `structuredContent`.
pub fn print_result(result: &Value, json: bool) -> u8 {
    let code = if is_error(result) {
        EXIT_FAILURE
    } else {
        EXIT_OK
    };
    if json {
        print_json(result);
        return code;
    }
    let items = result
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut lines = Vec::new();
    for item in items {
        match (item.get("type").and_then(Value::as_str), item.get("text")) {
            (Some("text"), Some(Value::String(text))) => lines.push(text.clone()),
            (kind, _) => eprintln!(
                "taskbroker: [{} content not shown; use --json]",
                kind.unwrap_or("untyped")
            ),
        }
    }
    if items.is_empty()
        && let Some(structured) = result.get("structuredContent")
    {
        lines.push(structured.to_string());
    }
    let text = lines.join("\n");
    if code == EXIT_OK {
        println!("{text}");
        let _ = std::io::stdout().flush();
    } else {
        eprintln!("{text}");
    }
    code
}

/// Pretty JSON to stdout.
pub fn print_json(value: &Value) {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    println!("{text}");
    let _ = std::io::stdout().flush();
}

/// Left-aligned text columns, right-aligned numbers: rows of cells, the
/// first the header: `tasks list` and the operator commands print so.
pub fn table(rows: &[Vec<String>], numeric: &[usize]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            let pad = widths[c].saturating_sub(cell.chars().count());
            if numeric.contains(&c) {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn is_error_needs_a_true_flag() {
        assert!(is_error(&json!({ "isError": true, "content": [] })));
        assert!(!is_error(&json!({ "isError": false })));
        assert!(!is_error(&json!({ "content": [] })));
    }

    #[test]
    fn tables_align_text_left_and_numbers_right() {
        let rows = vec![
            vec!["tool".to_owned(), "jobs".to_owned()],
            vec!["sleep".to_owned(), "3".to_owned()],
            vec!["x".to_owned(), "120".to_owned()],
        ];
        assert_eq!(
            table(&rows, &[1]),
            "tool   jobs\nsleep     3\nx       120\n"
        );
    }
}
