use super::sim::{self, Forecast, Refusal, Votes};
use super::*;

fn n(x: f64) -> Nats {
    Nats::new(x).expect("valid")
}

fn pow2(e: i32) -> Nats {
    n(2f64.powi(e))
}

/// Four teachers, three classes, five examples: 0 and 1 unanimous (0
/// correct, 1 wrong), 2–4 contested.
fn small_votes() -> Votes {
    let labels = vec![vec![0, 0, 0, 0], vec![1, 1, 1, 1], vec![0, 1, 1, 1], vec![2, 2, 0, 2], vec![0, 1, 2, 0]];
    let truth = vec![0, 2, 1, 2, 0];
    Votes::new(labels, truth, 3).expect("valid votes")
}

#[test]
fn votes_count_unanimous_and_average_teachers() {
    let v = small_votes();
    assert_eq!((v.len(), v.teachers(), v.unanimous(), v.unanimous_correct()), (5, 4, 2, 1));
    // Teacher 0 gets examples 0, 3, 4 right; teacher 1: 0, 2, 3; teacher 2:
    // 0, 2; teacher 3: 0, 2, 3, 4.
    assert_eq!(v.teacher_accuracy(0), 3.0 / 5.0);
    assert_eq!(v.teacher_accuracy(3), 4.0 / 5.0);
    assert!((v.serving_accuracy() - (3.0 + 3.0 + 2.0 + 4.0) / 20.0).abs() < 1e-15);
}

#[test]
fn votes_reject_bad_shapes() {
    assert!(Votes::new(vec![], vec![], 3).is_err());
    assert!(Votes::new(vec![vec![0, 1]], vec![0, 1], 3).is_err(), "rows ≠ truths");
    assert!(Votes::new(vec![vec![0, 1], vec![0]], vec![0, 1], 3).is_err(), "ragged");
    assert!(Votes::new(vec![vec![]], vec![0], 3).is_err(), "no teachers");
    assert!(Votes::new(vec![vec![0, 3]], vec![0], 3).is_err(), "label ≥ d");
    assert!(Votes::new(vec![vec![0, 1]], vec![3], 3).is_err(), "truth ≥ d");
}

#[test]
fn accuracy_is_at_least_the_unanimous_and_correct_share() -> Result<(), PrivacyError> {
    let v = small_votes();
    for e in [-2, -16, -32] {
        for _ in 0..20 {
            let correct = sim::accuracy_trial(&v, pow2(e), &mut rand::rng())?;
            assert!((v.unanimous_correct()..=v.len() - 1).contains(&correct), "b = 2^{e}: {correct}");
        }
    }
    Ok(())
}

/// Unanimous-only: the two unanimous examples answered (one correctly),
/// the three contested ones refused, nothing spent, even on a budget of
/// one answer.
#[test]
fn unanimous_only_answers_the_unanimous_examples_and_spends_nothing() -> Result<(), PrivacyError> {
    let v = small_votes();
    for _ in 0..10 {
        let (answered, correct, spent) = sim::unanimous_only_run(&v, pow2(-8), pow2(-8), &mut rand::rng())?;
        assert_eq!((answered, correct, spent), (v.unanimous(), v.unanimous_correct(), Nats::ZERO));
    }
    Ok(())
}

#[test]
fn unanimous_votes_are_answered_exactly() -> Result<(), PrivacyError> {
    let v = Votes::new(vec![vec![2; 6], vec![1; 6], vec![0; 6]], vec![2, 0, 0], 3)?;
    assert_eq!(sim::accuracy_trial(&v, pow2(-32), &mut rand::rng())?, 2);
    Ok(())
}

#[test]
fn paper_answers_exactly_floor_budget_over_b() -> Result<(), PrivacyError> {
    let v = small_votes();
    for (b, budget) in [(-8, -5), (-10, -4), (-3, -4), (-6, -6)] {
        let (b, budget) = (pow2(b), pow2(budget));
        let want = report::max_queries(b, budget);
        let run = sim::answers_until_refusal(&v, b, budget, Policy::Paper, 10_000, &mut rand::rng())?;
        assert_eq!(run, Refusal { answered: want, refused: true }, "b = {b}, B = {budget}");
    }
    Ok(())
}

#[test]
fn contested_lands_within_the_forecast() -> Result<(), PrivacyError> {
    let v = small_votes();
    let (b, budget) = (pow2(-8), pow2(-5));
    let charged = report::max_queries(b, budget);
    assert_eq!(charged, 8);
    let f = sim::contested_forecast(5, 2, charged).expect("some queries are contested");
    for _ in 0..50 {
        let run = sim::answers_until_refusal(&v, b, budget, Policy::Contested, 10_000, &mut rand::rng())?;
        assert!(run.refused);
        assert!((f.low..=f.high).contains(&run.answered), "{run:?} outside {f:?}");
    }
    Ok(())
}

