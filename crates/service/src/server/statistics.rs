//! Triton's statistics extension for each model version ([`Statistics`]):
//! what `ModelStatistics` and `GET /v2/models[/NAME[/versions/V]]/stats`
//! report, in Triton's message shapes.
//!
//! Triton's phases, as pacpriv's answers run them (the stages of
//! `pacpriv_stage_duration_seconds{stage}` in `crate::metrics`):
//!
//! | Triton | pacpriv |
//! |---|---|
//! | `queue` | admission: from arrival through the rate limit and the session's preflight read |
//! | `compute_input` | the teachers' fan-out (not run for a repeat the session answers from its cache) |
//! | `compute_infer` | the step: calibration, noise and charge (Algorithm 1) |
//! | `compute_output` | until the charge is durable |
//! | `success` | the whole request, answered |
//! | `fail` | the whole request, refused or failed after its model version was resolved |
//!
//! `inference_count` counts rows answered, `execution_count` requests
//! answered; `batch_stats` is empty (pacpriv does not batch requests
//! into executions of their own).
//!
//! # Invariants
//! - Counts and durations are the service's, summed over every principal:
//!   nothing per principal or session. What they time is what the stage
//!   histograms already show: none of it depends on s*
//!   (`docs/assurance/accounting.md` §8).
//! - Recording is a few relaxed atomic additions: no lock on a request's
//!   path.

use crate::proto::inference::{InferStatistics, ModelStatistics, StatisticDuration};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long an answered request spent in each phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// Admission (Triton's queue).
    pub queue: Duration,
    /// The teachers' fan-out, if the request asked them.
    pub fanout: Option<Duration>,
    /// The step: calibration, noise, charge.
    pub step: Duration,
    /// Until the charge was durable.
    pub durable: Duration,
}

/// One model version's counts and durations since it was built.
#[derive(Debug, Default)]
pub struct Statistics {
    last_inference_ms: AtomicU64,
    inferences: AtomicU64,
    executions: AtomicU64,
    success: Counter,
    fail: Counter,
    queue: Counter,
    compute_input: Counter,
    compute_infer: Counter,
    compute_output: Counter,
}

/// How many times, and how long in all.
#[derive(Debug, Default)]
struct Counter {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Counter {
    fn add(&self, took: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.ns.fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn read(&self) -> StatisticDuration {
        StatisticDuration { count: self.count.load(Ordering::Relaxed), ns: self.ns.load(Ordering::Relaxed) }
    }
}

impl Statistics {
    /// A request of `rows` rows answered in `took`, its phases `timings`.
    pub fn answered(&self, rows: usize, took: Duration, timings: &Timings) {
        self.inferences.fetch_add(rows as u64, Ordering::Relaxed);
        self.executions.fetch_add(1, Ordering::Relaxed);
        self.success.add(took);
        self.queue.add(timings.queue);
        if let Some(fanout) = timings.fanout {
            self.compute_input.add(fanout);
        }
        self.compute_infer.add(timings.step);
        self.compute_output.add(timings.durable);
        self.last_inference_ms.fetch_max(now_ms(), Ordering::Relaxed);
    }

    /// A request refused or failed after `took`.
    pub fn failed(&self, took: Duration) {
        self.fail.add(took);
        self.last_inference_ms.fetch_max(now_ms(), Ordering::Relaxed);
    }

    /// The message for model `name` at `version`.
    pub fn report(&self, name: &str, version: &str) -> ModelStatistics {
        ModelStatistics {
            name: name.to_owned(),
            version: version.to_owned(),
            last_inference: self.last_inference_ms.load(Ordering::Relaxed),
            inference_count: self.inferences.load(Ordering::Relaxed),
            execution_count: self.executions.load(Ordering::Relaxed),
            inference_stats: Some(InferStatistics {
                success: Some(self.success.read()),
                fail: Some(self.fail.read()),
                queue: Some(self.queue.read()),
                compute_input: Some(self.compute_input.read()),
                compute_infer: Some(self.compute_infer.read()),
                compute_output: Some(self.compute_output.read()),
            }),
            batch_stats: Vec::new(),
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn answers_and_failures_add_up_in_their_phases() {
        let stats = Statistics::default();
        let ms = Duration::from_millis;
        let asked = Timings { queue: ms(1), fanout: Some(ms(5)), step: ms(2), durable: ms(3) };
        stats.answered(4, ms(11), &asked);
        stats.answered(1, ms(6), &Timings { fanout: None, ..asked });
        stats.failed(ms(7));
        let r = stats.report("private", "1");
        assert_eq!((r.name.as_str(), r.version.as_str(), r.inference_count, r.execution_count), ("private", "1", 5, 2));
        assert!(r.last_inference > 0);
        let s = r.inference_stats.expect("stats");
        let pair = |d: Option<StatisticDuration>| d.map(|d| (d.count, d.ns / 1_000_000));
        assert_eq!(pair(s.success), Some((2, 17)));
        assert_eq!(pair(s.fail), Some((1, 7)));
        assert_eq!(pair(s.queue), Some((2, 2)));
        assert_eq!(pair(s.compute_input), Some((1, 5)), "a repeat asks no teacher");
        assert_eq!(pair(s.compute_infer), Some((2, 4)));
        assert_eq!(pair(s.compute_output), Some((2, 6)));
    }
}
