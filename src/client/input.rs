//! Answers to a tool's questions (`elicitation/create` in form mode): the
//! command line is often a user's first MCP client, so it answers them
//! itself, in both protocol generations. The answer comes from `--input
//! JSON` (scripts), or is asked field by field on the terminal; either way
//! it is checked against the question's `requestedSchema` (types, required
//! fields, enums, bounds) before it is sent. Without a terminal and without
//! `--input` the question is an error that shows the `--input` to pass.

use std::io::{BufRead, IsTerminal, Write};

use serde_json::{Map, Value, json};

use super::interrupt::Interrupt;

/// The MCP method of the questions answered here.
pub const ELICITATION: &str = "elicitation/create";

/// Why a question could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// No `--input` and no terminal to ask on.
    #[error(
        "the tool asks \"{message}\" and stdin is not a terminal to answer on: answer with --input '{example}' ({fields})"
    )]
    NoTerminal {
        /// The question.
        message: String,
        /// An `--input` that would answer it.
        example: String,
        /// The fields asked for, with their types.
        fields: String,
    },
    /// `--input` does not fit the question's schema.
    #[error("--input does not answer \"{message}\": {reason} (expected {fields})")]
    Invalid {
        /// The question.
        message: String,
        /// What is wrong, field by field.
        reason: String,
        /// The fields asked for, with their types.
        fields: String,
    },
    /// A request this client does not serve (sampling, URL-mode elicitation).
    #[error("the tool asks for {what}, which this command cannot answer")]
    Unsupported {
        /// The method (and mode).
        what: String,
    },
    /// The terminal failed.
    #[error("reading the answer from the terminal failed: {0}")]
    Terminal(String),
}

/// Where answers come from: `--input`, else the terminal.
#[derive(Debug, Clone, Default)]
pub struct Answerer {
    /// `--input`: one JSON object that answers every question.
    given: Option<Map<String, Value>>,
}

impl Answerer {
    /// Answers from `--input` (when given), else from the terminal.
    pub fn new(given: Option<Map<String, Value>>) -> Self {
        Self { given }
    }

    /// The client capabilities this answerer serves (form-mode elicitation).
    pub fn capabilities() -> Value {
        json!({ "elicitation": { "form": {} } })
    }

    /// The result (an `ElicitResult`) of one request from the server.
    /// Reading the terminal blocks the calling thread.
    pub fn answer(&self, method: &str, params: &Value) -> Result<Value, InputError> {
        let mode = params.get("mode").and_then(Value::as_str).unwrap_or("form");
        if method != ELICITATION || mode != "form" {
            return Err(InputError::Unsupported {
                what: if method == ELICITATION {
                    format!("{method} in {mode} mode")
                } else {
                    method.to_owned()
                },
            });
        }
        let question = Question::of(params);
        if let Some(given) = &self.given {
            let content = question
                .check(given)
                .map_err(|reason| InputError::Invalid {
                    message: question.message.clone(),
                    reason,
                    fields: question.fields(),
                })?;
            return Ok(json!({ "action": "accept", "content": content }));
        }
        if !std::io::stdin().is_terminal() {
            return Err(InputError::NoTerminal {
                message: question.message.clone(),
                example: question.example().to_string(),
                fields: question.fields(),
            });
        }
        let _ctrl_c = CtrlCEndsPrompt::arm();
        super::progress::suspended(|| question.ask_terminal())
    }
}

/// While a question is read from the terminal, Ctrl-C ends the command
/// (exit 130, as Ctrl-C does elsewhere): the blocked read cannot be
/// interrupted, and the command's own Ctrl-C handling waits for it.
struct CtrlCEndsPrompt(Option<tokio::task::JoinHandle<()>>);

impl CtrlCEndsPrompt {
    /// Listens from this call on: the listener is registered here, before
    /// the question is printed, so a Ctrl-C pressed as soon as the
    /// question shows is not lost while the watching task starts.
    fn arm() -> Self {
        let watch = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            let _entered = runtime.enter();
            let mut interrupt = Interrupt::new();
            runtime.spawn(async move {
                interrupt.recv().await;
                eprintln!();
                std::process::exit(i32::from(super::EXIT_INTERRUPTED));
            })
        });
        Self(watch)
    }
}

impl Drop for CtrlCEndsPrompt {
    fn drop(&mut self) {
        if let Some(watch) = &self.0 {
            watch.abort();
        }
    }
}

/// One form question: its message and the schema of its answer.
struct Question {
    message: String,
    /// `requestedSchema`: a flat object of primitive properties.
    schema: Value,
}

impl Question {
    fn of(params: &Value) -> Self {
        Self {
            message: params
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("(no message)")
                .to_owned(),
            schema: params
                .get("requestedSchema")
                .cloned()
                .unwrap_or_else(|| json!({ "type": "object", "properties": {} })),
        }
    }

