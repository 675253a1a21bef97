//! The noise audit: sequential tests, from a session's journal alone,
//! that its releases carried the calibrated noise (argument and power:
//! `docs/assurance/privacy-core.md` §9).
//!
//! Replay ([`super::replay`]) checks that every recorded ℓ is the published
//! release's likelihood under the recalibrated Σ_t. An operator who draws
//! from c²·Σ_t (c < 1), or adds nothing, and records the ℓ of what it
//! published under Σ_t passes that check: every such release is a possible
//! draw. What gives it away is the size of the residuals. For candidate
//! subset s, with J_t the directions of Σ_t the audit counts (chosen before
//! the draw, from Σ_t alone) and v_j their variances,
//!
//! ```text
//! Q_t(s) = Σ_{j∈J_t} (u_jᵀ(r_t − x_t(s)))² / v_j
//! ```
//!
//! is, given the past, χ²(|J_t|) for s = s* under honest noise, and a
//! non-central χ² (stochastically larger) for every other s. So for λ > 0
//! fixed in advance, E_t(s) = (1 + 2λ)^{|J_t|/2}·e^{−λ Q̄_t(s)} (Q̄_t ≥ Q_t
//! absorbs the grid and the verifier's round-off) has conditional mean ≤ 1
//! for every s, whatever the adaptively chosen queries.
//!
//! - **Too little noise.** X_T(s) = Π_t (1 + θ(E_t(s) − 1)) / (1 + p̄_t)
//!   is a non-negative supermartingale from 1 for every s, λ and bet size
//!   θ (p̄_t bounds the chance that step t is left out for sitting at the
//!   clamp), and so is the average over the λ grid [`LOWER_LAMBDAS`] (up to
//!   2⁴⁰, past every step's resolution), the bet sizes [`BETS`] (2⁻¹ down
//!   to 2⁻²¹: a step costs the bet of θ at most ln(1/(1 − θ)), so honest
//!   steps cost the small bets almost nothing and cannot recharge room for
//!   dishonest ones) and the m candidates. The same bets run on what J_t
//!   leaves out — the weak and unresolved basis directions, and apart from
//!   them the vector complement — against f_lo, a floor that every
//!   machine's Σ exceeds there, so that noise removed only where J_t does
//!   not look is caught too; and on the counted directions in groups by
//!   the rank of their variance ([`RANK_GROUPS`]), so that noise removed
//!   from a few is not averaged away among many honest ones. All are
//!   averaged. By Ville's inequality
//!   the p-value bound is min(1, 1 / mean X_T). At most
//!   [`near_noiseless_passing`] near-noiseless releases pass it, whatever
//!   the operator knows.
//! - **Too much noise, or a release placed far out.** With Q̲_t ≤ Q_t a
//!   lower bound and 0 < λ < ½, Π_t (1 − 2λ)^{|J_t|/2}·e^{λ Q_t(s*)} has
//!   mean 1; min_s Σ_t Q̲_t(s) ≤ Σ_t Q_t(s*), so
//!   Y_T = Π_t (1 − 2λ)^{|J_t|/2} / (1 + p̄_t) · e^{λ·min_s Σ_t Q̲_t(s)} is
//!   dominated by a supermartingale from 1, with no union bound. It fails
//!   a session whose releases lie farther from every subset's output than
//!   the calibrated noise allows — a decoy release that moves the posterior
//!   where the operator wants it, or large noise on some steps hiding none
//!   on others.
//!
//! Each test runs at α/2, so a dataset honestly served fails with
//! probability ≤ α. A dataset's sessions are one test ([`combine`]): a
//! product does not depend on the order of its factors, so the bets'
//! wealth over all its sessions is the real-time supermartingale's, and a
//! new session brings no fresh wealth.
//!
//! A step's bounds on Q_t(s) are computed in `evidence` ([`evidence`]);
//! the bets on them, a session's audit and the tests across sessions
//! here.
//!
//! # Invariants
//! - Pure: a function of the public record (outputs, Σ_t, the published
//!   release); nothing here sees s* or the draw.
//! - Which directions count is decided from Σ_t and the grid before the
//!   release is looked at, so the degrees of freedom are predictable.
//! - Every approximation is bounded in the direction that makes each test
//!   *less* likely to fire on honest noise.

