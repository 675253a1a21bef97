//! Progress of a labelling run on standard error: a bar on a terminal,
//! otherwise a log line every so many rows or seconds.

use indicatif::{ProgressBar, ProgressStyle};
use pacpriv_service::proto::pacpriv::Budget;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Without a terminal, a progress line at least this often.
const INTERVAL: Duration = Duration::from_secs(10);

/// Progress on standard error: a bar on a terminal, otherwise a log line
/// every so many rows or seconds.
pub enum Progress {
    Bar(ProgressBar),
    Lines { rows: u64, every: u64, last_rows: u64, last_time: Instant },
}

impl Progress {
    /// Progress of `rows` rows, `done` of them answered before; a line
    /// every `every` rows without a terminal.
    pub fn new(rows: u64, done: u64, every: u64) -> Progress {
        if std::io::stderr().is_terminal() {
            let style = ProgressStyle::with_template(
                "{elapsed_precise} [{wide_bar}] {pos}/{len} rows, {per_sec}, eta {eta}  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            let bar = ProgressBar::new(rows).with_style(style);
            bar.set_position(done);
            Progress::Bar(bar)
        } else {
            Progress::Lines { rows, every, last_rows: done, last_time: Instant::now() }
        }
    }

    /// `answered` rows answered in all, `kept` kept, budget `b`.
    pub fn update(&mut self, answered: u64, kept: u64, b: &Budget) {
        match self {
            Progress::Bar(bar) => {
                bar.set_position(answered);
                bar.set_message(format!("kept {kept}, spent {:.3e} of {:.3e} nats", b.spent, b.limit));
            }
            Progress::Lines { rows, every, last_rows, last_time } => {
                let due = answered - *last_rows >= *every || last_time.elapsed() >= INTERVAL;
                if due || answered == *rows {
                    tracing::info!(answered, rows = *rows, kept, spent = b.spent, limit = b.limit, "labelling");
                    (*last_rows, *last_time) = (answered, Instant::now());
                }
            }
        }
    }

    /// A warning that does not garble the bar.
    pub fn note(&self, message: &str) {
        match self {
            Progress::Bar(bar) => bar.suspend(|| tracing::warn!("{message}")),
            Progress::Lines { .. } => tracing::warn!("{message}"),
        }
    }

    /// Leaves the bar as it is.
    pub fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.abandon();
        }
    }
}
