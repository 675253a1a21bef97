//! [`Ticket`]: a wait for one record to become durable.

use super::error::StoreError;
use tokio::sync::watch;

/// What the writer reports for one record: `None` until its commit ends.
pub(super) type Outcome = Option<Result<(), String>>;

/// Waits for one record to become durable. Cloned where a later step must
/// wait for an earlier one's record (a cached answer of a step still being
/// committed, see [`crate::store::cell`]).
#[derive(Clone)]
pub struct Ticket(pub(super) watch::Receiver<Outcome>);

impl Ticket {
    /// A ticket and the writer's end of it.
    pub(super) fn new() -> (watch::Sender<Outcome>, Ticket) {
        let (done, wait) = watch::channel(None);
        (done, Ticket(wait))
    }

    /// Resolves once the record and every earlier record are durable.
    ///
    /// # Errors
    /// The commit failed or the writer stopped: the answer must not be
    /// released (its charge may or may not be on disk; it stays charged in
    /// memory either way).
    pub async fn durable(mut self) -> Result<(), StoreError> {
        match self.0.wait_for(Option::is_some).await {
            Ok(outcome) => Self::outcome(outcome.clone()),
            Err(_) => Err(StoreError::WriterGone),
        }
    }

    /// Whether the record is durable already (a wait would not wait).
    pub fn is_durable(&self) -> bool {
        matches!(*self.0.borrow(), Some(Ok(())))
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

    fn outcome(outcome: Outcome) -> Result<(), StoreError> {
        match outcome {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(StoreError::Unconfirmed(e)),
            None => Err(StoreError::WriterGone),
        }
    }
}