use super::posterior::log_sum_exp;
use statrs::distribution::{ChiSquared, ContinuousCDF};

mod evidence;
pub use evidence::{Block, StepEvidence, evidence};

/// The too-little-noise test's λ grid, uniform weights: 2⁻⁸, 2⁻⁶, …, 2⁴⁰.
/// A λ near (1/c² − 1)/2 is the most powerful against noise scaled by c,
/// so this covers c from about 0.996 down to 10⁻⁶, past every step's
/// resolution (a counted direction's grid slack is at most 10⁻³ of its
/// standard deviation, [`GRID_SHARE`]): one near-exact release of many
/// degrees of freedom is decisive on its own.
pub const LOWER_LAMBDAS: [f64; 25] = powers_of_two(-8, 2);

/// The shares θ of its running value a too-little-noise bet stakes on each
/// step, uniform weights: 2⁻¹, 2⁻⁵, …, 2⁻²¹. A bet of θ loses at most
/// ln(1/(1 − θ)) ≈ θ on any step, so an honest step costs the small bets
/// almost nothing: a dataset can serve ~1/θ honest steps before the bet of
/// θ has paid one nat for them, and an operator cannot recharge room for
/// dishonest steps by serving honest ones (the bound is
/// [`near_noiseless_passing`]). Fixed sizes, not adaptive ones, so that each
/// bet's wealth is a product over steps that does not depend on their
/// order: a dataset's sessions combine into one test ([`combine`]).
pub const BETS: [f64; 6] = powers_of_two(-1, -4);

/// The counted directions are also bet on in groups by the rank of their
/// variance — the largest alone, the next two, the next four, … and the
/// last group the rest — so that noise removed from a few directions is
/// not averaged away among many honest ones: a direction's group has at
/// most as many directions as rank before it.
pub const RANK_GROUPS: usize = 8;

/// The bets' subspaces: all counted directions together, the left-out
/// basis directions, the complement, and the [`RANK_GROUPS`] groups.
const SUBSPACES: usize = 3 + RANK_GROUPS;

/// 2^first, 2^(first + step), …: exact in binary.
const fn powers_of_two<const N: usize>(first: i32, step: i32) -> [f64; N] {
    let mut out = [0.0; N];
    let mut i = 0;
    while i < N {
        let e = first + step * i as i32;
        let (mut x, mut k) = (1.0, 0);
        while k < e.abs() {
            x = if e > 0 { x * 2.0 } else { x * 0.5 };
            k += 1;
        }
        out[i] = x;
        i += 1;
    }
    out
}

/// The too-much-noise test's λ grid (each < ½), uniform weights.
pub const UPPER_LAMBDAS: [f64; 6] = [0.031_25, 0.0625, 0.125, 0.25, 0.375, 0.45];

/// The default significance: `pacpriv verify --noise-alpha`.
pub const DEFAULT_ALPHA: f64 = 1e-6;

/// A direction counts only if its variance is at least this share of the
/// step's largest (its signal q_j ≥ 10⁻¹⁰ of the largest). Below it a
/// direction's q_j is known only to ~n·2⁻⁵³·q_max/q_j relative, so another
/// machine's kernels would compute another variance for it.
pub const SIGNAL_SHARE: f64 = 1e-5;

/// The share of the largest variance from which a direction counts when
/// the basis is the server's own (label mode; vector mode whose journal
/// names the path the server took): [`SIGNAL_SHARE`], raised for wide
/// blocks so that q_j's round-off, ~n·2⁻⁵²·q_max, moves v_j ∝ √q_j by at
/// most a quarter of [`VARIANCE_DRIFT`]. These weak directions are held to
/// their honest variance; only below this share does the floor apply.
pub fn signal_share(n: usize) -> f64 {
    SIGNAL_SHARE.max((2.0 * n as f64 * f64::EPSILON / (0.25 * VARIANCE_DRIFT)).sqrt())
}

/// An exact release is a finding (not left to the bets) when honest noise
/// would round to one with at most this chance: over a million steps, 10⁻⁶.
pub const EXACT_FINDING: f64 = 1e-12;

