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
//!   request appends its line to a buffer and wakes no thread; the
//!   `pacpriv-log` thread writes the buffer out every [`FLUSH_EVERY`], and
//!   a `WARN` or `ERROR` line writes it out at once. Written one by one,
//!   the lines of a server at `info` (one per answer) cost ~7 µs of CPU
//!   an answer at saturation through a pipe, as under Docker or
//!   Kubernetes (`BENCHMARKS.md`, *Logs off the request path*). Lines stay
//!   whole and in order; a crash may lose the `info` lines of its last
//!   [`FLUSH_EVERY`] (once [`Lines::flush_before_panics`] is called, a
//!   panic writes them out before its message, unless a write-out is
//!   under way then); once the [`Lines`] are dropped, every line is
//!   written out as it is logged.

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::io::{IsTerminal as _, Stderr, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::{Level, Span};
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

/// How long an `info` line waits before the `pacpriv-log` thread writes
/// it out, at most (while the thread gets to run).
pub const FLUSH_EVERY: Duration = Duration::from_millis(10);

/// Lines waiting in [`Lines`] past this many bytes are written out by the
/// line that made them so many.
const CAPACITY: usize = 64 << 10;

/// Log lines on their way to stderr (module invariants). A line is
/// appended to a buffer under a lock held for that alone; the buffer is
/// written out — in order, outside that lock — every [`FLUSH_EVERY`] by
/// the `pacpriv-log` thread, at once by a `WARN` or `ERROR` line (what an
/// operator needs most survives a crash that follows it), by a line that
/// brings it past [`CAPACITY`], before a panic's message (once
/// [`Lines::flush_before_panics`] is called), and once these `Lines` are
/// dropped, by every line after (nothing is left in a buffer nobody
/// writes out).
/// Keep them until the last thread that logs has stopped.
pub struct Lines<W: Write + Send + 'static = Stderr> {
    buffer: Buffered<W>,
    /// Dropped, stops the thread.
    stop: Option<mpsc::Sender<()>>,
    flusher: Option<JoinHandle<()>>,
}

impl Lines {
    /// Lines to stderr.
    pub fn to_stderr() -> Lines {
        Lines::to(std::io::stderr(), FLUSH_EVERY)
    }
}

impl<W: Write + Send + 'static> Lines<W> {
    /// Lines to `writer`, written out every `every` by the `pacpriv-log`
    /// thread; without the thread (it could not be started), each line
    /// is written out at once.
    pub fn to(writer: W, every: Duration) -> Lines<W> {
        let buffer = Buffered(Arc::new(Shared {
            waiting: Mutex::new(Vec::with_capacity(CAPACITY)),
            out: Mutex::new(Out { writer, spare: Vec::with_capacity(CAPACITY) }),
            through: AtomicBool::new(false),
        }));
        let (stop, stopped) = mpsc::channel::<()>();
        let flushed = buffer.clone();
        let flusher = std::thread::Builder::new().name("pacpriv-log".into()).spawn(move || {
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                flushed.0.flush();
            }
        });
        if flusher.is_err() {
            buffer.0.through.store(true, Ordering::Release);
        }
        Lines { buffer, stop: Some(stop), flusher: flusher.ok() }
    }

    /// What a `fmt` layer writes its lines with.
    pub fn writer(&self) -> Buffered<W> {
        self.buffer.clone()
    }

    /// From now on a panic writes out what waits before its message (which
    /// the panic hook writes to stderr in place), so that the message comes
    /// after the lines logged before it — unless a lock of the buffer is
    /// held then (a write-out under way, or the panicking thread's own
    /// line): a panic waits for no lock, only for its own write. Each call
    /// adds a hook; call it once.
    pub fn flush_before_panics(&self) {
        let shared = Arc::downgrade(&self.buffer.0);
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| flush_then(&shared, || previous(info))));
    }
}

impl<W: Write + Send + 'static> Drop for Lines<W> {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
        // From here on each line is written out as it is logged.
        self.buffer.0.through.store(true, Ordering::Release);
        self.buffer.0.flush();
    }
}

/// The buffer of [`Lines`], as a `fmt` layer's writer.
pub struct Buffered<W: Write = Stderr>(Arc<Shared<W>>);

impl<W: Write> Clone for Buffered<W> {
    fn clone(&self) -> Self {
        Buffered(Arc::clone(&self.0))
    }
}

struct Shared<W: Write> {
    /// Lines not yet written out, in the order they were logged.
    waiting: Mutex<Vec<u8>>,
    out: Mutex<Out<W>>,
    /// Every line is written out as it is logged (the `Lines` are gone,
    /// or their thread could not be started).
    through: AtomicBool,
}

