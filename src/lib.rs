//! pacpriv: PAC-private predictions.
//!
//! A client's query goes to all m teacher models; the answer released is the
//! argmax of the secret teacher's output plus Gaussian noise calibrated to how
//! much the teachers disagree under what this client has already learned
//! (paper: `../shared/papers/pac-private-responses.txt`, Algorithm 1).
//!
//! # Layout
//!
//! - [`privacy`]: the pure mathematics — noise calibration (Theorem 2.4) with
//!   a certificate, the posterior update (Eq. 4), the MI ledger, the
//!   MIA/ε reporting (Eq. 2), the confidence test (Prop. 5.1), the optimal
//!   membership attack (Prop. 6.1) and the secret-space assignment (§4.2.1).
//!   No I/O, no async, no global state.
//! - [`server`]: the gRPC front — auth, input validation, one module per
//!   RPC, the one error → status mapping, health and reflection, start-up.
//! - [`session`]: principals, their sessions, the secret index's lifecycle;
//!   applies one step of Algorithm 1 and returns once it is durable.
//! - [`store`]: durable session records — embedded (redb, group commit) or
//!   PostgreSQL (row-locked steps, for replicas).
//! - [`teachers`]: fan-out to all m teachers over the Open Inference
//!   Protocol; `teachers::demo` trains and serves the digits ensemble.
//! - [`settings`]: configuration loading and validation.
//! - [`tensor`]: wire tensors to numbers.
//! - `fuzz` (feature `fuzzing`, and in `cargo test`): fuzzing entry points
//!   for every parser of peer-chosen bytes (driven by `fuzz/` and by
//!   proptest in CI); not part of the product library.
//! - [`proto`]: wire protocols compiled from `proto/` at build time.
//! - [`cli`]: one file per subcommand of the `pacpriv` binary.
//!
//! A request goes `server` (auth, input) → `teachers` (fan-out) → `session`
//! (`privacy` step, `store` commit) → `server` (response).
//! Dependencies run one way: `cli → server → session → store → privacy`;
//! `privacy` imports nothing from the rest of the crate.

#![forbid(unsafe_code)]

pub mod cli;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;
pub mod metrics;
pub mod net;
pub mod privacy;
pub mod proto;
pub mod server;
pub mod session;
pub mod settings;
pub mod start;
pub mod store;
pub mod teachers;
pub mod tensor;
