//! pacpriv: PAC-private predictions — the `pacpriv` binary's command line.
//!
//! The workspace's crates are its layers (`docs/architecture.md`), each
//! depending only on those below it:
//!
//! 1. `pacpriv` (this crate): the binary, [`cli`] routing each subcommand,
//!    the integration tests and the benchmark driver;
//! 2. `pacpriv_tools`: the tools and clients (label, audit, utility, tune,
//!    verify, budget, subsets, admin, health);
//! 3. `pacpriv_service`: the service (server, session, store, teachers,
//!    settings, start, metrics);
//! 4. `pacpriv_demo`: the demo teachers' models and data;
//! 5. `pacpriv_privacy`: the pure mathematics (no I/O, no async).

#![forbid(unsafe_code)]

pub mod cli;
