//! Arithmetic that rounds privacy loss *up*.
//!
//! Spent MI is a sum of many per-query charges (10⁶ × 2⁻³² and decimals such
//! as 0.0039 that are not exact in binary). Round-to-nearest can round a sum
//! down, which would let a session spend slightly more than it is charged.
//! These helpers compute the exact rounding error (TwoSum / FMA) and step one
//! ulp up whenever the rounded result is below the real one. Modeled on
//! OpenDP's `InfAdd`/`InfMul`. Non-finite results are errors.

use super::{Nats, PrivacyError};

/// a + b, rounded toward +∞.
///
/// # Errors
/// [`PrivacyError::InvalidNats`] if the sum overflows.
pub fn add_up(a: Nats, b: Nats) -> Result<Nats, PrivacyError> {
    let (x, y) = (a.get(), b.get());
    let s = x + y;
    // Knuth's TwoSum: err is the exact real (x + y) − s.
    let bb = s - x;
    let err = (x - (s - bb)) + (y - bb);
    let up = if err > 0.0 { s.next_up() } else { s };
    Nats::new(up).map_err(|_| PrivacyError::InvalidNats { what: "sum of charges", value: up })
}

/// n · b, rounded toward +∞.
///
/// # Errors
/// [`PrivacyError::InvalidNats`] if the product overflows.
pub fn mul_up(n: u64, b: Nats) -> Result<Nats, PrivacyError> {
    // n itself may not be exact as f64 above 2^53: round it up first.
    let mut nf = n as f64;
    if (nf as u128) < n as u128 {
        nf = nf.next_up();
    }
    let p = nf * b.get();
    // FMA gives the exact residual nf·b − p.
    let err = nf.mul_add(b.get(), -p);
    let up = if err > 0.0 { p.next_up() } else { p };
    Nats::new(up).map_err(|_| PrivacyError::InvalidNats { what: "product of charges", value: up })
}

#[cfg(test)]
mod test;
