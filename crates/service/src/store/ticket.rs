//! [`Ticket`]: a wait for one record to become durable.

use super::error::StoreError;

/// Waits for one record to become durable.
pub struct Ticket(pub(super) tokio::sync::oneshot::Receiver<Result<(), String>>);

impl Ticket {
    /// Resolves once the record and every earlier record are durable.
    ///
    /// # Errors
    /// The commit failed or the writer stopped: the answer must not be
    /// released (its charge may or may not be on disk; it stays charged in
    /// memory either way).
    pub async fn durable(self) -> Result<(), StoreError> {
        Self::outcome(self.0.await)
    }

    /// As [`Ticket::durable`], blocking the thread (the store's own tests).
    ///
    /// # Errors
    /// As [`Ticket::durable`].
    #[cfg(test)]
    pub fn wait(self) -> Result<(), StoreError> {
        Self::outcome(self.0.blocking_recv())
    }

    pub(super) fn outcome(
        received: Result<Result<(), String>, tokio::sync::oneshot::error::RecvError>,
    ) -> Result<(), StoreError> {
        match received {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::Unconfirmed(e)),
            Err(_) => Err(StoreError::WriterGone),
        }
    }
}