/// Flag a session when more than this share of the b charged on its noisy
/// steps lies in directions no test covers.
pub const UNCOVERED_WARNING: f64 = 1e-2;

/// In vector mode (where the basis may come from either
/// decomposition, and the Gram matrix keeps directions down to 10⁻⁶ of its
/// largest eigenvalue while the SVD keeps them all), a direction counts
/// only if its variance is at least this share of the largest (√10⁻⁵: its
/// signal q_j ≥ 10⁻⁵ of the largest, ten times the Gram threshold), so
/// that both paths count the same directions.
pub const SIGNAL_SHARE_EITHER_BASIS: f64 = 3.162_277_660_168_379_5e-3;

/// A direction counts only if the grid moves its whitened coefficient by
/// at most this much: 2⁻³³·√n / √v_j ≤ 10⁻³. Below that variance the
/// rounding of the published release, not the noise, would decide the
/// statistic (at [`VARIANCE_FLOOR`](super::noise::VARIANCE_FLOOR) by a
/// factor of 10¹¹⁵).
pub const GRID_SHARE: f64 = 1e-3;

/// Relative difference allowed between the variances the verifier
/// recomputes and the server's on the directions that count: OpenBLAS
/// kernels differ by ~10⁻¹⁴; the two vector-mode bases by at most
/// ~2·10⁻⁴ from the signal the Gram path leaves out, and, at d ≤ m where
/// only C's basis may have a complement, by its 10⁻³ share of b
/// (`privacy-core.md` §9). Q̄ is inflated by 1 + this.
pub const VARIANCE_DRIFT: f64 = 2e-3;

/// ln((1 − θ) + θ·e^{log_e}): one step of the bet of size θ, in logs (E
/// itself overflows for hundreds of degrees of freedom at λ = 2⁴⁰).
fn bet(theta: f64, log_e: f64) -> f64 {
    if log_e < 700.0 {
        (theta * log_e.exp_m1()).ln_1p()
    } else {
        // θ·E dominates: ln(θE) + ln(1 + (1 − θ)/(θE)).
        log_e + theta.ln() + ((1.0 - theta) * (-log_e).exp() / theta).ln_1p()
    }
}

/// How many distinct statistics a step's bets keep the factors of (label
/// mode has one per class; vector mode's are all distinct, and the
/// search for a repeat would cost more than it saves).
const DISTINCT_STATISTICS: usize = 16;

/// log of each bet's factor on a step of `dof` degrees of freedom whose
/// statistic is `q`, less `penalty`, laid out [λ][θ].
fn factors(q: f64, dof: usize, penalty: f64) -> Vec<f64> {
    let half = 0.5 * dof as f64;
    // At E < e⁻⁴⁰ a bet's factor is 1 − θ to the last bit.
    let lost = BETS.map(|theta| (-theta).ln_1p() - penalty);
    let mut out = Vec::with_capacity(LOWER_LAMBDAS.len() * BETS.len());
    for lambda in LOWER_LAMBDAS {
        let log_e = half * (2.0 * lambda).ln_1p() - lambda * q;
        if log_e < -40.0 {
            out.extend(lost);
        } else {
            out.extend(BETS.map(|theta| bet(theta, log_e) - penalty));
        }
    }
    out
}

/// One subspace's too-little-noise bets: log X(s, λ, θ) for every
/// candidate s, λ of [`LOWER_LAMBDAS`] and θ of [`BETS`], laid out
/// [s][λ][θ].
#[derive(Clone, Debug, PartialEq)]
struct Bets {
    wealth: Vec<f64>,
    /// Σ ln(1 + p̄) over the steps this subspace did not test, owed by
    /// every bet alike (kept apart so that an untested step costs O(1)).
    paid: f64,
}

impl Bets {
    fn new(m: usize) -> Self {
        Bets { wealth: vec![0.0; m * LOWER_LAMBDAS.len() * BETS.len()], paid: 0.0 }
    }

