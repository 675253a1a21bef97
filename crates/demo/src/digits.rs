//! The vendored optical-digits data (`data/optdigits/`, CC BY 4.0) and its
//! deterministic train/test split.

use chacha20::ChaCha20Rng;
use rand::SeedableRng;
use rand::seq::SliceRandom;

/// Pixels per image (8×8, values 0–16).
pub const FEATURES: usize = 64;
/// Digits 0–9.
pub const CLASSES: usize = 10;
/// Share of the examples held out for testing.
pub const TEST_SHARE: f64 = 0.2;

const CSV: &str = include_str!("../../../data/optdigits/digits.csv");

/// One labelled image.
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    /// Pixel counts 0–16, row by row.
    pub pixels: [f32; FEATURES],
    /// The digit.
    pub digit: usize,
}

/// The dataset split by a seed: `train` is the universe U the teachers'
/// subsets are drawn from; `test` is never trained on.
#[derive(Clone, Debug)]
pub struct Split {
    /// Training examples (the secret-space universe).
    pub train: Vec<Example>,
    /// Held-out examples.
    pub test: Vec<Example>,
}

/// Parses the vendored CSV. The file is part of the binary, so a parse
/// failure is a build defect; it is still reported, not panicked on.
///
/// # Errors
/// A line that is not 64 pixel counts and a digit.
pub fn load() -> Result<Vec<Example>, String> {
    CSV.lines()
        .enumerate()
        .map(|(i, line)| parse_line(line).ok_or_else(|| format!("data/optdigits/digits.csv line {}: malformed", i + 1)))
        .collect()
}

fn parse_line(line: &str) -> Option<Example> {
    let mut fields = line.split(',').map(|f| f.trim().parse::<u8>().ok());
    let mut pixels = [0f32; FEATURES];
    for p in &mut pixels {
        *p = f32::from(fields.next()??);
    }
    let digit = usize::from(fields.next()??);
    (fields.next().is_none() && digit < CLASSES).then_some(Example { pixels, digit })
}

/// `k` canaries for a membership audit (issue 25 §2): images of
/// independent uniformly random pixel counts — far from every digit, so a
/// teacher's answer near one is shaped by whether it trained on it — each
/// with its own label (canary i is labelled i mod 10). Deterministic in
/// `seed`, so the auditor rebuilds the same ones.
pub fn canaries(k: usize, seed: u64) -> Vec<Example> {
    use rand::RngExt;
    let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0x6361_6e61_7279); // "canary"
    (0..k)
        .map(|i| {
            let mut pixels = [0f32; FEATURES];
            for p in &mut pixels {
                *p = f32::from(rng.random_range(0u8..=16));
            }
            Example { pixels, digit: i % CLASSES }
        })
        .collect()
}

/// Shuffles with ChaCha20 seeded by `seed` and holds out [`TEST_SHARE`].
///
/// # Errors
/// As [`load`].
pub fn split(seed: u64) -> Result<Split, String> {
    let mut all = load()?;
    all.shuffle(&mut ChaCha20Rng::seed_from_u64(seed));
    let n_test = (all.len() as f64 * TEST_SHARE).round() as usize;
    let train = all.split_off(n_test);
    Ok(Split { train, test: all })
}
