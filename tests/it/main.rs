//! Integration tests: one binary, one module per area, shared helpers in
//! `util`. These run the real `pacpriv` binary, with the shipped fan-out
//! (dynamic batching, one model per teacher); `tests/unbatched.rs` and
//! `tests/stacked.rs` run the server-facing modules again with the other
//! fan-out variants.

/// Environment added to every `pacpriv serve` the tests start: none, the
/// shipped defaults.
pub const FANOUT: &[(&str, &str)] = &[];

mod accuracy;
mod audit;
mod bench;
mod bench_store;
mod budget;
mod canaries;
mod client;
mod crash;
mod disk_full;
mod drain;
mod edges;
mod faults;
mod http;
mod hygiene;
mod identity;
mod interop;
mod isolation;
mod label;
mod limits;
mod models;
mod ops;
mod reload;
mod replicas;
mod retry;
mod service;
mod soak;
mod start_wait;
mod startup;
mod store;
mod strangers;
mod subsets;
mod teacher_tls;
mod telemetry;
mod tune;
mod unanimous;
mod util;
mod utility;
mod verify;
