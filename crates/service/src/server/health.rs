//! `grpc.health.v1.Health` on every listener: tonic-health's service, its
//! statuses set by [`crate::start::readiness`], with one bound of ours —
//! a `Watch` stream ends when its connection reaches
//! `server.max_connection_age_ms`. A connection's age otherwise ends only
//! in a GOAWAY, which waits for the calls in flight: an open `Watch`
//! would let a stranger hold a slot for ever.

use crate::net::connection;
use futures_util::StreamExt;
use std::pin::Pin;
use std::time::Duration;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

/// The health service over `reporter`'s statuses, its `Watch` streams
/// ending at `max_age` of their connection.
pub fn server(reporter: &HealthReporter, max_age: Duration) -> HealthServer<Aged> {
    HealthServer::new(Aged { inner: HealthService::from_health_reporter(reporter.clone()), max_age })
}

/// tonic-health's service, its `Watch` streams bounded by their
/// connection's age.
pub struct Aged {
    inner: HealthService,
    max_age: Duration,
}

type Stream = Pin<Box<dyn futures_util::Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for Aged {
    async fn check(&self, request: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = Stream;

    async fn watch(&self, request: Request<HealthCheckRequest>) -> Result<Response<Stream>, Status> {
        // A call not on a guarded listener (none is) is bounded from now.
        let accepted = connection::of(request.extensions()).map_or_else(tokio::time::Instant::now, |c| c.accepted());
        let statuses = self.inner.watch(request).await?.into_inner();
        let aged = tokio::time::sleep_until(accepted + self.max_age);
        Ok(Response::new(Box::pin(statuses.take_until(aged))))
    }
}