    /// Every bet's log wealth.
    fn values(&self) -> impl Iterator<Item = f64> + Clone + '_ {
        self.wealth.iter().map(move |w| w - self.paid)
    }

    /// One tested step: `statistic[s]` on `dof` degrees of freedom, each
    /// bet then divided by 1 + p̄ (`penalty` = ln(1 + p̄)). Candidates with
    /// the same statistic (in label mode, every teacher of a class) share
    /// one evaluation of the bets' factors.
    fn add(&mut self, statistic: &[f64], dof: usize, penalty: f64) {
        let width = LOWER_LAMBDAS.len() * BETS.len();
        let mut known: Vec<(u64, Vec<f64>)> = Vec::new();
        for (rows, &q) in self.wealth.chunks_mut(width).zip(statistic) {
            let at = known.iter().position(|(bits, _)| *bits == q.to_bits());
            let at = at.unwrap_or_else(|| {
                known.push((q.to_bits(), factors(q, dof, penalty)));
                known.len() - 1
            });
            rows.iter_mut().zip(&known[at].1).for_each(|(w, f)| *w += f);
            if known.len() > DISTINCT_STATISTICS {
                known.clear();
            }
        }
    }

    /// A step this subspace does not test: it stakes nothing (E taken as
    /// 1) and pays the clamp's p̄.
    fn pay(&mut self, penalty: f64) {
        self.paid += penalty;
    }

    /// The product with another session's bets of the same m.
    fn merge(&mut self, other: &Bets) {
        self.wealth.iter_mut().zip(&other.wealth).for_each(|(w, o)| *w += o);
        self.paid += other.paid;
    }
}

/// A session's audit so far.
#[derive(Clone, Debug, PartialEq)]
pub struct NoiseAudit {
    /// The bets on the directions that count, on the left-out basis
    /// directions, on the complement, and on each rank group, each against
    /// its variance or floor ([`SUBSPACES`]).
    bets: Vec<Bets>,
    floor_dof: u64,
    /// Σ_t Q̄_t(s).
    sum: Vec<f64>,
    /// Σ_t Q̲_t(s).
    sum_lower: Vec<f64>,
    /// Σ_t ln(1 + p̄_t).
    clamp_penalty: f64,
    dof: u64,
    steps: u64,
    used: u64,
    clamped: u64,
    weak: u64,
    unresolved: u64,
    complement: u64,
    exact: u64,
    /// Σ_t of the step's uncovered and floor-only shares of b.
    uncovered: f64,
    floor_only: f64,
}

/// The audit's verdict on one session, or on a dataset's sessions
/// together ([`combine`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// min_s Σ_t Q̄_t(s): the residuals' size under the best-fitting subset
    /// (sessions whose secret is not known to be shared: the sum of each
    /// one's).
    pub statistic: f64,
    /// Σ_t |J_t|.
    pub dof: u64,
    /// A bound on the chance that honest noise leaves residuals this small
    /// (too little noise), valid under adaptive queries.
    pub p_less: f64,
    /// A bound on the chance that honest noise leaves residuals this large
    /// under every subset (too much noise, or releases placed far out).
    pub p_more: f64,
    /// √(statistic / dof): the noise's apparent scale against Σ (≈ 1 when
    /// honest; the best-fitting subset lowers it a little).
    pub scale: f64,
    /// Noisy steps seen.
    pub steps: u64,
    /// Steps with at least one direction counted.
    pub used: u64,
    /// Steps left out at the clamp.
    pub clamped: u64,
    /// Directions left out as weak.
    pub weak: u64,
    /// See [`StepEvidence::unresolved`].
    pub unresolved: u64,
    /// See [`StepEvidence::complement`].
    pub complement: u64,
    /// Steps whose release equals a candidate's output exactly.
    pub exact: u64,
    /// Left-out dimensions tested against their floor, summed over steps.
    pub floor_dof: u64,
    /// The share of the b charged on noisy steps that lies in directions
    /// no test covers (0 without a noisy step).
    pub uncovered: f64,
    /// The share held only to the floor.
    pub floor_only: f64,
}

impl Verdict {
    /// The releases carry less noise than calibrated, at significance α/2.
    pub fn less(&self, alpha: f64) -> bool {
        self.p_less < 0.5 * alpha
    }

