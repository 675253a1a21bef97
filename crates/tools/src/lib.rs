//! pacpriv-tools: the tools and clients of the `pacpriv` binary, one module
//! per subcommand, each with `Args` (parsed and validated by clap) and `run`
//! (applies them). The binary's dispatcher (`pacpriv::cli`) routes to them.
//!
//! - planning, offline: [`budget`], [`subsets`], [`utility`], [`tune`];
//! - against a running server: [`label`], [`audit`], [`admin`], [`health`]
//!   (channels and TLS flags in [`connect`]);
//! - over an exported journal: [`verify`].
//!
//! `audit`, `tune` and `utility` train the demo ensemble themselves, so
//! they exist with the `demo` feature only (on by default).
//!
//! The only users of `plotters`, `indicatif` and `csv` in the workspace.
//! `anyhow` is allowed here (command glue); the libraries below return
//! typed errors.

#![forbid(unsafe_code)]

pub mod admin;
#[cfg(feature = "demo")]
pub mod audit;
pub mod budget;
pub mod connect;
#[cfg(feature = "demo")]
pub mod demo_model;
pub mod health;
pub mod label;
pub mod subsets;
#[cfg(feature = "demo")]
pub mod tune;
#[cfg(feature = "demo")]
pub mod utility;
/// `pacpriv verify`: the verifier, a crate of its own so that an auditor
/// builds it without the server (`pacpriv-verify`).
pub use pacpriv_verify as verify;

/// An error after which running the same command again continues the
/// work (a labelling job stopped by an exhausted budget, an unavailable
/// server or an interrupt): `main` exits with 75 (`EX_TEMPFAIL`) for it
/// instead of 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Resumable(pub String);

/// The plural ending for `n` of something ("" for one, "s" otherwise).
fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}