struct Out<W: Write> {
    writer: W,
    /// The buffer the last write-out took (kept for its capacity).
    spare: Vec<u8>,
}

impl<W: Write> Shared<W> {
    fn waiting(&self) -> MutexGuard<'_, Vec<u8>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes out what waits.
    fn flush(&self) {
        self.write_out(self.waiting());
    }

    /// Writes out what waits, in order: `out` is taken before `waiting`
    /// is let go, so an earlier write-out finishes before a later one
    /// starts. Lines logged meanwhile wait for no write — unless a
    /// write-out of their own (a `WARN`, a full buffer) queues behind this
    /// one, which holds `waiting` until it starts.
    fn write_out(&self, waiting: MutexGuard<'_, Vec<u8>>) {
        if waiting.is_empty() {
            return;
        }
        Self::write(waiting, self.out.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Writes out what waits if neither lock is held (before a panic's
    /// message).
    fn try_flush(&self) {
        if let Some(waiting) = try_lock(&self.waiting)
            && !waiting.is_empty()
            && let Some(out) = try_lock(&self.out)
        {
            Self::write(waiting, out);
        }
    }

    fn write(mut waiting: MutexGuard<'_, Vec<u8>>, mut out: MutexGuard<'_, Out<W>>) {
        let Out { writer, spare } = &mut *out;
        // Empty unless a write panicked: its lines are not written twice.
        spare.clear();
        std::mem::swap(&mut *waiting, spare);
        drop(waiting);
        // A failed write is not retried: its lines are lost, as they were
        // when each was written in place.
        let _ = writer.write_all(spare).and_then(|()| writer.flush());
        spare.clear();
        // One long line does not keep its memory for good.
        spare.shrink_to(CAPACITY);
    }
}

/// What a panic does ([`Lines::flush_before_panics`]): writes out what
/// waits in `shared`, if it is still there and no lock of it is held, then
/// `then` (the hook before, which writes the panic's message).
fn flush_then<W: Write>(shared: &Weak<Shared<W>>, then: impl FnOnce()) {
    if let Some(shared) = shared.upgrade() {
        shared.try_flush();
    }
    then();
}

/// `mutex`'s guard unless another holds it.
fn try_lock<T>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

impl<'a, W: Write + 'a> MakeWriter<'a> for Buffered<W> {
    type Writer = Line<'a, W>;

    fn make_writer(&'a self) -> Line<'a, W> {
        self.line(false)
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line<'a, W> {
        self.line(*meta.level() <= Level::WARN)
    }
}

impl<W: Write> Buffered<W> {
    /// A line, written out at once (with what waits before it) if `now`.
    fn line(&self, now: bool) -> Line<'_, W> {
        Line { waiting: Some(self.0.waiting()), shared: &self.0, now }
    }
}

/// One line being written into the buffer: it holds the buffer's lock,
/// so lines never interleave; dropped, it writes the buffer out if it
/// must (see [`Lines`]).
pub struct Line<'a, W: Write> {
    waiting: Option<MutexGuard<'a, Vec<u8>>>,
    shared: &'a Shared<W>,
    /// A `WARN` or `ERROR` line.
    now: bool,
}

impl<W: Write> Write for Line<'_, W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if let Some(waiting) = &mut self.waiting {
            waiting.extend_from_slice(bytes);
        }
        Ok(bytes.len())
    }

    /// Nothing: a line is written out when it is dropped, if it must be.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<W: Write> Drop for Line<'_, W> {
    fn drop(&mut self) {
        if let Some(waiting) = self.waiting.take()
            && (self.now || waiting.len() >= CAPACITY || self.shared.through.load(Ordering::Acquire))
        {
            self.shared.write_out(waiting);
        }
    }
}