    /// The releases lie farther out than calibrated noise puts them, at
    /// significance α/2.
    pub fn more(&self, alpha: f64) -> bool {
        self.p_more < 0.5 * alpha
    }

    /// Either test fails: an honest session does so with probability ≤ α.
    pub fn caught(&self, alpha: f64) -> bool {
        self.less(alpha) || self.more(alpha)
    }

    /// Nothing was tested: no direction of any noisy step counted, and no
    /// left-out dimension was tested against its floor.
    pub fn untested(&self) -> bool {
        self.dof == 0 && self.floor_dof == 0
    }
}

impl NoiseAudit {
    /// An audit over `m` candidate subsets.
    pub fn new(m: usize) -> Self {
        NoiseAudit {
            bets: (0..SUBSPACES).map(|_| Bets::new(m)).collect(),
            floor_dof: 0,
            sum: vec![0.0; m],
            sum_lower: vec![0.0; m],
            clamp_penalty: 0.0,
            dof: 0,
            steps: 0,
            used: 0,
            clamped: 0,
            weak: 0,
            unresolved: 0,
            complement: 0,
            exact: 0,
            uncovered: 0.0,
            floor_only: 0.0,
        }
    }

    /// The number of candidate subsets.
    pub fn candidates(&self) -> usize {
        self.sum.len()
    }

    /// Adds one noisy step. Evidence for another number of candidates is
    /// ignored (replay refuses such a step before it gets here).
    pub fn add(&mut self, e: &StepEvidence) {
        self.steps += 1;
        self.weak += e.weak as u64;
        self.unresolved += e.unresolved as u64;
        self.complement += e.complement as u64;
        self.uncovered += if e.clamped { 1.0 } else { e.uncovered };
        self.floor_only += if e.clamped { 0.0 } else { e.floor_only };
        if e.dof == 0 {
            return;
        }
        let penalty = e.clamp_bound.ln_1p();
        self.clamp_penalty += penalty;
        if e.clamped {
            // Left out: the bets stake nothing on it.
            self.clamped += 1;
            self.bets.iter_mut().for_each(|b| b.pay(penalty));
            return;
        }
        let m = self.sum.len();
        if e.statistic.len() != m || e.lower.len() != m {
            return;
        }
        self.used += 1;
        self.exact += u64::from(e.exact);
        self.dof += e.dof as u64;
        for (s, (&q, &low)) in e.statistic.iter().zip(&e.lower).enumerate() {
            self.sum[s] += q;
            self.sum_lower[s] += low;
        }
        let (counted, rest) = self.bets.split_first_mut().expect("SUBSPACES > 0");
        counted.add(&e.statistic, e.dof, penalty);
        let empty = Block::default();
        let blocks = [&e.left, &e.complement_block].into_iter().chain(&e.ranked).chain(std::iter::repeat(&empty));
        for (i, (bets, block)) in rest.iter_mut().zip(blocks).enumerate() {
            if block.statistic.len() == m && block.dof > 0 {
                self.floor_dof += if i < 2 { block.dof as u64 } else { 0 };
                bets.add(&block.statistic, block.dof, penalty);
            } else {
                // Untested, the bet stakes nothing; the clamp's p̄ is paid.
                bets.pay(penalty);
            }
        }
    }

    /// The verdict so far.
    pub fn verdict(&self) -> Verdict {
        let lowest = |x: &[f64]| x.iter().copied().fold(f64::INFINITY, f64::min);
        self.verdict_with(lowest(&self.sum), lowest(&self.sum_lower))
    }

    /// The product with another session's audit of the same m: every bet
    /// and every sum, per candidate.
    fn merge(&mut self, other: &NoiseAudit) {
        for (b, o) in self.bets.iter_mut().zip(&other.bets) {
            b.merge(o);
        }
        self.sum.iter_mut().zip(&other.sum).for_each(|(a, b)| *a += b);
        self.sum_lower.iter_mut().zip(&other.sum_lower).for_each(|(a, b)| *a += b);
        self.merge_counts(other);
    }

