//! What one noisy step contributes to the audit ([`evidence`]): for every
//! candidate s, bounds Q̲_t(s) ≤ Q_t(s) ≤ Q̄_t(s) on the whitened residual
//! Q_t(s) = (r_t − x_s)ᵀ Σ_t⁺ (r_t − x_s) over the directions that count,
//! by rank group, and the left-out directions' blocks against their
//! floors (the module's equations are in [`super`]; the argument in
//! `docs/assurance/privacy-core.md` §9).

use super::{GRID_SHARE, RANK_GROUPS, SIGNAL_SHARE_EITHER_BASIS, VARIANCE_DRIFT, signal_share};
use crate::grid::{self, PUBLISHED_CLAMP, PUBLISHED_GRID};
use crate::noise::Noise;
use ndarray::{Array1, Array2, ArrayView1};
use statrs::distribution::{ContinuousCDF, Normal};

/// One block of directions a step's bets test: its degrees of freedom and,
/// per candidate, an upper bound on its whitened residual (empty when not
/// tested).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    /// Directions in the block (0: not tested).
    pub dof: usize,
    /// The bound per candidate.
    pub statistic: Vec<f64>,
}

/// What one noisy step contributes to the audit.
#[derive(Clone, Debug, PartialEq)]
pub struct StepEvidence {
    /// Q̄_t(s) ≥ Q_t(s) for every candidate s (empty when no direction
    /// counts or the step is clamped).
    pub statistic: Vec<f64>,
    /// Q̲_t(s) ≤ Q_t(s) for every candidate s (likewise).
    pub lower: Vec<f64>,
    /// The counted directions by rank group ([`RANK_GROUPS`]; groups the
    /// step has too few directions for are empty).
    pub ranked: Vec<Block>,
    /// The left-out basis directions (weak, unresolved), tested against a
    /// floor every machine's Σ exceeds there: an upper bound of
    /// ‖P(r − x_s)‖²/f_lo for every candidate.
    pub left: Block,
    /// The vector complement, likewise.
    pub complement_block: Block,
    /// |J_t|: the directions that count.
    pub dof: usize,
    /// p̄_t: a bound on the chance that honest noise reaches the clamp on
    /// one of the block's coordinates (0 when no direction counts).
    pub clamp_bound: f64,
    /// Directions left out because their variance is below the signal
    /// share of the largest ([`SIGNAL_SHARE`](super::SIGNAL_SHARE), [`SIGNAL_SHARE_EITHER_BASIS`]).
    pub weak: usize,
    /// Directions left out because the 2⁻³² grid cannot resolve them
    /// ([`GRID_SHARE`]).
    pub unresolved: usize,
    /// Dimensions of the isotropic complement left out (vector mode: its
    /// variance covers round-off and left-out signal, machine-dependent).
    pub complement: usize,
    /// The release sits at the ±2²⁰ clamp on a noisy coordinate: its exact
    /// value is unknown and the step is left out (counted in p̄).
    pub clamped: bool,
    /// The published block equals a candidate's output exactly although a
    /// direction that counts carries noise.
    pub exact: bool,
    /// A bound on the chance that honest noise rounds to an exact release:
    /// D·Π_j min(1, √(2/π)·2⁻³³‖u_j‖₁/√v_j) over the directions that count,
    /// D the distinct centres (every coordinate within half a grid step of
    /// a centre puts each |u_jᵀ(r − x)| within 2⁻³³‖u_j‖₁).
    pub exact_chance: f64,
    /// The share of the step's certificate ½·tr(Σ⁺C) (of b) in directions
    /// no test covers (1 when nothing is tested).
    pub uncovered: f64,
    /// The share held only to the floor (the left-out bets).
    pub floor_only: f64,
}

