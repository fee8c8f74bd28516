//! The web console at `/ui`: an overview of the queue and the workers, every
//! principal's tasks with filters and keyset pages, one task's whole story,
//! live updates from the change feed, and a cancel button. Read-only
//! otherwise.
//!
//! The pages are one embedded HTML shell with its script and style
//! ([`pages`]); the script reads JSON from `/ui/api/*` ([`api`]) and
//! listens to `/ui/api/events` ([`events`]). Every route but the assets and
//! the login page checks [`access`] first: without tokens the console is
//! served only on a loopback listener; with tokens it needs a token marked
//! operator.

mod access;
mod api;
mod events;
mod pages;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

use crate::server::AppState;
use crate::store::{OpsStore, UpstreamStore};

/// What the console's routes share.
#[derive(Clone)]
pub struct Console {
    /// The server's state: the broker (cancels, the feed, the tools),
    /// tokens, settings and the listen address.
    pub app: AppState,
    /// The operator reads, and nothing else of the store: writes (a
    /// cancel) go through the broker.
    pub store: Arc<dyn OpsStore + Send + Sync>,
    /// The upstream servers' rows (state, tools), read for the overview.
    pub upstreams: Arc<dyn UpstreamStore + Send + Sync>,
    /// `sqlite` or `postgres`, shown in the top bar.
    pub database: &'static str,
    /// Cancelled when the server starts to stop: live streams end.
    pub stopping: CancellationToken,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

/// The console's routes, all under `/ui`.
pub fn routes(console: Console) -> Router {
    Router::new()
        .route("/ui", get(pages::shell))
        .route("/ui/", get(pages::shell))
        .route("/ui/tasks", get(pages::shell))
        .route("/ui/tasks/{task_id}", get(pages::shell))
        .route("/ui/login", get(pages::login_page).post(pages::login))
        .route("/ui/logout", post(pages::logout))
        .route("/ui/assets/{name}", get(pages::asset))
        .route("/ui/api/meta", get(api::meta))
        .route("/ui/api/overview", get(api::overview))
        .route("/ui/api/tasks", get(api::tasks))
        .route("/ui/api/tasks/{task_id}", get(api::task))
        .route("/ui/api/tasks/{task_id}/cancel", post(api::cancel))
        .route("/ui/api/events", get(events::stream))
        .route("/ui/{*rest}", get(pages::not_found))
        .with_state(console)
}