    fn properties(&self) -> Vec<(String, Value)> {
        self.schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    fn required(&self, name: &str) -> bool {
        self.schema
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|r| r.iter().any(|n| n.as_str() == Some(name)))
    }

    /// `approved: boolean (required), note: string` for messages.
    fn fields(&self) -> String {
        let fields: Vec<String> = self
            .properties()
            .iter()
            .map(|(name, schema)| {
                let mut text = format!("{name}: {}", describe_type(schema));
                if self.required(name) {
                    text.push_str(" (required)");
                }
                text
            })
            .collect();
        if fields.is_empty() {
            "no fields".to_owned()
        } else {
            fields.join(", ")
        }
    }

    /// An answer that fits: every required field (every field when none is
    /// required) with a value of its type.
    fn example(&self) -> Value {
        let properties = self.properties();
        let any_required = properties.iter().any(|(n, _)| self.required(n));
        let mut example = Map::new();
        for (name, schema) in properties {
            if !any_required || self.required(&name) {
                example.insert(name, example_value(&schema));
            }
        }
        Value::Object(example)
    }

    /// `answer` checked against the schema: no unknown field, and every
    /// violation of the schema (type, required, enum, bounds) named.
    fn check(&self, answer: &Map<String, Value>) -> Result<Map<String, Value>, String> {
        let known: Vec<String> = self.properties().into_iter().map(|(n, _)| n).collect();
        let mut problems: Vec<String> = answer
            .keys()
            .filter(|k| !known.contains(k))
            .map(|k| format!("unknown field '{k}'"))
            .collect();
        let value = Value::Object(answer.clone());
        match jsonschema::validator_for(&self.schema) {
            Ok(validator) => problems.extend(validator.iter_errors(&value).map(|e| {
                let at = e.instance_path().to_string();
                if at.is_empty() {
                    e.to_string()
                } else {
                    format!("{}: {e}", at.trim_start_matches('/'))
                }
            })),
            Err(e) => problems.push(format!("the tool's schema cannot be read: {e}")),
        }
        if problems.is_empty() {
            Ok(answer.clone())
        } else {
            Err(problems.join("; "))
        }
    }

    /// Ask each field on the terminal (prompts on stderr) until the whole
    /// answer fits the schema; end of input declines.
    fn ask_terminal(&self) -> Result<Value, InputError> {
        let stdin = std::io::stdin();
        let mut lines = stdin.lock().lines();
        let mut err = std::io::stderr();
        let _ = writeln!(err, "taskbroker: the tool asks: {}", self.message);
        loop {
            let mut answer = Map::new();
            for (name, schema) in self.properties() {
                let required = self.required(&name);
                loop {
                    let _ = write!(err, "  {}: ", prompt(&name, &schema, required));
                    let _ = err.flush();
                    let Some(line) = lines.next() else {
                        let _ = writeln!(err);
                        return Ok(json!({ "action": "decline" }));
                    };
                    let line = line.map_err(|e| InputError::Terminal(e.to_string()))?;
                    let text = line.trim();
                    if text.is_empty() {
                        if required {
                            let _ = writeln!(err, "    {name} is required");
                            continue;
                        }
                        if let Some(default) = schema.get("default") {
                            answer.insert(name.clone(), default.clone());
                        }
                        break;
                    }
                    match parse_field(text, &schema) {
                        Ok(value) => {
                            answer.insert(name.clone(), value);
                            break;
                        }
                        Err(why) => {
                            let _ = writeln!(err, "    {why}");
                        }
                    }
                }
            }
            match self.check(&answer) {
                Ok(content) => return Ok(json!({ "action": "accept", "content": content })),
                Err(why) => {
                    let _ = writeln!(err, "    that does not fit: {why}; once more");
                }
            }
        }
    }
}

