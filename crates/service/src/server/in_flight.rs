//! Per-principal cap on calls in flight
//! (`server.max_calls_in_flight_per_principal`): one principal's clients
//! cannot hold every task, teacher batch slot and store round trip of the
//! server, whatever the rate limit (off by default) lets through.
//!
//! # Invariants
//! - A call over the cap is refused before its input is validated or any
//!   teacher is asked: RESOURCE_EXHAUSTED (HTTP 429) with error reason
//!   `TOO_MANY_IN_FLIGHT`, nothing charged, the session untouched.
//! - A unary query holds one place from admission to its answer; a
//!   `PredictStream` holds one for its whole life (its messages are asked
//!   one at a time, paced by the rate limit).
//! - Places are counted per principal, whatever the session scope, and
//!   given back when the call's [`Place`] drops, however it ends.

use super::status::ServiceError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// The calls each principal has in flight, against one cap.
pub struct InFlight {
    max: usize,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

/// One call's place; given back when dropped.
#[derive(Debug)]
pub struct Place {
    principal: String,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

impl InFlight {
    /// At most `max` calls in flight per principal.
    pub fn new(max: usize) -> Self {
        InFlight { max, held: Arc::default() }
    }

    /// A place for one more call of `principal`.
    ///
    /// # Errors
    /// [`ServiceError::TooManyInFlight`] when it holds `max` already.
    pub fn enter(&self, principal: &str) -> Result<Place, ServiceError> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(principal.to_owned()).or_default();
        if *count >= self.max {
            return Err(ServiceError::TooManyInFlight { max: self.max });
        }
        *count += 1;
        Ok(Place { principal: principal.to_owned(), held: Arc::clone(&self.held) })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.principal) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.principal);
            }
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn a_principal_past_its_cap_is_refused_until_a_call_ends() {
        let in_flight = InFlight::new(2);
        let (a, _b) = (in_flight.enter("alice").expect("first"), in_flight.enter("alice").expect("second"));
        assert!(matches!(in_flight.enter("alice"), Err(ServiceError::TooManyInFlight { max: 2 })));
        let _bob = in_flight.enter("bob").expect("another principal has its own places");
        drop(a);
        let _again = in_flight.enter("alice").expect("a place given back");
    }
}
