//! Logs and distributed traces of `pacpriv serve`: the `tracing`
//! subscriber (text or JSON logs on stderr, in blocks: [`Lines`]) and, when
//! `telemetry.otlp_endpoint` is set, OpenTelemetry spans exported over OTLP
//! (gRPC) through the `tracing-opentelemetry` bridge, with W3C trace
//! context taken from each client request ([`adopt_parent`]) and passed on
//! to every teacher call ([`inject`]).
//!
//! Spans: one per RPC (`rpc`), one per query (`query`: principal and query
//! id), one per teacher batch (a root of its own, linked to each query it
//! serves) and per teacher call (`teacher_call`: the model, every teacher
//! alike).
//!
//! # Invariants
//! - A client's trace context is a hint, not an instruction: every request
//!   is traced when export is on (the client's `sampled` flag cannot turn
//!   it off), and only `traceparent` is read — a client's `tracestate` is
//!   neither kept nor sent on to teachers.
//! - A span's fields and events are those the logs already carry: never
//!   the secret index, the noise or the posterior (`tests/it/telemetry.rs`
//!   scans the exported spans as `hygiene` scans the logs).
//! - Off (the default), nothing is exported and no trace context is read
//!   or sent.
//! - The server's log lines reach stderr in blocks ([`Lines`]): a
//!   request appends its line to a buffer and wakes no thread, and the
//!   `pacpriv-log` thread writes the buffer out every [`FLUSH_EVERY`]
//!   (whichever request fills it writes it out at once). Written one by
//!   one, the lines of a server at `info` (one per answer) cost ~10 µs of
//!   CPU an answer at saturation through a pipe, as under Docker or Kubernetes
//!   (`BENCHMARKS.md`, *Logs off the request path*). No line is dropped;
//!   a crash may lose the last [`FLUSH_EVERY`] of them, and dropping
//!   [`Logging`] writes out every line.

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::io::{BufWriter, IsTerminal as _, Stderr, Write};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The span of one call to one teacher model.
pub const TEACHER_CALL: &str = "teacher_call";

/// Why tracing could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("telemetry.otlp_endpoint: {0}")]
pub struct TraceError(String);

/// Exports spans until dropped (flushing what is queued).
pub struct Exporting(SdkTracerProvider);

impl Drop for Exporting {
    fn drop(&mut self) {
        if let Err(e) = self.0.shutdown() {
            tracing::warn!(error = %e, "flushing the last spans failed");
        }
    }
}

/// The server's logging, kept for as long as it serves: dropped, it
/// writes out the lines still waiting and flushes the last spans.
pub struct Logging {
    // Fields drop in order: the spans' last log lines reach the writer
    // before it stops.
    _exporting: Option<Exporting>,
    _lines: Lines,
}

/// How long a log line waits in [`Lines`]' buffer at most.
pub const FLUSH_EVERY: Duration = Duration::from_millis(10);

/// Log lines on their way to stderr (module invariants): a buffer of
/// 64 KiB, written out by whichever line fills it and by the `pacpriv-log`
/// thread every [`FLUSH_EVERY`].
pub struct Lines<W: Write + Send + 'static = Stderr> {
    buffer: Buffered<W>,
    /// Dropped, stops the thread (which writes out the buffer first).
    stop: Option<mpsc::Sender<()>>,
    flusher: Option<JoinHandle<()>>,
}

impl Lines {
    /// Lines to stderr.
    pub fn to_stderr() -> Lines {
        Lines::to(std::io::stderr)
    }
}

