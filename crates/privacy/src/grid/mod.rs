//! The grid Q on which a release may leave the process (argument:
//! `docs/assurance/privacy-core.md` §8, `docs/assurance/accounting.md` §2).
//!
//! Q(x) = ⌊x·2³² + ½⌋·2⁻³² after clamping x to ±2²⁰: the nearest multiple
//! of 2⁻³², ties rounded up (toward +∞). One rule, everywhere a value is
//! gridded, chosen because it commutes with adding a grid value g:
//! Q(g + z) = g + Q(z) exactly in the reals, ties included. Round half to
//! even does not (Q(1.5·2⁻³²) = 2·2⁻³² but 2⁻³² + Q(½·2⁻³²) = 2⁻³²), nor
//! does half away from zero around 0 (Q(−½·2⁻³²) = −2⁻³² but
//! −2⁻³² + Q(½·2⁻³²) = 0). That identity is what lets a release
//! centred on a grid value be published as centre + Q(z) without the
//! floating-point sum fl(centre + z), whose rounding depends on the centre
//! and so on the secret (Mironov 2012).
//!
//! # Invariants
//! - Every gridded value is k·2⁻³² with |k| ≤ 2⁵³: an exact `f64`.
//! - [`q`] is computed exactly (no double rounding at ties or near them).
//! - [`publish`] returns exactly Q(centre + z) for a centre on the grid with
//!   |centre| ≤ [`CENTRE_CLAMP`]: the only inputs it reads are the centre's
//!   grid values and z, never a floating-point sum of the two.

use ndarray::{Array1, ArrayView1};

/// Grid step of a published value: 2⁻³².
pub const PUBLISHED_GRID: f64 = 1.0 / 4_294_967_296.0;

/// 1 / [`PUBLISHED_GRID`] = 2³²: multiplying by it is the same exact
/// scaling as dividing by the grid, and cheaper.
const GRIDS_PER_UNIT: f64 = 4_294_967_296.0;

/// Largest magnitude of a published coordinate: 2²⁰.
pub const PUBLISHED_CLAMP: f64 = 1_048_576.0;

/// Largest magnitude of a release centre (a vector-mode teacher output is
/// clamped here before anything else): 2¹⁹, so that centre + Q(z) with z
/// clamped at 2²⁰ + 2¹⁹ stays below 2²¹, where every multiple of 2⁻³² is
/// exact.
pub const CENTRE_CLAMP: f64 = 524_288.0;

/// `x` clamped to ±`clamp` and rounded to the nearest multiple of
/// [`PUBLISHED_GRID`], ties up: ⌊x·2³² + ½⌋·2⁻³², exactly. NaN (which a
/// release never holds) maps to 0. Exact for `clamp` ≤ 2²¹.
pub fn q(x: f64, clamp: f64) -> f64 {
    let x = if x.is_nan() { 0.0 } else { x.clamp(-clamp, clamp) };
    // Scaling by a power of two is exact; t − ⌊t⌋ is exact too, so the tie
    // test sees the true fraction (⌊t + ½⌋ computed in floating point would
    // round t = ½ − 2⁻⁵⁴ up to 1).
    let t = x * GRIDS_PER_UNIT;
    let floor = floor(t);
    let k = floor + f64::from(u8::from(t - floor >= 0.5));
    // +0.0 for −0.0: a sign bit is not a grid value.
    (k * PUBLISHED_GRID) + 0.0
}

/// ⌊t⌋, exactly, without a call into libm and without branches, so that
/// gridding all m × d outputs of vector mode vectorises (the baseline
/// x86-64 target has neither a rounding instruction nor a packed f64 → i64
/// conversion). Below 2⁵², |t| + 2⁵² lies in [2⁵², 2⁵³), whose spacing is
/// 1, so subtracting 2⁵² again leaves |t| rounded to an integer, exactly;
/// with t's sign back that is an integer within ½ of t, and one less where
/// it is above t. Every double of magnitude 2⁵² or more is an integer
/// already. Differs from `f64::floor` only in the sign of a zero, which
/// [`q`] drops.
fn floor(t: f64) -> f64 {
    // x87's extended precision would keep |t| + 2⁵² exact, and this return t.
    #[cfg(all(target_arch = "x86", not(target_feature = "sse2")))]
    compile_error!("grid::floor needs IEEE double arithmetic (SSE2) on 32-bit x86");
    const INTEGERS_FROM: f64 = 4_503_599_627_370_496.0; // 2⁵²
    let nearest = ((t.abs() + INTEGERS_FROM) - INTEGERS_FROM).copysign(t);
    let below = nearest - f64::from(u8::from(nearest > t));
    if t.abs() < INTEGERS_FROM { below } else { t }
}

/// The least noise variance the grid resolves along a block of `n`
/// coordinates: one whose whitened coefficient the rounding of the
/// published release (≤ 2⁻³³ a coordinate) moves by at most `share`,
/// 2⁻³³·√n / √v ≤ share.
pub fn resolved_variance(n: usize, share: f64) -> f64 {
    (0.5 * PUBLISHED_GRID * (n as f64).sqrt() / share).powi(2)
}

/// Q applied to every coordinate of a release (clamp ±2²⁰).
pub fn to_grid(values: ArrayView1<'_, f64>) -> Vec<f64> {
    values.iter().map(|&v| q(v, PUBLISHED_CLAMP)).collect()
}

/// A release centre on the grid: `x` clamped to ±[`CENTRE_CLAMP`] and
/// gridded. Vector-mode teacher outputs pass through this before
/// unanimity, calibration, release and Eq. 4 see them.
pub fn centre(x: f64) -> f64 {
    q(x, CENTRE_CLAMP)
}

/// Q(centre + z), computed as clamp(centre + Q′(z)) where Q′ rounds like Q
/// but clamps at 2²⁰ + 2¹⁹: both terms are grid values below 2²¹, so the
/// sum is exact; by Q(g + z) = g + Q(z) it is Q of the exact release; and
/// wherever |z| passes the wider clamp, centre + z is beyond ±2²⁰ with the
/// same sign, so the final clamp agrees with Q's. `centre` must be on the
/// grid within ±[`CENTRE_CLAMP`] ([`centre`] makes it so; a one-hot vector
/// is).
pub fn publish(centre: ArrayView1<'_, f64>, z: &Array1<f64>) -> Vec<f64> {
    centre.iter().zip(z).map(|(&c, &z)| publish_one(c, z)).collect()
}

/// One coordinate of [`publish`]: Q(c + z) for a grid centre `c`. Where
/// c = 0 and z = 0 it is exactly +0.0, so a release whose noise lives on a
/// few coordinates needs [`publish_one`] only there (label mode).
pub fn publish_one(c: f64, z: f64) -> f64 {
    (c + q(z, PUBLISHED_CLAMP + CENTRE_CLAMP)).clamp(-PUBLISHED_CLAMP, PUBLISHED_CLAMP)
}

#[cfg(test)]
mod test;
