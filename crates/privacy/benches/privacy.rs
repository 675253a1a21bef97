//! Per-query privacy math: calibrate + sample + posterior update + ledger,
//! i.e. one `mechanism::answer`, for m = 128 teachers at d ∈ {2, 10, 100,
//! 1000, 32 768} with realistic disagreement patterns (most teachers agree;
//! a few dissent); vector mode; and the pieces of a Gram-space vector mode
//! (`gram_pieces`, issue 44 §3).
//!
//! Run: `OPENBLAS_NUM_THREADS=1 cargo bench -p pacpriv-privacy --bench privacy`
//! Baseline in the same run: `copy_posterior` (cloning the 128 log-weights,
//! the least any update must do), so the report can state ratios.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use chacha20::ChaCha20Rng;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ndarray::Array2;
use pacpriv_privacy::Nats;
use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_privacy::mechanism::{SecretIndex, SessionState, TeacherOutputs, answer};
use pacpriv_privacy::posterior::Posterior;
use rand::{RngExt, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

const M: usize = 128;

/// Labels where `dissent[j]` teachers vote for class j+1 and the rest for 0,
/// with the classes spread over the range so that d matters for indexing.
fn pattern(d: usize, dissent: &[usize]) -> Vec<usize> {
    let mut labels = vec![0; M];
    let mut at = 0;
    for (j, &n) in dissent.iter().enumerate() {
        let class = ((j + 1) * 7919) % d;
        for l in labels.iter_mut().skip(at).take(n) {
            *l = class;
        }
        at += n;
    }
    labels
}

fn session(rng: &mut ChaCha20Rng) -> SessionState {
    // A posterior some queries in: weights spread over a few orders of magnitude.
    let log_w = (0..M).map(|_| rng.random_range(-8.0..0.0)).collect();
    SessionState {
        posterior: Posterior::from_log_weights(log_w).expect("finite"),
        ledger: Ledger::new(Nats::new(2f64.powi(-32)).expect("valid"), Nats::new(1e9).expect("valid"), Policy::Paper)
            .expect("valid"),
    }
}

fn label_mode(c: &mut Criterion) {
    let mut group = c.benchmark_group("label_answer");
    group.measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let secret = SecretIndex::new(M - 1, M).expect("in range");
    let patterns: [(&str, &[usize]); 4] =
        [("unanimous", &[]), ("k2_120v8", &[8]), ("k3_110v12v6", &[12, 6]), ("k8_spread", &[6, 5, 4, 4, 3, 3, 2])];
    // 32 768: a huge label space (issue 44 §4), beside `pacpriv-bench math --d 32768`.
    for d in [2usize, 10, 100, 1000, 32_768] {
        for (name, dissent) in patterns {
            if dissent.len() + 1 > d {
                continue;
            }
            let outputs = TeacherOutputs::Labels { labels: pattern(d, dissent), classes: d };
            let mut state = session(&mut rng);
            group.bench_with_input(BenchmarkId::new(name, d), &outputs, |bench, outputs| {
                bench.iter(|| answer(&mut state, black_box(outputs), secret, None, &mut rng).expect("answers"))
            });
        }
    }
    // Baseline: the cheapest possible per-query state change.
    let state = session(&mut rng);
    group.bench_function("copy_posterior", |bench| bench.iter(|| black_box(state.posterior.clone())));
    group.finish();
}

fn vector_mode(c: &mut Criterion) {
    let mut group = c.benchmark_group("vector_answer");
    group.sample_size(10).measurement_time(Duration::from_secs(3));
    let mut rng = ChaCha20Rng::seed_from_u64(2);
    let secret = SecretIndex::new(3, M).expect("in range");
    for d in [10usize, 100, 1000] {
        // Softmax-like scores: mostly agreeing, with per-teacher jitter.
        let v = Array2::from_shape_fn(
            (M, d),
            |(_, j)| if j == 0 { 0.8 } else { 0.2 / d as f64 } + rng.random_range(0.0..0.01),
        );
        let outputs = TeacherOutputs::Vectors(v);
        let mut state = session(&mut rng);
        group.bench_with_input(BenchmarkId::new("jittered_scores", d), &outputs, |bench, outputs| {
            bench.iter(|| answer(&mut state, black_box(outputs), secret, None, &mut rng).expect("answers"))
        });
    }
    group.finish();
}

/// The pieces of vector mode in the m × m Gram space (issue 44 §3), each
/// timed alone on the jittered scores' weighted, centred m × d matrix X,
/// beside the thin SVD of X (the fallback, and before issue 56 the path at
/// d ≤ 2m): the Gram
/// matrix K = XXᵀ (one m × d × m product), two ways to eigendecompose the
/// 128 × 128 K (LAPACK `dsyev` through `eigh`; `gesdd` through `svddc`,
/// whose singular vectors of a symmetric PSD matrix are its eigenvectors),
/// and the d-wide directions XᵀW (one d × m × m product).
fn gram_pieces(c: &mut Criterion) {
    use ndarray_linalg::{Eigh, JobSvd, SVDDC, UPLO};
    let mut group = c.benchmark_group("gram_pieces");
    group.sample_size(10).measurement_time(Duration::from_secs(3));
    let mut rng = ChaCha20Rng::seed_from_u64(3);
    for d in [1000usize, 10_000] {
        let v = Array2::from_shape_fn(
            (M, d),
            |(_, j)| if j == 0 { 0.8 } else { 0.2 / d as f64 } + rng.random_range(0.0..0.01),
        );
        let mean = v.mean_axis(ndarray::Axis(0)).expect("rows");
        let x = (&v - &mean.insert_axis(ndarray::Axis(0))) / (M as f64).sqrt();
        let k = x.dot(&x.t());
        let (_, w) = k.eigh(UPLO::Lower).expect("eigh");
        group.bench_with_input(BenchmarkId::new("svd_of_x", d), &x, |bench, x| {
            bench.iter(|| black_box(x).svddc(JobSvd::Some).expect("svd"))
        });
        group.bench_with_input(BenchmarkId::new("gram_k", d), &x, |bench, x| bench.iter(|| black_box(x).dot(&x.t())));
        group.bench_with_input(BenchmarkId::new("eigh_k", d), &k, |bench, k| {
            bench.iter(|| black_box(k).eigh(UPLO::Lower).expect("eigh"))
        });
        group.bench_with_input(BenchmarkId::new("svddc_k", d), &k, |bench, k| {
            bench.iter(|| black_box(k).svddc(JobSvd::All).expect("svd"))
        });
        group.bench_with_input(BenchmarkId::new("directions_xtw", d), &(x.clone(), w.clone()), |bench, (x, w)| {
            bench.iter(|| black_box(x).t().dot(w))
        });
    }
    group.finish();
}

criterion_group!(benches, label_mode, vector_mode, gram_pieces);
criterion_main!(benches);