#[test]
fn the_cap_stops_a_run_without_refusal() -> Result<(), PrivacyError> {
    let v = small_votes();
    for policy in [Policy::Paper, Policy::Contested] {
        let run = sim::answers_until_refusal(&v, pow2(-20), pow2(-8), policy, 7, &mut rand::rng())?;
        assert_eq!(run, Refusal { answered: 7, refused: false });
    }
    // All unanimous under contested: nothing is ever charged.
    let all = Votes::new(vec![vec![1; 4]; 3], vec![1, 0, 1], 2)?;
    let run = sim::answers_until_refusal(&all, pow2(-2), pow2(-3), Policy::Contested, 1000, &mut rand::rng())?;
    assert_eq!(run, Refusal { answered: 1000, refused: false });
    assert_eq!(sim::contested_forecast(3, 3, 0), None);
    Ok(())
}

/// Every arrangement of `contested` C's among n slots, as booleans.
fn arrangements(n: usize, contested: usize) -> Vec<Vec<bool>> {
    (0u32..1 << n)
        .filter(|mask| mask.count_ones() as usize == contested)
        .map(|mask| (0..n).map(|i| mask >> i & 1 == 1).collect())
        .collect()
}

#[test]
fn forecast_matches_enumeration() {
    // n = 5 with 3 contested: every pair of passes is equally likely, and
    // K ≤ 5 contested answers fit in two passes.
    let (n, contested) = (5, 3);
    let passes = arrangements(n, contested);
    for charged in 0..=5u64 {
        let mut counts = Vec::new();
        for first in &passes {
            for second in &passes {
                let stream = first.iter().chain(second);
                let refused_at = stream.enumerate().filter(|(_, c)| **c).nth(charged as usize).map(|(i, _)| i);
                counts.push(refused_at.expect("two passes hold 6 contested queries") as u64);
            }
        }
        let mean = counts.iter().sum::<u64>() as f64 / counts.len() as f64;
        let (low, high) = (*counts.iter().min().expect("some"), *counts.iter().max().expect("some"));
        let f = sim::contested_forecast(n as u64, (n - contested) as u64, charged).expect("contested queries");
        assert_eq!((f.low, f.high), (low, high), "K = {charged}");
        assert!((f.expected - mean).abs() < 1e-12, "K = {charged}: {} vs {mean}", f.expected);
    }
}

#[test]
fn forecast_of_a_large_budget() {
    // 2^24 charged answers, 79 of 359 contested per pass.
    let f = sim::contested_forecast(359, 280, 1 << 24).expect("contested queries");
    let (q, r) = ((1u64 << 24) / 79, (1u64 << 24) % 79);
    assert_eq!(
        f,
        Forecast {
            low: q * 359 + r,
            high: q * 359 + r + 280,
            expected: (q * 359) as f64 + (r + 1) as f64 * 360.0 / 80.0 - 1.0
        }
    );
}

#[test]
fn summary_of_trials() {
    let s = sim::summarize(&[1.0, 2.0, 3.0, 4.0]).expect("non-empty");
    assert_eq!((s.mean, s.min, s.max), (2.5, 1.0, 4.0));
    let se = s.se.expect("two or more values");
    assert!((se - (5.0f64 / 3.0 / 4.0).sqrt()).abs() < 1e-15);
    assert_eq!(sim::summarize(&[7.0]).expect("non-empty").se, None);
    assert_eq!(sim::summarize(&[]), None);
    assert_eq!(mean_se(&s), "2.50 ± 0.65");
}

#[test]
fn numbers_print_grouped() {
    assert_eq!(thousands(0u64), "0");
    assert_eq!(thousands(999u64), "999");
    assert_eq!(thousands(1000u64), "1,000");
    assert_eq!(thousands(16_777_216u64), "16,777,216");
    assert_eq!(thousands_f(1234.56, 1), "1,234.6");
    assert_eq!(thousands_f(3.5, 1), "3.5");
    assert_eq!(power_of_two(pow2(-8)), "2^-8");
    assert_eq!(power_of_two(n(0.001)), "1e-3");
}

#[test]
fn per_query_list_and_budget_parse() -> anyhow::Result<()> {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }
    let a = Cli::try_parse_from(["utility"])?.args;
    let given: Vec<&str> = a.per_query_mi.iter().map(|b| b.given.as_str()).collect();
    assert_eq!(given, DEFAULT_PER_QUERY.split(',').collect::<Vec<_>>());
    assert_eq!(a.per_query_mi[7].nats, pow2(-32));
    assert_eq!((a.trials, a.max_queries, a.budget_mi.is_none()), (20, 1_000_000, true));
    let a = Cli::try_parse_from(["utility", "--per-query-mi", "2^-4,0.001", "--budget-mi", "2^-6"])?.args;
    assert_eq!(a.per_query_mi.iter().map(|b| b.nats).collect::<Vec<_>>(), vec![pow2(-4), n(0.001)]);
    assert_eq!(a.budget_mi.map(|b| b.nats), Some(pow2(-6)));
    assert!(Cli::try_parse_from(["utility", "--per-query-mi", "2^-4,-1"]).is_err());
    assert!(Cli::try_parse_from(["utility", "--budget-mi", "lots"]).is_err());
    assert!(Cli::try_parse_from(["utility", "--trials", "0"]).is_err());
    Ok(())
}
