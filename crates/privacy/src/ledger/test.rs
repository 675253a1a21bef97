use super::*;
use proptest::prelude::*;

fn n(x: f64) -> Nats {
    Nats::new(x).expect("valid")
}

#[test]
fn paper_policy_charges_every_answer() -> Result<(), PrivacyError> {
    let l = Ledger::new(n(0.25), n(1.0), Policy::Paper)?;
    assert_eq!(l.charge_for(true), n(0.25));
    assert_eq!(l.charge_for(false), n(0.25));
    Ok(())
}

#[test]
fn contested_policy_makes_unanimous_answers_free() -> Result<(), PrivacyError> {
    let mut l = Ledger::new(n(0.25), n(0.25), Policy::Contested)?;
    l.record(l.charge_for(false))?;
    // Spent: a contested answer is refused, a unanimous one still answered.
    assert!(matches!(l.check(l.charge_for(false)), Err(PrivacyError::BudgetExhausted { .. })));
    l.record(l.charge_for(true))?;
    assert_eq!((l.answered(), l.charged(), l.spent()), (2, 1, n(0.25)));
    Ok(())
}

#[test]
fn refuses_exactly_when_spent_plus_charge_exceeds_limit() -> Result<(), PrivacyError> {
    let mut l = Ledger::new(n(0.25), n(0.75), Policy::Paper)?;
    for _ in 0..3 {
        l.record(n(0.25))?; // 0.75 = limit is allowed
    }
    let before = l.clone();
    let err = l.record(n(0.25));
    assert_eq!(err, Err(PrivacyError::BudgetExhausted { spent: n(0.75), budget: n(0.75), charge: n(0.25) }));
    assert_eq!(l, before);
    assert_eq!(l.remaining(), 0.0);
    Ok(())
}

#[test]
fn restore_and_policy_parsing_validate() {
    assert!(Ledger::restore(n(0.1), n(1.0), Policy::Paper, n(0.2), 1, 2).is_err());
    assert!(Ledger::new(n(1e-40), n(1.0), Policy::Paper).is_err());
    assert_eq!("contested".parse::<Policy>(), Ok(Policy::Contested));
    assert_eq!(Policy::Paper.to_string(), "paper");
    assert!("generous".parse::<Policy>().is_err());
}

proptest! {
    /// Whatever the sequence of unanimous/contested answers, spent never
    /// exceeds the limit and never undercounts the charges.
    #[test]
    fn budget_is_never_exceeded(b in 1e-9f64..0.1, limit in 0.0f64..1.0, qs in prop::collection::vec(any::<bool>(), 0..400), contested in any::<bool>()) {
        let policy = if contested { Policy::Contested } else { Policy::Paper };
        let mut l = Ledger::new(n(b), n(limit), policy).expect("valid");
        let mut exact = 0.0f64;
        for unanimous in qs {
            let c = l.charge_for(unanimous);
            if l.record(c).is_ok() {
                exact += c.get();
            }
            prop_assert!(l.spent().get() <= limit);
        }
        prop_assert!(l.spent().get() >= exact * (1.0 - 1e-12));
        prop_assert!(l.charged() <= l.answered());
    }
}

// ---- docs/assurance/accounting.md §1.4 and §3: the ledger's arithmetic ----

use crate::conservative::add_up;