    /// Adds another audit's counts and penalties (not its bets or sums).
    fn merge_counts(&mut self, other: &NoiseAudit) {
        self.floor_dof += other.floor_dof;
        self.clamp_penalty += other.clamp_penalty;
        self.dof += other.dof;
        self.steps += other.steps;
        self.used += other.used;
        self.clamped += other.clamped;
        self.weak += other.weak;
        self.unresolved += other.unresolved;
        self.complement += other.complement;
        self.exact += other.exact;
        self.uncovered += other.uncovered;
        self.floor_only += other.floor_only;
    }

    /// The verdict with `statistic` as the best fit's Σ Q̄ and `lowest` as
    /// a lower bound on Σ_t Q_t(s*).
    fn verdict_with(&self, statistic: f64, lowest: f64) -> Verdict {
        let m = self.sum.len();
        // The mean of X_T over the subspaces, the candidates, λ and θ.
        let all = self.bets.iter().flat_map(Bets::values);
        let log_mean = if m == 0 { 0.0 } else { log_sum_exp(all) - components(m).ln() };
        self.verdict_from(statistic, lowest, log_mean)
    }

    /// The verdict with the bets' log mean wealth `log_mean` (and, as
    /// [`Self::verdict_with`], the statistic and the bound on Σ_t Q_t(s*)).
    fn verdict_from(&self, statistic: f64, lowest: f64, log_mean: f64) -> Verdict {
        let (p_less, p_more, statistic, scale) = if self.dof == 0 {
            (1.0, 1.0, 0.0, 1.0)
        } else {
            let mean = log_mean;
            let d = self.dof as f64;
            let more = log_sum_exp(
                UPPER_LAMBDAS.iter().map(|l| l * lowest + 0.5 * d * (-2.0 * l).ln_1p() - self.clamp_penalty),
            ) - (UPPER_LAMBDAS.len() as f64).ln();
            ((-mean).exp().min(1.0), (-more).exp().min(1.0), statistic, (statistic / d).sqrt())
        };
        Verdict {
            statistic,
            dof: self.dof,
            p_less,
            p_more,
            scale,
            steps: self.steps,
            used: self.used,
            clamped: self.clamped,
            weak: self.weak,
            unresolved: self.unresolved,
            complement: self.complement,
            exact: self.exact,
            floor_dof: self.floor_dof,
            uncovered: if self.steps == 0 { 0.0 } else { self.uncovered / self.steps as f64 },
            floor_only: if self.steps == 0 { 0.0 } else { self.floor_only / self.steps as f64 },
        }
    }
}

/// The number of bets the too-little-noise test averages over m
/// candidates: the subspaces × m × |Λ| × |Θ|.
fn components(m: usize) -> f64 {
    (SUBSPACES * m * LOWER_LAMBDAS.len() * BETS.len()) as f64
}

/// Whether a dataset's sessions are known to share one secret subset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secret {
    /// They committed to one dataset's noise key: one s* for all, so the
    /// too-much-noise test takes min_s of the sum over sessions.
    Shared,
    /// Not known (journals before noise keys): each session's s* may be
    /// another, so that test sums each session's min_s. The too-little-noise
    /// bets hold for every candidate either way.
    Unknown,
}

/// One test over sessions of the same m that share one secret or are not
/// known to (argument: `privacy-core.md` §9). Every bet's wealth is a
/// product over steps of factors whose conditional mean, given everything
/// released before that step in any session, is at most 1 — for every
/// candidate, not only s* — and a product does not depend on the order its
/// factors are taken in: so the product over all the steps, session by
/// session, is the real-time supermartingale's value at the export, and
/// Ville's inequality holds for it. `None` when the sessions have
/// different numbers of candidates.
pub fn combine<'a>(sessions: impl IntoIterator<Item = &'a NoiseAudit>, secret: Secret) -> Option<Verdict> {
    Some(verdict_across(&[Part::of([(sessions.into_iter().collect(), secret)])?]))
}

