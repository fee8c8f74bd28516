//! Exporting spans over OTLP/HTTP (protobuf), off by default.
//!
//! On when `--otlp-endpoint` is given (the collector's base URL, as
//! `OTEL_EXPORTER_OTLP_ENDPOINT`: spans go to `<url>/v1/traces`) or when
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
//! is set; `OTEL_SDK_DISABLED=true` turns it off whatever else says. The
//! other standard variables apply as the OpenTelemetry SDK reads them
//! (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`,
//! `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`, ...). Spans are
//! batched on a thread of their own; a collector that is down costs a
//! dropped batch and a warning, never a task.

use anyhow::Context as _;
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

use super::TRACER;

/// The environment variables that turn exporting on.
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// How long exit waits for the last batch to go out.
const FLUSH_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Where and as what this process exports.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--otlp-endpoint`: the collector's base URL.
    pub endpoint: Option<String>,
    /// Which kind of process this is (`serve`, `worker`), a resource
    /// attribute of every span.
    pub process: &'static str,
}

/// The exporter while it runs: [`Exporting::shutdown`] sends what is
/// still batched.
#[derive(Debug)]
pub struct Exporting {
    provider: SdkTracerProvider,
    endpoint: String,
}

impl Exporting {
    /// Where spans go (the traces URL, for the start-up log line).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Send what is batched and stop (blocks up to [`FLUSH_AT_EXIT`]).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(FLUSH_AT_EXIT) {
            tracing::warn!(error = %e, "flushing the last spans failed");
        }
    }
}

/// Start exporting if `settings` or the environment ask for it; None when
/// traces are off. Call once, before the async runtime starts.
pub fn start(settings: &Settings) -> anyhow::Result<Option<Exporting>> {
    let endpoint = match settings.endpoint.as_deref().map(str::trim) {
        Some("") => anyhow::bail!(
            "--otlp-endpoint is empty; give the collector's URL, such as http://127.0.0.1:4318"
        ),
        Some(base) => Some(traces_url(base).map_err(|e| anyhow::anyhow!("--otlp-endpoint {e}"))?),
        None => from_environment()?,
    };
    let disabled =
        std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let Some(endpoint) = endpoint.filter(|_| !disabled) else {
        return Ok(None);
    };
    let exporter = SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint.clone())
        .build()
        .context("cannot set up the OTLP exporter")?;
    let mut resource = Resource::builder().with_attributes([
        KeyValue::new("taskbroker.process", settings.process),
        KeyValue::new("process.pid", i64::from(std::process::id())),
    ]);
    // OTEL_SERVICE_NAME, when set, is read by the SDK's detectors.
    if std::env::var("OTEL_SERVICE_NAME").map_or(true, |v| v.trim().is_empty()) {
        resource = resource.with_service_name("taskbroker");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("taskbroker");
    if TRACER.set(tracer).is_err() {
        anyhow::bail!("traces are already exported by this process");
    }
    Ok(Some(Exporting { provider, endpoint }))
}

/// The traces URL the standard variables give, if any: the signal's own
/// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, as it is) or the base one
/// (`OTEL_EXPORTER_OTLP_ENDPOINT`, plus `/v1/traces`); refused unless
/// `http://`, as the flag is.
fn from_environment() -> anyhow::Result<Option<String>> {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let (name, url) = if let Some(url) = var(ENDPOINT_VARS[0]) {
        (ENDPOINT_VARS[0], url)
    } else if let Some(base) = var(ENDPOINT_VARS[1]) {
        (
            ENDPOINT_VARS[1],
            traces_url(&base).map_err(|e| anyhow::anyhow!("{}: {e}", ENDPOINT_VARS[1]))?,
        )
    } else {
        return Ok(None);
    };
    if !url.starts_with("http://") || url.len() <= "http://".len() {
        anyhow::bail!(
            "{name}={url}: give an http:// URL of an OTLP/HTTP collector; https is not built in"
        );
    }
    Ok(Some(url))
}

/// `<base>/v1/traces` for a collector's base URL; refused unless it is an
/// `http://` URL with a host (this build speaks OTLP without TLS: a
/// collector beside the broker, or one reached through it).
fn traces_url(base: &str) -> anyhow::Result<String> {
    let Some(rest) = base.strip_prefix("http://") else {
        anyhow::bail!(
            "{base}: give an http:// URL of an OTLP/HTTP collector (such as http://127.0.0.1:4318); https is not built in"
        );
    };
    if rest.is_empty() || rest.starts_with('/') {
        anyhow::bail!("{base}: the URL names no host");
    }
    Ok(format!("{}/v1/traces", base.trim_end_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn the_base_url_gets_the_traces_path() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318/").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/otlp").unwrap(),
            "http://collector:4318/otlp/v1/traces"
        );
        for bad in ["https://x:4318", "127.0.0.1:4318", "http://", "http:///v1"] {
            assert!(traces_url(bad).is_err(), "{bad}");
        }
    }
}
