//! OpenTelemetry traces: spans exported over OTLP to an in-process
//! collector (the real OTLP/gRPC service), the client's W3C `traceparent`
//! as their root (whatever its sampled flag), the teacher batch a root of
//! its own linked to the query and passed on to every teacher call (the
//! client's `tracestate` never is), and — as `hygiene` does for the logs —
//! nothing in them that depends on the secret index.

use crate::util::faulty::{FaultyTeachers, write_config};
use crate::util::{Process, client, digit, image, key_hash, with_key};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const M: usize = 8;
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// An OTLP trace collector keeping every span it receives.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request.into_inner().resource_spans.into_iter().flat_map(|r| r.scope_spans).flat_map(|s| s.spans);
        self.0.lock().expect("spans").extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// Serves on a free loopback port; its `http://` endpoint.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let endpoint = format!("http://{}", listener.local_addr().expect("bound"));
        let service = TraceServiceServer::new(self.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        endpoint
    }

    /// The spans of `trace`, once `want` of them named `name` arrived.
    async fn wait_for(&self, trace: &[u8], name: &str, want: usize) -> Vec<Span> {
        for _ in 0..200 {
            let spans: Vec<Span> =
                self.0.lock().expect("spans").iter().filter(|s| s.trace_id == trace).cloned().collect();
            if spans.iter().filter(|s| s.name == name).count() >= want {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("fewer than {want} {name:?} spans of the trace arrived");
    }
}

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(span: &Span) -> BTreeMap<String, String> {
    span.attributes.iter().map(|kv| (kv.key.clone(), text(&kv.value))).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One traced query under secret `secret`: the spans of its trace, and the
/// `traceparent`s each teacher model received.
async fn traced_query(teachers: &str, secret: usize) -> (Vec<Span>, HashMap<String, Vec<String>>) {
    let collector = Collector::default();
    let endpoint = collector.start().await;
    let proxy = FaultyTeachers::start(teachers).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (cfg, secret_file) = (dir.path().join("teachers.toml"), dir.path().join("secret"));
    write_config(&cfg, M, |_| proxy.endpoint.clone());
    std::fs::write(&secret_file, secret.to_string()).expect("secret file");
    let server = Process::serve(
        Some(&cfg),
        &[
            ("PACPRIV__TELEMETRY__OTLP_ENDPOINT", endpoint),
            ("PACPRIV__PRIVACY__SECRET_INDEX_FILE", secret_file.display().to_string()),
            ("PACPRIV__PRINCIPALS__ALICE__KEY_SHA256", key_hash("alice-key")),
            ("PACPRIV__PRINCIPALS__ALICE__BUDGET_MI", "1".into()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ],
    );
    let mut c = client(&server.addr).await;
    let mut request = with_key(image("traced-1", &digit(5)), "alice-key");
    // Flagged "not sampled", with a tracestate: neither is the client's to
    // decide (issue 40 §8).
    let parent = format!("00-{TRACE_ID}-00f067aa0ba902b7-00");
    request.metadata_mut().insert("traceparent", parent.parse().expect("ascii"));
    request.metadata_mut().insert("tracestate", "client=private-state".parse().expect("ascii"));
    c.predict(request).await.expect("answered");
    let trace: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&TRACE_ID[2 * i..2 * i + 2], 16).expect("hex")).collect();
    // The RPC's span ends last, after the response: once it is in, so is
    // every other span of the client's trace (they end before it).
    let mut spans = collector.wait_for(&trace, "rpc", 1).await;
    // The teacher batch is a trace of its own, linked to the query.
    let batch = loop {
        let all = collector.0.lock().expect("spans").clone();
        if let Some(b) = all.iter().find(|s| s.name == "teacher_batch" && s.links.iter().any(|l| l.trace_id == trace)) {
            break b.clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    spans.extend(collector.wait_for(&batch.trace_id, "teacher_call", M).await);
    (spans, proxy.traceparents())
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_follow_the_clients_trace_to_every_teacher_and_never_show_the_secret() {
    let teachers = Process::teachers_at(M, 3, "127.0.0.1:0");
    let mut shapes = Vec::new();
    for secret in [2usize, 6] {
        let (spans, traceparents) = traced_query(&teachers.addr, secret).await;
        let by_name = |name: &str| spans.iter().filter(|s| s.name == name).collect::<Vec<_>>();

        // The client's trace is the root, though it asked not to be
        // sampled: the RPC span's parent is the client's span, and the
        // query is in the trace.
        let rpc = by_name("rpc");
        assert_eq!(rpc.len(), 1, "{:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());
        assert_eq!(hex(&rpc[0].parent_span_id), "00f067aa0ba902b7");
        let query = by_name("query");
        assert_eq!(query.len(), 1);
        let q = attributes(query[0]);
        assert_eq!((q["principal"].as_str(), q["query_id"].as_str()), ("alice", "traced-1"));
        // The teacher batch, which may serve other principals' queries
        // too, sits in no client's trace: a root, linked to the query.
        let batch = by_name("teacher_batch");
        assert_eq!(batch.len(), 1);
        assert!(batch[0].parent_span_id.is_empty() && hex(&batch[0].trace_id) != TRACE_ID, "{:?}", batch[0]);
        assert!(batch[0].links.iter().any(|l| l.span_id == query[0].span_id), "linked to the query");
        let calls = by_name("teacher_call");
        assert!(calls.iter().all(|c| c.trace_id == batch[0].trace_id), "the calls are the batch's");
        let mut models: Vec<String> = calls.iter().map(|s| attributes(s)["model"].clone()).collect();
        models.sort();
        assert_eq!(models, (0..M).map(|i| format!("digits-{i:03}")).collect::<Vec<_>>(), "one call span per teacher");

        // Every teacher received the batch's trace context, and never the
        // client's tracestate.
        assert_eq!(traceparents.len(), M, "{traceparents:?}");
        let batch_trace = format!("00-{}-", hex(&batch[0].trace_id));
        for (model, seen) in &traceparents {
            assert!(
                seen.iter().all(|t| t.starts_with(&batch_trace) && !t.contains("private-state")),
                "{model}: {seen:?}"
            );
        }

        // Hygiene: nothing exported names the secret or carries noise.
        for s in &spans {
            let fields = attributes(s)
                .into_iter()
                .chain(s.events.iter().flat_map(|e| e.attributes.iter().map(|kv| (kv.key.clone(), text(&kv.value)))));
            for (key, value) in fields {
                let key = key.to_lowercase();
                assert!(
                    !["secret", "noise", "posterior", "log_likelihood", "published"].iter().any(|w| key.contains(w)),
                    "span {:?} exports {key} = {value}",
                    s.name
                );
            }
        }
        // What is exported has the same shape whatever the secret.
        let mut shape: Vec<(String, Vec<String>)> =
            spans.iter().map(|s| (s.name.clone(), attributes(s).into_keys().collect())).collect();
        shape.sort();
        shapes.push(shape);
    }
    assert_eq!(shapes[0], shapes[1], "the exported spans do not depend on the secret index");
}
