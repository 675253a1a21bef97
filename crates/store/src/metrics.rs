//! What a backend reports of its commits, to whoever counts them: the
//! service registers them as `pacpriv_store_commit_duration` and
//! `pacpriv_store_commit_batch_size`. The store links no metrics library.

use std::sync::Arc;

/// Told of every commit once it is durable.
pub trait CommitObserver: Send + Sync {
    /// One commit of `records` session records took `seconds` to make
    /// durable (embedded: one group commit; PostgreSQL: one step's
    /// transaction).
    fn commit(&self, seconds: f64, records: usize);
}

/// Where a backend reports its commits; by default, nowhere.
#[derive(Clone)]
pub struct StoreMetrics(Arc<dyn CommitObserver>);

impl StoreMetrics {
    /// Reports to `observer`.
    pub fn new(observer: Arc<dyn CommitObserver>) -> Self {
        StoreMetrics(observer)
    }

    /// Records one commit of `records` session records.
    pub fn commit(&self, seconds: f64, records: usize) {
        self.0.commit(seconds, records);
    }
}

impl Default for StoreMetrics {
    fn default() -> Self {
        StoreMetrics(Arc::new(Uncounted))
    }
}

/// Counts nothing: a store opened without metrics (tools, tests).
struct Uncounted;

impl CommitObserver for Uncounted {
    fn commit(&self, _seconds: f64, _records: usize) {}
}
