//! MCP 2026-07-28, the stateless base protocol, and its tasks extension
//! (`io.modelcontextprotocol/tasks`, SEP-2663): the envelope every request
//! carries in `params._meta`, the header and `_meta` names, and the shapes
//! of results. Pure data: no I/O.

use serde_json::{Map, Value, json};

use super::LogLevel;
use super::{ErrorCode, RpcError};

/// The protocol version of this generation.
pub const VERSION: &str = "2026-07-28";

/// Every stateless version this server serves.
pub const SUPPORTED_VERSIONS: &[&str] = &[VERSION];

/// `_meta` key: the request's protocol version (required).
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key: the client's capabilities for this request (required).
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key: who the client is (optional).
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// `_meta` key: the lowest log level the client wants (optional; without
/// it, no `notifications/message`).
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// `_meta` key on results: who the server is.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// `_meta` key on notifications of a `subscriptions/listen` stream.
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The tasks extension's key in `capabilities.extensions`.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// Header naming the JSON-RPC method (must equal the body's).
pub const METHOD_HEADER: &str = "mcp-method";
/// Header naming the tool (tools/call) or the task (tasks/*).
pub const NAME_HEADER: &str = "mcp-name";

/// What a 2026-07-28 request says about itself in `params._meta`.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// `io.modelcontextprotocol/protocolVersion`.
    pub version: String,
    /// `io.modelcontextprotocol/clientCapabilities` (an object).
    pub capabilities: Value,
    /// `io.modelcontextprotocol/logLevel`, when given.
    pub log_level: Option<LogLevel>,
    /// `progressToken`, when given.
    pub progress_token: Option<Value>,
}

/// Whether `params` carry the 2026-07-28 envelope at all: a
/// `_meta.io.modelcontextprotocol/protocolVersion` of any value.
pub fn has_envelope(params: Option<&Value>) -> bool {
    params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(META_PROTOCOL_VERSION))
        .is_some()
}

impl Envelope {
    /// Read the envelope of a request's `params`; -32602 when `_meta` or a
    /// required key is missing or has the wrong type.
    pub fn parse(params: Option<&Value>) -> Result<Self, RpcError> {
        let missing = |what: &str| {
            RpcError::invalid_params(format!(
                "Invalid params: {what} (MCP {VERSION} requests carry params._meta with \
                 \"{META_PROTOCOL_VERSION}\" and \"{META_CLIENT_CAPABILITIES}\")"
            ))
        };
        let meta = match params.and_then(|p| p.get("_meta")) {
            None => return Err(missing("params._meta is missing")),
            Some(Value::Object(meta)) => meta,
            Some(_) => return Err(missing("params._meta must be an object")),
        };
        let version = match meta.get(META_PROTOCOL_VERSION) {
            None => return Err(missing(&format!("_meta lacks \"{META_PROTOCOL_VERSION}\""))),
            Some(Value::String(v)) => v.clone(),
            Some(_) => {
                return Err(missing(&format!(
                    "_meta \"{META_PROTOCOL_VERSION}\" must be a string"
                )));
            }
        };
        let capabilities = match meta.get(META_CLIENT_CAPABILITIES) {
            None => {
                return Err(missing(&format!(
                    "_meta lacks \"{META_CLIENT_CAPABILITIES}\" (send {{}} for none)"
                )));
            }
            Some(c @ Value::Object(_)) => c.clone(),
            Some(_) => {
                return Err(missing(&format!(
                    "_meta \"{META_CLIENT_CAPABILITIES}\" must be an object"
                )));
            }
        };
        let log_level = match meta.get(META_LOG_LEVEL) {
            None | Some(Value::Null) => None,
            Some(Value::String(level)) => Some(LogLevel::parse(level).ok_or_else(|| {
                RpcError::invalid_params(format!(
                    "Invalid params: unknown _meta \"{META_LOG_LEVEL}\" '{level}' (expected one of \
                     debug, info, notice, warning, error, critical, alert, emergency)"
                ))
            })?),
            Some(_) => {
                return Err(missing(&format!(
                    "_meta \"{META_LOG_LEVEL}\" must be a string"
                )));
            }
        };
        let progress_token = meta
            .get("progressToken")
            .filter(|t| t.is_string() || t.is_i64() || t.is_u64())
            .cloned();
        Ok(Self {
            version,
            capabilities,
            log_level,
            progress_token,
        })
    }

