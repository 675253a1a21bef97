//! What a spent MI budget means: the membership-inference (MIA) success bound
//! of paper Eq. 2, its (ε, δ)-DP equivalent (§2.2), and planning the number of
//! queries a target allows (Table 1).
//!
//! # Paper
//!
//! With a prior membership probability of ½ for every point (§4.2.1), Eq. 2
//! says an adversary's success rate s satisfies KL(Bern(s) ‖ Bern(½)) ≤ B, the
//! total MI in nats:
//!
//! ```text
//! kl(s) = s·ln(2s) + (1−s)·ln(2(1−s)) ≤ B
//! ```
//!
//! so the bound is the root s ≥ ½ of kl(s) = B, and s = 1 once B ≥ ln 2.
//! (ε, δ)-DP bounds the same success rate by s = 1 − (1−δ)/(1+e^ε) (§2.2);
//! solving for ε gives the DP parameter "with the same guarantee". Natural
//! logarithms (nats) reproduce every entry of Table 1.
//!
//! # What is proven, exactly
//!
//! Theorem 2.3 (Eq. 2), for a view V with I(S; V) ≤ B and one target point u
//! whose prior membership probability is ½: every decision rule Â(V), with
//! or without its own randomness, has Pr[Â(V) = 1{u ∈ S}] ≤ [`mia_bound`]`(B)`,
//! the probability taken over the secret S, the mechanism's noise and the
//! adversary's randomness. It holds for each point of the universe, hence
//! for the expected fraction of points an attack gets right. It is *not*
//! - a bound for one realised transcript: on an unlucky transcript the
//!   posterior on u can be far more confident (only the average is bounded);
//! - a bound for points whose prior is not ½ (pacpriv's subsets make every
//!   prior exactly ½, §4.2.1);
//! - differential privacy: [`epsilon_equivalent`] is the ε whose DP bound on
//!   the same success rate equals this one (§2.2), not a claim that the
//!   mechanism is (ε, δ)-DP for neighbouring datasets.
//!
//! The B it takes is a bound on I(S; V). For a session that is its limit
//! (I(S; V) ≤ 𝔼(spent) ≤ limit, `docs/assurance/accounting.md` §1.6); `mia_bound(spent)`
//! of the realised `spent` is valid for an attacker that stops at a fixed
//! charge, not one that stops adaptively (§1.7).
//!
//! # Owns
//!
//! Pure functions on `f64` success rates (fractions in [½, 1], not percent)
//! and [`Nats`] budgets: [`mia_bound`], [`epsilon_equivalent`],
//! [`mia_of_epsilon`], [`max_queries`] and its target forms, and the
//! [`compact_count`] used to print query counts as the paper does.
//!
//! # Invariants
//!
//! - Rounding never understates leakage: [`mia_bound`] returns the smallest
//!   `f64` s with `kl_from_half(s) ≥ B` (so at most one ulp above the real
//!   root), and [`max_queries`] uses [`mul_up`], so T·b ≤ target holds for the
//!   real product, not just the rounded one.
//! - Near s = ½ every quantity is computed from x = s − ½ (exact for
//!   s ∈ [¼, 1]) without cancellation: a budget of 2⁻³² moves s by only 10⁻⁵.

use super::conservative::mul_up;
use super::{Nats, PrivacyError};
use std::f64::consts::LN_2;

/// The δ of the (ε, δ)-DP equivalents, as in the paper (§2.2, Table 1).
pub const DELTA: f64 = 1e-5;

/// Below this |x| = |s − ½|, [`kl_from_half`] sums its power series instead
/// of the `ln_1p` form. The `ln_1p` form cancels from ~x down to ~2x²: its
/// relative error is ≈2·10⁻¹³ at |x| = 10⁻³ but ≤ 5·10⁻¹⁵ above 0.05, while
/// [`SERIES_TERMS`] terms of the series are exact to rounding below 0.05.
const SERIES_BELOW: f64 = 0.05;

/// With y = 4x² < 0.01 the n-th term is below yⁿ/(2n(2n−1)); n = 10 leaves
/// a remainder < 10⁻²⁰·y/380, far below one ulp of the first term y/2.
const SERIES_TERMS: u32 = 10;

