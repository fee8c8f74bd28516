//! The console's HTML: one shell for every page (the script draws them),
//! the login page, and the embedded script and style. Every response says
//! what the browser may load (a strict Content-Security-Policy: nothing
//! inline, nothing from elsewhere) and is never cached.

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::Console;
use super::access::{self, Denied};

const INDEX: &str = include_str!("assets/index.html");
const LOGIN: &str = include_str!("assets/login.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// Where the login page puts its message.
const MESSAGE_SLOT: &str = "<!--MESSAGE-->";

/// Scripts and styles from this server only, no inline code, no frames.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// Headers every console response carries.
pub fn secure(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: with it a browser sends `Origin: null` on the login
    // form, which the origin check must refuse.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn html(status: StatusCode, body: String) -> Response {
    secure(
        (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            body,
        )
            .into_response(),
    )
}

/// The login page with `message` (escaped) in its slot.
fn login_with(status: StatusCode, message: &str) -> Response {
    html(status, LOGIN.replace(MESSAGE_SLOT, &escape(message)))
}

/// A denial as a page: the login page says why, unless nothing was tried
/// yet (no token sent): then it is just the form.
fn denied_page(denied: Denied) -> Response {
    let message = if denied.nothing_tried {
        ""
    } else {
        &denied.message
    };
    login_with(denied.status, message)
}

fn see_other(to: &'static str) -> Response {
    secure((StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response())
}

/// `/ui`, `/ui/tasks`, `/ui/tasks/{id}`: the shell, for operators.
pub async fn shell(State(console): State<Console>, headers: HeaderMap, uri: Uri) -> Response {
    match access::check(&console, &headers, &uri).await {
        Ok(_) => html(StatusCode::OK, INDEX.to_owned()),
        Err(denied) => denied_page(denied),
    }
}

/// `GET /ui/login`.
pub async fn login_page() -> Response {
    login_with(StatusCode::OK, "")
}

/// The login form.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    token: String,
}

/// `POST /ui/login`: an operator token becomes the console's cookie.
pub async fn login(
    State(console): State<Console>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    if let Err(denied) = access::check_site(&console, &headers) {
        return denied_page(denied);
    }
    let Ok(Form(form)) = form else {
        return login_with(
            StatusCode::BAD_REQUEST,
            "Bad Request: send the form field 'token'.",
        );
    };
    match access::operator(&console, &form.token).await {
        Ok(operator) => {
            tracing::info!(
                principal = operator.principal.as_deref(),
                "console: operator logged in"
            );
            let mut response = see_other("/ui");
            if let Ok(cookie) =
                HeaderValue::from_str(&access::set_cookie(form.token.trim(), &headers))
            {
                response.headers_mut().insert(header::SET_COOKIE, cookie);
            }
            response
        }
        Err(denied) => {
            tracing::warn!(status = %denied.status, "console: login refused");
            denied_page(denied)
        }
    }
}

/// `POST /ui/logout`: forget the cookie (from the console's own pages).
pub async fn logout(State(console): State<Console>, headers: HeaderMap) -> Response {
    if let Err(denied) = access::check_site(&console, &headers) {
        return denied_page(denied);
    }
    let mut response = see_other("/ui/login");
    if let Ok(cookie) = HeaderValue::from_str(&access::clear_cookie()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// `/ui/assets/console.js` and `console.css`, from the binary.
pub async fn asset(Path(name): Path<String>) -> Response {
    let (body, kind) = match name.as_str() {
        "console.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "console.css" => (STYLE, "text/css; charset=utf-8"),
        _ => return not_found().await,
    };
    secure((StatusCode::OK, [(header::CONTENT_TYPE, kind)], body).into_response())
}

/// Any other `/ui/...` path.
pub async fn not_found() -> Response {
    secure(
        (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "Not Found: the console's pages are /ui, /ui/tasks and /ui/tasks/{taskId}\n",
        )
            .into_response(),
    )
}

/// `text` safe inside HTML.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_escaped_into_the_login_page() {
        assert_eq!(
            escape("<b>'x'&\"y\""),
            "&lt;b&gt;&#39;x&#39;&amp;&quot;y&quot;"
        );
        assert!(
            LOGIN.contains(MESSAGE_SLOT),
            "login.html has the message slot"
        );
    }
}