/// The evidence of one noisy step: `noise` is Σ_t as the verifier
/// recalibrated it, `published` the release on `noise`'s coordinates,
/// `centres[s]` candidate s's output there, `weights[s]` its posterior
/// weight (for the shares of b), and `either_basis` whether the basis may
/// come from either vector-mode decomposition (vector mode whose journal
/// does not name the server's).
pub fn evidence(
    noise: &Noise,
    published: ArrayView1<'_, f64>,
    centres: &[Array1<f64>],
    weights: ArrayView1<'_, f64>,
    either_basis: bool,
) -> StepEvidence {
    let n = noise.coords().len();
    let v = noise.variances();
    let largest = v.iter().fold(0.0f64, |a, &x| a.max(x));
    let share = if either_basis { SIGNAL_SHARE_EITHER_BASIS } else { signal_share(n) };
    let resolvable = grid::resolved_variance(n, GRID_SHARE);
    let (mut weak, mut unresolved) = (0, 0);
    let mut used = Vec::new();
    // Written so that a NaN variance counts as left out.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    for (j, &vj) in v.iter().enumerate() {
        if !(vj >= share * largest) {
            weak += 1;
        } else if !(vj >= resolvable) {
            unresolved += 1;
        } else {
            used.push(j);
        }
    }
    let complement = if noise.complement() > 0.0 { n - noise.rank() } else { 0 };
    let mut e = StepEvidence {
        statistic: Vec::new(),
        lower: Vec::new(),
        ranked: Vec::new(),
        left: Block::default(),
        complement_block: Block::default(),
        dof: used.len(),
        clamp_bound: 0.0,
        weak,
        unresolved,
        complement,
        clamped: false,
        exact: false,
        exact_chance: 1.0,
        uncovered: 1.0,
        floor_only: 0.0,
    };
    if used.is_empty() {
        return e;
    }
    e.clamp_bound = clamp_bound(noise, centres, largest);
    e.clamped = published.iter().any(|x| x.abs() >= PUBLISHED_CLAMP);
    if e.clamped {
        return e;
    }
    e.exact = centres.iter().any(|x| x.iter().zip(&published).all(|(a, b)| a.to_bits() == b.to_bits()));
    // Any of the distinct centres (Anderson's inequality: a box about
    // another centre is no likelier than about the draw's own); on a basis
    // that may not be the server's, its variances may be 1 − drift of ours.
    let mut distinct: Vec<&Array1<f64>> = Vec::new();
    for x in centres {
        if !distinct.contains(&x) {
            distinct.push(x);
        }
    }
    let basis_drift = if either_basis { (1.0 - VARIANCE_DRIFT).powf(-0.5 * used.len() as f64) } else { 1.0 };
    e.exact_chance = (distinct.len() as f64
        * basis_drift
        * used
            .iter()
            .map(|&j| {
                let width = 0.5 * PUBLISHED_GRID * noise.basis().column(j).iter().map(|x| x.abs()).sum::<f64>();
                ((2.0 / std::f64::consts::PI).sqrt() * width / v[j].sqrt()).min(1.0)
            })
            .product::<f64>())
    .min(1.0);

    let basis = noise.basis();
    let v_min = used.iter().map(|&j| v[j]).fold(f64::INFINITY, f64::min);
    // The counted directions by rank of variance, largest first: group g
    // holds ranks 2^g − 1 … 2^(g+1) − 2, the last group the rest.
    let mut by_rank = used.clone();
    by_rank.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); RANK_GROUPS];
    for (rank, &j) in by_rank.iter().enumerate() {
        groups[((rank + 1).ilog2() as usize).min(RANK_GROUPS - 1)].push(j);
    }
    e.ranked = groups.iter().map(|g| Block { dof: g.len(), statistic: Vec::new() }).collect();
    // How far a whitened residual over k directions of variance ≥ var can
    // be between the exact release and the published one: the grid's
    // 2⁻³³ a coordinate, then the verifier's round-off of uᵀδ (within
    // (n + 2)·2⁻⁵³·‖δ‖ a coefficient, allowed four times over), through
    // ‖U‖₂ ≤ √(1 + η): η ≤ 10⁻¹⁰ from the Orthonormal check in output
    // space, up to 2·10⁻⁵ (and a little) for a basis checked from G
    // (vector mode), so ‖U‖₂ ≤ 1 + 2·10⁻⁵.
    let gamma = 4.0 * (n + 2) as f64 * f64::EPSILON;
    let slack = |delta: &Array1<f64>, k: usize, var: f64| {
        (1.0 + 2e-5) * (0.5 * PUBLISHED_GRID * (n as f64).sqrt() + gamma * delta.dot(delta).sqrt() * (k as f64).sqrt())
            / var.sqrt()
    };
    // What J leaves out, tested against f_lo: Σ ⪰ f_lo·I on span(U) (no
    // variance below noise::dynamic_range_floor of the largest) and, with a
    // complement, on the whole block (the complement, and so every
    // variance, is at least what the grid resolves:
    // vector::complement_floor). The left-out basis directions and the
    // complement are tested apart, so that one's honest noise cannot mask
    // the other's absence; each only where f_lo is itself resolvable.
    let top = largest.max(noise.complement());
    let with_complement = noise.complement() > 0.0;
    // The grid's floor holds for the server's Σ only if it had a complement
    // too: in vector mode with n ≤ m the SVD spans all n directions and has
    // none, while C's basis may leave one out (issue 56), and the server
    // may have taken either.
    let server_had_complement = with_complement && !(either_basis && n <= centres.len());
    let f_lo = (crate::noise::dynamic_range_floor(n) * top * (1.0 - VARIANCE_DRIFT)).max(if server_had_complement {
        resolvable
    } else {
        0.0
    });
    let left: Vec<usize> = (0..v.len()).filter(|j| !used.contains(j)).collect();
    let test_left = f_lo >= resolvable && !left.is_empty();
    let test_complement = f_lo >= resolvable && with_complement;
    let u_left = Array2::from_shape_fn((n, left.len()), |(i, k)| basis[[i, left[k]]]);
    // ‖P δ‖²/f_lo for a part P δ of δ outside J, bounded above likewise.
    let floor_bound = |part: &Array1<f64>, delta: &Array1<f64>| {
        (1.0 + VARIANCE_DRIFT) * (norm(part) / f_lo.sqrt() + slack(delta, n, f_lo)).powi(2)
    };
    let mut coefficients = Vec::with_capacity(centres.len());
    let mut outside = Vec::with_capacity(centres.len());
    for x in centres {
        // r̂ − x is exact: both are multiples of 2⁻³² below 2²¹.
        let delta = &published - x;
        let t = basis.t().dot(&delta);
        if with_complement {
            outside.push(&delta - &basis.dot(&t));
        }
        let root = used.iter().map(|&j| t[j] * t[j] / v[j]).sum::<f64>().sqrt();
        let s = slack(&delta, used.len(), v_min);
        e.statistic.push((1.0 + VARIANCE_DRIFT) * (root + s).powi(2));
        e.lower.push((root - s).max(0.0).powi(2) / (1.0 + VARIANCE_DRIFT));
        for (block, group) in e.ranked.iter_mut().zip(&groups).filter(|(_, g)| !g.is_empty()) {
            let root = group.iter().map(|&j| t[j] * t[j] / v[j]).sum::<f64>().sqrt();
            let least = group.iter().map(|&j| v[j]).fold(f64::INFINITY, f64::min);
            block.statistic.push((1.0 + VARIANCE_DRIFT) * (root + slack(&delta, group.len(), least)).powi(2));
        }
        if test_left {
            let t_left: Array1<f64> = left.iter().map(|&j| t[j]).collect();
            e.left.statistic.push(floor_bound(&u_left.dot(&t_left), &delta));
        }
        coefficients.push(t);
        if let Some(part) = outside.last().filter(|_| test_complement) {
            e.complement_block.statistic.push(floor_bound(part, &delta));
        }
    }
    e.left.dof = if test_left { left.len() } else { 0 };
    e.complement_block.dof = if test_complement { n - noise.rank() } else { 0 };

    // Where b lies: ½·tr(Σ⁺C) splits into c_j/v_j per basis direction and
    // E‖P⊥(x − x̄)‖²/f over the complement, with c_j = E(u_jᵀ(x − x̄))² under
    // the posterior, computed from r − x (the release's offset cancels).
    let total = weights.sum();
    let spread = |values: &[f64]| {
        let mean = values.iter().zip(&weights).map(|(x, w)| x * w).sum::<f64>() / total;
        values.iter().zip(&weights).map(|(x, w)| w * (x - mean).powi(2)).sum::<f64>() / total
    };
    let per_direction: Vec<f64> =
        (0..v.len()).map(|j| spread(&coefficients.iter().map(|t| t[j]).collect::<Vec<_>>()) / v[j]).collect();
    let in_complement = if with_complement {
        (0..n).map(|i| spread(&outside.iter().map(|p| p[i]).collect::<Vec<_>>())).sum::<f64>() / noise.complement()
    } else {
        0.0
    };
    let all = per_direction.iter().sum::<f64>() + in_complement;
    if all > 0.0 && all.is_finite() {
        let (mut floor_only, mut none) = (0.0, 0.0);
        let left_share: f64 = left.iter().map(|&j| per_direction[j]).sum();
        *(if test_left { &mut floor_only } else { &mut none }) += left_share;
        *(if test_complement { &mut floor_only } else { &mut none }) += in_complement;
        e.uncovered = none / all;
        e.floor_only = floor_only / all;
    }
    e
}

/// ‖x‖₂.
fn norm(x: &Array1<f64>) -> f64 {
    x.dot(x).sqrt()
}

/// A bound on P(some coordinate of the block reaches ±2²⁰) under honest
/// noise: each coordinate's variance is at most Σ's largest eigenvalue,
/// and its centre is within the largest |x_s| of 0.
fn clamp_bound(noise: &Noise, centres: &[Array1<f64>], largest: f64) -> f64 {
    let n = noise.coords().len();
    let centre = centres.iter().flat_map(|x| x.iter()).fold(0.0f64, |a, x| a.max(x.abs()));
    let margin = PUBLISHED_CLAMP - 0.5 * PUBLISHED_GRID - centre;
    let sd = (largest.max(noise.complement()) * (1.0 + VARIANCE_DRIFT)).sqrt();
    if !(margin > 0.0 && sd > 0.0) {
        return 1.0;
    }
    let tail = Normal::standard().sf(margin / sd);
    (2.0 * n as f64 * tail).min(1.0)
}
