use super::*;
use proptest::prelude::*;

fn n(x: f64) -> Nats {
    Nats::new(x).expect("test values are valid")
}

#[test]
fn exact_sums_are_not_rounded() -> Result<(), PrivacyError> {
    assert_eq!(add_up(n(0.5), n(0.25))?.get(), 0.75);
    assert_eq!(mul_up(1_000_000, n(2f64.powi(-32)))?.get(), 1e6 * 2f64.powi(-32));
    Ok(())
}

#[test]
fn inexact_sums_round_up() -> Result<(), PrivacyError> {
    // 0.1 + 0.2 rounds to nearest *above* 0.3's double already; 1 + 2^-60 rounds down to 1.
    let s = add_up(n(1.0), n(2f64.powi(-60)))?;
    assert!(s.get() > 1.0);
    Ok(())
}

#[test]
fn overflow_is_an_error() {
    assert!(add_up(n(f64::MAX), n(f64::MAX)).is_err());
    assert!(mul_up(u64::MAX, n(f64::MAX)).is_err());
}

proptest! {
    /// The rounded-up sum is never below the exact real sum (checked with
    /// exact rational arithmetic via i128 on dyadic inputs).
    #[test]
    fn add_up_never_below_exact(a in 0u64..(1 << 52), ea in -60i32..0, b in 0u64..(1 << 52), eb in -60i32..0) {
        let x = a as f64 * 2f64.powi(ea - 52);
        let y = b as f64 * 2f64.powi(eb - 52);
        let s = add_up(n(x), n(y)).expect("finite").get();
        // Scale everything by 2^112 to compare exactly as integers.
        let scale = |v: f64| -> i128 { (v * 2f64.powi(112)) as i128 };
        prop_assert!(scale(s) >= scale(x) + scale(y));
        prop_assert!(s <= (x + y).next_up());
    }

    #[test]
    fn repeated_charges_never_undercount(k in 1u64..5000, b in 1e-12f64..1e-2) {
        let mut spent = Nats::ZERO;
        for _ in 0..k {
            spent = add_up(spent, n(b)).expect("finite");
        }
        let product = mul_up(k, n(b)).expect("finite");
        // Both are upper bounds of the real k·b; the product's error is one ulp.
        prop_assert!(spent.get() >= product.get() * (1.0 - 1e-15));
        prop_assert!(spent.get() >= (k as f64) * b * (1.0 - 1e-15));
    }
}
