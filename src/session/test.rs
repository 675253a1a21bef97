use super::*;

fn principal(name: &str, key: &str, budget: f64) -> Result<PrincipalConfig, PrivacyError> {
    let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    Ok(PrincipalConfig { name: name.into(), key_sha256: digest, budget: Nats::new(budget)? })
}

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Sessions over the embedded store in `dir`.
async fn sessions_in(
    dir: &std::path::Path,
    scope: Scope,
    policy: Policy,
) -> Result<Sessions, Box<dyn std::error::Error>> {
    let ps = [principal("alice", "ka", 0.3)?, principal("bob", "kb", 0.3)?];
    let store = Store::Embedded(Arc::new(EmbeddedStore::open(&dir.join("state.redb"))?));
    let params =
        SessionParams { per_query: Nats::new(0.125)?, policy, m: 4, secret: SecretIndex::new(2, 4)?, journal: true };
    Ok(Sessions::new(&ps, scope, Nats::new(0.5)?, params, &store).await?)
}

async fn sessions(scope: Scope, policy: Policy) -> Result<(Sessions, tempfile::TempDir), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    Ok((sessions_in(dir.path(), scope, policy).await?, dir))
}

/// The in-memory posterior of an embedded-store session.
fn posterior_of(h: &Handle) -> Result<Posterior, SessionError> {
    match &h.session.backend {
        Backend::Local { state, .. } => Ok(state.lock().map_err(|_| SessionError::Poisoned)?.state.posterior.clone()),
        Backend::Shared { .. } => Err(SessionError::Poisoned),
    }
}

fn split() -> TeacherOutputs {
    TeacherOutputs::Labels { labels: vec![0, 1, 1, 0], classes: 3 }
}

#[tokio::test]
async fn keys_authenticate_their_principal_and_nothing_else() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Paper).await?;
    assert_eq!(s.authenticate("ka")?.principal(), "alice");
    assert_eq!(s.authenticate("kb")?.principal(), "bob");
    assert!(matches!(s.authenticate("kc"), Err(SessionError::Unauthenticated)));
    assert!(matches!(s.authenticate(""), Err(SessionError::Unauthenticated)));
    assert_eq!(key_digest_hex("demo-key"), "c48a01f49fd0f2cc404bc3cbbc80e91457a3d41bb429a695243de4c61794155c");
    Ok(())
}

#[tokio::test]
async fn per_principal_budgets_are_separate_and_run_out() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Paper).await?;
    let (alice, bob) = (s.authenticate("ka")?, s.authenticate("kb")?);
    // 0.3 / 0.125: two answers fit, the third does not.
    for n in 1..=2 {
        let (a, view) = alice.answer(split(), None, "q".into()).await?;
        assert_eq!(a.charge.get(), 0.125);
        assert_eq!((view.answered, view.spent), (n, 0.125 * n as f64));
    }
    let before = alice.budget().await?;
    assert!(matches!(alice.ensure_can_pay().await, Err(SessionError::Exhausted { .. })));
    match alice.answer(split(), None, "q".into()).await {
        Err(SessionError::Exhausted { spent, limit, charge }) => assert_eq!((spent, limit, charge), (0.25, 0.3, 0.125)),
        other => panic!("expected exhaustion, got {:?}", other.map(|(_, v)| v)),
    }
    assert_eq!(alice.budget().await?, before, "a refusal changes nothing");
    assert_eq!(bob.budget().await?.spent, 0.0);
    bob.ensure_can_pay().await?;
    Ok(())
}

#[tokio::test]
async fn global_scope_shares_one_session() -> TestResult {
    let (s, _dir) = sessions(Scope::Global, Policy::Paper).await?;
    let (alice, bob) = (s.authenticate("ka")?, s.authenticate("kb")?);
    alice.answer(split(), None, "q".into()).await?;
    let view = bob.budget().await?;
    assert_eq!((view.spent, view.limit, view.answered), (0.125, 0.5, 1));
    Ok(())
}

#[tokio::test]
async fn contested_policy_never_refuses_up_front() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Contested).await?;
    let alice = s.authenticate("ka")?;
    alice.answer(split(), None, "q".into()).await?;
    alice.answer(split(), None, "q".into()).await?;
    // Exhausted for contested answers, but a unanimous one is free.
    alice.ensure_can_pay().await?;
    let (a, view) = alice.answer(TeacherOutputs::Labels { labels: vec![2; 4], classes: 3 }, None, "q".into()).await?;
    assert_eq!((a.label, a.charge.get(), view.answered, view.charged), (2, 0.0, 3, 2));
    assert!(matches!(alice.answer(split(), None, "q".into()).await, Err(SessionError::Exhausted { .. })));
    Ok(())
}

#[tokio::test]
async fn a_rejected_step_changes_nothing() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Paper).await?;
    let alice = s.authenticate("ka")?;
    let wrong_m = TeacherOutputs::Labels { labels: vec![0, 1], classes: 3 };
    assert!(matches!(alice.answer(wrong_m, None, "q".into()).await, Err(SessionError::Privacy(_))));
    assert_eq!(alice.budget().await?.answered, 0);
    Ok(())
}

#[tokio::test]
async fn sessions_resume_from_the_store_and_the_journal_replays_them() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (before, posterior) = {
        let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Contested).await?;
        let alice = s.authenticate("ka")?;
        alice.answer(split(), None, "a1".into()).await?;
        alice.answer(TeacherOutputs::Labels { labels: vec![1; 4], classes: 3 }, None, "a2".into()).await?;
        alice.answer(split(), None, "a3".into()).await?;
        let posterior = posterior_of(&alice)?;
        (alice.budget().await?, posterior)
    };
    let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Contested).await?;
    let alice = s.authenticate("ka")?;
    assert_eq!(alice.budget().await?, before, "spending survives a restart");
    assert_eq!(posterior_of(&alice)?, posterior);
    assert_eq!(s.authenticate("kb")?.budget().await?.answered, 0);

    // Replaying the journal from the prior gives the stored posterior bit for bit.
    let journal = match &alice.session.backend {
        Backend::Local { store, .. } => store.journal("alice")?,
        Backend::Shared { .. } => Vec::new(),
    };
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