/// One test over every session of an export, whatever its number of
/// candidates: `by_m` holds, per m, its sessions in groups that each share
/// one secret or are not known to (the too-much-noise test sums each
/// group's lower bound on Σ_t Q_t(s*): min_s of the group's sums where it
/// shares one secret, each session's min_s where not known to).
/// Each step moves the bets of its own m only, so for every subspace, λ
/// and θ the product over the m's of each m's average over its candidates
/// is a supermartingale from 1, and so is their average: an operator who
/// journals sessions with other teacher counts gets no fresh wealth (each
/// further m costs the test ln m, not a new α). `None` when a group mixes
/// numbers of candidates.
pub fn combine_export<'a>(by_m: impl IntoIterator<Item = Vec<(Vec<&'a NoiseAudit>, Secret)>>) -> Option<Verdict> {
    let parts: Option<Vec<Part>> = by_m.into_iter().map(Part::of).collect();
    Some(verdict_across(&parts?))
}

/// One number of candidates' share of a test: its sessions' audits merged,
/// the best fit's statistic, and a lower bound on Σ_t Q_t(s*).
struct Part {
    all: NoiseAudit,
    statistic: f64,
    lowest: f64,
}

impl Part {
    fn of<'a>(groups: impl IntoIterator<Item = (Vec<&'a NoiseAudit>, Secret)>) -> Option<Part> {
        let lowest_of = |x: &[f64]| if x.is_empty() { 0.0 } else { x.iter().copied().fold(f64::INFINITY, f64::min) };
        let mut part = Part { all: NoiseAudit::new(0), statistic: 0.0, lowest: 0.0 };
        let mut first = true;
        for (sessions, secret) in groups {
            let Some((head, rest)) = sessions.split_first() else { continue };
            let mut group = (*head).clone();
            for a in rest {
                if a.candidates() != group.candidates() {
                    return None;
                }
                group.merge(a);
            }
            let fit = |a: &NoiseAudit| (if a.dof == 0 { 0.0 } else { lowest_of(&a.sum) }, lowest_of(&a.sum_lower));
            let (s, l) = match secret {
                Secret::Shared => fit(&group),
                Secret::Unknown => sessions.iter().map(|a| fit(a)).fold((0.0, 0.0), |(s, l), (a, b)| (s + a, l + b)),
            };
            part.statistic += s;
            part.lowest += l;
            if first {
                part.all = group;
                first = false;
            } else if part.all.candidates() != group.candidates() {
                return None;
            } else {
                part.all.merge(&group);
            }
        }
        Some(part)
    }
}

/// The verdict of one test over `parts` (each its own m).
fn verdict_across(parts: &[Part]) -> Verdict {
    let mut total = NoiseAudit::new(0);
    parts.iter().for_each(|p| total.merge_counts(&p.all));
    let statistic: f64 = parts.iter().map(|p| p.statistic).sum();
    let lowest: f64 = parts.iter().map(|p| p.lowest).sum();
    let tested: Vec<&Part> = parts.iter().filter(|p| p.all.candidates() > 0).collect();
    // log X per (subspace, λ, θ): Σ over the m's of the log of that m's
    // average over its candidates.
    let width = LOWER_LAMBDAS.len() * BETS.len();
    let per_component = (0..SUBSPACES).flat_map(|sub| (0..width).map(move |k| (sub, k))).map(|(sub, k)| {
        tested
            .iter()
            .map(|p| {
                let m = p.all.candidates();
                let bets = &p.all.bets[sub];
                log_sum_exp((0..m).map(|s| bets.wealth[s * width + k] - bets.paid)) - (m as f64).ln()
            })
            .sum::<f64>()
    });
    let log_mean = log_sum_exp(per_component.collect::<Vec<_>>()) - ((SUBSPACES * width) as f64).ln();
    total.verdict_from(statistic, lowest, log_mean)
}

/// The χ²_k quantile at `u`, by bisection on the CDF (statrs' inverse is
/// NaN in the far left tail).
fn chi_squared_quantile(chi: &ChiSquared, k: usize, u: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, 10.0 * k as f64 + 200.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if chi.cdf(mid) < u { lo = mid } else { hi = mid }
    }
    0.5 * (lo + hi)
}

