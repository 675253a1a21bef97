//! `grpc.health.v1.Health` on every listener: tonic-health's service, its
//! statuses set by [`crate::start::readiness`], its `Watch` streams ending
//! when their connection reaches `server.max_connection_age_ms`
//! ([`Aged`]): an open `Watch` would otherwise let a stranger hold a slot
//! for ever.

use crate::net::aged::Aged;
use std::time::Duration;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

/// The health service over `reporter`'s statuses, its `Watch` streams
/// ending at `max_age` of their connection.
pub fn server(reporter: &HealthReporter, max_age: Duration) -> Aged<HealthServer<HealthService>> {
    Aged::new(HealthServer::new(HealthService::from_health_reporter(reporter.clone())), max_age)
}