/// Installs the server's subscriber: logs (`json` or text) filtered by
/// `RUST_LOG` (default `info`), written through `lines`, and span export
/// to `otlp_endpoint` (as `service_name`) when one is given. Call inside
/// a tokio runtime (the exporter's channel lives there); keep the result
/// while serving (dropped, it flushes the last spans). A second call
/// keeps the first subscriber.
///
/// # Errors
/// [`TraceError`]: the exporter could not be built.
pub fn install(
    json: bool,
    lines: &Lines,
    otlp_endpoint: Option<&str>,
    service_name: &str,
) -> Result<Option<Exporting>, TraceError> {
    install_with(json, lines.writer(), otlp_endpoint, service_name)
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

    /// Never, within a test.
    const NEVER: Duration = Duration::from_secs(3600);

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
    fn an_info_line_waits_for_the_thread_or_the_drop() -> std::io::Result<()> {
        let written = Written::default();
        let lines = Lines::to(written.clone(), NEVER);
        let writer = lines.writer();
        let mut line = writer.make_writer();
        line.write_all(b"answered\n")?;
        line.flush()?;
        drop(line);
        assert_eq!(written.text(), "", "a line costs no write of its own");
        drop(lines);
        assert_eq!(written.text(), "answered\n", "the drop writes out what waits");

        let written = Written::default();
        let lines = Lines::to(written.clone(), Duration::from_millis(1));
        lines.writer().make_writer().write_all(b"answered\n")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while written.text().is_empty() {
            assert!(Instant::now() < deadline, "the thread never wrote the line out");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(written.text(), "answered\n");
        Ok(())
    }

    #[test]
    fn a_warning_is_written_out_at_once_with_what_waits_before_it() {
        let written = Written::default();
        let lines = Lines::to(written.clone(), NEVER);
        let logs = tracing_subscriber::fmt().with_ansi(false).with_writer(lines.writer()).finish();
        tracing::subscriber::with_default(logs, || {
            tracing::info!("first");
            assert_eq!(written.text(), "");
            tracing::warn!("second");
            let text = written.text();
            assert!(text.contains("first") && text.contains("second"), "{text}");
            assert!(text.find("first") < text.find("second"), "{text}");
            tracing::info!("third");
            assert!(!written.text().contains("third"));
        });
        drop(lines);
        assert!(written.text().contains("third"));
    }

    /// A writer that takes its time, so that write-outs overlap.
    struct Slow(Written);

    impl Write for Slow {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            std::thread::sleep(Duration::from_micros(200));
            self.0.write(bytes)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_stay_whole_and_in_order() {
        let written = Written::default();
        // The thread writes out every 100 µs, racing the lines that write
        // out themselves (each 64th or so fills the buffer), on a slow
        // writer.
        let lines = Lines::to(Slow(written.clone()), Duration::from_micros(100));
        fn line_of(t: usize, i: usize) -> String {
            // One longer than the buffer: written out by the line itself.
            let pad = if i == 1_000 { "y".repeat(CAPACITY + 1) } else { "x".repeat(1000) };
            format!("thread {t} line {i} {pad}")
        }
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let writer = lines.writer();
                std::thread::spawn(move || {
                    for i in 0..2_000 {
                        // In two writes: a lock per write would let the
                        // other thread's lines in between.
                        let mut line = writer.make_writer();
                        let text = line_of(t, i);
                        let (head, tail) = text.split_at(10);
                        let _ = line.write_all(head.as_bytes());
                        let _ = line.write_all(format!("{tail}\n").as_bytes());
                    }
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().is_ok());
        }
        drop(lines);
        let text = written.text();
        assert_eq!(text.lines().count(), 4_000);
        for t in 0..2 {
            let mine: Vec<&str> = text.lines().filter(|l| l.starts_with(&format!("thread {t} "))).collect();
            let expected: Vec<String> = (0..2_000).map(|i| line_of(t, i)).collect();
            assert!(mine == expected, "thread {t}'s lines are not whole and in order");
        }
    }

    #[test]
    fn a_panic_writes_out_what_waits_before_its_message() -> std::io::Result<()> {
        let written = Written::default();
        let lines = Lines::to(written.clone(), NEVER);
        lines.writer().make_writer().write_all(b"before the panic\n")?;
        let shared = Arc::downgrade(&lines.buffer.0);
        // The hook before, as the default one does: the message, in place.
        let mut message = written.clone();
        flush_then(&shared, || {
            let _ = message.write_all(b"the panic's message\n");
        });
        assert_eq!(written.text(), "before the panic\nthe panic's message\n");

        // A write-out under way (its `out` held): the message does not wait.
        lines.writer().make_writer().write_all(b"waiting\n")?;
        let out = lines.buffer.0.out.lock().unwrap_or_else(PoisonError::into_inner);
        flush_then(&shared, || {
            let _ = message.write_all(b"another message\n");
        });
        drop(out);
        assert!(written.text().ends_with("another message\n"));
        drop(lines);
        assert!(written.text().ends_with("another message\nwaiting\n"), "nothing lost");
        Ok(())
    }

    #[test]
    fn after_the_drop_each_line_is_written_out_as_it_is_logged() -> std::io::Result<()> {
        let written = Written::default();
        let lines = Lines::to(written.clone(), NEVER);
        let writer = lines.writer();
        drop(lines);
        // A store thread that stops after the server's logging did.
        let mut line = writer.make_writer();
        line.write_all(b"shutting down\n")?;
        drop(line);
        assert_eq!(written.text(), "shutting down\n");
        Ok(())
    }
}