/// KL(Bern(s) ‖ Bern(½)) in nats: s·ln(2s) + (1−s)·ln(2(1−s)).
///
/// Accurate to a few ulps over [0, 1], including near s = ½ where the two
/// terms cancel (there it is ≈ 2(s − ½)²). Symmetric about ½;
/// `kl_from_half(1) = ln 2`. NaN outside [0, 1].
pub fn kl_from_half(s: f64) -> f64 {
    kl_of_offset(s - 0.5)
}

/// [`kl_from_half`] of s = ½ + x, for |x| ≤ ½.
fn kl_of_offset(x: f64) -> f64 {
    let a = x.abs();
    if a < SERIES_BELOW {
        // Σ_{n≥1} (2a)^{2n} / (2n(2n−1)), by Horner in y = 4a².
        let y = 4.0 * a * a;
        (1..=SERIES_TERMS).rev().fold(0.0, |acc, n| {
            let n = f64::from(n);
            y * (1.0 / (2.0 * n * (2.0 * n - 1.0)) + acc)
        })
    } else if a < 0.5 {
        (0.5 + a) * (2.0 * a).ln_1p() + (0.5 - a) * (-2.0 * a).ln_1p()
    } else if a == 0.5 {
        // 0·ln 0 = 0.
        LN_2
    } else {
        f64::NAN
    }
}

/// The MIA success bound (a fraction in [½, 1]) after total MI `total`
/// (paper Eq. 2 with a ½ prior): the root s ≥ ½ of
/// [`kl_from_half`]`(s) = B`, and 1 when B ≥ ln 2.
///
/// # Privacy guarantee
/// Paper Theorem 2.3, Eq. 2 (Xiao and Devadas 2023): an adversary guessing
/// the membership of any point u with prior ½ succeeds with a probability p
/// satisfying KL(Bern(p) ‖ Bern(½)) ≤ I(S; transcript), which Theorem 3.3
/// bounds by B. kl is increasing on [½, 1], so p ≤ the root.
///
/// # Runtime
/// Newton's method on x = s − ½ from Pinsker's bound, then bisection
/// inside the bracket it gives, down to adjacent doubles: ~10–25 KL
/// evaluations where bisection from [0, ½] alone took ~60–90 (this is in
/// every response's budget; `BENCHMARKS.md`, "Saturation, profiled"). The
/// upper end of the final bracket is returned, rounded up onto the `f64`
/// grid of s, so the result is the smallest `f64` whose kl is ≥ B.
pub fn mia_bound(total: Nats) -> f64 {
    let b = total.get();
    // f64 LN_2 is below the real ln 2, so saturating here only rounds up.
    if b >= LN_2 {
        return 1.0;
    }
    on_grid_of_s(b, advantage(b))
}

/// s = ½ + x rounded up onto the `f64` grid of s, then settled there: the
/// smallest double s with kl_from_half(s) ≥ B among its neighbours. Above
/// x ≈ 0.05 the KL's two rounded terms cancel, so its computed value is
/// not monotone at the ulp of s, and the crossing found in x need not be
/// one in s; at most a few steps either way.
fn on_grid_of_s(b: f64, x: f64) -> f64 {
    let mut s = 0.5 + x;
    // s − ½ is exact (Sterbenz); if ½ + x was rounded down, step up.
    if s - 0.5 < x {
        s = s.next_up();
    }
    // Ends: kl_from_half(1) = ln 2 > B, and s never goes below ½.
    while kl_from_half(s) < b {
        s = s.next_up();
    }
    while s > 0.5 && kl_from_half(s.next_down()) >= b {
        s = s.next_down();
    }
    s
}

/// The smallest `f64` x ∈ [0, ½] with `kl_of_offset(x) ≥ b`, for
/// 0 ≤ b < ln 2: the bound minus ½ at full relative precision (the `f64`
/// grid of s near ½ is much coarser than that of x).
fn advantage(b: f64) -> f64 {
    if b <= 0.0 {
        return 0.0;
    }
    let (lo, hi) = newton_bracket(b).unwrap_or((0.0, 0.5));
    bisect(b, lo, hi)
}

