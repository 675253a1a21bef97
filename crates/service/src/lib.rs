//! pacpriv-service: the PAC-private prediction service.
//!
//! A client's query goes to all m teacher models; the answer released is the
//! argmax of the secret teacher's output plus Gaussian noise calibrated to how
//! much the teachers disagree under what this client has already learned
//! (paper: Zhu, Sridhar, Devadas, *PAC-Private Responses with Adversarial
//! Composition*, Algorithm 1; the argument end to end: `docs/assurance/accounting.md`).
//! The mathematics is the `pacpriv_privacy` crate; this crate is everything
//! that turns it into a service.
//!
//! # Layout
//!
//! From the top of the dependency order down: a module imports only the
//! modules named after it in this list, and `pacpriv_store`,
//! `pacpriv_privacy` and `pacpriv_demo` below this crate. `tests/module_order.rs` checks the
//! first from the source's `crate::…`/`super::…` paths (and the order of
//! the files inside `session/` and `settings/`, which their
//! `mod.rs` lists); cargo enforces the second (`docs/architecture.md`).
//!
//! 1. [`start`]: start-up in one place — builds the store, teachers,
//!    secret and sessions, binds the listeners, shuts them down.
//! 2. [`server`]: request handling — auth, input validation, one module
//!    per RPC, the one error → status mapping.
//! 3. [`settings`]: configuration, parsed into typed values per section.
//! 4. [`session`]: principals, their sessions, the answer cache, the
//!    secret index's lifecycle; applies one step of Algorithm 1 and
//!    returns once it is durable. [`teachers`]: fan-out to all m teachers
//!    over the Open Inference Protocol; `teachers::demo` serves the demo
//!    teachers (`pacpriv_demo`).
//! 5. [`tensor`]: wire tensors to numbers.
//! 6. the ground floor: [`metrics`], [`net`] (listening sockets), [`trace`] (logs and
//!    OpenTelemetry spans, trace context in and out), [`proto`] (wire
//!    protocols, compiled from `proto/`).
//!
//! Below this crate: `pacpriv_store`, durable records and where a
//! session's state lives (`pacpriv_store::cell`) — embedded (redb, group
//! commit) or PostgreSQL (row-locked steps, for replicas) — over
//! `pacpriv_records`, the records' formats.
//!
//! `fuzz` (feature `fuzzing`, and in `cargo test`) holds the fuzzing entry
//! points for every parser of peer-chosen bytes (driven by `fuzz/` and by
//! proptest in CI); it is not part of the product library.
//!
//! A request goes `server` (auth, input) → `session` (preflight) →
//! `teachers` (fan-out) → `session` (`pacpriv_privacy` step, `pacpriv_store` commit) →
//! `server` (response); `docs/architecture.md` follows one Predict from
//! the socket to the ledger.

#![forbid(unsafe_code)]

#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;
pub mod metrics;
pub mod net;
pub mod proto;
pub mod server;
pub mod session;
pub mod settings;
pub mod start;
pub mod teachers;
pub mod tensor;
pub mod trace;
