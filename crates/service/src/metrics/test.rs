use super::*;

#[test]
fn exposition_uses_conventional_names() -> Result<(), std::fmt::Error> {
    let m = Metrics::new(10);
    m.service.answered(true, 0.25, false);
    m.service.query(Outcome::RefusedBudget);
    m.service.duration(Rpc::Predict, 0.01);
    m.service.budget("alice", "default", 0.25, 1.0, 0.6);
    let bayes = m.teachers.of_model("bayes", "1");
    bayes.teacher("digits-000").call(0.002);
    bayes.teacher("digits-000").error(TeacherError::Timeout);
    m.store.commit(0.001, 3);
    let text = m.encode()?;
    for line in [
        "pacpriv_queries_total{outcome=\"answered\"} 1",
        "pacpriv_queries_total{outcome=\"refused_budget\"} 1",
        "pacpriv_answers_unanimous_total 1",
        "pacpriv_mi_charged_nats_total 0.25",
        "pacpriv_budget_spent_nats{principal=\"alice\",dataset=\"default\"} 0.25",
        "pacpriv_budget_limit_nats{principal=\"alice\",dataset=\"default\"} 1.0",
        "pacpriv_teacher_errors_total{model=\"bayes\",version=\"1\",teacher=\"digits-000\",kind=\"timeout\"} 1",
        "pacpriv_request_duration_seconds_count{rpc=\"predict\"} 1",
        "pacpriv_teacher_call_duration_seconds_count{model=\"bayes\",version=\"1\",teacher=\"digits-000\"} 1",
        "pacpriv_store_commit_duration_seconds_count 1",
        "pacpriv_store_commit_batch_size_sum 3.0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    Ok(())
}

#[test]
fn principal_series_are_bounded_and_the_rest_counted() -> Result<(), std::fmt::Error> {
    let m = Metrics::new(2);
    for (i, name) in ["a", "b", "c", "d", "c"].into_iter().enumerate() {
        m.service.budget(name, "default", 0.01 * i as f64, 1.0, 0.6);
    }
    // "a" and "b" got series (and keep updating); "c" and "d" are counted once each.
    m.service.budget("a", "default", 0.5, 1.0, 0.6);
    let text = m.encode()?;
    let series = text.lines().filter(|l| l.starts_with("pacpriv_budget_spent_nats{")).count();
    assert_eq!(series, 2, "{text}");
    assert!(text.contains("pacpriv_budget_spent_nats{principal=\"a\",dataset=\"default\"} 0.5"));
    assert!(text.lines().any(|l| l == "pacpriv_principal_series_dropped 2"), "{text}");
    Ok(())
}

#[test]
fn closed_label_sets_are_exported_at_zero_before_any_event() -> Result<(), std::fmt::Error> {
    let m = Metrics::new(10);
    let _teacher = m.teachers.of_model("private", "2").teacher("digits-007");
    let text = m.encode()?;
    for line in [
        "pacpriv_queries_total{outcome=\"internal\"} 0",
        "pacpriv_queries_total{outcome=\"teacher_unavailable\"} 0",
        "pacpriv_request_duration_seconds_count{rpc=\"get_budget\"} 0",
        "pacpriv_teacher_errors_total{model=\"private\",version=\"2\",teacher=\"digits-007\",kind=\"malformed\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    Ok(())
}

/// A version a reload removed takes its series with it; another version's
/// teachers of the same names keep theirs.
#[test]
fn a_forgotten_version_leaves_no_series() -> Result<(), std::fmt::Error> {
    let m = Metrics::new(10);
    let (one, two) = (m.teachers.of_model("private", "1"), m.teachers.of_model("private", "2"));
    for version in [&one, &two] {
        version.teacher("digits-000").call(0.001);
        version.teacher("digits-000").error(TeacherError::Timeout);
    }
    m.service.model_answers("private", "2").inc_by(3);
    two.forget(["digits-000"]);
    m.service.forget_model("private", "2");
    let text = m.encode()?;
    assert!(!text.contains("version=\"2\""), "{text}");
    assert!(
        text.contains(
            "pacpriv_teacher_call_duration_seconds_count{model=\"private\",version=\"1\",teacher=\"digits-000\"} 1"
        ),
        "{text}"
    );
    Ok(())
}

/// The closed label sets record through series resolved at start-up: each
/// event lands in its own label's series, none in another's.
#[test]
fn each_outcome_rpc_and_stage_lands_in_its_own_series() -> Result<(), std::fmt::Error> {
    let m = Metrics::new(10);
    for (i, outcome) in Outcome::ALL.into_iter().enumerate() {
        for _ in 0..=i {
            m.service.query(outcome);
        }
    }
    for (i, rpc) in Rpc::ALL.into_iter().enumerate() {
        for _ in 0..=i {
            m.service.duration(rpc, 0.01);
        }
    }
    for (i, stage) in Stage::ALL.into_iter().enumerate() {
        for _ in 0..=i {
            m.service.stage(stage, 0.01);
        }
    }
    let text = m.encode()?;
    let lines = Outcome::ALL
        .iter()
        .enumerate()
        .map(|(i, o)| format!("pacpriv_queries_total{{outcome=\"{}\"}} {}", o.as_str(), i + 1));
    let rpcs = Rpc::ALL
        .iter()
        .enumerate()
        .map(|(i, r)| format!("pacpriv_request_duration_seconds_count{{rpc=\"{}\"}} {}", r.as_str(), i + 1));
    let stages = Stage::ALL
        .iter()
        .enumerate()
        .map(|(i, s)| format!("pacpriv_stage_duration_seconds_count{{stage=\"{}\"}} {}", s.as_str(), i + 1));
    for line in lines.chain(rpcs).chain(stages) {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    Ok(())
}

/// A principal's gauges are resolved once and keep following its budget;
/// the same principal in another dataset has its own.
#[test]
fn budget_gauges_follow_each_principal_in_each_dataset() -> Result<(), std::fmt::Error> {
    let m = Metrics::new(10);
    m.service.budget("alice", "default", 0.25, 1.0, 0.6);
    m.service.budget("alice", "faces", 0.125, 2.0, 0.55);
    m.service.budget("alice", "default", 0.5, 1.0, 0.7);
    let text = m.encode()?;
    for line in [
        "pacpriv_budget_spent_nats{principal=\"alice\",dataset=\"default\"} 0.5",
        "pacpriv_mia_bound{principal=\"alice\",dataset=\"default\"} 0.7",
        "pacpriv_budget_spent_nats{principal=\"alice\",dataset=\"faces\"} 0.125",
        "pacpriv_budget_limit_nats{principal=\"alice\",dataset=\"faces\"} 2.0",
        "pacpriv_principal_series_dropped 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    Ok(())
}
