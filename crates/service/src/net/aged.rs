//! Streams that end at their connection's age ([`Aged`]).
//!
//! A connection past `server.max_connection_age_ms` is sent a GOAWAY,
//! which waits for the calls in flight: a server stream no credential
//! opens (`Health/Watch`, `ServerReflectionInfo`) would let a stranger, or
//! a principal since revoked, hold the connection and its slot for ever.
//! Wrapped in [`Aged`], such a service's responses end with
//! `UNAVAILABLE` ("reconnect") once their connection reaches its age.
//!
//! # Invariants
//! - The deadline is the connection's acceptance plus the age, whenever the
//!   call began; a call on no guarded connection is bounded from its start.
//! - A response cut at the deadline ends with trailers, never mid-message:
//!   the body's frames are whole gRPC messages.

use super::connection;
use http_body::Frame;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};
use tonic::body::Body;
use tonic::codegen::{Bytes, Service, http};

/// `inner`, its responses ending at their connection's `max_age`.
#[derive(Clone)]
pub struct Aged<S> {
    inner: S,
    max_age: Duration,
}

impl<S> Aged<S> {
    /// `inner`, bounded by `max_age` (`server.max_connection_age_ms`).
    pub fn new(inner: S, max_age: Duration) -> Self {
        Aged { inner, max_age }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Aged<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Aged<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let accepted = connection::of(request.extensions()).map_or_else(Instant::now, |c| c.accepted());
        let deadline = accepted + self.max_age;
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = call.await?;
            Ok(response.map(|inner| {
                Body::new(AgedBody { inner, deadline: Box::pin(tokio::time::sleep_until(deadline)), ended: false })
            }))
        })
    }
}

/// A response body that ends at `deadline`.
struct AgedBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    ended: bool,
}

impl http_body::Body for AgedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        // The deadline first: a client that keeps a message always waiting
        // (requests queued ahead, a small window) must not outlive it.
        if this.deadline.as_mut().poll(cx).is_pending() {
            let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
            this.ended = frame.is_none();
            return Poll::Ready(frame);
        }
        this.ended = true;
        let status = tonic::Status::unavailable("the connection reached server.max_connection_age_ms; reconnect");
        let mut trailers = http::HeaderMap::new();
        Poll::Ready(Some(match status.add_header(&mut trailers) {
            Ok(()) => Ok(Frame::trailers(trailers)),
            Err(status) => Err(status),
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use http_body::Body as _;
    use http_body_util::BodyExt;

    /// A body with a message always ready (a client keeping requests
    /// queued) still ends at its deadline, with UNAVAILABLE.
    #[tokio::test]
    async fn a_body_always_ready_ends_at_its_deadline() {
        let endless =
            futures_util::stream::repeat_with(|| Ok::<_, tonic::Status>(Frame::data(Bytes::from_static(b"m"))));
        let inner = Body::new(http_body_util::StreamBody::new(endless));
        let deadline = Box::pin(tokio::time::sleep_until(Instant::now() + Duration::from_millis(50)));
        let mut body = AgedBody { inner, deadline, ended: false };
        let mut data = 0usize;
        let ending = async {
            loop {
                let frame = body.frame().await.expect("a frame").expect("not an error");
                match frame.into_data() {
                    Ok(_) => data += 1,
                    Err(frame) => break frame.into_trailers().expect("trailers"),
                }
                tokio::task::yield_now().await;
            }
        };
        let trailers = tokio::time::timeout(Duration::from_secs(5), ending).await.expect("ended by its deadline");
        assert!(data > 0, "messages before the deadline pass");
        assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"14"[..]), "{trailers:?}");
        assert!(body.frame().await.is_none(), "and nothing after");
        assert!(body.is_end_stream());
    }
}