impl<W: Write + Send + 'static> Lines<W> {
    /// Lines to what `open` makes, through the `pacpriv-log` thread;
    /// without it (it could not be started), each line is written out at
    /// once.
    pub fn to(open: impl Fn() -> W) -> Lines<W> {
        let buffer = Buffered(Arc::new(Mutex::new(BufWriter::with_capacity(64 << 10, open()))));
        let (stop, stopped) = mpsc::channel::<()>();
        let flushed = buffer.clone();
        let flusher = std::thread::Builder::new().name("pacpriv-log".into()).spawn(move || {
            loop {
                let last = !matches!(stopped.recv_timeout(FLUSH_EVERY), Err(RecvTimeoutError::Timeout));
                flushed.flush();
                if last {
                    break;
                }
            }
        });
        if flusher.is_err() {
            // A buffer of no bytes writes each line straight through.
            *buffer.lock() = BufWriter::with_capacity(0, open());
        }
        Lines { buffer, stop: Some(stop), flusher: flusher.ok() }
    }

    /// What a `fmt` layer writes its lines with.
    pub fn writer(&self) -> Buffered<W> {
        self.buffer.clone()
    }
}

impl<W: Write + Send + 'static> Drop for Lines<W> {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
        self.buffer.flush();
    }
}

/// The buffer of [`Lines`], as a `fmt` layer's writer.
pub struct Buffered<W: Write = Stderr>(Arc<Mutex<BufWriter<W>>>);

impl<W: Write> Clone for Buffered<W> {
    fn clone(&self) -> Self {
        Buffered(Arc::clone(&self.0))
    }
}

impl<W: Write> Buffered<W> {
    fn lock(&self) -> MutexGuard<'_, BufWriter<W>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn flush(&self) {
        // A failed write is not retried: its lines are lost, as they were
        // when written in place.
        let _ = self.lock().flush();
    }
}

impl<'a, W: Write + 'a> MakeWriter<'a> for Buffered<W> {
    type Writer = Line<'a, W>;

    fn make_writer(&'a self) -> Line<'a, W> {
        Line(self.lock())
    }
}

/// One line being written into the buffer (it holds the lock, so lines
/// never interleave).
pub struct Line<'a, W: Write>(MutexGuard<'a, BufWriter<W>>);

impl<W: Write> Write for Line<'_, W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.write(bytes)
    }

    /// Nothing: the `pacpriv-log` thread writes the buffer out.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the server's subscriber: logs (`json` or text) filtered by
/// `RUST_LOG` (default `info`), written by their own thread ([`Lines`]),
/// and span export to `otlp_endpoint` (as `service_name`) when one is
/// given. Call inside a tokio runtime (the exporter's channel lives
/// there), and keep the result while serving. A second call keeps the
/// first subscriber.
///
/// # Errors
/// [`TraceError`]: the exporter could not be built.
pub fn install(json: bool, otlp_endpoint: Option<&str>, service_name: &str) -> Result<Logging, TraceError> {
    let lines = Lines::to_stderr();
    let exporting = install_with(json, lines.writer(), otlp_endpoint, service_name)?;
    Ok(Logging { _exporting: exporting, _lines: lines })
}

/// Installs logs (`json` or text) written to stderr in place, filtered by
/// `RUST_LOG` (default `info`), for the commands that are not a server:
/// each line is out before the next step, and nothing waits in a buffer
/// when the process exits.
pub fn install_direct(json: bool) {
    // Without an endpoint nothing can fail.
    let _ = install_with(json, std::io::stderr, None, "pacpriv");
}

fn install_with<W>(
    json: bool,
    writer: W,
    otlp_endpoint: Option<&str>,
    service_name: &str,
) -> Result<Option<Exporting>, TraceError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    let logs = if json { fmt.json().boxed() } else { fmt.with_ansi(std::io::stderr().is_terminal()).boxed() };
    // A teacher call's span names its model: exported, every teacher
    // alike, but kept out of the logs' span context, which name only a
    // teacher that failed (as `tests/it/hygiene.rs` checks).
    let logs = logs.with_filter(tracing_subscriber::filter::filter_fn(|m| !(m.is_span() && m.name() == TEACHER_CALL)));
    let Some(endpoint) = otlp_endpoint else {
        let _ = tracing_subscriber::registry().with(logs).with(filter).try_init();
        return Ok(None);
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.to_owned())
        .build()
        .map_err(|e| TraceError(e.to_string()))?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service_name.to_owned()).build();
    // Not parent-based: whether a request is traced is the operator's
    // choice (export on), not the client's traceparent flags.
    let provider = SdkTracerProvider::builder()
        .with_sampler(opentelemetry_sdk::trace::Sampler::AlwaysOn)
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let spans = tracing_opentelemetry::layer().with_tracer(provider.tracer("pacpriv"));
    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    let _ = tracing_subscriber::registry().with(logs).with(spans).with(filter).try_init();
    Ok(Some(Exporting(provider)))
}

