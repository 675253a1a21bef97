use super::*;

fn principal(name: &str, key: &str, budget: f64) -> Result<PrincipalConfig, PrivacyError> {
    let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    Ok(PrincipalConfig { name: name.into(), key_sha256: digest, budget: Nats::new(budget)? })
}

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Sessions over a fresh store in `dir`.
fn sessions_in(dir: &std::path::Path, scope: Scope, policy: Policy) -> Result<Sessions, Box<dyn std::error::Error>> {
    let ps = [principal("alice", "ka", 0.3)?, principal("bob", "kb", 0.3)?];
    let store = Arc::new(EmbeddedStore::open(&dir.join("state.redb"))?);
    let params =
        SessionParams { per_query: Nats::new(0.125)?, policy, m: 4, secret: SecretIndex::new(2, 4)?, journal: true };
    Ok(Sessions::new(&ps, scope, Nats::new(0.5)?, &params, &store)?)
}

fn sessions(scope: Scope, policy: Policy) -> Result<(Sessions, tempfile::TempDir), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    Ok((sessions_in(dir.path(), scope, policy)?, dir))
}

fn split() -> TeacherOutputs {
    TeacherOutputs::Labels { labels: vec![0, 1, 1, 0], classes: 3 }
}

#[test]
fn keys_authenticate_their_principal_and_nothing_else() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Paper)?;
    assert_eq!(s.authenticate("ka")?.principal(), "alice");
    assert_eq!(s.authenticate("kb")?.principal(), "bob");
    assert!(matches!(s.authenticate("kc"), Err(SessionError::Unauthenticated)));
    assert!(matches!(s.authenticate(""), Err(SessionError::Unauthenticated)));
    assert_eq!(key_digest_hex("demo-key"), "c48a01f49fd0f2cc404bc3cbbc80e91457a3d41bb429a695243de4c61794155c");
    Ok(())
}

#[test]
fn per_principal_budgets_are_separate_and_run_out() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Paper)?;
    let (alice, bob) = (s.authenticate("ka")?, s.authenticate("kb")?);
    // 0.3 / 0.125: two answers fit, the third does not.
    for n in 1..=2 {
        let (a, view) = alice.answer(&split(), None, "q")?;
        assert_eq!(a.charge.get(), 0.125);
        assert_eq!((view.answered, view.spent), (n, 0.125 * n as f64));
    }
    let before = alice.budget()?;
    assert!(matches!(alice.ensure_can_pay(), Err(SessionError::Exhausted { .. })));
    match alice.answer(&split(), None, "q") {
        Err(SessionError::Exhausted { spent, limit, charge }) => assert_eq!((spent, limit, charge), (0.25, 0.3, 0.125)),
        other => panic!("expected exhaustion, got {:?}", other.map(|(_, v)| v)),
    }
    assert_eq!(alice.budget()?, before, "a refusal changes nothing");
    assert_eq!(bob.budget()?.spent, 0.0);
    bob.ensure_can_pay()?;
    Ok(())
}

#[test]
fn global_scope_shares_one_session() -> TestResult {
    let (s, _dir) = sessions(Scope::Global, Policy::Paper)?;
    let (alice, bob) = (s.authenticate("ka")?, s.authenticate("kb")?);
    alice.answer(&split(), None, "q")?;
    let view = bob.budget()?;
    assert_eq!((view.spent, view.limit, view.answered), (0.125, 0.5, 1));
    Ok(())
}

#[test]
fn contested_policy_never_refuses_up_front() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Contested)?;
    let alice = s.authenticate("ka")?;
    alice.answer(&split(), None, "q")?;
    alice.answer(&split(), None, "q")?;
    // Exhausted for contested answers, but a unanimous one is free.
    alice.ensure_can_pay()?;
    let (a, view) = alice.answer(&TeacherOutputs::Labels { labels: vec![2; 4], classes: 3 }, None, "q")?;
    assert_eq!((a.label, a.charge.get(), view.answered, view.charged), (2, 0.0, 3, 2));
    assert!(matches!(alice.answer(&split(), None, "q"), Err(SessionError::Exhausted { .. })));
    Ok(())
}

#[test]
fn a_rejected_step_changes_nothing() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Paper)?;
    let alice = s.authenticate("ka")?;
    let wrong_m = TeacherOutputs::Labels { labels: vec![0, 1], classes: 3 };
    assert!(matches!(alice.answer(&wrong_m, None, "q"), Err(SessionError::Privacy(_))));
    assert_eq!(alice.budget()?.answered, 0);
    Ok(())
}

#[test]
fn sessions_resume_from_the_store_and_the_journal_replays_them() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (before, posterior) = {
        let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Contested)?;
        let alice = s.authenticate("ka")?;
        alice.answer(&split(), None, "a1")?;
        alice.answer(&TeacherOutputs::Labels { labels: vec![1; 4], classes: 3 }, None, "a2")?;
        alice.answer(&split(), None, "a3")?;
        let posterior = alice.session.lock()?.state.posterior.clone();
        (alice.budget()?, posterior)
    };
    let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Contested)?;
    let alice = s.authenticate("ka")?;
    assert_eq!(alice.budget()?, before, "spending survives a restart");
    assert_eq!(alice.session.lock()?.state.posterior, posterior);
    assert_eq!(alice.session.lock()?.version, 3);
    assert_eq!(s.authenticate("kb")?.budget()?.answered, 0);

    // Replaying the journal from the prior gives the stored posterior bit for bit.
    let journal = alice.session.store.journal("alice")?;
    assert_eq!(journal.iter().map(|j| j.query_id.as_str()).collect::<Vec<_>>(), ["a1", "a2", "a3"]);
    let mut replay = Posterior::uniform(4)?;
    for entry in &journal {
        if !entry.log_likelihood.is_empty() {
            replay.update(ndarray::ArrayView1::from(&entry.log_likelihood))?;
        }
    }
    assert_eq!(replay, posterior);
    assert_eq!(journal.iter().map(|j| j.charge).sum::<f64>(), before.spent);
    Ok(())
}
