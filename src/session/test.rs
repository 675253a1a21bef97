use super::*;

fn principal(name: &str, key: &str, budget: f64) -> Result<PrincipalConfig, PrivacyError> {
    let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    Ok(PrincipalConfig { name: name.into(), key_sha256: digest, budget: Nats::new(budget)? })
}

fn sessions(scope: Scope, policy: Policy) -> Result<Sessions, PrivacyError> {
    let ps = [principal("alice", "ka", 0.3)?, principal("bob", "kb", 0.3)?];
    Sessions::new(&ps, scope, Nats::new(0.5)?, Nats::new(0.125)?, policy, 4, SecretIndex::new(2, 4)?)
}

fn split() -> TeacherOutputs {
    TeacherOutputs::Labels { labels: vec![0, 1, 1, 0], classes: 3 }
}

#[test]
fn keys_authenticate_their_principal_and_nothing_else() -> Result<(), Box<dyn std::error::Error>> {
    let s = sessions(Scope::PerPrincipal, Policy::Paper)?;
    assert_eq!(s.authenticate("ka")?.principal(), "alice");
    assert_eq!(s.authenticate("kb")?.principal(), "bob");
    assert!(matches!(s.authenticate("kc"), Err(SessionError::Unauthenticated)));
    assert!(matches!(s.authenticate(""), Err(SessionError::Unauthenticated)));
    assert_eq!(key_digest_hex("demo-key"), "c48a01f49fd0f2cc404bc3cbbc80e91457a3d41bb429a695243de4c61794155c");
    Ok(())
}

#[test]
fn per_principal_budgets_are_separate_and_run_out() -> Result<(), Box<dyn std::error::Error>> {
    let s = sessions(Scope::PerPrincipal, Policy::Paper)?;
    let (alice, bob) = (s.authenticate("ka")?, s.authenticate("kb")?);
    // 0.3 / 0.125: two answers fit, the third does not.
    for n in 1..=2 {
        let (a, view) = alice.answer(&split(), None)?;
        assert_eq!(a.charge.get(), 0.125);
        assert_eq!((view.answered, view.spent), (n, 0.125 * n as f64));
    }
    let before = alice.budget()?;
    assert!(matches!(alice.ensure_can_pay(), Err(SessionError::Exhausted { .. })));
    match alice.answer(&split(), None) {
        Err(SessionError::Exhausted { spent, limit, charge }) => assert_eq!((spent, limit, charge), (0.25, 0.3, 0.125)),
        other => panic!("expected exhaustion, got {:?}", other.map(|(_, v)| v)),
    }
    assert_eq!(alice.budget()?, before, "a refusal changes nothing");
    assert_eq!(bob.budget()?.spent, 0.0);
    bob.ensure_can_pay()?;
    Ok(())
}

#[test]
fn global_scope_shares_one_session() -> Result<(), Box<dyn std::error::Error>> {
    let s = sessions(Scope::Global, Policy::Paper)?;
    let (alice, bob) = (s.authenticate("ka")?, s.authenticate("kb")?);
    alice.answer(&split(), None)?;
    let view = bob.budget()?;
    assert_eq!((view.spent, view.limit, view.answered), (0.125, 0.5, 1));
    Ok(())
}

#[test]
fn contested_policy_never_refuses_up_front() -> Result<(), Box<dyn std::error::Error>> {
    let s = sessions(Scope::PerPrincipal, Policy::Contested)?;
    let alice = s.authenticate("ka")?;
    alice.answer(&split(), None)?;
    alice.answer(&split(), None)?;
    // Exhausted for contested answers, but a unanimous one is free.
    alice.ensure_can_pay()?;
    let (a, view) = alice.answer(&TeacherOutputs::Labels { labels: vec![2; 4], classes: 3 }, None)?;
    assert_eq!((a.label, a.charge.get(), view.answered, view.charged), (2, 0.0, 3, 2));
    assert!(matches!(alice.answer(&split(), None), Err(SessionError::Exhausted { .. })));
    Ok(())
}

#[test]
fn a_rejected_step_changes_nothing() -> Result<(), Box<dyn std::error::Error>> {
    let s = sessions(Scope::PerPrincipal, Policy::Paper)?;
    let alice = s.authenticate("ka")?;
    let wrong_m = TeacherOutputs::Labels { labels: vec![0, 1], classes: 3 };
    assert!(matches!(alice.answer(&wrong_m, None), Err(SessionError::Privacy(_))));
    assert_eq!(alice.budget()?.answered, 0);
    Ok(())
}