    /// Whether the request declared the tasks extension.
    pub fn declares_tasks(&self) -> bool {
        self.capabilities
            .get("extensions")
            .and_then(|e| e.get(TASKS_EXTENSION))
            .is_some_and(Value::is_object)
    }
}

/// -32022 for a version this server does not serve, with the versions it
/// does.
pub fn unsupported_version(requested: &str) -> RpcError {
    RpcError::new(
        ErrorCode::UnsupportedVersion,
        format!(
            "Unsupported protocol version '{requested}' (supported: {})",
            SUPPORTED_VERSIONS.join(", ")
        ),
    )
    .with_data(json!({ "supported": SUPPORTED_VERSIONS, "requested": requested }))
}

/// -32020: a header disagrees with the body.
pub fn header_mismatch(message: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::HeaderMismatch, message)
}

/// -32021: the request needs client capabilities it did not declare;
/// `required` is a ClientCapabilities object naming them.
pub fn missing_capability(message: impl Into<String>, required: Value) -> RpcError {
    RpcError::new(ErrorCode::MissingCapability, message)
        .with_data(json!({ "requiredCapabilities": required }))
}

/// `{"extensions": {"io.modelcontextprotocol/tasks": {}}}`.
pub fn tasks_capability() -> Value {
    json!({ "extensions": { TASKS_EXTENSION: {} } })
}

/// `_meta` of every result: the server's name and version.
pub fn server_info_meta() -> Value {
    json!({ META_SERVER_INFO: { "name": "taskbroker", "version": env!("CARGO_PKG_VERSION") } })
}

/// Mark a result object complete (`resultType`) and sign it with the
/// server's `_meta`, keeping any `_meta` it has.
pub fn complete(result: Value) -> Value {
    with_result_type(result, "complete")
}

/// Set `resultType` and the server's `_meta` on a result object.
pub fn with_result_type(result: Value, result_type: &str) -> Value {
    let mut obj = match result {
        Value::Object(obj) => obj,
        other => {
            let mut obj = Map::new();
            obj.insert("value".into(), other);
            obj
        }
    };
    obj.insert("resultType".into(), json!(result_type));
    let meta = obj.entry("_meta").or_insert_with(|| json!({}));
    if let (Value::Object(meta), Value::Object(info)) = (meta, server_info_meta()) {
        for (k, v) in info {
            meta.entry(k).or_insert(v);
        }
    }
    Value::Object(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(meta: Value) -> Value {
        json!({ "_meta": meta })
    }

    #[test]
    fn envelope_requires_version_and_capabilities() {
        assert!(Envelope::parse(None).is_err());
        assert!(Envelope::parse(Some(&json!({}))).is_err());
        let no_caps = params(json!({ META_PROTOCOL_VERSION: VERSION }));
        assert_eq!(
            Envelope::parse(Some(&no_caps)).unwrap_err().code,
            ErrorCode::InvalidParams
        );
        let caps_not_object =
            params(json!({ META_PROTOCOL_VERSION: VERSION, META_CLIENT_CAPABILITIES: [] }));
        assert!(Envelope::parse(Some(&caps_not_object)).is_err());
        let ok = params(json!({ META_PROTOCOL_VERSION: VERSION, META_CLIENT_CAPABILITIES: {} }));
        let envelope = Envelope::parse(Some(&ok)).unwrap();
        assert_eq!(envelope.version, VERSION);
        assert!(!envelope.declares_tasks());
    }

    #[test]
    fn tasks_extension_is_read_from_capabilities() {
        let p = params(json!({
            META_PROTOCOL_VERSION: VERSION,
            META_CLIENT_CAPABILITIES: tasks_capability(),
        }));
        assert!(Envelope::parse(Some(&p)).unwrap().declares_tasks());
    }

    #[test]
    fn complete_keeps_existing_meta() {
        let r = complete(json!({ "content": [], "_meta": { "x": 1 } }));
        assert_eq!(r["resultType"], "complete");
        assert_eq!(r["_meta"]["x"], 1);
        assert_eq!(r["_meta"][META_SERVER_INFO]["name"], "taskbroker");
    }

    #[test]
    fn unsupported_version_names_the_supported_ones() {
        let e = unsupported_version("v999").to_json();
        assert_eq!(e["code"], -32022);
        assert_eq!(e["data"]["requested"], "v999");
        assert_eq!(e["data"]["supported"][0], VERSION);
    }
}
