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
//! waits while that count is above zero and answers keep landing (one
//! has in the last short while), for at most a bound
//! ([`Arrivals::gather`]). Where nothing else is on its way — one client,
//! or a lone query — it waits not at all. (An answer that stops being
//! counted without queuing a record lands too: a refusal, a multi-row
//! request's row until all are in, a stream's fan-out.)
//!
//! # Invariants
//! - What is counted is answers that left the fan-out, whoever asked:
//!   nothing here depends on a session's state or its secret index.
//! - Waiting only delays a sync; every answer still waits for its own
//!   record to be durable. The wait ends when nothing is on its way, when
//!   nothing has landed for a short while, or at a bound: an answer held
//!   far from its step delays a sync by the short while when nothing
//!   else lands, and by the bound at most.
//! - A stream's fan-outs are not counted (`PredictStream` queues them
//!   behind its earlier steps), and a multi-row request's rows are
//!   counted only once all of them are answered.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// The count of answers between their fan-out and their record (module
/// documentation). One per process, shared by every model's teachers and
/// the store.
#[derive(Debug)]
pub struct Arrivals {
    coming: AtomicUsize,
    /// When the last one landed (its record queued, or no step), in
    /// nanoseconds since `since`: the writer stops waiting once none has
    /// landed for a while.
    landed: AtomicU64,
    since: Instant,
    /// The writer is waiting for `coming` to reach zero.
    waiting: AtomicBool,
    /// The thread that waits (the store's writer; the first to gather).
    writer: OnceLock<Thread>,
}

/// One answer on its way: counted until dropped, which happens once its
/// step has queued the record (or once it will not step).
#[derive(Debug)]
pub struct Arrival(Arc<Arrivals>);

impl Default for Arrivals {
    fn default() -> Self {
        Arrivals {
            coming: AtomicUsize::new(0),
            landed: AtomicU64::new(0),
            since: Instant::now(),
            waiting: AtomicBool::new(false),
            writer: OnceLock::new(),
        }
    }
}

impl Arrivals {
    /// Counts one answer that left its fan-out.
    pub fn arrive(self: &Arc<Self>) -> Arrival {
        self.coming.fetch_add(1, Ordering::SeqCst);
        Arrival(Arc::clone(self))
    }

    /// While answers are on their way and they keep landing, waits: until
    /// none is on its way, or none has landed for `quiet` (counted from
    /// the start, or from the last landing), or `at_most` has passed.
    /// Returns whether it waited at all.
    ///
    /// The quiet cut-off bounds what an answer held far from its step
    /// costs each sync while nothing else lands: `quiet`; under steady
    /// traffic the sync waits for that traffic anyway, up to `at_most`.
    /// Only the first thread to call it with answers on their way ever
    /// waits (one store per process); any other returns at once.
    pub(crate) fn gather(&self, quiet: Duration, at_most: Duration) -> bool {
        if self.coming.load(Ordering::SeqCst) == 0
            || self.writer.get_or_init(std::thread::current).id() != std::thread::current().id()
        {
            return false;
        }
        let started = Instant::now();
        let deadline = started + at_most;
        // Set before `coming` is read again, and read by the last arrival
        // after it decrements (both sequentially consistent): either this
        // thread sees zero or that one sees it waiting and unparks it. An
        // unpark before the park makes the park return at once.
        self.waiting.store(true, Ordering::SeqCst);
        while self.coming.load(Ordering::SeqCst) > 0 {
            let now = Instant::now();
            let landed = self.since + Duration::from_nanos(self.landed.load(Ordering::SeqCst));
            let until = deadline.min(started.max(landed) + quiet);
            if now >= until {
                break;
            }
            std::thread::park_timeout(until - now);
        }
        self.waiting.store(false, Ordering::SeqCst);
        true
    }

    /// How many answers are on their way now.
    pub fn coming(&self) -> usize {
        self.coming.load(Ordering::SeqCst)
    }

