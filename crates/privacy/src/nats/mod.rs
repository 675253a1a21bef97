//! [`Nats`]: a mutual-information quantity in natural-log units.
//!
//! The paper's budgets (b per query, B in total) are MI in nats (§2.1, Eq. 2
//! uses natural logarithms: that is what reproduces Table 1). A bare `f64`
//! never crosses a module boundary as a privacy parameter: the constructor
//! proves the value is finite and non-negative.

use super::PrivacyError;
use std::fmt;
use std::str::FromStr;

/// A finite, non-negative amount of mutual information, in nats.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Default, serde::Serialize)]
pub struct Nats(f64);

impl Nats {
    /// Zero nats: what a unanimous answer costs under the `contested` policy.
    pub const ZERO: Nats = Nats(0.0);

    /// Checks that `value` is finite and ≥ 0.
    ///
    /// # Errors
    /// [`PrivacyError::InvalidNats`] otherwise.
    pub fn new(value: f64) -> Result<Self, PrivacyError> {
        if value.is_finite() && value >= 0.0 {
            // Normalise −0.0 so that comparisons and printing are unsurprising.
            Ok(Nats(value + 0.0))
        } else {
            Err(PrivacyError::InvalidNats { what: "MI", value })
        }
    }

    /// The value in nats.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl fmt::Display for Nats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Shortest representation that round-trips: budgets like 2^-32 must
        // print exactly, not as a rounded decimal.
        write!(f, "{:e}", self.0)
    }
}

/// Parses `0.0039`, `1e-5`, `2^-32` and `2**-32` (exact powers of two).
impl FromStr for Nats {
    type Err = PrivacyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PrivacyError::ParseNats { input: s.to_owned() };
        let t = s.trim();
        let value = if let Some(exp) = t.strip_prefix("2^").or_else(|| t.strip_prefix("2**")) {
            let exp: i32 = exp.trim().trim_start_matches('(').trim_end_matches(')').parse().map_err(|_| err())?;
            if !(-1074..=1023).contains(&exp) {
                return Err(err());
            }
            2f64.powi(exp)
        } else {
            t.parse::<f64>().map_err(|_| err())?
        };
        Nats::new(value).map_err(|_| err())
    }
}

#[cfg(test)]
mod test;
