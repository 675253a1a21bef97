//! The fan-out against the demo teachers served over loopback gRPC: every
//! way of asking (one query at a time, batched, stacked) must give each
//! query exactly its own teachers' outputs.

use super::demo::{self, DemoServer};
use super::*;
use crate::metrics::Metrics;
use pacpriv_demo::Trained;
use pacpriv_privacy::mechanism::TeacherOutputs;
use pacpriv_store::{Arrival, Arrivals};
use std::sync::Arc;
use std::time::Duration;

const M: usize = 6;

fn policy(output_name: Option<&str>) -> CallPolicy {
    CallPolicy {
        deadline: Duration::from_secs(5),
        retries: 0,
        input_name: "input-0".into(),
        input_datatype: "FP32".into(),
        output_name: output_name.map(str::to_owned),
    }
}

fn labels(outputs: &TeacherOutputs) -> Vec<usize> {
    match outputs {
        TeacherOutputs::Labels { labels, .. } => labels.clone(),
        TeacherOutputs::Vectors(v) => {
            v.rows().into_iter().map(|r| pacpriv_privacy::mechanism::argmax(r.iter().copied())).collect()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_and_stacked_answers_are_each_querys_own() -> Result<(), Box<dyn std::error::Error>> {
    let demo = Trained::train(M, 5)?;
    let examples: Vec<_> = demo.split.test.iter().take(40).cloned().collect();
    let expected = demo.labels(&examples);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(DemoServer::new(demo.teachers).serve(listener, std::future::pending()));

    let label = OutputMode::Label { classes: 10 };
    let batched = Batching { window: Duration::from_millis(20), max_batch: 8 };
    let variants = [
        ("unbatched", Teachers::PerTeacher(demo::specs(addr, M)), Batching::OFF, None, label),
        ("batched", Teachers::PerTeacher(demo::specs(addr, M)), batched, None, label),
        ("stacked", Teachers::Stacked { spec: demo::stacked_spec(addr), models: M }, batched, None, label),
        // Scores read from the probabilities output, per example and teacher.
        (
            "stacked scores",
            Teachers::Stacked { spec: demo::stacked_spec(addr), models: M },
            batched,
            Some("probabilities"),
            OutputMode::Vector { dim: 10 },
        ),
    ];
    for (name, teachers, batching, output, mode) in variants {
        let metrics = Metrics::new(10);
        let arrivals = Arc::new(Arrivals::default());
        let ensemble = Arc::new(Ensemble::new(
            teachers,
            policy(output),
            mode,
            batching,
            &metrics.teachers,
            Arc::clone(&arrivals),
        )?);
        assert_eq!(ensemble.len(), M);
        // All at once, so the batched variants really batch.
        let pixels: Vec<Vec<f64>> = examples.iter().map(|e| e.pixels.iter().map(|&p| f64::from(p)).collect()).collect();
        let answers = all_at_once(&ensemble, &pixels).await;
        // Each answer is counted on its way to the store until its caller
        // lets go of it (its step has queued the record).
        assert_eq!(arrivals.coming(), examples.len(), "{name}");
        for (i, answer) in answers.into_iter().enumerate() {
            assert_eq!(labels(&answer?.0), expected[i], "{name}: example {i} got another example's outputs");
        }
        assert_eq!(arrivals.coming(), 0, "{name}");
        let fanouts = fanouts(&metrics.encode()?);
        if batching.enabled() {
            assert!(fanouts < examples.len() as f64 / 2.0, "{name}: {fanouts} fan-outs for {} queries", examples.len());
        } else {
            assert_eq!(fanouts, examples.len() as f64, "{name}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_teacher_fails_every_query_of_its_batch() -> Result<(), Box<dyn std::error::Error>> {
    let demo = Trained::train(2, 5)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(DemoServer::new(demo.teachers).serve(listener, std::future::pending()));
    // One real teacher and one that does not exist on that server.
    let mut specs = demo::specs(addr, 2);
    specs[1].model = "no-such-model".into();
    let metrics = Metrics::new(10);
    let batching = Batching { window: Duration::from_millis(20), max_batch: 8 };
    let mode = OutputMode::Label { classes: 10 };
    let arrivals = Arc::new(Arrivals::default());
    let specs = Teachers::PerTeacher(specs);
    let ensemble =
        Arc::new(Ensemble::new(specs, policy(None), mode, batching, &metrics.teachers, Arc::clone(&arrivals))?);
    let answers = all_at_once(&ensemble, &vec![vec![0.0; 64]; 4]).await;
    // Nothing is on its way to the store for a batch that failed.
    assert_eq!(arrivals.coming(), 0);
    for answer in answers {
        let e = answer.err().ok_or("a query was answered without all its teachers")?;
        assert!(e.to_string().contains("no-such-model"), "{e}");
    }
    Ok(())
}

/// Every query sent at once (each on a task of its own), results in order.
async fn all_at_once(
    ensemble: &Arc<Ensemble>,
    queries: &[Vec<f64>],
) -> Vec<Result<(TeacherOutputs, Arrival), FanoutError>> {
    let mut set = tokio::task::JoinSet::new();
    for (i, x) in queries.iter().enumerate() {
        let (ensemble, x) = (Arc::clone(ensemble), x.clone());
        set.spawn(async move { (i, ensemble.query(&x).await) });
    }
    let mut out: Vec<_> = set.join_all().await;
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// `pacpriv_teacher_batch_size_count`: fan-outs made.
fn fanouts(exposition: &str) -> f64 {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix("pacpriv_teacher_batch_size_count "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}