/// Makes the trace context the client sent (its `traceparent` among
/// `headers`: HTTP headers or gRPC metadata; not its `tracestate`) the
/// parent of `span`; nothing when none was sent or export is off.
pub fn adopt_parent(span: &Span, headers: &dyn Extractor) {
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&ParentOnly(headers)));
    // Fails only when no OpenTelemetry layer is installed: export is off.
    let _ = span.set_parent(parent);
}

/// A client's headers with only `traceparent` visible.
struct ParentOnly<'a>(&'a dyn Extractor);

impl Extractor for ParentOnly<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        if key.eq_ignore_ascii_case("traceparent") { self.0.get(key) } else { None }
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().into_iter().filter(|k| k.eq_ignore_ascii_case("traceparent")).collect()
    }
}

/// HTTP request headers, as trace context.
pub struct Headers<'a>(pub &'a axum::http::HeaderMap);

/// gRPC request metadata, as trace context.
pub struct Metadata<'a>(pub &'a tonic::metadata::MetadataMap);

/// Adds the current span's trace context to an outgoing call's `metadata`.
pub fn inject(metadata: &mut tonic::metadata::MetadataMap) {
    let context = Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&context, &mut Outgoing(metadata)));
}

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(axum::http::HeaderName::as_str).collect()
    }
}

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => k.as_str(),
                tonic::metadata::KeyRef::Binary(k) => k.as_str(),
            })
            .collect()
    }
}

struct Outgoing<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for Outgoing<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::AsciiMetadataKey::from_bytes(key.as_bytes()),
            value.parse::<tonic::metadata::AsciiMetadataValue>(),
        ) {
            self.0.insert(k, v);
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use std::time::Instant;

    /// What the lines were written to.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl Written {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
        }
    }

    impl Write for Written {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_waits_in_the_buffer_and_the_thread_writes_it_out() -> std::io::Result<()> {
        let written = Written::default();
        let lines = Lines::to({
            let written = written.clone();
            move || written.clone()
        });
        let writer = lines.writer();
        {
            let mut line = writer.make_writer();
            line.write_all(b"answered\n")?;
            line.flush()?;
            // The line holds the lock, so the thread cannot have written
            // the buffer out: a line costs no write of its own.
            assert_eq!(written.text(), "");
        }
        // Written out by the thread, with no drop and no full buffer.
        let deadline = Instant::now() + Duration::from_secs(30);
        while written.text().is_empty() {
            assert!(Instant::now() < deadline, "the line was never written out");
            std::thread::sleep(FLUSH_EVERY);
        }
        assert_eq!(written.text(), "answered\n");
        Ok(())
    }

    #[test]
    fn every_line_is_written_out_whole_by_the_drop() {
        let written = Written::default();
        let lines = Lines::to({
            let written = written.clone();
            move || written.clone()
        });
        let writers: Vec<_> = (0..2)
            .map(|t| {
                let writer = lines.writer();
                std::thread::spawn(move || {
                    for i in 0..5_000 {
                        // As `fmt` writes a line: one `write_all` per event.
                        let _ = writer.make_writer().write_all(format!("thread {t} line {i}\n").as_bytes());
                    }
                })
            })
            .collect();
        for w in writers {
            assert!(w.join().is_ok());
        }
        drop(lines);
        let text = written.text();
        for t in 0..2 {
            let mine: Vec<&str> = text.lines().filter(|l| l.starts_with(&format!("thread {t} "))).collect();
            let expected: Vec<String> = (0..5_000).map(|i| format!("thread {t} line {i}")).collect();
            assert_eq!(mine, expected, "thread {t}'s lines, whole and in order");
        }
        assert_eq!(text.lines().count(), 10_000);
    }
}