/// A bracket kl(lo) < b ≤ kl(hi) a few thousand ulps wide around the root,
/// or `None` (bisect all of [0, ½]). Newton's method starts at Pinsker's
/// bound √(b/2), which is above the root (kl(x) ≥ 2x²); kl is increasing
/// and convex on [0, ½), so its iterates fall towards the root from above.
/// The bracket is only a starting point: both ends are checked against
/// kl itself, so the bisection returns the same double it would from [0, ½].
fn newton_bracket(b: f64) -> Option<(f64, f64)> {
    // Below ½, where kl' is finite: at ½ Newton could not move.
    let mut x = (b / 2.0).sqrt().min(0.5 * (1.0 - 2f64.powi(-20)));
    for _ in 0..NEWTON_STEPS {
        // kl'(x) = ln((1 + 2x)/(1 − 2x)): ∞ at ½, where b < ln 2 lies below.
        let slope = (2.0 * x).ln_1p() - (-2.0 * x).ln_1p();
        let next = x - (kl_of_offset(x) - b) / slope;
        if !(next.is_finite() && next > 0.0 && next < 0.5) || next == x {
            break;
        }
        x = next;
    }
    let mut width = x * BRACKET_WIDTH;
    for _ in 0..4 {
        let (lo, hi) = ((x - width).max(0.0), (x + width).min(0.5));
        if kl_of_offset(lo) < b && kl_of_offset(hi) >= b {
            return Some((lo, hi));
        }
        width *= 256.0;
    }
    None
}

/// Newton steps before the bracket is checked: from √(b/2) the relative
/// error is ~x²/3 and squares each step, so four reach round-off for every
/// b below ~0.6 nats; near ln 2 (x → ½) the bracket check widens instead.
const NEWTON_STEPS: u32 = 6;

/// The bracket's half-width relative to Newton's x: ~2¹² ulps of x, wider
/// than the KL's few-ulp rounding moves the root.
const BRACKET_WIDTH: f64 = 1e-12;

/// Bisection on [lo, hi] (kl(lo) < b ≤ kl(hi)) down to adjacent doubles;
/// returns the upper end.
fn bisect(b: f64, mut lo: f64, mut hi: f64) -> f64 {
    loop {
        let mid = lo + (hi - lo) / 2.0;
        if mid <= lo || mid >= hi {
            return hi;
        }
        if kl_of_offset(mid) < b {
            lo = mid;
        } else {
            hi = mid;
        }
    }
}

/// The ε such that (ε, [`DELTA`])-DP gives the same MIA bound `mia`
/// (a fraction): from s = 1 − (1−δ)/(1+e^ε), ε = ln((s−δ)/(1−s)).
///
/// Computed as `ln_1p(2x − 2δ) − ln_1p(−2x)` with x = s − ½, which is exact
/// near ½. Returns 0 when that is negative (s ≤ ½ + δ/2: even ε = 0 with
/// δ = 10⁻⁵ allows more), +∞ for s ≥ 1, and NaN for NaN.
pub fn epsilon_equivalent(mia: f64) -> f64 {
    if mia.is_nan() {
        return f64::NAN;
    }
    if mia >= 1.0 {
        return f64::INFINITY;
    }
    let x = (mia - 0.5).max(0.0);
    let eps = (2.0 * x - 2.0 * DELTA).ln_1p() - (-2.0 * x).ln_1p();
    if eps > 0.0 { eps } else { 0.0 }
}

/// The MIA success bound (a fraction) of (ε, [`DELTA`])-DP:
/// s = 1 − (1−δ)/(1+e^ε) (Sridhar et al. 2025, quoted in §2.2).
///
/// For ε ≤ 1 this is evaluated as ½ + (expm1(ε) + 2δ)/(2(2 + expm1(ε))),
/// which keeps full precision in s − ½. Negative ε is treated as 0; NaN
/// gives NaN; the result is 1 for ε ≳ 37 (and +∞).
pub fn mia_of_epsilon(eps: f64) -> f64 {
    if eps.is_nan() {
        return f64::NAN;
    }
    let eps = eps.max(0.0);
    if eps <= 1.0 {
        let e = eps.exp_m1();
        0.5 + (e + 2.0 * DELTA) / (2.0 * (2.0 + e))
    } else {
        1.0 - (1.0 - DELTA) / (1.0 + eps.exp())
    }
}

