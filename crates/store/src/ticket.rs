//! [`Ticket`]: a wait for one record to become durable.

use super::error::StoreError;
use std::sync::{Arc, OnceLock};
use tokio::sync::Notify;

/// How one record's commit ended.
#[derive(Debug)]
enum Outcome {
    Committed,
    Failed(String),
    /// The writer dropped the record without committing it.
    WriterGone,
}

/// What a ticket and the writer share: small, because a session keeps the
/// ticket of its last charged record (see [`crate::cell`]).
#[derive(Debug, Default)]
struct Shared {
    outcome: OnceLock<Outcome>,
    ended: Notify,
}

/// Waits for one record to become durable. Cloned where a later step must
/// know whether an earlier one's record is durable (a cached answer of a
/// step that may still be committing, see [`crate::cell`]).
#[derive(Clone, Debug)]
pub struct Ticket(Arc<Shared>);

/// The writer's end of a [`Ticket`]: reports the commit's outcome once;
/// dropped unreported, it reports [`StoreError::WriterGone`].
pub(super) struct Done(Arc<Shared>);

impl Done {
    /// Reports how the record's commit ended and wakes every waiter.
    pub(super) fn report(self, result: &Result<(), String>) {
        let outcome = match result {
            Ok(()) => Outcome::Committed,
            Err(e) => Outcome::Failed(e.clone()),
        };
        let _ = self.0.outcome.set(outcome);
        // Drop wakes the waiters.
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        let _ = self.0.outcome.set(Outcome::WriterGone);
        self.0.ended.notify_waiters();
    }
}

impl Ticket {
    /// A ticket and the writer's end of it.
    pub(super) fn new() -> (Done, Ticket) {
        let shared = Arc::new(Shared::default());
        (Done(Arc::clone(&shared)), Ticket(shared))
    }

    /// Resolves once the record and every earlier record are durable.
    ///
    /// # Errors
    /// The commit failed or the writer stopped: the answer must not be
    /// released (its charge may or may not be on disk; it stays charged in
    /// memory either way).
    pub async fn durable(self) -> Result<(), StoreError> {
        loop {
            // Registered before the check, so a report in between still
            // wakes this waiter.
            let ended = self.0.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if let Some(outcome) = self.0.outcome.get() {
                return match outcome {
                    Outcome::Committed => Ok(()),
                    Outcome::Failed(e) => Err(StoreError::Unconfirmed(e.clone())),
                    Outcome::WriterGone => Err(StoreError::WriterGone),
                };
            }
            ended.await;
        }
    }

    /// Whether the record is durable already (a wait would not wait).
    pub fn is_durable(&self) -> bool {
        matches!(self.0.outcome.get(), Some(Outcome::Committed))
    }

    /// As [`Ticket::durable`], blocking the thread (the store's own tests).
    ///
    /// # Errors
    /// As [`Ticket::durable`].
    #[cfg(test)]
    pub fn wait(self) -> Result<(), StoreError> {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|_| StoreError::WriterGone)?
            .block_on(self.durable())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    /// A session keeps its last charged ticket while idle: it must stay
    /// small beside the ~1.8 KiB of an idle session (`BENCHMARKS.md`).
    #[test]
    fn a_ticket_is_small() {
        assert!(size_of::<Shared>() <= 96, "{} bytes", size_of::<Shared>());
    }

    #[tokio::test]
    async fn every_clone_learns_the_outcome_and_a_dropped_writer_end_is_writer_gone() {
        let (done, ticket) = Ticket::new();
        let waiting = tokio::spawn(ticket.clone().durable());
        tokio::task::yield_now().await;
        assert!(!ticket.is_durable());
        done.report(&Ok(()));
        assert!(waiting.await.is_ok_and(|r| r.is_ok()));
        assert!(ticket.is_durable() && ticket.clone().durable().await.is_ok());

        let (done, ticket) = Ticket::new();
        done.report(&Err("disk full".into()));
        assert!(matches!(ticket.clone().durable().await, Err(StoreError::Unconfirmed(e)) if e == "disk full"));
        assert!(!ticket.is_durable());

        let (done, ticket) = Ticket::new();
        drop(done);
        assert!(matches!(ticket.durable().await, Err(StoreError::WriterGone)));
    }
}
