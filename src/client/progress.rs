//! The progress display on stderr: an indicatif bar or spinner when stderr
//! is a terminal, nothing otherwise (no noise in scripts and logs).

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Steps of a bar with a known total.
const STEPS: u64 = 1000;

/// The bar on screen, so that a question asked on the terminal can hide it
/// while it waits for the answer ([`suspended`]).
static SHOWN: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Run `f` (which writes to and reads from the terminal) with the progress
/// display, if any, hidden; it comes back afterwards.
pub fn suspended<R>(f: impl FnOnce() -> R) -> R {
    let shown = SHOWN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    match shown {
        Some(bar) => bar.suspend(f),
        None => f(),
    }
}

fn show(bar: Option<&ProgressBar>) {
    *SHOWN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = bar.cloned();
}

/// A spinner that turns into a bar once a total is known.
#[derive(Debug)]
pub struct Progress {
    /// None when stderr is not a terminal.
    bar: Option<ProgressBar>,
    /// Whether the bar style (with a total) is set.
    has_total: bool,
}

impl Progress {
    /// A spinner saying `message`, if stderr is a terminal.
    pub fn new(message: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed}] {wide_msg}") {
                bar.set_style(style);
            }
            bar.set_message(message.to_owned());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        show(bar.as_ref());
        Self {
            bar,
            has_total: false,
        }
    }

    /// Show a status line (e.g. a task's statusMessage).
    pub fn message(&self, text: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(text.to_owned());
        }
    }

    /// Show progress (`notifications/progress`): a bar when `total` is known.
    pub fn update(&mut self, progress: f64, total: Option<f64>, message: Option<&str>) {
        let Some(bar) = &self.bar else {
            return;
        };
        match total.filter(|t| *t > 0.0) {
            Some(total) => {
                if !self.has_total {
                    if let Ok(style) = ProgressStyle::with_template(
                        "{spinner} [{elapsed}] {bar:30} {percent:>3}% {wide_msg}",
                    ) {
                        bar.set_style(style);
                    }
                    bar.set_length(STEPS);
                    self.has_total = true;
                }
                let fraction = (progress / total).clamp(0.0, 1.0);
                bar.set_position((fraction * STEPS as f64).round() as u64);
            }
            None if message.is_none() => bar.set_message(format!("progress {progress}")),
            None => {}
        }
        if let Some(message) = message {
            bar.set_message(message.to_owned());
        }
    }

    /// Remove the display (before printing a result or a question).
    pub fn clear(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
            show(None);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}