/// The largest T with `mul_up(T, per_query) ≤ target_total`: how many queries
/// at b nats each fit in a total budget, with the product rounded up.
///
/// Saturates at `u64::MAX` (in particular when `per_query` is 0).
///
/// # Runtime
/// One division, then a few [`mul_up`] steps: the estimate ⌊target/b⌋ is
/// within a few units (relative 10⁻¹⁶) of the answer.
pub fn max_queries(per_query: Nats, target_total: Nats) -> u64 {
    if per_query.get() == 0.0 {
        return u64::MAX;
    }
    let fits = |t: u64| mul_up(t, per_query).is_ok_and(|spent| spent <= target_total);
    // `as` saturates: an infinite quotient becomes u64::MAX.
    let mut t = (target_total.get() / per_query.get()).floor() as u64;
    // mul_up is non-decreasing in T, so stepping finds the exact boundary.
    while t > 0 && !fits(t) {
        t -= 1;
    }
    while t < u64::MAX && fits(t + 1) {
        t += 1;
    }
    t
}

/// The largest T such that T queries at `per_query` nats each keep the MIA
/// bound at or below `target_mia` (a fraction, e.g. 0.5108 for 51.08 %).
///
/// # Errors
/// [`PrivacyError::Domain`] unless ½ ≤ `target_mia` < 1 (at 1 every T
/// qualifies).
pub fn max_queries_for_mia(per_query: Nats, target_mia: f64) -> Result<u64, PrivacyError> {
    if !(0.5..1.0).contains(&target_mia) {
        return Err(PrivacyError::Domain(format!(
            "the target MIA success rate must be in [0.5, 1): from the prior 50 % up to, \
             but excluding, 100 % (which any number of queries meets); got {target_mia}"
        )));
    }
    let target_total = Nats::new(kl_from_half(target_mia))?;
    Ok(max_queries(per_query, target_total))
}

/// The largest T such that T queries at `per_query` nats each keep the MIA
/// bound at or below that of (ε, [`DELTA`])-DP: the "T s.t. ε ≤ …" rows of
/// Table 1.
///
/// # Errors
/// [`PrivacyError::Domain`] if `eps` is negative, NaN or infinite, or so large
/// (≳ 37) that its MIA bound rounds to 100 %, which every T satisfies.
pub fn max_queries_for_epsilon(per_query: Nats, eps: f64) -> Result<u64, PrivacyError> {
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(PrivacyError::Domain(format!("target ε must be a finite number ≥ 0 (e.g. 1 or 8), got {eps}")));
    }
    let target_mia = mia_of_epsilon(eps);
    if target_mia >= 1.0 {
        return Err(PrivacyError::Domain(format!(
            "target ε = {eps} allows an MIA success rate of 100 %, so every number of \
             queries meets it; choose ε below 37"
        )));
    }
    max_queries_for_mia(per_query, target_mia)
}

/// A query count the way Table 1 prints it: exact below 1000, otherwise
/// rounded to the nearest thousand, million, billion or trillion (`7K`,
/// `477M`, `3B`); a count that rounds to 1000 of a unit moves to the next
/// unit (999 999 → `1M`). Counts of 10¹⁵ and above stay in trillions.
pub fn compact_count(n: u64) -> String {
    const UNITS: [(u128, &str); 4] = [(1_000, "K"), (1_000_000, "M"), (1_000_000_000, "B"), (1_000_000_000_000, "T")];
    if n < 1000 {
        return n.to_string();
    }
    let n = u128::from(n);
    let round = |unit: u128| (n + unit / 2) / unit;
    let (unit, suffix) = UNITS.into_iter().find(|&(unit, _)| round(unit) < 1000).unwrap_or(UNITS[3]);
    format!("{}{suffix}", round(unit))
}

#[cfg(test)]
mod test;
