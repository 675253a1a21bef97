//! The server-facing integration tests again with the stacked layout
//! (`teachers.layout = "stacked"`): one model answering for all m teachers
//! per batch must behave exactly as m models.

/// Environment added to every `pacpriv serve` these tests start.
pub const FANOUT: &[(&str, &str)] = &[("PACPRIV__TEACHERS__LAYOUT", "stacked")];

#[path = "it/audit.rs"]
mod audit;
#[path = "it/crash.rs"]
mod crash;
#[path = "it/label.rs"]
mod label;
#[path = "it/models.rs"]
mod models;
#[path = "it/ops.rs"]
mod ops;
#[path = "it/replicas.rs"]
mod replicas;
#[path = "it/service.rs"]
mod service;
#[path = "it/util/mod.rs"]
#[allow(dead_code)]
mod util;