    /// Whether the writer is waiting in [`Arrivals::gather`] now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> bool {
        self.waiting.load(Ordering::SeqCst)
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        let arrivals = &self.0;
        let landed = u64::try_from(arrivals.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        arrivals.landed.fetch_max(landed, Ordering::SeqCst);
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

    const MINUTE: Duration = Duration::from_secs(60);

    /// Drops `arrivals` one by one, `every` apart, on a thread of its own.
    fn landing(arrivals: Vec<Arrival>, every: Duration) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            for arrival in arrivals {
                std::thread::sleep(every);
                drop(arrival);
            }
        })
    }

    #[test]
    fn nothing_on_its_way_is_no_wait() {
        let arrivals = Arc::new(Arrivals::default());
        assert!(!arrivals.gather(MINUTE, MINUTE));
        drop(arrivals.arrive());
        assert!(!arrivals.gather(MINUTE, MINUTE));
        assert_eq!(arrivals.coming(), 0);
    }

    #[test]
    fn the_last_arrival_wakes_the_writer() -> Result<(), &'static str> {
        let arrivals = Arc::new(Arrivals::default());
        let on_their_way: Vec<Arrival> = (0..3).map(|_| arrivals.arrive()).collect();
        let started = Instant::now();
        let dropping = landing(on_their_way, Duration::from_millis(20));
        // Bounds of a minute: returning well before them is the last
        // arrival's wake-up.
        assert!(arrivals.gather(MINUTE, MINUTE));
        assert_eq!(arrivals.coming(), 0);
        assert!(started.elapsed() < MINUTE / 2, "woken by the last arrival, not a bound");
        dropping.join().map_err(|_| "dropping thread panicked")
    }

    #[test]
    fn an_arrival_held_far_from_its_step_costs_the_quiet_while_not_the_bound() -> Result<(), &'static str> {
        let arrivals = Arc::new(Arrivals::default());
        let held = arrivals.arrive();
        let others: Vec<Arrival> = (0..5).map(|_| arrivals.arrive()).collect();
        // Landings 300 ms apart, over 1.5 s in all: longer than one quiet
        // while, and each well within one (a loaded machine's slack).
        let quiet = Duration::from_secs(1);
        let started = Instant::now();
        let dropping = landing(others, Duration::from_millis(300));
        assert!(arrivals.gather(quiet, MINUTE));
        assert!(started.elapsed() < MINUTE / 2, "waited for the bound");
        // Each landing extended the wait, and it ended after the last one
        // (a quiet while later), not at the bound.
        let coming = arrivals.coming();
        dropping.join().map_err(|_| "dropping thread panicked")?;
        assert_eq!(coming, 1, "stopped before the others landed");
        drop(held);
        assert_eq!(arrivals.coming(), 0);
        Ok(())
    }

    #[test]
    fn answers_that_keep_landing_are_waited_for_until_the_bound() -> Result<(), &'static str> {
        let arrivals = Arc::new(Arrivals::default());
        let others: Vec<Arrival> = (0..50).map(|_| arrivals.arrive()).collect();
        let at_most = Duration::from_millis(500);
        let started = Instant::now();
        let dropping = landing(others, Duration::from_millis(50));
        // Landings every 50 ms for 2.5 s: only the bound ends the wait.
        assert!(arrivals.gather(MINUTE, at_most));
        assert!(started.elapsed() >= at_most, "stopped before the bound");
        let coming = arrivals.coming();
        assert!(coming > 0, "waited past the bound, until all had landed");
        assert!(coming < 50, "none landed while it waited");
        dropping.join().map_err(|_| "dropping thread panicked")
    }

    #[test]
    fn only_the_first_thread_to_gather_waits() -> Result<(), &'static str> {
        let arrivals = Arc::new(Arrivals::default());
        let held = arrivals.arrive();
        assert!(arrivals.gather(Duration::from_millis(1), Duration::from_millis(1)));
        let other = Arc::clone(&arrivals);
        let waited = std::thread::spawn(move || other.gather(MINUTE, MINUTE)).join().map_err(|_| "panicked")?;
        assert!(!waited, "a second store's writer would never be woken: it must not wait");
        drop(held);
        Ok(())
    }
}
