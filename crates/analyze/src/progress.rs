//! A progress bar on stderr for long analyses.
//!
//! Shown only when stderr is a terminal, so logs and pipes stay clean.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress of a replay, in events.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar over `total` events, or nothing when `quiet` or when stderr
    /// is not a terminal.
    pub fn new(total: u64, quiet: bool) -> Self {
        if quiet || !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} replaying [{bar:40}] {human_pos}/{human_len} events ({per_sec:.0}, {eta})",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        Progress { bar: Some(bar) }
    }

    /// Adds `rows` replayed events.
    pub fn advance(&self, rows: u64) {
        if let Some(b) = &self.bar {
            b.inc(rows);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
