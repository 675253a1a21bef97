use super::*;
use crate::ledger::Ledger;
use crate::mechanism::{SecretIndex, answer};
use crate::posterior::Posterior;
use chacha20::ChaCha20Rng;
use ndarray::Array2;
use proptest::prelude::*;
use rand::{RngExt, SeedableRng};

fn state(m: usize, b: f64, policy: Policy) -> SessionState {
    SessionState {
        posterior: Posterior::uniform(m).expect("m > 0"),
        ledger: Ledger::new(Nats::new(b).expect("b"), Nats::new(16.0).expect("limit"), policy).expect("ledger"),
    }
}

/// One step as the server journals it.
#[derive(Clone)]
struct Entry {
    outputs: TeacherOutputs,
    published: Vec<f64>,
    label: usize,
    charge: f64,
    log_likelihood: Vec<f64>,
    update_rule: UpdateRule,
    path: Option<vector::Path>,
}

impl Entry {
    /// The entry the server journals for answer `a` to `outputs`.
    fn answered(outputs: TeacherOutputs, a: crate::mechanism::Answer) -> Self {
        Entry {
            outputs,
            published: a.published,
            label: a.label,
            charge: a.charge.get(),
            log_likelihood: a.log_likelihood.map(|l| l.to_vec()).unwrap_or_default(),
            update_rule: a.update_rule,
            path: a.path,
        }
    }

    fn recorded(&self) -> Recorded<'_> {
        Recorded {
            outputs: &self.outputs,
            published: &self.published,
            label: self.label,
            charge: self.charge,
            log_likelihood: &self.log_likelihood,
            update_rule: self.update_rule,
            // As this release journals it: the path the server took, under
            // its rules (a step's path decides its Σ: a server under rules 2
            // may check K's basis from G, which replay choosing a path for a
            // journal from before issue 66 never does).
            path: self.path,
            rules: if self.path.is_some() { vector::RULES } else { 0 },
            floor: crate::noise::Floor::default(),
        }
    }
}

/// Runs the real mechanism on `queries` from the prior; returns the
/// journal and the server's final state.
fn run(start: &SessionState, queries: Vec<TeacherOutputs>, secret: usize, seed: u64) -> (Vec<Entry>, SessionState) {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut server = start.clone();
    let secret = SecretIndex::new(secret, start.posterior.len()).expect("secret in range");
    let entries = queries
        .into_iter()
        .map(|outputs| {
            let a = answer(&mut server, &outputs, secret, None, &mut rng).expect("answered");
            Entry::answered(outputs, a)
        })
        .collect();
    (entries, server)
}

fn replay_all(start: &SessionState, entries: &[Entry]) -> Result<SessionState, (usize, Mismatch)> {
    let mut s = start.clone();
    for (i, e) in entries.iter().enumerate() {
        let replayed = replay(&mut s, &e.recorded()).map_err(|m| (i, m))?;
        // The mechanism never publishes at the clamp at these scales.
        assert_eq!(replayed.unchecked, None, "step {i}");
    }
    Ok(s)
}

fn bits(p: &Posterior) -> Vec<u64> {
    p.log_weights().iter().map(|x| x.to_bits()).collect()
}

