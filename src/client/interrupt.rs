//! Ctrl-C for the CLI's commands: SIGINT listened for from the moment an
//! [`Interrupt`] is made, so one pressed before anybody waits is kept, not
//! lost (a command waiting for a result, a question on the terminal).

/// SIGINT, listened for from creation on (a Ctrl-C that comes while nobody
/// waits is kept for the next [`Interrupt::recv`]). Made inside a tokio
/// runtime.
pub(super) struct Interrupt(Option<tokio::signal::unix::Signal>);

impl Interrupt {
    pub(super) fn new() -> Self {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()) {
            Ok(signal) => Self(Some(signal)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for Ctrl-C");
                Self(None)
            }
        }
    }

    /// Wait for the next Ctrl-C (forever if we cannot listen).
    pub(super) async fn recv(&mut self) {
        match self.0.as_mut() {
            Some(signal) => {
                signal.recv().await;
            }
            None => std::future::pending().await,
        }
    }
}