/// The expected degrees of freedom after which noise scaled by `c` on
/// steps of `k` degrees of freedom each is caught at significance `alpha`
/// among `m` candidates: ln(2·11m·|Λ|·|Θ|/α) (11 subspaces) over the best bet's expected
/// gain per step, E ln(1 − θ + θ(1 + 2λ)^{k/2} e^{−λc²χ²_k}) (numerical,
/// over 4 000 quantiles of χ²_k), times k. The statistic's spread moves
/// the actual point by O(√D); `None` when no bet gains more than the
/// quadrature's error (c too close to 1).
pub fn expected_dof(c: f64, k: usize, m: usize, alpha: f64) -> Option<f64> {
    let chi = ChiSquared::new(k as f64).ok()?;
    let n = 4_000;
    let quantiles: Vec<f64> = (0..n).map(|i| chi_squared_quantile(&chi, k, (i as f64 + 0.5) / n as f64)).collect();
    let gain = LOWER_LAMBDAS
        .iter()
        .flat_map(|&l| BETS.map(|theta| (l, theta)))
        .map(|(l, theta)| {
            let log_e = |x: f64| 0.5 * k as f64 * (2.0 * l).ln_1p() - l * c * c * x;
            quantiles.iter().map(|&x| bet(theta, log_e(x))).sum::<f64>() / n as f64
        })
        .fold(f64::NEG_INFINITY, f64::max);
    let threshold = (2.0 * components(m) / alpha).ln();
    // Honest noise's gain is at most 0 (Jensen); the quadrature's error
    // is far below this.
    (gain > QUADRATURE_ERROR).then(|| threshold / gain * k as f64)
}

/// Gains per step below this are within [`expected_dof`]'s quadrature
/// error, and taken as none.
const QUADRATURE_ERROR: f64 = 1e-7;

/// The chance, per near-noiseless release, that the bound
/// [`near_noiseless_passing`] does not cover it: its draw's χ² is above
/// this upper quantile.
pub const NEAR_NOISELESS_TAIL: f64 = 1e-6;

/// The guarantee (`privacy-core.md` §9): at most this many releases whose
/// noise is scaled by `c` or less, on steps of `k` degrees of freedom that
/// count, pass the too-little-noise test at `alpha` in a dataset of `m`
/// candidates that also served `honest` other noisy steps — in any order,
/// by an operator who knows the audit and its wealth at every step. Each
/// such release's draw must have its χ²_k below the 1 − 10⁻⁶ quantile
/// ([`NEAR_NOISELESS_TAIL`]) and the grid to move its whitened residual by
/// at most `slack` (at most [`GRID_SHARE`] on any direction that counts);
/// the clamp's p̄ is taken at 0 (each step's ln(1 + p̄) adds to its honest
/// cost).
///
/// For every bet (θ, λ) on s*, an honest step lowers log X by at most
/// ln(1/(1 − θ)) and a near-noiseless one raises it by at least
/// g = ln(1 − θ + θ(1 + 2λ)^{k/2}e^{−λQ̄_max}); the dataset passes only if
/// every bet stays below 2·11m|Λ||Θ|/α (11 subspaces), so N·g − H·ln(1/(1 − θ)) <
/// ln(2·11m|Λ||Θ|/α) for every bet, and N is at most the least over bets of
/// ⌈(ln(2·11m|Λ||Θ|/α) + H·ln(1/(1 − θ)))/g⌉ − 1. It grows like ln H: the
/// bet of θ ≈ 1/H pays about one nat for the honest steps.
pub fn near_noiseless_passing(c: f64, k: usize, m: usize, honest: u64, alpha: f64, slack: f64) -> u64 {
    let Ok(chi) = ChiSquared::new(k as f64) else {
        return u64::MAX;
    };
    let reach = c * chi_squared_quantile(&chi, k, 1.0 - NEAR_NOISELESS_TAIL).sqrt() + slack * (1.0 + 1e-6);
    let q_max = (1.0 + VARIANCE_DRIFT) * reach * reach;
    let threshold = (2.0 * components(m) / alpha).ln();
    LOWER_LAMBDAS
        .iter()
        .flat_map(|&l| BETS.map(|theta| (l, theta)))
        .filter_map(|(l, theta)| {
            let gain = bet(theta, 0.5 * k as f64 * (2.0 * l).ln_1p() - l * q_max);
            let room = threshold - honest as f64 * (-theta).ln_1p();
            (gain > 0.0).then(|| (room / gain).ceil() as u64 - 1)
        })
        .min()
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
mod test;
