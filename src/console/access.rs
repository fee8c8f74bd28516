//! Who may open the console. Without tokens in the database, anyone who
//! reaches a loopback listener (the operator's own machine); otherwise
//! the bearer of a valid token marked operator, sent as the console's
//! cookie (set by the login form) or as `Authorization: Bearer` (scripts).
//! `Origin` and `Host` are checked as on `/mcp` (DNS rebinding).

use axum::http::{HeaderMap, StatusCode, Uri, header};

use super::Console;
use crate::server::auth::{self, AuthError};
use crate::server::origin;

/// The cookie that carries the operator's token (HttpOnly, SameSite=Strict,
/// Path=/ui).
pub const COOKIE: &str = "taskbroker_console";

/// An operator let in.
#[derive(Debug, Clone)]
pub struct Operator {
    /// The token's principal; None without tokens (loopback).
    pub principal: Option<String>,
}

/// Why not, as the HTTP status and a sentence for the page or the JSON.
#[derive(Debug, Clone)]
pub struct Denied {
    /// 400, 401 (log in), 403 or 500.
    pub status: StatusCode,
    /// What to tell the person.
    pub message: String,
    /// The request carried no token at all (a first visit, or after
    /// logging out): nothing was tried, so the login page shows its form
    /// without an error. Scripts still get `message`.
    pub nothing_tried: bool,
}

impl Denied {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            nothing_tried: false,
        }
    }
}

/// How to make a token that opens the console.
pub const CREATE_HINT: &str = "create one with: taskbroker token create --principal ops --operator";

/// Headers a reverse proxy adds: a request that carries one did not come
/// from this machine's own browser, whatever address it reached us on.
const PROXY_HEADERS: [&str; 4] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-real-ip",
];

/// `Origin` and `Host` as on `/mcp`, except that a page of the console's
/// own site (an `Origin` naming the `Host` it was sent to) may post: its
/// browser sends `Origin` on the login form and on cancels, whatever name
/// the broker is reached by. A DNS-rebound page passes this too, but the
/// operator's cookie is not sent to its name, and without tokens the Host
/// check keeps a loopback broker to loopback names.
pub fn check_site(console: &Console, headers: &HeaderMap) -> Result<(), Denied> {
    let app = &console.app;
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let own_site = match (text(header::ORIGIN), text(header::HOST)) {
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host)),
        _ => false,
    };
    let (local, allowed) = (app.local_addr, &app.config.allowed_origins);
    if !own_site {
        origin::check_origin(headers, local, allowed)
            .map_err(|refused| Denied::new(StatusCode::FORBIDDEN, refused.message()))?;
    }
    origin::check_host(headers, local, allowed)
        .map_err(|refused| Denied::new(StatusCode::FORBIDDEN, refused.message()))
}

/// Check a request to the console.
pub async fn check(console: &Console, headers: &HeaderMap, uri: &Uri) -> Result<Operator, Denied> {
    let app = &console.app;
    check_site(console, headers)?;
    auth::check_query(uri).map_err(|e| Denied::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    let tokens = app.broker.tokens();
    let exist = app
        .token_presence
        .tokens_exist(&tokens, false)
        .await
        .map_err(|e| failed(&e))?;
    if !exist {
        if PROXY_HEADERS.iter().any(|h| headers.contains_key(*h)) {
            return Err(Denied::new(
                StatusCode::FORBIDDEN,
                format!(
                    "Forbidden: this request came through a proxy; without tokens the console is only for the broker's own machine; {CREATE_HINT}"
                ),
            ));
        }
        return if app.local_addr.ip().is_loopback() {
            Ok(Operator { principal: None })
        } else {
            Err(Denied::new(
                StatusCode::FORBIDDEN,
                format!(
                    "Forbidden: without tokens the console is served only on a loopback listen address (this broker listens on {}); {CREATE_HINT}",
                    app.local_addr
                ),
            ))
        };
    }
    let Some(token) = presented(headers) else {
        return Err(Denied {
            nothing_tried: true,
            ..Denied::new(
                StatusCode::UNAUTHORIZED,
                format!("Log in with an operator token ({CREATE_HINT})."),
            )
        });
    };
    operator(console, &token).await
}

/// The operator behind `token`, or why not.
pub async fn operator(console: &Console, token: &str) -> Result<Operator, Denied> {
    match auth::verify(&console.app.broker.tokens(), token.trim()).await {
        Ok(v) if v.operator => Ok(Operator {
            principal: Some(v.principal),
        }),
        Ok(v) => Err(Denied::new(
            StatusCode::FORBIDDEN,
            format!(
                "Forbidden: the token of principal '{}' is not an operator token; {CREATE_HINT}",
                v.principal
            ),
        )),
        Err(AuthError::Store(e)) => Err(failed(&e)),
        Err(_) => Err(Denied::new(
            StatusCode::UNAUTHORIZED,
            "Unauthorized: invalid, revoked or expired token.",
        )),
    }
}

fn failed(e: &dyn std::fmt::Display) -> Denied {
    tracing::error!(error = %e, "console: reading tokens failed");
    Denied::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "Internal error: the database did not answer",
    )
}

/// The token sent: `Authorization: Bearer`, else the console's cookie
/// (another scheme, such as a proxy's Basic, is not ours).
fn presented(headers: &HeaderMap) -> Option<String> {
    if let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(auth::bearer)
    {
        return Some(token.to_owned());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

/// `Set-Cookie` that keeps `token` for the console's pages; `Secure` when
/// the browser reached us over https (through a proxy that says so).
pub fn set_cookie(token: &str, headers: &HeaderMap) -> String {
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"))
        || headers
            .get("forwarded")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|f| f.to_ascii_lowercase().contains("proto=https"));
    let secure = if https { "; Secure" } else { "" };
    format!("{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict{secure}")
}

/// `Set-Cookie` that forgets it.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_token_comes_from_the_header_or_the_cookie() {
        let mut h = HeaderMap::new();
        assert_eq!(presented(&h), None);
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; taskbroker_console=tbk_x_y; b=2"),
        );
        assert_eq!(presented(&h).as_deref(), Some("tbk_x_y"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic dXNlcjpwdw=="),
        );
        assert_eq!(
            presented(&h).as_deref(),
            Some("tbk_x_y"),
            "a proxy's Basic is not ours"
        );
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer tbk_h_s"),
        );
        assert_eq!(presented(&h).as_deref(), Some("tbk_h_s"));
    }

    #[test]
    fn the_cookie_is_secure_behind_https() {
        let mut h = HeaderMap::new();
        assert!(!set_cookie("t", &h).contains("Secure"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        assert!(set_cookie("t", &h).ends_with("; Secure"));
    }
}
