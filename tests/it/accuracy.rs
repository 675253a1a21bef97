//! The paper's Table 3 on the demo data, through the live service: the
//! held-out split is answered at several per-query budgets b and compared
//! with what the serving teacher alone and the unanimous teachers get.
//!
//! b = ∞ is measured at b = 2^40: the service has no "no noise" switch (a
//! privacy product should not), and at 2^40 the label noise has standard
//! deviation below 1e-6, far too small to move an argmax of a one-hot.

use crate::util::{Process, client, image, predict};
use pacpriv_demo::Trained;
use tokio::task::JoinSet;

/// The seed of config/default.toml's demo and of `pacpriv teachers`.
const SEED: u64 = 20261123;
const M: usize = 128;
/// Any fixed index: the test must know which teacher serves.
const SECRET: usize = 37;

#[tokio::test(flavor = "multi_thread")]
async fn accuracy_follows_table_3() {
    let ensemble = Trained::train(M, SEED).expect("demo trains");
    let test = &ensemble.split.test;
    let pixels: Vec<Vec<f64>> = test.iter().map(|e| e.pixels.iter().map(|&p| f64::from(p)).collect()).collect();
    let serving_correct =
        test.iter().zip(&pixels).filter(|(e, x)| ensemble.teachers[SECRET].predict(x) == e.digit).count();
    let unanimous_correct =
        test.iter().zip(&pixels).filter(|(e, x)| ensemble.teachers.iter().all(|t| t.predict(x) == e.digit)).count();
    let full = ensemble.full_data_model().expect("trains");
    let full_correct = test.iter().zip(&pixels).filter(|(e, x)| full.predict(x) == e.digit).count();

    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("teachers.toml");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, format!("{SECRET}\n")).expect("write secret");
    let _teachers = Process::teachers(M, SEED, &cfg);

    let n = test.len();
    let pct = |k: usize| 100.0 * k as f64 / n as f64;
    println!("\ndemo: optical digits, m = {M}, {n} held-out examples, secret teacher {SECRET}");
    println!("| setting | accuracy |\n|---|---|");
    println!("| non-private (one model on all training data) | {:.2} % |", pct(full_correct));
    println!("| serving teacher alone | {:.2} % |", pct(serving_correct));
    println!("| all {M} teachers unanimous and correct | {:.2} % |", pct(unanimous_correct));
    for (name, b) in [("∞ (2^40)", 40), ("2^-8", -8), ("2^-16", -16), ("2^-32", -32)] {
        let per_query = 2f64.powi(b);
        let env = vec![
            ("PACPRIV__PRIVACY__PER_QUERY_MI", format!("2^{b}")),
            ("PACPRIV__PRIVACY__SECRET_INDEX_FILE", secret.display().to_string()),
            ("PACPRIV__PRINCIPALS__DEMO__BUDGET_MI", format!("{}", per_query * (n as f64 + 1.0))),
        ];
        let server = Process::serve(Some(&cfg), &env);
        let labels = answer_all(&server.addr, &pixels).await;
        let correct = labels.iter().zip(test).filter(|(l, e)| **l as usize == e.digit).count();
        println!("| private, b = {name} | {:.2} % |", pct(correct));
        if b == 40 {
            assert_eq!(correct, serving_correct, "b → ∞ must be the serving teacher exactly");
        }
        // Unanimous answers are exact, so they are always right.
        assert!(correct >= unanimous_correct, "b = {name}: {correct} < unanimous-and-correct {unanimous_correct}");
    }
}

/// The service's label for every example, at most 16 queries in flight.
async fn answer_all(addr: &str, pixels: &[Vec<f64>]) -> Vec<u32> {
    let c = client(addr).await;
    let mut labels = vec![u32::MAX; pixels.len()];
    let mut answers = JoinSet::new();
    for (i, x) in pixels.iter().enumerate() {
        let (mut c, req) = (c.clone(), image(&format!("t{i}"), &x.iter().map(|&v| v as f32).collect::<Vec<_>>()));
        answers.spawn(async move { (i, predict(&mut c, "demo-key", req).await) });
        while answers.len() >= 16 || (i + 1 == pixels.len() && !answers.is_empty()) {
            let (j, r) = answers.join_next().await.expect("a task").expect("task ran");
            labels[j] = r.expect("answered").label;
        }
    }
    labels
}
