//! DNS-rebinding protection (H-2): the `Origin` of a browser request must
//! be localhost, the address we listen on, or one the operator allowed; when
//! we listen on loopback, the `Host` must name loopback too.

use std::net::SocketAddr;

use axum::http::{HeaderMap, header};

/// Why a request's `Origin` or `Host` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `Origin` names a site that is not ours.
    Origin,
    /// `Host` names another host while we listen on loopback.
    Host,
}

impl Refused {
    /// The text of the 403.
    pub fn message(self) -> &'static str {
        match self {
            Self::Origin => "Forbidden: Origin not allowed",
            Self::Host => "Forbidden: Host not allowed",
        }
    }
}

/// Check a request's `Origin` and `Host` headers (each when present).
pub fn check(headers: &HeaderMap, local: SocketAddr, allowed: &[String]) -> Result<(), Refused> {
    check_origin(headers, local, allowed)?;
    check_host(headers, local, allowed)
}

/// The `Origin` header alone (when present).
pub fn check_origin(
    headers: &HeaderMap,
    local: SocketAddr,
    allowed: &[String],
) -> Result<(), Refused> {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let ok = origin
            .to_str()
            .is_ok_and(|o| origin_allowed(o, local, allowed));
        if !ok {
            tracing::warn!(origin = %String::from_utf8_lossy(origin.as_bytes()), "request refused: origin not allowed");
            return Err(Refused::Origin);
        }
    }
    Ok(())
}

/// The `Host` header alone (when present).
pub fn check_host(
    headers: &HeaderMap,
    local: SocketAddr,
    allowed: &[String],
) -> Result<(), Refused> {
    if let Some(host) = headers.get(header::HOST) {
        let ok = host.to_str().is_ok_and(|h| host_allowed(h, local, allowed));
        if !ok {
            tracing::warn!(host = %String::from_utf8_lossy(host.as_bytes()), "request refused: host not allowed");
            return Err(Refused::Host);
        }
    }
    Ok(())
}

/// Host part of an origin or Host header value, lower-cased, without port
/// or brackets.
fn host_of(authority: &str) -> String {
    let authority = authority.trim().to_ascii_lowercase();
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default().to_owned();
    }
    authority.split(':').next().unwrap_or_default().to_owned()
}

fn is_loopback_host(host: &str) -> bool {
    host == "localhost"
        || host.ends_with(".localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether a request with this `Origin` header may proceed.
pub fn origin_allowed(origin: &str, local: SocketAddr, allowed: &[String]) -> bool {
    let origin = origin.trim();
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(origin)) {
        return true;
    }
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false; // includes the opaque origin "null"
    };
    if !matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https") {
        return false;
    }
    let host = host_of(authority);
    is_loopback_host(&host) || (!local.ip().is_unspecified() && host == local.ip().to_string())
}

/// Whether the `Host` header is acceptable: anything when we listen on a
/// non-loopback address, else only loopback names.
pub fn host_allowed(host: &str, local: SocketAddr, allowed: &[String]) -> bool {
    if !local.ip().is_loopback() {
        return true;
    }
    let name = host_of(host);
    is_loopback_host(&name)
        || allowed
            .iter()
            .any(|a| host_of(a.split("://").last().unwrap_or(a)) == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h2_origins() {
        let local: SocketAddr = "127.0.0.1:8808".parse().unwrap();
        let allowed = vec!["https://app.example.com".to_owned()];
        assert!(origin_allowed("http://localhost:3000", local, &allowed));
        assert!(origin_allowed("http://127.0.0.1:8808", local, &allowed));
        assert!(origin_allowed("http://[::1]:1", local, &allowed));
        assert!(origin_allowed("https://app.example.com", local, &allowed));
        assert!(!origin_allowed("https://evil.example.com", local, &allowed));
        assert!(!origin_allowed("null", local, &allowed));
        assert!(!origin_allowed(
            "http://localhost.evil.com",
            local,
            &allowed
        ));
        assert!(host_allowed("localhost:8808", local, &allowed));
        assert!(!host_allowed("evil.com:8808", local, &allowed));
    }
}
