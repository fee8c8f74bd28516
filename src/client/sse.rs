//! An incremental Server-Sent Events parser: feed it bytes as they arrive,
//! take out whole events.

/// One SSE event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `id` field, if the event had one.
    pub id: Option<String>,
    /// The `event` field (`message` when absent).
    pub event: Option<String>,
    /// The `data` lines, joined with `\n`.
    pub data: String,
    /// The `retry` field in milliseconds, if any.
    pub retry: Option<u64>,
}

/// Parses a byte stream into events. Comments (lines starting with `:`) are
/// skipped; lines end with `\n`, `\r\n` or `\r`.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes not yet forming a whole line.
    pending: Vec<u8>,
    /// The event being read.
    current: SseEvent,
    /// Whether any field of `current` was seen.
    touched: bool,
    /// Whether `current` has a data field (so later ones join with `\n`).
    has_data: bool,
}

impl SseParser {
    /// A parser with nothing read.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes; returns the events they complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i < self.pending.len() {
            let end = match self.pending[i] {
                b'\n' => i + 1,
                b'\r' if i + 1 < self.pending.len() => {
                    if self.pending[i + 1] == b'\n' {
                        i + 2
                    } else {
                        i + 1
                    }
                }
                // A `\r` at the end may be the first half of `\r\n`: wait.
                b'\r' => break,
                _ => {
                    i += 1;
                    continue;
                }
            };
            let line = String::from_utf8_lossy(&self.pending[start..i]).into_owned();
            if let Some(event) = self.line(&line) {
                events.push(event);
            }
            start = end;
            i = end;
        }
        self.pending.drain(..start);
        events
    }

    /// Handle one line; a blank line completes an event.
    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let touched = std::mem::replace(&mut self.touched, false);
            self.has_data = false;
            let event = std::mem::take(&mut self.current);
            return touched.then_some(event);
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        self.touched = true;
        match field {
            "id" => self.current.id = Some(value.to_owned()),
            "event" => self.current.event = Some(value.to_owned()),
            "retry" => self.current.retry = value.parse().ok(),
            "data" => {
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_and_line_endings() {
        let mut p = SseParser::new();
        assert!(p.push(b"id: s-0\r\nretry: 1000\r\ndata: \r").is_empty());
        let first = p.push(b"\n\r\n: keep-alive\n\nid: s-1\nevent: message\ndata: {\"a\"");
        assert_eq!(
            first,
            vec![SseEvent {
                id: Some("s-0".into()),
                event: None,
                data: String::new(),
                retry: Some(1000),
            }]
        );
        let second = p.push(b":1}\ndata: x\n\n");
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].id.as_deref(), Some("s-1"));
        assert_eq!(second[0].event.as_deref(), Some("message"));
        assert_eq!(second[0].data, "{\"a\":1}\nx");
    }

    #[test]
    fn lone_carriage_returns_end_lines() {
        let mut p = SseParser::new();
        let events = p.push(b"data: one\r\rdata: two\r\r\n");
        let data: Vec<_> = events.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(data, ["one", "two"]);
    }
}
