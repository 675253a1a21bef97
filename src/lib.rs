//! pacpriv: PAC-private predictions.
//!
//! A client's query goes to all m teacher models; the answer released is the
//! argmax of the secret teacher's output plus Gaussian noise calibrated to how
//! much the teachers disagree under what this client has already learned
//! (paper: Zhu, Sridhar, Devadas, *PAC-Private Responses with Adversarial
//! Composition*, Algorithm 1; the argument end to end: `docs/accounting.md`).
//!
//! # Layout
//!
//! From the top of the dependency order down; a module imports only from
//! the layers below its own (checked with `farm-studio look`: no arrow
//! runs back up).
//!
//! 1. [`cli`]: one file per subcommand of the `pacpriv` binary.
//! 2. [`start`]: start-up in one place — builds the store, teachers,
//!    secret and sessions, binds the listeners, shuts them down.
//! 3. [`server`]: request handling — auth, input validation, one module
//!    per RPC, the one error → status mapping.
//! 4. [`settings`]: configuration, parsed into typed values per section.
//! 5. [`session`]: principals, their sessions, the answer cache, the
//!    secret index's lifecycle; applies one step of Algorithm 1 and
//!    returns once it is durable. [`teachers`]: fan-out to all m teachers
//!    over the Open Inference Protocol; `teachers::demo` trains and serves
//!    the digits ensemble.
//! 6. [`store`]: durable records (schema'd, versioned) and where a
//!    session's state lives (`store::cell`) — embedded (redb, group
//!    commit) or PostgreSQL (row-locked steps, for replicas). [`tensor`]:
//!    wire tensors to numbers.
//! 7. [`privacy`]: the pure mathematics — noise calibration (Theorem 2.4)
//!    with a certificate, the posterior update (Eq. 4), the MI ledger, the
//!    MIA/ε reporting (Eq. 2), the confidence test (Prop. 5.1), the
//!    optimal membership attack (Prop. 6.1) and the secret-space
//!    assignment (§4.2.1). No I/O, no async, no global state; imports
//!    nothing from the rest of the crate. Beside it at the ground floor:
//!    [`metrics`], [`net`] (listening sockets), [`trace`] (logs and
//!    OpenTelemetry spans, trace context in and out), [`proto`] (wire
//!    protocols and the store's record schema, compiled from `proto/`).
//!
//! `fuzz` (feature `fuzzing`, and in `cargo test`) holds the fuzzing entry
//! points for every parser of peer-chosen bytes (driven by `fuzz/` and by
//! proptest in CI); it is not part of the product library.
//!
//! A request goes `server` (auth, input) → `session` (preflight) →
//! `teachers` (fan-out) → `session` (`privacy` step, `store` commit) →
//! `server` (response); `docs/architecture.md` follows one Predict from
//! the socket to the ledger.

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
pub mod trace;
