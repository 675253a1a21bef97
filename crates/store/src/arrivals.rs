//! [`Arrivals`]: how many records are on their way to the embedded
//! store's writer, so that it syncs them in one frame instead of several.
//!
//! A fan-out answers many queries at once (a batch of up to 64), and their
//! steps then run one after another on the runtime's threads. A writer
//! that synced whatever had reached it would sync the first few, then the
//! next few, one sync per handful. The CPU a sync costs is per sync, not
//! per record (`BENCHMARKS.md`, *The store's log*), so the fewer syncs per
//! answer, the cheaper each answer. The teachers' side counts each answer
//! past its fan-out ([`Arrivals::arrive`]) until its step has queued its
//! record (the [`Arrival`] is dropped); the writer, holding records,
//! waits while that count is above zero, for at most a bound
//! ([`Arrivals::gather`]). Where nothing else is on its way — one client,
//! or a lone query — it waits not at all.
//!
//! # Invariants
//! - What is counted is answers that left the fan-out, whoever asked:
//!   nothing here depends on a session's state or its secret index.
//! - Waiting only delays a sync; every answer still waits for its own
//!   record to be durable, and the wait is bounded, so a step that never
//!   comes (a refusal, a cancelled call) costs at most that bound once.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// The count of answers between their fan-out and their record (module
/// documentation). One per process, shared by every model's teachers and
/// the store.
#[derive(Debug, Default)]
pub struct Arrivals {
    coming: AtomicUsize,
    /// The writer is waiting for `coming` to reach zero.
    waiting: AtomicBool,
    /// The writer's thread, to wake when it does.
    writer: OnceLock<Thread>,
}

/// One answer on its way: counted until dropped, which its request does
/// once its step has queued the record (or once it will not step).
#[derive(Debug)]
pub struct Arrival(Arc<Arrivals>);

impl Arrivals {
    /// Counts one answer that left its fan-out.
    pub fn arrive(self: &Arc<Self>) -> Arrival {
        self.coming.fetch_add(1, Ordering::SeqCst);
        Arrival(Arc::clone(self))
    }

    /// Makes the calling thread the one [`Arrivals::gather`] runs on (the
    /// store's writer); the first to call is.
    pub(crate) fn register_writer(&self) {
        let _ = self.writer.set(std::thread::current());
    }

    /// While answers are on their way, waits until none is or `at_most`
    /// has passed; returns whether it waited at all.
    pub(crate) fn gather(&self, at_most: Duration) -> bool {
        if self.coming.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let deadline = Instant::now() + at_most;
        // Set before `coming` is read again, and read by the last arrival
        // after it decrements (both sequentially consistent): either this
        // thread sees zero or that one sees it waiting and unparks it. An
        // unpark before the park makes the park return at once.
        self.waiting.store(true, Ordering::SeqCst);
        while self.coming.load(Ordering::SeqCst) > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::park_timeout(left);
        }
        self.waiting.store(false, Ordering::SeqCst);
        true
    }

    /// How many answers are on their way now.
    pub fn coming(&self) -> usize {
        self.coming.load(Ordering::SeqCst)
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        let arrivals = &self.0;
        if arrivals.coming.fetch_sub(1, Ordering::SeqCst) == 1
            && arrivals.waiting.load(Ordering::SeqCst)
            && let Some(writer) = arrivals.writer.get()
        {
            writer.unpark();
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn nothing_on_its_way_is_no_wait() {
        let arrivals = Arc::new(Arrivals::default());
        arrivals.register_writer();
        assert!(!arrivals.gather(Duration::from_secs(60)));
        drop(arrivals.arrive());
        assert!(!arrivals.gather(Duration::from_secs(60)));
        assert_eq!(arrivals.coming(), 0);
    }

    #[test]
    fn the_last_arrival_wakes_the_writer() -> Result<(), &'static str> {
        let arrivals = Arc::new(Arrivals::default());
        arrivals.register_writer();
        let on_their_way: Vec<Arrival> = (0..3).map(|_| arrivals.arrive()).collect();
        let started = Instant::now();
        let dropping = std::thread::spawn(move || {
            for arrival in on_their_way {
                std::thread::sleep(Duration::from_millis(20));
                drop(arrival);
            }
        });
        // A minute's bound: returning well before it is the last drop's wake-up.
        assert!(arrivals.gather(Duration::from_secs(60)));
        assert_eq!(arrivals.coming(), 0);
        assert!(started.elapsed() < Duration::from_secs(30), "woken by the last arrival, not the bound");
        dropping.join().map_err(|_| "dropping thread panicked")
    }

    #[test]
    fn an_arrival_that_never_comes_costs_the_bound_once() {
        let arrivals = Arc::new(Arrivals::default());
        arrivals.register_writer();
        let stuck = arrivals.arrive();
        let started = Instant::now();
        assert!(arrivals.gather(Duration::from_millis(50)));
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(arrivals.coming(), 1);
        drop(stuck);
        assert_eq!(arrivals.coming(), 0);
    }
}
