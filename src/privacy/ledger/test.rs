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