proptest! {
    /// After any sequence of charges (mixed magnitudes, so that sums need
    /// rounding), spent is exactly the rounded-up running sum of the
    /// accepted charges; a charge is refused iff that sum would exceed the
    /// limit, and then nothing changes; spent never exceeds the limit and is
    /// never below the exact real sum (checked in exact integer arithmetic:
    /// charges are k·2^e with e ≥ −60, scaled by 2^110).
    #[test]
    fn spent_is_the_rounded_up_sum_of_accepted_charges(
        charges in prop::collection::vec((1u64..256, -60i32..0), 0..300),
        limit in 0.0f64..64.0,
        contested in any::<bool>(),
    ) {
        let policy = if contested { Policy::Contested } else { Policy::Paper };
        let mut l = Ledger::new(n(2f64.powi(-20)), n(limit), policy).expect("valid");
        let (mut expected, mut exact) = (Nats::ZERO, 0i128);
        let scaled = |x: f64| -> i128 { (x * 2f64.powi(110)) as i128 };
        for (k, e) in charges {
            let c = n(k as f64 * 2f64.powi(e));
            let before = l.clone();
            let after = add_up(expected, c).expect("finite");
            prop_assert_eq!(l.check(c).is_ok(), after <= l.limit());
            match l.record(c) {
                Ok(()) => {
                    prop_assert!(after <= l.limit());
                    expected = after;
                    exact += scaled(c.get());
                    prop_assert_eq!(l.answered(), before.answered() + 1);
                }
                Err(err) => {
                    prop_assert!(after > l.limit());
                    prop_assert_eq!(err, PrivacyError::BudgetExhausted { spent: before.spent(), budget: before.limit(), charge: c });
                    prop_assert_eq!(&l, &before);
                }
            }
            prop_assert_eq!(l.spent(), expected);
            prop_assert!(l.spent().get() <= limit);
            // spent ≥ the exact sum; truncating spent·2^110 only drops what
            // lies beyond the exact sum (a multiple of 2^−60).
            prop_assert!(scaled(l.spent().get()) >= exact);
        }
    }

    /// Under `contested`, spent is explained by the charged answers alone:
    /// it is the rounded-up sum of exactly `charged` copies of b (unanimous
    /// answers add nothing), so charged·b ≤ spent ≤ charged·b·(1 + charged·2⁻⁵²),
    /// and for b a power of two spent = charged·b exactly.
    #[test]
    fn contested_spending_is_the_charged_answers_times_b(
        b in prop_oneof![1e-9f64..0.1, (1i32..=40).prop_map(|e| 2f64.powi(-e))],
        qs in prop::collection::vec(any::<bool>(), 0..400),
        limit_in_b in 0.0f64..300.0,
    ) {
        let mut l = Ledger::new(n(b), n(limit_in_b * b), Policy::Contested).expect("valid");
        for unanimous in qs {
            let _ = l.record(l.charge_for(unanimous));
        }
        let mut sum = Nats::ZERO;
        for _ in 0..l.charged() {
            sum = add_up(sum, n(b)).expect("finite");
        }
        prop_assert_eq!(l.spent(), sum);
        let product = l.charged() as f64 * b;
        prop_assert!(l.spent().get() >= product * (1.0 - f64::EPSILON));
        prop_assert!(l.spent().get() <= product * (1.0 + (l.charged() as f64 + 1.0) * f64::EPSILON));
        if b.log2().fract() == 0.0 {
            prop_assert_eq!(l.spent().get(), product);
        }
    }
}

proptest! {
    /// Issue 53 §6: the check before a request draws (`check_charges(n)`)
    /// lets it through exactly when its n rows' records, one after the
    /// other, all fit, and returns the spent total they leave — whatever
    /// b, the spending before and the limit (b with a long mantissa, so
    /// that the sums round).
    #[test]
    fn the_check_before_the_draw_is_the_rows_records(
        b in prop_oneof![1e-9f64..0.5, (1i32..=40).prop_map(|e| 2f64.powi(-e))],
        before in 0u64..200,
        rows in 0u64..64,
        limit_in_b in 0.0f64..300.0,
    ) {
        let mut l = Ledger::new(n(b), n(limit_in_b * b), Policy::Paper).expect("valid");
        for _ in 0..before {
            let _ = l.record(n(b));
        }
        let checked = l.check_charges(rows);
        let mut recorded = l.clone();
        let all_fit = (0..rows).all(|_| recorded.record(n(b)).is_ok());
        prop_assert_eq!(checked.is_ok(), all_fit);
        if let Ok(after) = checked {
            prop_assert_eq!(after, recorded.spent());
        }
    }
}

/// The edge a single rounded sum misses: with b = 0.1 (every sum
/// rounds), k rows' records one after the other reach a total that k·0.1
/// rounded once is not, for many k. Against a limit at the records'
/// total the check lets k rows through, one step below it refuses them;
/// the single sum would have decided one of the two wrongly.
#[test]
fn the_check_before_the_draw_rounds_as_the_records_do() -> Result<(), PrivacyError> {
    let b = n(0.1);
    let mut records = Nats::ZERO;
    let mut disagreements = 0;
    for k in 1..200u64 {
        records = add_up(records, b)?;
        let at = Ledger::new(b, records, Policy::Paper)?;
        assert_eq!(at.check_charges(k)?, records, "{k} rows against their records' total");
        let below = Ledger::new(b, n(records.get().next_down()), Policy::Paper)?;
        assert!(matches!(below.check_charges(k), Err(PrivacyError::BudgetExhausted { .. })), "{k} rows, below");
        if add_up(Nats::ZERO, n(k as f64 * 0.1))? != records {
            disagreements += 1;
        }
    }
    assert!(disagreements > 10, "b = 0.1 should show the edge: {disagreements} disagreements");
    Ok(())
}