fn label_queries(rng: &mut ChaCha20Rng, m: usize, d: usize, n: usize) -> Vec<TeacherOutputs> {
    (0..n)
        .map(|_| {
            // Mostly agreeing teachers, as real ones are; some unanimous.
            let common = rng.random_range(0..d);
            let spread = rng.random_range(0..3);
            let labels =
                (0..m).map(|_| if rng.random_range(0..4) < spread { rng.random_range(0..d) } else { common }).collect();
            TeacherOutputs::Labels { labels, classes: d }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every step the mechanism takes verifies, and replaying the journal
    /// reproduces the server's posterior bit for bit and its ledger.
    #[test]
    fn real_transcripts_verify_and_replay_exactly(
        m in 2usize..12, d in 2usize..7, n in 1usize..25, b_exp in 4i32..28, seed in any::<u64>(),
        paper in any::<bool>(), secret_pick in any::<usize>(),
    ) {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let policy = if paper { Policy::Paper } else { Policy::Contested };
        let start = state(m, 2f64.powi(-b_exp), policy);
        let (entries, server) = run(&start, label_queries(&mut rng, m, d, n), secret_pick % m, seed);
        let replayed = replay_all(&start, &entries).map_err(|(i, e)| TestCaseError::fail(format!("step {i}: {e}")))?;
        prop_assert_eq!(bits(&replayed.posterior), bits(&server.posterior));
        prop_assert_eq!(replayed.ledger, server.ledger);
    }

    #[test]
    fn vector_transcripts_verify(
        // d ≤ m and d > m: both Gram matrices' bases (vector::gram_basis).
        m in 2usize..8, d in 1usize..40, n in 1usize..10, b_exp in 4i32..24, seed in any::<u64>(),
        secret_pick in any::<usize>(),
    ) {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let start = state(m, 2f64.powi(-b_exp), Policy::Contested);
        let queries = (0..n)
            .map(|_| TeacherOutputs::Vectors(Array2::from_shape_fn((m, d), |_| rng.random_range(-2.0..2.0))))
            .collect();
        let (entries, server) = run(&start, queries, secret_pick % m, seed);
        let replayed = replay_all(&start, &entries).map_err(|(i, e)| TestCaseError::fail(format!("step {i}: {e}")))?;
        prop_assert_eq!(bits(&replayed.posterior), bits(&server.posterior));
    }
}

fn labelled_run() -> (SessionState, Vec<Entry>) {
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    let start = state(8, 2f64.powi(-6), Policy::Contested);
    let mut queries = label_queries(&mut rng, 8, 4, 12);
    queries[3] = TeacherOutputs::Labels { labels: vec![0, 0, 1, 2, 2, 2, 3, 2], classes: 4 };
    queries[5] = TeacherOutputs::Labels { labels: vec![1; 8], classes: 4 };
    let (entries, _) = run(&start, queries, 2, 7);
    (start, entries)
}

#[test]
fn a_flipped_label_or_charge_is_named_at_its_step() {
    let (start, mut entries) = labelled_run();
    let honest = entries[3].label;
    entries[3].label = (honest + 1) % 4;
    assert!(matches!(replay_all(&start, &entries), Err((3, Mismatch::Label { .. }))));
    entries[3].label = honest;

    entries[5].charge = 2f64.powi(-6); // unanimous: free under contested
    assert!(matches!(replay_all(&start, &entries), Err((5, Mismatch::Charge { .. }))));
    entries[5].charge = 0.0;
    entries[3].charge = 0.0; // contested: costs b
    assert!(matches!(replay_all(&start, &entries), Err((3, Mismatch::Charge { .. }))));
}

#[test]
fn a_moved_release_or_update_is_detected() {
    let (start, entries) = labelled_run();
    let mut moved = labelled_run().1;
    // Another release, label kept: the update no longer matches it.
    let active = [0, 1, 2, 3].into_iter().filter(|&c| c != entries[3].label);
    for c in active {
        moved[3].published[c] -= 0.25;
    }
    moved[3].published[entries[3].label] += 0.75;
    assert!(matches!(replay_all(&start, &moved), Err((3, Mismatch::LogLikelihood { .. }))), "moved release");

    // A posterior nudged toward one subset.
    let mut nudged = labelled_run().1;
    nudged[3].log_likelihood[2] += 1e-3;
    assert!(matches!(replay_all(&start, &nudged), Err((3, Mismatch::LogLikelihood { teacher: 2, .. }))));

    // A unanimous step that moved the posterior, or released noise.
    let mut noisy = labelled_run().1;
    noisy[5].published[1] = 0.75;
    assert!(matches!(replay_all(&start, &noisy), Err((5, Mismatch::NotExact(_)))));
}

#[test]
fn a_dropped_step_breaks_the_next_one() {
    let (start, mut entries) = labelled_run();
    assert!(replay_all(&start, &entries).is_ok());
    entries.remove(3);
    // Step 4 (now 3) was calibrated to the posterior after the dropped one.
    let e = replay_all(&start, &entries).expect_err("dropped step detected");
    assert!(matches!(e.1, Mismatch::LogLikelihood { .. }), "{e:?}");
}

#[test]
fn an_under_noised_release_is_caught() {
    // The server calibrated to 64·b (an eighth of the noise's scale) but
    // recorded the charge of b.
    let b = 2f64.powi(-10);
    let start = state(8, b, Policy::Contested);
    let mut cheat = state(8, 64.0 * b, Policy::Contested);
    let outputs = TeacherOutputs::Labels { labels: vec![0, 0, 1, 1, 1, 2, 2, 0], classes: 3 };
    let secret = SecretIndex::new(4, 8).expect("secret");
    let a = answer(&mut cheat, &outputs, secret, None, &mut ChaCha20Rng::seed_from_u64(3)).expect("answered");
    // The charge of b, not of the 64·b it was calibrated to.
    let entry = Entry { charge: b, ..Entry::answered(outputs, a) };
    let e = replay(&mut start.clone(), &entry.recorded()).expect_err("under-noised step caught");
    assert!(matches!(e, Mismatch::LogLikelihood { .. }), "{e:?}");
}

#[test]
fn unanimous_only_never_answers_a_contested_query() {
    let start = state(4, 2f64.powi(-8), Policy::UnanimousOnly);
    let outputs = TeacherOutputs::Labels { labels: vec![0, 0, 1, 0], classes: 2 };
    let entry = Entry {
        outputs,
        published: vec![1.0, 0.0],
        label: 0,
        charge: 0.0,
        log_likelihood: vec![0.0; 4],
        update_rule: UpdateRule::Grouped,
        path: None,
    };
    assert_eq!(replay(&mut start.clone(), &entry.recorded()), Err(Mismatch::ContestedAnswered));
}

#[test]
fn a_step_past_the_limit_is_over_budget() {
    let mut s = state(4, 0.5, Policy::Paper);
    s.ledger = Ledger::new(Nats::new(0.5).expect("b"), Nats::new(0.75).expect("limit"), Policy::Paper).expect("ledger");
    let outputs = TeacherOutputs::Labels { labels: vec![1; 4], classes: 2 };
    let entry = Entry {
        outputs,
        published: vec![0.0, 1.0],
        label: 1,
        charge: 0.5,
        log_likelihood: vec![],
        update_rule: UpdateRule::PerSubset,
        path: None,
    };
    assert!(replay(&mut s, &entry.recorded()).is_ok());
    assert!(matches!(replay(&mut s, &entry.recorded()), Err(Mismatch::OverBudget(_))));
}

#[test]
fn a_published_value_off_the_grid_or_past_the_clamp_is_refused() {
    let (start, _) = labelled_run();
    for bad in [0.25 + 2f64.powi(-40), f64::NAN, f64::INFINITY, 2f64.powi(21), -0.0] {
        let mut forged = labelled_run().1;
        forged[3].published[0] = bad;
        let e = replay_all(&start, &forged).expect_err("refused");
        assert!(matches!(e, (3, Mismatch::OffGrid { coordinate: 0, .. })), "{bad:e}: {e:?}");
    }
}

/// Issue 40 §1's forgery: one noisy coordinate published at the clamp,
/// where any ℓ fits, and log-likelihoods of −10³⁰⁰ for every teacher but
/// one, which would collapse the posterior onto that teacher and let later
/// releases carry almost no noise. Replay cannot check ℓ there, and says so.
#[test]
fn a_release_at_the_clamp_is_reported_unchecked_not_passed() {
    let (start, entries) = labelled_run();
    let mut s = start.clone();
    for e in &entries[..3] {
        assert_eq!(replay(&mut s, &e.recorded()).expect("honest").unchecked, None);
    }
    let mut forged = labelled_run().1;
    let step = &mut forged[3];
    // Teachers 0..8 say [0, 0, 1, 2, 2, 2, 3, 2]: only teacher 6 says 3.
    step.published[step.label] = crate::grid::PUBLISHED_CLAMP;
    step.log_likelihood = (0..8).map(|i| if i == 6 { 0.0 } else { -1e300 }).collect();
    let replayed = replay(&mut s, &step.recorded()).expect("applied, unchecked");
    assert_eq!(replayed.unchecked, Some(Unchecked::Clamp { coordinate: step.label }));
    assert!(s.posterior.weights()[6] > 1.0 - 1e-12, "the forgery collapsed the posterior: {:?}", s.posterior.weights());

    // The same release one grid step inside the clamp is checked, and not
    // passed: there it rules out every teacher but 6 on both sides (so
    // their ℓ need not match), and teacher 6's own update is too wide for
    // the grid to pin — reported unchecked.
    let mut inside = labelled_run().1;
    let step = &mut inside[3];
    step.published[step.label] = crate::grid::PUBLISHED_CLAMP - crate::grid::PUBLISHED_GRID;
    step.log_likelihood = (0..8).map(|i| if i == 6 { 0.0 } else { -1e300 }).collect();
    let mut s = start.clone();
    for e in &inside[..3] {
        replay(&mut s, &e.recorded()).expect("honest");
    }
    match replay(&mut s, &inside[3].recorded()) {
        Ok(replayed) => assert!(matches!(replayed.unchecked, Some(Unchecked::Tolerance { .. })), "{replayed:?}"),
        Err(e) => assert!(matches!(e, Mismatch::LogLikelihood { .. }), "{e:?}"),
    }
}

/// A verifier whose OpenBLAS kernels put an input on the other side of one
/// of the Gram path's thresholds recomputes the other path's Σ
/// (`privacy-core.md` §4). Its ℓ then differ from the server's by a
/// constant common to every teacher — the two paths give the complement
/// slightly different variances, and the release's part there is the same
/// for every teacher — which every update rule ignores. Replay compares ℓ
/// up to that constant, so a step verifies on either path, whichever the
/// server took (issue 52 §4): forced both ways here, for d > m (K, with a
/// complement) and d ≤ m (C, a full basis: a server before issue 56 took
/// the SVD there).
#[test]
fn a_step_verifies_on_either_basis_whichever_the_server_took() {
    let mut shifted = 0;
    for ((m, d), b_exp) in [(8, 40), (8, 6)].into_iter().flat_map(|shape| [4, 12, 24].map(|b| (shape, b))) {
        let start = state(m, 2f64.powi(-b_exp), Policy::Contested);
        for server_path in [vector::Path::Gram, vector::Path::Svd] {
            for verifier_path in [vector::Path::Gram, vector::Path::Svd] {
                let mut rng = ChaCha20Rng::seed_from_u64(44 + b_exp as u64);
                let (mut server, mut verifier) = (start.clone(), start.clone());
                for step in 0..6 {
                    let outputs =
                        TeacherOutputs::Vectors(Array2::from_shape_fn((m, d), |_| rng.random_range(-2.0..2.0)));
                    let entry = vector_step(&mut server, outputs, server_path, &mut rng);
                    let TeacherOutputs::Vectors(v) = &entry.outputs else { unreachable!("vector queries") };
                    // The constant: recorded − derived for teacher 0 on the verifier's path.
                    let b = verifier.ledger.per_query();
                    let calibrated =
                        calibrate(&verifier, &entry.outputs, b, verifier_path, Floor::default()).expect("calibrates");
                    let r = Array1::from(entry.published.clone());
                    let derived = observed(&calibrated.noise, &(&r - &v.row(0)).view()).ll;
                    if (entry.log_likelihood[0] - derived).abs() > 1e-6 {
                        shifted += 1;
                    }
                    let replayed = replay_on(&mut verifier, &entry.recorded(), verifier_path, None);
                    let replayed = replayed.unwrap_or_else(|e| {
                        panic!("b = 2^-{b_exp}, step {step}: {server_path:?} on {verifier_path:?}: {e}")
                    });
                    assert_eq!(replayed.unchecked, None);
                }
                assert_eq!(bits(&verifier.posterior), bits(&server.posterior));
            }
        }
    }
    assert!(shifted > 0, "no step's ℓ moved under the other path: the constant this documents is gone");
}

/// One vector-mode step as the mechanism takes it, on the basis `path`.
fn vector_step(server: &mut SessionState, outputs: TeacherOutputs, path: vector::Path, rng: &mut ChaCha20Rng) -> Entry {
    let secret = 1;
    let TeacherOutputs::Vectors(v) = &outputs else { unreachable!("vector outputs") };
    let v = v.mapv(grid::centre);
    let cal = vector::calibrate_on(&server.posterior, v.view(), server.ledger.per_query(), path, Floor::default())
        .expect("calibrates");
    let draw = cal.noise().sample(rng);
    let published = grid::publish(v.row(secret), &cal.noise().noise_vector(&draw));
    let ll = cal.teacher_log_likelihoods(secret, &draw);
    server.posterior.update(ll.view()).expect("update");
    let charge = server.ledger.charge_for(false);
    server.ledger.record(charge).expect("fits");
    Entry {
        label: mechanism::argmax(published.iter().copied()),
        outputs: TeacherOutputs::Vectors(v.clone()),
        published,
        charge: charge.get(),
        log_likelihood: ll.to_vec(),
        update_rule: UpdateRule::PerSubset,
        // Replay chooses, as for a journal from before issue 66: the
        // server was forced onto a path such a journal could hold.
        path: None,
    }
}

/// What the tolerance on ℓ was before issue 52: h‖Σ⁺δ‖₁ + ½·n·h²·λ_max(Σ⁺)
/// per teacher, absolute — unbounded as a variance nears the floor.
fn old_tolerance(noise: &Noise, delta: &Array1<f64>) -> f64 {
    let h = 0.5 * PUBLISHED_GRID;
    let g = observed(noise, &delta.view()).g;
    let inverse_max = noise.variances().iter().fold(0.0f64, |a, v| a.max(1.0 / v));
    h * g.iter().map(|x| x.abs()).sum::<f64>() + 0.5 * delta.len() as f64 * h * h * inverse_max
}

/// Issue 52 §3, a collapsed direction: a vector step whose noise is a few
/// grid steps wide (outputs 2⁻³⁰ apart). The grid moves ℓ by tens of nats,
/// so a forged update within that passed before; now the step is reported
/// unchecked (never passed), honest or forged.
#[test]
fn a_step_the_grid_cannot_pin_is_reported_unchecked() {
    let start = state(2, 2f64.powi(-4), Policy::Contested);
    let v = Array2::from_shape_vec((2, 1), vec![0.0, 2f64.powi(-30)]).expect("shape");
    let mut server = start.clone();
    let mut entry = vector_step(
        &mut server,
        TeacherOutputs::Vectors(v.clone()),
        vector::Path::Auto,
        &mut ChaCha20Rng::seed_from_u64(9),
    );
    let honest = replay(&mut start.clone(), &entry.recorded()).expect("applied");
    let Some(Unchecked::Tolerance { tolerance, .. }) = honest.unchecked else { panic!("{:?}", honest.unchecked) };
    assert!(tolerance > 1e-2, "{tolerance:e}");

    entry.log_likelihood[0] += 0.5 * tolerance; // the posterior moved, within what the grid allows
    let calibrated = calibrate(&start, &entry.outputs, start.ledger.per_query(), vector::Path::Auto, Floor::default())
        .expect("calibrates");
    let r = Array1::from(entry.published.clone());
    assert!(old_tolerance(&calibrated.noise, &(&r - &v.row(0))) > 0.5 * tolerance, "the old check passed this forgery");
    let forged = replay(&mut start.clone(), &entry.recorded()).expect("applied, unchecked");
    assert!(matches!(forged.unchecked, Some(Unchecked::Tolerance { .. })), "{:?}", forged.unchecked);
}

/// Issue 52 §3, a direction at the variance floor: the class teachers 4
/// and 5 predict has weight e⁻¹²⁰⁰ (its mass underflows), so its direction
/// gets [`VARIANCE_FLOOR`](crate::noise::VARIANCE_FLOOR) and the old
/// tolerance was ~10²³⁰ for every teacher. A forger who rules out the
/// secret teacher's class-mates (recording ℓ = −10²⁰⁰ for them, per
/// subset) collapses the verifier's posterior onto s*; that passed. Taken
/// relative to the most likely teacher, class-mates' ℓ are pinned exactly.
#[test]
fn a_forged_update_at_the_variance_floor_is_caught() {
    let m = 6;
    let mut start = state(m, 2f64.powi(-8), Policy::Contested);
    start.posterior = Posterior::from_log_weights(vec![0.0, 0.0, 0.0, 0.0, -1200.0, -1200.0]).expect("posterior");
    let outputs = TeacherOutputs::Labels { labels: vec![0, 0, 0, 0, 1, 1], classes: 2 };
    let mut server = start.clone();
    let secret = SecretIndex::new(0, m).expect("secret");
    let a = answer(&mut server, &outputs, secret, None, &mut ChaCha20Rng::seed_from_u64(5)).expect("answered");
    let mut entry = Entry::answered(outputs, a);
    let honest = replay(&mut start.clone(), &entry.recorded()).expect("the honest step verifies");
    assert_eq!(honest.unchecked, None, "teachers 4 and 5 are negligible whatever the grid did");
    // Negligible on both sides, their ℓ need not match (another machine's
    // kernels put it elsewhere on a direction at the floor).
    let mut elsewhere = entry.clone();
    elsewhere.log_likelihood[4] -= 1e6;
    replay(&mut start.clone(), &elsewhere.recorded()).expect("a ruled-out teacher's ℓ does not matter");

    let calibrated = calibrate(&start, &entry.outputs, start.ledger.per_query(), vector::Path::Auto, Floor::default())
        .expect("calibrates");
    let r: Array1<f64> = calibrated.noise.coords().iter().map(|&c| entry.published[c]).collect();
    for i in 1..4 {
        assert!(old_tolerance(&calibrated.noise, &(&r - &calibrated.centres[i])) > 1e200, "the old check passed it");
        entry.log_likelihood[i] = -1e200;
    }
    entry.update_rule = UpdateRule::PerSubset;
    let e = replay(&mut start.clone(), &entry.recorded()).expect_err("caught");
    assert!(matches!(e, Mismatch::LogLikelihood { teacher: 1, reference: 0, .. }), "{e:?}");
}

/// Honest vector steps at the sizes deployments use verify with nothing
/// unchecked: the noise floors keep every direction wide enough for the
/// grid and round-off to pin the update (issue 52 §3).
#[test]
fn honest_vector_steps_verify_checked_at_deployment_sizes() {
    for (m, d, b_exp) in [(128, 100, 8), (8, 1000, 4), (16, 3000, 12)] {
        let mut rng = ChaCha20Rng::seed_from_u64(d as u64);
        let start = state(m, 2f64.powi(-b_exp), Policy::Contested);
        let queries = (0..4)
            .map(|_| TeacherOutputs::Vectors(Array2::from_shape_fn((m, d), |_| rng.random_range(-1.0..1.0))))
            .collect();
        let (entries, server) = run(&start, queries, 1, d as u64);
        let mut s = start.clone();
        for (i, e) in entries.iter().enumerate() {
            let replayed = replay(&mut s, &e.recorded()).unwrap_or_else(|e| panic!("m = {m}, d = {d}, step {i}: {e}"));
            assert_eq!(replayed.unchecked, None, "m = {m}, d = {d}, step {i}");
            assert!(replayed.slack <= LOG_LIKELIHOOD_TOLERANCE, "m = {m}, d = {d}: slack {:e}", replayed.slack);
        }
        assert_eq!(bits(&s.posterior), bits(&server.posterior));
    }
}

/// At d ≤ m a server may have taken the SVD (an earlier release, or its
/// Gram path declined), whose basis spans all d, while the verifier's C
/// basis leaves the centring's null direction to a complement: an honest
/// session replays step by step and passes the noise audit. (The audit
/// also no longer holds such a server's weak directions to the grid floor
/// that only a complement guarantees, `noise_audit::evidence`; these
/// outputs do not reach the corner where that floor would have decided.)
#[test]
fn an_svd_server_passes_the_audit_of_a_verifier_on_c() {
    let (m, d) = (8, 8);
    let start = state(m, 2f64.powi(-12), Policy::Contested);
    let mut rng = ChaCha20Rng::seed_from_u64(56);
    let (mut server, mut verifier) = (start.clone(), start.clone());
    let mut audit = noise_audit::NoiseAudit::new(m);
    for step in 0..300 {
        let base: Vec<f64> = (0..d).map(|_| rng.random_range(0.0..1.0)).collect();
        let v = Array2::from_shape_fn((m, d), |(_, j)| base[j] + rng.random_range(0.0..1e-3));
        if step == 0 {
            // The verifier's basis is C's, with a complement (rank ≤ m − 1 < d).
            let cal =
                vector::calibrate(&verifier.posterior, v.view(), verifier.ledger.per_query()).expect("calibrates");
            assert_eq!(cal.basis_source(), vector::Basis::Gram);
            assert!(cal.noise().complement() > 0.0 && cal.noise().rank() < d);
        }
        let entry = vector_step(&mut server, TeacherOutputs::Vectors(v), vector::Path::Svd, &mut rng);
        let replayed = replay_on(&mut verifier, &entry.recorded(), vector::Path::Auto, None)
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        audit.add(&replayed.evidence.expect("a noisy step"));
    }
    let verdict = audit.verdict();
    assert!(!verdict.caught(1e-6), "an honest SVD server was caught: {verdict:?}");
}

/// Issue 66: a vector step replays on the path its journal names, and a
/// journal that names the SVD where every machine's mechanism takes a Gram
/// matrix (Σ chosen another way, possibly after seeing the draw) is refused.
#[test]
fn a_journaled_path_is_followed_and_an_svd_where_gram_serves_is_refused() {
    let (m, d) = (16, 8);
    let start = state(m, 2f64.powi(-10), Policy::Paper);
    let mut rng = ChaCha20Rng::seed_from_u64(66);
    let outputs = TeacherOutputs::Vectors(Array2::from_shape_fn((m, d), |_| rng.random_range(0.0..1.0)));
    let secret = SecretIndex::new(3, m).expect("secret");
    let a = answer(&mut start.clone(), &outputs, secret, None, &mut rng).expect("answered");
    assert!(matches!(a.path, Some(vector::Path::GramKeeping(_))), "{:?}", a.path);
    assert!(vector::gram_always_serves(&start.posterior, outputs_view(&outputs), vector::RULES).expect("fits"));
    let entry = Entry::answered(outputs, a.clone());
    let recorded = |path| Recorded { path, rules: vector::RULES, ..entry.recorded() };
    replay(&mut start.clone(), &recorded(a.path)).expect("the journaled path verifies");
    let refused = replay(&mut start.clone(), &recorded(Some(vector::Path::Svd)));
    assert!(matches!(&refused, Err(Mismatch::Uncertified(why)) if why.contains("Gram matrix")), "{refused:?}");
}

/// Issue 70 §5: a server under calibration rules 2 checks K's basis from
/// G wherever that check passes on every machine; a journal that says it
/// checked it in output space there (path 3) is refused, as a second Σ
/// to choose from after the draw, while under rules 1, which had no check
/// from G, the same journal verifies.
#[test]
fn a_basis_checked_in_output_space_where_every_server_checks_from_g_is_refused() {
    let (m, d) = (16, 40);
    let start = state(m, 2f64.powi(-10), Policy::Paper);
    let mut rng = ChaCha20Rng::seed_from_u64(70);
    let outputs = TeacherOutputs::Vectors(Array2::from_shape_fn((m, d), |_| rng.random_range(0.0..1.0)));
    let secret = SecretIndex::new(5, m).expect("secret");
    let a = answer(&mut start.clone(), &outputs, secret, None, &mut rng).expect("answered");
    let Some(vector::Path::GramKeepingCheckedFromK(kept)) = a.path else { panic!("{:?}", a.path) };
    assert!(vector::checks_from_g_always(&start.posterior, outputs_view(&outputs), kept).expect("fits"));
    let entry = Entry::answered(outputs, a.clone());
    let recorded = |path, rules| Recorded { path: Some(path), rules, ..entry.recorded() };
    let checked = vector::Path::GramKeepingCheckedFromK(kept);
    replay(&mut start.clone(), &recorded(checked, vector::RULES)).expect("the journaled path verifies");
    let itself = vector::Path::GramKeepingFromK(kept);
    let refused = replay(&mut start.clone(), &recorded(itself, 2));
    assert!(matches!(&refused, Err(Mismatch::Uncertified(why)) if why.contains("from G")), "{refused:?}");
    // Rules 1: path 3 is that server's Σ, which differs from path 4's by
    // the charge, so the step itself does not match — but not as a path
    // chosen another way.
    let older = replay(&mut start.clone(), &recorded(itself, 1));
    assert!(!matches!(&older, Err(Mismatch::Uncertified(why)) if why.contains("from G")), "{older:?}");
}

fn outputs_view(outputs: &TeacherOutputs) -> ndarray::ArrayView2<'_, f64> {
    match outputs {
        TeacherOutputs::Vectors(v) => v.view(),
        TeacherOutputs::Labels { .. } => panic!("vector outputs"),
    }
}