/// The allowed values of an enum field: `enum`, or `oneOf`/`anyOf` of
/// `const` (titled enums).
fn choices(schema: &Value) -> Vec<Value> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values.clone();
    }
    let items = schema
        .get("oneOf")
        .or_else(|| schema.get("anyOf"))
        .or_else(|| schema.pointer("/items/enum"))
        .and_then(Value::as_array);
    items
        .map(|items| {
            items
                .iter()
                .map(|i| i.get("const").cloned().unwrap_or_else(|| i.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn type_of(schema: &Value) -> &str {
    schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("string")
}

/// `boolean`, `integer 1..10`, `one of "a", "b"`.
fn describe_type(schema: &Value) -> String {
    let options = choices(schema);
    if !options.is_empty() {
        let list: Vec<String> = options.iter().map(Value::to_string).collect();
        return format!("one of {}", list.join(", "));
    }
    let kind = type_of(schema);
    match (schema.get("minimum"), schema.get("maximum")) {
        (Some(min), Some(max)) => format!("{kind} {min}..{max}"),
        (Some(min), None) => format!("{kind} >= {min}"),
        (None, Some(max)) => format!("{kind} <= {max}"),
        (None, None) => kind.to_owned(),
    }
}

fn example_value(schema: &Value) -> Value {
    if let Some(first) = choices(schema).into_iter().next() {
        return first;
    }
    if let Some(default) = schema.get("default") {
        return default.clone();
    }
    match type_of(schema) {
        "boolean" => json!(true),
        "integer" | "number" => schema.get("minimum").cloned().unwrap_or(json!(1)),
        _ => json!("..."),
    }
}

/// `approved (boolean) [y/n]`, with the field's title or description.
fn prompt(name: &str, schema: &Value, required: bool) -> String {
    let about = schema
        .get("title")
        .or_else(|| schema.get("description"))
        .and_then(Value::as_str)
        .map(|t| format!(" - {t}"))
        .unwrap_or_default();
    let hint = match type_of(schema) {
        "boolean" => " [y/n]".to_owned(),
        _ => String::new(),
    };
    let optional = if required {
        ""
    } else {
        ", optional: Enter skips"
    };
    format!("{name}{about} ({}{optional}){hint}", describe_type(schema))
}

/// One typed line as the field's value.
fn parse_field(text: &str, schema: &Value) -> Result<Value, String> {
    let options = choices(schema);
    if !options.is_empty() {
        let typed = serde_json::from_str::<Value>(text).ok();
        if let Some(found) = options
            .iter()
            .find(|o| o.as_str() == Some(text) || typed.as_ref() == Some(*o))
        {
            return Ok(found.clone());
        }
        if let Ok(n) = text.parse::<usize>()
            && (1..=options.len()).contains(&n)
        {
            return Ok(options[n - 1].clone());
        }
        return Err(format!("answer {} (or its number)", describe_type(schema)));
    }
    match type_of(schema) {
        "boolean" => match text.to_ascii_lowercase().as_str() {
            "y" | "yes" | "true" => Ok(json!(true)),
            "n" | "no" | "false" => Ok(json!(false)),
            _ => Err("answer y or n".to_owned()),
        },
        "integer" => text
            .parse::<i64>()
            .map(|n| json!(n))
            .map_err(|_| "answer a whole number".to_owned()),
        "number" => text
            .parse::<f64>()
            .ok()
            .and_then(|n| serde_json::Number::from_f64(n).map(Value::Number))
            .ok_or_else(|| "answer a number".to_owned()),
        _ => Ok(json!(text)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approve() -> Value {
        json!({
            "message": "Ship it?",
            "requestedSchema": {
                "type": "object",
                "properties": { "approved": { "type": "boolean" },
                                "size": { "type": "string", "enum": ["s", "m"] } },
                "required": ["approved"]
            }
        })
    }

    fn given(v: Value) -> Answerer {
        Answerer::new(v.as_object().cloned())
    }

    #[test]
    fn input_is_checked_against_the_schema() {
        let ok = given(json!({"approved": true, "size": "m"}))
            .answer(ELICITATION, &approve())
            .unwrap();
        assert_eq!(
            ok,
            json!({"action": "accept", "content": {"approved": true, "size": "m"}})
        );
        for (bad, says) in [
            (json!({"approved": "yes"}), "approved"),
            (json!({}), "required"),
            (json!({"approved": true, "size": "xl"}), "size"),
            (
                json!({"approved": true, "colour": 1}),
                "unknown field 'colour'",
            ),
        ] {
            let e = given(bad.clone())
                .answer(ELICITATION, &approve())
                .unwrap_err();
            assert!(
                matches!(e, InputError::Invalid { .. }) && e.to_string().contains(says),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_example_answers_the_question() {
        let q = Question::of(&approve());
        assert_eq!(q.example(), json!({"approved": true}));
        assert!(q.check(q.example().as_object().unwrap()).is_ok());
        assert_eq!(
            q.fields(),
            r#"approved: boolean (required), size: one of "s", "m""#
        );
    }

    #[test]
    fn typed_lines_become_values() {
        assert_eq!(
            parse_field("y", &json!({"type": "boolean"})),
            Ok(json!(true))
        );
        assert_eq!(
            parse_field("12", &json!({"type": "integer"})),
            Ok(json!(12))
        );
        assert!(parse_field("1.5", &json!({"type": "integer"})).is_err());
        let e = json!({"type": "string", "enum": ["s", "m"]});
        assert_eq!(parse_field("2", &e), Ok(json!("m")));
        assert_eq!(parse_field("s", &e), Ok(json!("s")));
        assert!(parse_field("x", &e).is_err());
    }

    #[test]
    fn other_requests_are_not_answered() {
        let e = Answerer::default()
            .answer("sampling/createMessage", &json!({}))
            .unwrap_err();
        assert!(matches!(e, InputError::Unsupported { .. }), "{e}");
    }
}
