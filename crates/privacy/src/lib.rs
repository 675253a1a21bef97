//! pacpriv's privacy core: everything that decides how much noise an answer gets,
//! what the client learns from it, and what that costs. Pure: no I/O, no
//! async, no global state, no logging. Noise comes from a caller's
//! [`rand::CryptoRng`] or from a dataset's secret noise key ([`keyed`]);
//! the one other internal generator is the seeded ChaCha20 that makes the
//! public secret-space assignment reproducible.
//!
//! Paper: Zhu, Sridhar, Devadas, "PAC-Private Responses with Adversarial
//! Composition". The argument for each
//! module is written out in `docs/assurance/privacy-core.md`.
//! How they compose into the session-level guarantee: `docs/assurance/accounting.md`.
//!
//! | module | paper | owns |
//! |---|---|---|
//! | [`nats`] | §2.1 | the checked MI quantity type |
//! | [`conservative`] | — | arithmetic that rounds privacy loss up |
//! | [`noise`] | Thm 2.4 | a calibrated covariance Σ, its certificate, sampling |
//! | [`keyed`] | — | committed noise: the keyed generator of every release's normals |
//! | [`key_audit`] | Alg. 1 | which teacher plus the key's noise is a published release (`pacpriv verify --noise-key`) |
//! | [`label`] | Thm 2.4, §4.2.4 | label-mode calibration (k active classes) |
//! | [`vector`] | Thm 2.4, §2.1 remark | vector-mode calibration (weighted SVD or m × m Gram matrix) |
//! | [`posterior`] | Eq. 4, Lemma 3.2 | the belief over the m subsets |
//! | [`ledger`] | Thm 3.3 | MI spent, budget, refusal |
//! | [`mechanism`] | Algorithm 1 | teacher outputs in, one answered query out, applied atomically |
//! | [`replay`] | Algorithm 1, Eq. 4 | re-deriving a journaled step from its public record (`pacpriv verify`) |
//! | [`noise_audit`] | Thm 2.4, Ville | the sequential test that releases carried the calibrated noise (`pacpriv verify`) |
//! | [`report`] | Eq. 2, §2.2 | MIA bound, ε-equivalent, planning |
//! | [`grid`] | — | the 2⁻³² grid a release leaves on, computed without the centre's rounding |
//! | [`confidence`] | Prop. 5.1 | the confidence filter |
//! | [`attack`] | Prop. 6.1 | the optimal membership-inference rule |
//! | [`secret_space`] | §4.2.1 | which points each subset holds |
//!
//! # Invariants
//!
//! - Every Σ that leaves [`noise`] carries a certificate: ½·tr(Σ⁺C) ≤ b with the
//!   exact C, and range(C) ⊆ range(Σ). Round-off only ever adds noise.
//! - The posterior is kept as normalised log-weights and is never
//!   exponentiated before normalising.
//! - The secret index is a [`mechanism::SecretIndex`], which cannot be printed.
//!
//! # Example
//!
//! Calibrating and releasing one answer: `README.md` beside this crate
//! (run as `tests/readme.rs`).

#![forbid(unsafe_code)]

pub mod attack;
pub mod confidence;
pub mod conservative;
pub mod grid;
pub mod key_audit;
pub mod keyed;
pub mod label;
pub mod ledger;
pub mod mechanism;
pub mod nats;
pub mod noise;
pub mod noise_audit;
pub mod posterior;
pub mod replay;
pub mod report;
pub mod secret_space;
pub mod vector;

pub use nats::Nats;

/// Everything that can go wrong inside the privacy core. Every variant means
/// "nothing was released and no state changed".
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PrivacyError {
    /// An MI quantity was negative, NaN or infinite.
    #[error("{what} must be a finite, non-negative number of nats, got {value}")]
    InvalidNats {
        /// Which quantity.
        what: &'static str,
        /// The offending value.
        value: f64,
    },
    /// A string was not a valid MI quantity.
    #[error("cannot parse {input:?} as nats: expected a decimal (0.0039, 1e-5) or a power of two (2^-32)")]
    ParseNats {
        /// The input as given.
        input: String,
    },
    /// The per-query budget is too small for certified calibration.
    #[error("per-query MI {value:e} nats is below the supported minimum {min:e}")]
    PerQueryTooSmall {
        /// The requested b.
        value: f64,
        /// [`noise::MIN_PER_QUERY`].
        min: f64,
    },
    /// Teacher outputs or a posterior did not fit together.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// A teacher output or weight was NaN or infinite.
    #[error("non-finite value in {0}")]
    NonFinite(&'static str),
    /// The posterior has a different number of subsets than there are teachers.
    #[error("posterior has {posterior} subsets but {teachers} teacher outputs were given")]
    TeacherCount {
        /// Subsets in the posterior.
        posterior: usize,
        /// Teacher outputs given.
        teachers: usize,
    },
    /// Answering would spend more than the budget.
    #[error("MI budget exhausted: spent {spent} of {budget} nats, this answer costs {charge}")]
    BudgetExhausted {
        /// MI already spent.
        spent: Nats,
        /// The session's limit.
        budget: Nats,
        /// What this answer would cost.
        charge: Nats,
    },
    /// LAPACK failed (e.g. did not converge).
    #[error("linear algebra failed: {0}")]
    Linalg(String),
    /// The calibrated covariance could not be certified even after scaling
    /// it up; nothing is released.
    #[error("noise calibration could not be certified: {0}")]
    Uncertified(String),
    /// The teachers disagree and the policy answers unanimous queries
    /// only ([`ledger::Policy::UnanimousOnly`]); nothing was drawn or
    /// charged.
    #[error(
        "the teachers disagree on this query and privacy.policy = \"unanimous_only\" answers only queries they all agree on; nothing was charged"
    )]
    Contested,
    /// An argument outside its documented domain.
    #[error("{0}")]
    Domain(String),
}

impl From<ndarray_linalg::error::LinalgError> for PrivacyError {
    fn from(e: ndarray_linalg::error::LinalgError) -> Self {
        PrivacyError::Linalg(e.to_string())
    }
}
