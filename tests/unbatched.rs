//! The server-facing integration tests again with dynamic batching off
//! (`teachers.batch_window_ms = 0`): every query asked on its own must
//! behave exactly as a batched one.

/// Environment added to every `pacpriv serve` these tests start.
pub const FANOUT: &[(&str, &str)] = &[("PACPRIV__TEACHERS__BATCH_WINDOW_MS", "0")];

#[path = "it/audit.rs"]
mod audit;
#[path = "it/crash.rs"]
mod crash;
#[path = "it/label.rs"]
mod label;
#[path = "it/ops.rs"]
mod ops;
#[path = "it/replicas.rs"]
mod replicas;
#[path = "it/service.rs"]
mod service;
#[path = "it/util/mod.rs"]
#[allow(dead_code)]
mod util;
