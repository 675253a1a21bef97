use super::step::{Answered, charged_rows};
use super::*;
use cache::{CacheKey, CacheSettings, OnEvicted, QueryDigest};
use futures_util::FutureExt;
use pacpriv_privacy::Nats;
use pacpriv_privacy::PrivacyError;
use pacpriv_privacy::keyed::NoiseKey;
use pacpriv_privacy::ledger::Policy;
use pacpriv_privacy::mechanism::{SecretIndex, TeacherOutputs};
use pacpriv_privacy::posterior::{Posterior, UpdateRule};
use pacpriv_store::{Arrivals, DEFAULT_DATASET, EmbeddedStore, Origin, Release, Store, StoreError};
use sha2::{Digest, Sha256};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

fn principal(name: &str, key: &str, budget: f64) -> Result<PrincipalConfig, PrivacyError> {
    let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    Ok(PrincipalConfig {
        name: name.into(),
        key_sha256: digest,
        budget: Nats::new(budget)?,
        dataset_budgets: Default::default(),
    })
}

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Two cached answers per session; evicted repeats refused.
const CACHE: CacheSettings = CacheSettings { capacity: 2, on_evicted: OnEvicted::Refuse };

/// Sessions over the embedded store in `dir`.
async fn sessions_in(
    dir: &std::path::Path,
    scope: Scope,
    policy: Policy,
) -> Result<Sessions, Box<dyn std::error::Error>> {
    let ps = [principal("alice", "ka", 0.3)?, principal("bob", "kb", 0.3)?];
    let store = Store::Embedded(Arc::new(EmbeddedStore::open(&dir.join("state.redb"))?));
    Ok(Sessions::new(&ps, vec![dataset(DEFAULT_DATASET, scope, params(policy)?)?], &store).await?)
}

/// One dataset of the registry: `name`, with a global budget of 0.5.
fn dataset(name: &str, scope: Scope, params: SessionParams) -> Result<DatasetTerms, PrivacyError> {
    Ok(DatasetTerms { name: name.into(), scope, global_budget: Nats::new(0.5)?, params: Arc::new(params) })
}

/// The caller a credential names, on its session in the default dataset.
async fn login(s: &Sessions, credential: Credential<'_>) -> Result<Handle, SessionError> {
    Ok(s.authenticate(credential).await?.on(0)?.clone())
}

/// The draws' site of the session "s" that the step tests resume.
fn site() -> step::Site {
    step::Site(NoiseKey::from_bytes([7; 32]).session(DEFAULT_DATASET, "s"))
}

/// The sessions' parameters: m = 4, b = 0.125, journal on, [`CACHE`].
fn params(policy: Policy) -> Result<SessionParams, PrivacyError> {
    Ok(SessionParams {
        per_query: Nats::new(0.125)?,
        policy,
        m: 4,
        secret: SecretIndex::new(2, 4)?,
        noise: NoiseKey::from_bytes([7; 32]),
        journal: true,
        cache: CACHE,
        calibration: Default::default(),
    })
}

async fn sessions(scope: Scope, policy: Policy) -> Result<(Sessions, tempfile::TempDir), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    Ok((sessions_in(dir.path(), scope, policy).await?, dir))
}

/// The posterior of a session.
async fn posterior_of(h: &Handle) -> Result<Posterior, SessionError> {
    h.session.read(&[], |v| v.state.posterior.clone()).await
}

fn split() -> TeacherOutputs {
    TeacherOutputs::Labels { labels: vec![0, 1, 1, 0], classes: 3 }
}

#[tokio::test]
async fn keys_authenticate_their_principal_and_nothing_else() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Paper).await?;
    assert_eq!(login(&s, Credential::ApiKey("ka")).await?.principal(), "alice");
    assert_eq!(login(&s, Credential::ApiKey("kb")).await?.principal(), "bob");
    assert!(matches!(login(&s, Credential::ApiKey("kc")).await, Err(SessionError::Unauthenticated)));
    assert!(matches!(login(&s, Credential::ApiKey("")).await, Err(SessionError::Unauthenticated)));
    assert_eq!(key_digest_hex("demo-key"), "c48a01f49fd0f2cc404bc3cbbc80e91457a3d41bb429a695243de4c61794155c");
    Ok(())
}

#[tokio::test]
async fn per_principal_budgets_are_separate_and_run_out() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Paper).await?;
    let (alice, bob) = (login(&s, Credential::ApiKey("ka")).await?, login(&s, Credential::ApiKey("kb")).await?);
    // 0.3 / 0.125: two answers fit, the third does not.
    for n in 1..=2 {
        let (a, view) = alice.answer(split(), None, "q".into()).await?;
        assert_eq!(a.charge.get(), 0.125);
        assert_eq!((view.answered, view.spent), (n, 0.125 * n as f64));
    }
    let before = alice.budget().await?;
    assert!(matches!(preflight(&alice, new_query()).await, Err(SessionError::Exhausted { .. })));
    match alice.answer(split(), None, "q".into()).await {
        Err(SessionError::Exhausted { spent, limit, charge }) => assert_eq!((spent, limit, charge), (0.25, 0.3, 0.125)),
        other => panic!("expected exhaustion, got {:?}", other.map(|(_, v)| v)),
    }
    assert_eq!(alice.budget().await?, before, "a refusal changes nothing");
    assert_eq!(bob.budget().await?.spent, 0.0);
    assert_eq!(preflight(&bob, new_query()).await?, Preflight::Ask);
    Ok(())
}

#[tokio::test]
async fn global_scope_shares_one_session() -> TestResult {
    let (s, _dir) = sessions(Scope::Global, Policy::Paper).await?;
    let (alice, bob) = (login(&s, Credential::ApiKey("ka")).await?, login(&s, Credential::ApiKey("kb")).await?);
    alice.answer(split(), None, "q".into()).await?;
    let view = bob.budget().await?;
    assert_eq!((view.spent, view.limit, view.answered), (0.125, 0.5, 1));
    Ok(())
}

#[tokio::test]
async fn contested_policy_never_refuses_up_front() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Contested).await?;
    let alice = login(&s, Credential::ApiKey("ka")).await?;
    alice.answer(split(), None, "q".into()).await?;
    alice.answer(split(), None, "q".into()).await?;
    // Exhausted for contested answers, but a unanimous one is free.
    assert_eq!(preflight(&alice, new_query()).await?, Preflight::Ask);
    let (a, view) = alice.answer(TeacherOutputs::Labels { labels: vec![2; 4], classes: 3 }, None, "q".into()).await?;
    assert_eq!((a.label, a.charge.get(), view.answered, view.charged), (2, 0.0, 3, 2));
    assert!(matches!(alice.answer(split(), None, "q".into()).await, Err(SessionError::Exhausted { .. })));
    Ok(())
}

#[tokio::test]
async fn a_rejected_step_changes_nothing() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Paper).await?;
    let alice = login(&s, Credential::ApiKey("ka")).await?;
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
        let alice = login(&s, Credential::ApiKey("ka")).await?;
        alice.answer(split(), None, "a1".into()).await?;
        alice.answer(TeacherOutputs::Labels { labels: vec![1; 4], classes: 3 }, None, "a2".into()).await?;
        alice.answer(split(), None, "a3".into()).await?;
        let posterior = posterior_of(&alice).await?;
        (alice.budget().await?, posterior)
    };
    let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Contested).await?;
    let alice = login(&s, Credential::ApiKey("ka")).await?;
    assert_eq!(alice.budget().await?, before, "spending survives a restart");
    assert_eq!(posterior_of(&alice).await?, posterior);
    assert_eq!(login(&s, Credential::ApiKey("kb")).await?.budget().await?.answered, 0);

    // Replaying the journal from the prior gives the stored posterior bit for bit.
    drop((alice, s));
    let journal = EmbeddedStore::open(&dir.path().join("state.redb"))?.journal("alice")?;
    assert_eq!(journal.iter().map(|j| j.query_id.as_str()).collect::<Vec<_>>(), ["a1", "a2", "a3"]);
    let mut replay = Posterior::uniform(4)?;
    for entry in &journal {
        if !entry.log_likelihood.is_empty() {
            let rule = UpdateRule::from_code(entry.update_rule).ok_or("unknown update rule")?;
            let labels = entry.step.as_ref().map(|s| s.labels.as_slice()).unwrap_or_default();
            replay.update_by(rule, labels, ndarray::ArrayView1::from(&entry.log_likelihood))?;
        }
    }
    assert_eq!(replay, posterior);
    assert_eq!(journal.iter().map(|j| j.charge).sum::<f64>(), before.spent);
    Ok(())
}

#[tokio::test]
async fn admin_principals_get_a_fresh_key_and_revocation_is_immediate_and_durable() -> TestResult {
    let dir = tempfile::tempdir()?;
    let key = {
        let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Paper).await?;
        let (account, key) = s.create("carol", Nats::new(0.25)?, &Default::default()).await?;
        assert!(key.starts_with("ppk_") && key.len() == 68, "{key}");
        assert_eq!(
            (account.principal.origin, account.datasets[0].budget.limit, account.datasets[0].budget.spent),
            (Origin::Admin, 0.25, 0.0)
        );
        let carol = login(&s, Credential::ApiKey(&key)).await?;
        assert_eq!(carol.principal(), "carol");
        carol.answer(split(), None, "c1".into()).await?;
        assert_eq!(s.inspect("carol").await?.datasets[0].budget.spent, 0.125);

        // Names are never reused, revoked or not; nor are bad names accepted.
        assert!(matches!(
            s.create("carol", Nats::new(1.0)?, &Default::default()).await,
            Err(SessionError::Registry(_))
        ));
        assert!(matches!(
            s.create("alice", Nats::new(1.0)?, &Default::default()).await,
            Err(SessionError::Registry(_))
        ));
        for bad in ["", "*global*", "a b", &"x".repeat(65)] {
            assert!(
                matches!(
                    s.create(bad, Nats::new(1.0)?, &Default::default()).await,
                    Err(SessionError::InvalidPrincipal(_))
                ),
                "{bad:?}"
            );
        }

        let revoked = s.revoke("carol").await?;
        assert!(!revoked.principal.active());
        assert_eq!(revoked.datasets[0].budget.spent, 0.125, "revocation keeps the spending on record");
        assert!(matches!(login(&s, Credential::ApiKey(&key)).await, Err(SessionError::Unauthenticated)));
        assert!(matches!(carol_again(&s).await, Err(SessionError::Unauthenticated)));
        assert!(matches!(s.revoke("nobody").await, Err(SessionError::UnknownPrincipal(_))));
        assert!(matches!(
            s.create("carol", Nats::new(1.0)?, &Default::default()).await,
            Err(SessionError::Registry(_))
        ));
        let names: Vec<String> = s.list().await?.into_iter().map(|a| a.principal.name).collect();
        assert_eq!(names, ["alice", "bob", "carol"]);
        key
    };
    // After a restart: still revoked, spending still there, alice still works.
    let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Paper).await?;
    assert!(matches!(login(&s, Credential::ApiKey(&key)).await, Err(SessionError::Unauthenticated)));
    let carol = s.inspect("carol").await?;
    assert_eq!((carol.principal.active(), carol.datasets[0].budget.spent), (false, 0.125));
    assert_eq!(login(&s, Credential::ApiKey("ka")).await?.principal(), "alice");
    Ok(())
}

async fn carol_again(s: &Sessions) -> Result<Handle, SessionError> {
    login(s, Credential::Certificate("carol")).await
}

#[tokio::test]
async fn certificates_name_active_principals_and_config_keys_can_rotate() -> TestResult {
    let dir = tempfile::tempdir()?;
    {
        let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Paper).await?;
        assert_eq!(login(&s, Credential::Certificate("bob")).await?.principal(), "bob");
        assert!(matches!(login(&s, Credential::Certificate("mallory")).await, Err(SessionError::Unauthenticated)));
        login(&s, Credential::ApiKey("ka")).await?.answer(split(), None, "a1".into()).await?;
    }
    // The operator rotates alice's key in the configuration: the old key
    // stops working, the new one reaches the same session (spending kept).
    let store = Store::Embedded(Arc::new(EmbeddedStore::open(&dir.path().join("state.redb"))?));
    let params = SessionParams {
        per_query: Nats::new(0.125)?,
        policy: Policy::Paper,
        m: 4,
        secret: SecretIndex::new(2, 4)?,
        noise: NoiseKey::from_bytes([7; 32]),
        journal: true,
        cache: CACHE,
        calibration: Default::default(),
    };
    let s = Sessions::new(
        &[principal("alice", "ka2", 0.3)?],
        vec![dataset(DEFAULT_DATASET, Scope::PerPrincipal, params)?],
        &store,
    )
    .await?;
    assert!(matches!(login(&s, Credential::ApiKey("ka")).await, Err(SessionError::Unauthenticated)));
    assert_eq!(login(&s, Credential::ApiKey("ka2")).await?.budget().await?.spent, 0.125);
    // A configured key that another principal already holds is refused.
    let clash = Sessions::new(
        &[principal("eve", "kb", 0.3)?],
        vec![dataset(DEFAULT_DATASET, Scope::PerPrincipal, params)?],
        &store,
    )
    .await;
    assert!(matches!(clash, Err(SessionError::Registry(StoreError::KeyInUse { .. }))));
    Ok(())
}

/// docs/assurance/accounting.md §4: under per-principal scope each session's
/// posterior — the belief its noise is calibrated to — moves only with its
/// own principal's answers; under global scope everyone's answers move the
/// one shared posterior.
#[tokio::test]
async fn per_principal_sessions_calibrate_to_their_own_transcript_only() -> TestResult {
    let uniform = Posterior::uniform(4)?;
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Paper).await?;
    let (alice, bob) = (login(&s, Credential::ApiKey("ka")).await?, login(&s, Credential::ApiKey("kb")).await?);
    alice.answer(split(), None, "a1".into()).await?;
    alice.answer(split(), None, "a2".into()).await?;
    assert_ne!(posterior_of(&alice).await?, uniform, "alice's answers moved her posterior");
    assert_eq!(posterior_of(&bob).await?, uniform, "bob's noise ignores what alice was told");

    let (g, _gdir) = sessions(Scope::Global, Policy::Paper).await?;
    let (alice, bob) = (login(&g, Credential::ApiKey("ka")).await?, login(&g, Credential::ApiKey("kb")).await?);
    alice.answer(split(), None, "a1".into()).await?;
    assert_ne!(posterior_of(&bob).await?, uniform);
    assert_eq!(posterior_of(&bob).await?, posterior_of(&alice).await?, "one transcript, one posterior");
    Ok(())
}

/// docs/assurance/accounting.md §5: the store *is* the accounting. Delete it and the
/// same teachers face fresh budgets and a uniform posterior — nothing in
/// the process remembers the answers already given.
#[tokio::test]
async fn deleting_the_store_forgets_every_budget_and_posterior() -> TestResult {
    let dir = tempfile::tempdir()?;
    {
        let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Paper).await?;
        let alice = login(&s, Credential::ApiKey("ka")).await?;
        alice.answer(split(), None, "a1".into()).await?;
        assert_eq!(alice.budget().await?.spent, 0.125);
    }
    let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Paper).await?;
    let alice = login(&s, Credential::ApiKey("ka")).await?;
    assert_eq!(alice.budget().await?.spent, 0.125, "a restart remembers");
    drop((alice, s));
    std::fs::remove_file(dir.path().join("state.redb"))?;
    let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Paper).await?;
    let alice = login(&s, Credential::ApiKey("ka")).await?;
    assert_eq!(alice.budget().await?.spent, 0.0, "a deleted store forgets");
    assert_eq!(posterior_of(&alice).await?, Posterior::uniform(4)?);
    Ok(())
}

/// A keyed query for the cache, with the noisy vector asked for or not.
fn keyed(example: f64, return_noisy: bool, alpha: Option<f64>) -> Asking {
    Asking {
        alpha,
        query_id: format!("q{example}"),
        key: Some(QueryDigest::of(&[example]).into()),
        return_noisy,
        model: ModelTag::default(),
    }
}

async fn ask(h: &Handle, outputs: Option<TeacherOutputs>, asking: Asking) -> Result<(Reply, BudgetView), SessionError> {
    let (mut replies, view) = h.begin(vec![(outputs, asking)], Vec::new()).await?.release().await?;
    assert_eq!(replies.len(), 1);
    Ok((replies.remove(0), view))
}

/// The preflight of one query.
async fn preflight(h: &Handle, key: CacheKey) -> Result<Preflight, SessionError> {
    let found = h.preflight(&[key], Some("q")).await?;
    assert_eq!(found.len(), 1);
    Ok(found[0])
}

#[tokio::test]
async fn a_repeated_query_gets_its_answer_again_for_free_even_after_a_restart() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (first, posterior) = {
        let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Paper).await?;
        let alice = login(&s, Credential::ApiKey("ka")).await?;
        let (first, view) = ask(&alice, Some(split()), keyed(1.0, true, Some(0.05))).await?;
        assert!(!first.cached && first.charge.get() == 0.125 && view.answered == 1);
        let posterior = posterior_of(&alice).await?;
        for _ in 0..5 {
            // Before the fan-out the session already knows the query ...
            assert_eq!(preflight(&alice, QueryDigest::of(&[1.0]).into()).await?, Preflight::Known);
            // ... and answers it without teachers, charge or posterior change.
            let (again, view) = ask(&alice, None, keyed(1.0, true, Some(0.05))).await?;
            assert_eq!(again, Reply { cached: true, charge: Nats::ZERO, ..first.clone() });
            assert_eq!((view.answered, view.spent), (1, 0.125));
            assert_eq!(posterior_of(&alice).await?, posterior);
        }
        // A repeat that also brings teacher outputs is still the cached answer.
        assert!(ask(&alice, Some(split()), keyed(1.0, false, None)).await?.0.cached);
        (first, posterior)
    };
    let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Paper).await?;
    let alice = login(&s, Credential::ApiKey("ka")).await?;
    let (again, view) = ask(&alice, None, keyed(1.0, true, Some(0.05))).await?;
    assert_eq!(again, Reply { cached: true, charge: Nats::ZERO, ..first }, "the cache survives a restart");
    assert_eq!((view.answered, posterior_of(&alice).await?), (1, posterior));
    Ok(())
}

/// Alice's session over a fresh embedded store in `dir` whose disk is
/// stalled until the returned transaction is dropped or aborted.
async fn stalled(
    dir: &std::path::Path,
    policy: Policy,
    journal: bool,
) -> Result<(Sessions, Handle, redb::WriteTransaction), Box<dyn std::error::Error>> {
    let store = Arc::new(EmbeddedStore::open(&dir.join("state.redb"))?);
    let ps = [principal("alice", "ka", 0.3)?];
    let params = SessionParams { journal, ..params(policy)? };
    let datasets = vec![dataset(DEFAULT_DATASET, Scope::PerPrincipal, params)?];
    let s = Sessions::new(&ps, datasets, &Store::Embedded(Arc::clone(&store))).await?;
    let alice = login(&s, Credential::ApiKey("ka")).await?;
    let stall = store.stall()?;
    Ok((s, alice, stall))
}

/// `step`'s release, checked not to have happened yet: `what` waits for
/// the stalled disk.
fn held_back(step: Step, what: &str) -> Pin<Box<impl Future<Output = Result<Answered, SessionError>>>> {
    let mut release = Box::pin(step.release());
    assert!(release.as_mut().now_or_never().is_none(), "{what} left before its record was durable");
    release
}

/// `step`'s release, which must not wait for the stalled disk.
fn released_now(step: Step, what: &str) -> Result<Answered, Box<dyn std::error::Error>> {
    Ok(step.release().now_or_never().ok_or(format!("{what} waited for the disk"))??)
}

/// With the journal on, every answer waits for its entry or event — the
/// journal holds every release that left — and so does a refusal.
#[tokio::test]
async fn with_the_journal_on_even_free_answers_wait_for_their_entry() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (_s, alice, stall) = stalled(dir.path(), Policy::Contested, true).await?;
    let unanimous = TeacherOutputs::Labels { labels: vec![2; 4], classes: 3 };
    let free =
        held_back(alice.begin(vec![(Some(unanimous), keyed(1.0, false, None))], Vec::new()).await?, "a free answer");
    let mut refused = Box::pin(alice.begin(vec![(None, keyed(1.0, true, None))], Vec::new()));
    assert!(refused.as_mut().now_or_never().is_none(), "a journaled refusal returned before its event was durable");
    stall.abort()?;
    assert!(free.await?.0[0].unanimous);
    assert!(matches!(refused.await, Err(SessionError::NoisyNotKept)));
    Ok(())
}

/// A row's answer, counted on its way to the store since its fan-out
/// (`pacpriv_store::Arrivals`, which the store's writer waits for), stops
/// being counted once `begin` has queued its record — before the record
/// is durable, so the writer that waits finds it — and when its step is
/// refused.
#[tokio::test]
async fn a_rows_arrival_lands_once_its_record_is_queued_or_it_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (_s, alice, stall) = stalled(dir.path(), Policy::Contested, false).await?;
    let arrivals = Arc::new(Arrivals::default());
    let unanimous = TeacherOutputs::Labels { labels: vec![2; 4], classes: 3 };
    let rows = vec![(Some(split()), keyed(2.0, false, None)), (Some(unanimous), keyed(1.0, false, None))];
    let charged = alice.begin(rows, vec![arrivals.arrive(), arrivals.arrive()]).await?;
    assert_eq!(arrivals.coming(), 0, "still counted after the record was queued");
    let charged = held_back(charged, "a charged answer");
    let refused = alice.begin(vec![(None, keyed(1.0, true, None))], vec![arrivals.arrive()]).await;
    assert!(matches!(refused, Err(SessionError::NoisyNotKept)));
    assert_eq!(arrivals.coming(), 0, "still counted after a refusal");
    stall.abort()?;
    assert!(charged.await?.0[0].charge.get() > 0.0);
    Ok(())
}

/// Issue 44 §1 (journal off, the default): while the disk is stalled, an
/// exact unanimous answer that charged nothing (`contested`) and a cached
/// repeat of it leave at once; a charged answer waits for its charge, and
/// so does a cached repeat of it, whose charge is not durable yet. Once the disk moves, every record —
/// the free ones too — is durable.
#[tokio::test]
async fn free_answers_leave_without_waiting_for_the_disk_and_charged_ones_wait() -> TestResult {
    let dir = tempfile::tempdir()?;
    let unanimous = || Some(TeacherOutputs::Labels { labels: vec![2; 4], classes: 3 });
    {
        let (_s, alice, stall) = stalled(dir.path(), Policy::Contested, false).await?;
        let (free, view) = released_now(
            alice.begin(vec![(unanimous(), keyed(1.0, false, None))], Vec::new()).await?,
            "a free answer",
        )?;
        assert_eq!(view.mia_bound, 0.5, "nothing spent, nothing learnt");
        assert!(free[0].unanimous && free[0].charge.get() == 0.0 && !free[0].cached);

        let charged = held_back(
            alice.begin(vec![(Some(split()), keyed(2.0, false, None))], Vec::new()).await?,
            "a charged answer",
        );
        let repeat =
            held_back(alice.begin(vec![(None, keyed(2.0, false, None))], Vec::new()).await?, "a cached noisy answer");
        // A free repeat does not wait; a batch with one charged row does.
        let (again, _) = released_now(
            alice.begin(vec![(None, keyed(1.0, false, None))], Vec::new()).await?,
            "a cached unanimous answer",
        )?;
        assert!(again[0].cached && again[0].label == 2);
        let rows = vec![(Some(split()), keyed(4.0, false, None)), (unanimous(), keyed(3.0, false, None))];
        let mixed = held_back(alice.begin(rows, Vec::new()).await?, "a batch with a charged row");

        stall.abort()?;
        let (charged, view) = charged.await?;
        assert!(charged[0].charge.get() == 0.125 && view.answered == 2);
        // The bound follows `spent`, also where the last view was a free answer's.
        assert_eq!(view.mia_bound, pacpriv_privacy::report::mia_bound(Nats::new(0.125)?));
        let (repeat, _) = repeat.await?;
        assert_eq!(repeat[0].label, charged[0].label);
        assert_eq!(mixed.await?.0.len(), 2);
    }
    // Every step reached the disk: the answers are cached after a restart,
    // and both charges are on the ledger.
    let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Contested).await?;
    let alice = login(&s, Credential::ApiKey("ka")).await?;
    for example in [1.0, 2.0] {
        assert_eq!(preflight(&alice, QueryDigest::of(&[example]).into()).await?, Preflight::Known);
    }
    let view = alice.budget().await?;
    assert_eq!((view.answered, view.charged, view.spent), (4, 2, 0.25));
    Ok(())
}

/// Under `paper` a unanimous answer is charged b: it waits for its
/// charge, and so does a cached repeat of it while that charge is not
/// durable.
#[tokio::test]
async fn under_paper_unanimous_answers_and_their_repeats_wait_for_the_charge() -> TestResult {
    assert!(
        Release::Free < Release::AfterCharges && Release::AfterCharges < Release::Durable,
        "a batch waits for its strictest row"
    );
    let dir = tempfile::tempdir()?;
    let (_s, alice, stall) = stalled(dir.path(), Policy::Paper, false).await?;
    let unanimous = TeacherOutputs::Labels { labels: vec![2; 4], classes: 3 };
    let first = held_back(
        alice.begin(vec![(Some(unanimous), keyed(1.0, false, None))], Vec::new()).await?,
        "a unanimous answer charged b",
    );
    let repeat = held_back(alice.begin(vec![(None, keyed(1.0, false, None))], Vec::new()).await?, "its cached repeat");
    stall.abort()?;
    assert_eq!(first.await?.0[0].charge.get(), 0.125);
    assert!(repeat.await?.0[0].cached);
    Ok(())
}

#[tokio::test]
async fn repeats_that_would_need_fresh_noise_are_refused_and_change_nothing() -> TestResult {
    // Contested: the unanimous answers below are free, so b = 0.125 of 0.3 fits.
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Contested).await?;
    let unanimous = || TeacherOutputs::Labels { labels: vec![2; 4], classes: 3 };
    let alice = login(&s, Credential::ApiKey("ka")).await?;
    ask(&alice, Some(split()), keyed(1.0, false, None)).await?;
    // Its noisy vector was not returned, so not kept: refused, not redrawn.
    let refused = ask(&alice, None, keyed(1.0, true, None)).await;
    assert!(matches!(refused, Err(SessionError::NoisyNotKept)), "{refused:?}");
    // Two more queries evict the first (capacity 2): its repeat is refused.
    ask(&alice, Some(unanimous()), keyed(2.0, false, None)).await?;
    ask(&alice, Some(unanimous()), keyed(3.0, false, None)).await?;
    let before = (alice.budget().await?, posterior_of(&alice).await?);
    assert_eq!(
        preflight(&alice, QueryDigest::of(&[1.0]).into()).await?,
        Preflight::Known,
        "no teacher is asked for a refused repeat"
    );
    let refused = ask(&alice, Some(split()), keyed(1.0, false, None)).await;
    assert!(matches!(refused, Err(SessionError::EvictedRepeat)), "{refused:?}");
    assert_eq!((alice.budget().await?, posterior_of(&alice).await?), before);
    // Uncached callers are never looked up.
    assert!(!alice.answer(unanimous(), None, "plain".into()).await?.0.cached);
    // A query the session believed cached but whose answer is gone: nothing
    // to answer with, nothing charged.
    let before = alice.budget().await?;
    assert!(matches!(ask(&alice, None, keyed(9.0, false, None)).await, Err(SessionError::CacheMoved)));
    assert_eq!(alice.budget().await?, before);
    Ok(())
}

#[tokio::test]
async fn the_cached_confidence_flag_answers_any_alpha() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Paper).await?;
    let alice = login(&s, Credential::ApiKey("ka")).await?;
    let (first, _) = ask(&alice, Some(split()), keyed(1.0, false, None)).await?;
    assert_eq!(first.confident, None);
    let lax = ask(&alice, None, keyed(1.0, false, Some(0.5))).await?.0.confident;
    let strict = ask(&alice, None, keyed(1.0, false, Some(1e-9))).await?.0.confident;
    assert!(lax.is_some() && strict.is_some());
    assert!(lax >= strict, "a laxer α keeps at least as much: {lax:?} vs {strict:?}");
    Ok(())
}

/// Issue 21 §4: under global scope the answer cache is partitioned by
/// principal, so bob's responses and statuses — cached flags, refusals of
/// evicted repeats — are the same whether or not alice has been querying
/// (on main her queries evicted his entries from the one shared FIFO). Only
/// the shared budget figures may differ, and they are not compared.
#[tokio::test]
async fn under_global_scope_another_principals_queries_never_change_your_answers() -> TestResult {
    let unanimous = || TeacherOutputs::Labels { labels: vec![1; 4], classes: 3 };
    let mut seen = Vec::new();
    for alice_queries in [0, 5] {
        let (s, _dir) = sessions(Scope::Global, Policy::Contested).await?;
        let (alice, bob) = (login(&s, Credential::ApiKey("ka")).await?, login(&s, Credential::ApiKey("kb")).await?);
        let asking = |h: &Handle, x: f64| Asking {
            key: Some(h.cache_key(QueryDigest::of(&[x]))),
            ..keyed(x, false, Some(0.05))
        };
        let mut replies = Vec::new();
        for x in [1.0, 2.0, 1.0, 3.0, 4.0, 2.0] {
            if x == 3.0 {
                for i in 0..alice_queries {
                    ask(&alice, Some(unanimous()), asking(&alice, 100.0 + f64::from(i))).await?;
                }
            }
            // As the server does: no teacher for a query the cache knows.
            let outputs =
                (preflight(&bob, bob.cache_key(QueryDigest::of(&[x]))).await? == Preflight::Ask).then(unanimous);
            let reply = ask(&bob, outputs, asking(&bob, x)).await;
            replies.push(
                reply.map(|(r, _)| (r.label, r.unanimous, r.cached, r.confident, r.charge)).map_err(|e| e.to_string()),
            );
        }
        seen.push(replies);
    }
    assert_eq!(seen[0], seen[1]);
    assert!(seen[0][5].is_err(), "bob's own third and fourth queries evicted his first two: {:?}", seen[0]);
    Ok(())
}

#[tokio::test]
async fn under_global_scope_a_principal_never_gets_another_principals_cached_answer() -> TestResult {
    let (s, _dir) = sessions(Scope::Global, Policy::Paper).await?;
    let (alice, bob) = (login(&s, Credential::ApiKey("ka")).await?, login(&s, Credential::ApiKey("kb")).await?);
    let digest = QueryDigest::of(&[1.0]);
    let asking = |h: &Handle| Asking { key: Some(h.cache_key(digest)), ..keyed(1.0, false, None) };
    ask(&alice, Some(split()), asking(&alice)).await?;
    assert_eq!(preflight(&alice, alice.cache_key(digest)).await?, Preflight::Known);
    assert_eq!(preflight(&bob, bob.cache_key(digest)).await?, Preflight::Ask, "bob cannot tell that alice asked it");
    let (reply, _) = ask(&bob, Some(split()), asking(&bob)).await?;
    assert!(!reply.cached, "bob's asking is a fresh, charged release");
    Ok(())
}

/// A query no test asks: its preflight says whether a new query could be paid for.
fn new_query() -> CacheKey {
    QueryDigest::of(&[-12_345.0]).into()
}

/// Issue 23 §2: a request of n rows is n queries, each charged as alone,
/// answered whole or not at all.
#[tokio::test]
async fn a_batch_is_answered_whole_or_not_at_all() -> TestResult {
    let dir = tempfile::tempdir()?;
    let rows = |xs: &[f64], fresh: bool| -> Vec<(Option<TeacherOutputs>, Asking)> {
        xs.iter().map(|&x| (fresh.then(split), keyed(x, false, None))).collect()
    };
    {
        let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Paper).await?;
        let alice = login(&s, Credential::ApiKey("ka")).await?;
        // Three new rows cost 3b = 0.375 of a 0.3 budget: refused, nothing
        // drawn, kept or charged.
        let before = (alice.budget().await?, posterior_of(&alice).await?);
        match alice.begin(rows(&[1.0, 2.0, 3.0], true), Vec::new()).await {
            Err(SessionError::Exhausted { spent, charge, .. }) => assert_eq!((spent, charge), (0.0, 0.375)),
            other => panic!("expected the whole batch refused, got {:?}", other.map(|_| ())),
        }
        assert_eq!((alice.budget().await?, posterior_of(&alice).await?), before);
        assert_eq!(preflight(&alice, QueryDigest::of(&[1.0]).into()).await?, Preflight::Ask, "no row was kept");
        // Two new rows, the first repeated: two charges, the repeat is the
        // first row's answer again.
        let (replies, view) = alice.begin(rows(&[1.0, 2.0, 1.0], true), Vec::new()).await?.release().await?;
        let charges: Vec<f64> = replies.iter().map(|r| r.charge.get()).collect();
        assert_eq!(charges, [0.125, 0.125, 0.0]);
        assert!(replies[2].cached && replies[2].label == replies[0].label);
        assert_eq!((view.spent, view.answered, view.charged), (0.25, 2, 2));
        // Cached rows are free when nothing new fits any more ...
        let (replies, _) = alice.begin(rows(&[2.0, 1.0], false), Vec::new()).await?.release().await?;
        assert!(replies.iter().all(|r| r.cached && r.charge == Nats::ZERO));
        // ... but one new row among them refuses the whole request.
        let mixed = vec![(None, keyed(2.0, false, None)), (Some(split()), keyed(4.0, false, None))];
        assert!(matches!(alice.begin(mixed, Vec::new()).await, Err(SessionError::Exhausted { .. })));
        assert_eq!(alice.budget().await?.spent, 0.25);
    }
    // Each charged row is a step of its own in the durable journal.
    let store = EmbeddedStore::open(&dir.path().join("state.redb"))?;
    let journal = store.journal("alice")?;
    let steps: Vec<(u64, &str)> = journal.iter().map(|j| (j.version, j.query_id.as_str())).collect();
    assert_eq!(steps, [(1, "q1"), (2, "q2")]);
    assert_eq!(store.load("alice")?.map(|r| r.version), Some(2));
    Ok(())
}

/// A reload that cuts a budget below what is spent: the spending stays,
/// new queries are refused, cached answers are still given (free).
#[tokio::test]
async fn a_budget_cut_below_the_spending_still_repeats_cached_answers() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Paper).await?;
    let alice = login(&s, Credential::ApiKey("ka")).await?;
    ask(&alice, Some(split()), keyed(1.0, false, None)).await?;
    ask(&alice, Some(split()), keyed(2.0, false, None)).await?;
    s.reconfigure(&[principal("alice", "ka", 0.1)?, principal("bob", "kb", 0.3)?]).await?;
    let alice = login(&s, Credential::ApiKey("ka")).await?;
    let view = alice.budget().await?;
    assert_eq!((view.spent, view.limit), (0.25, 0.1));
    assert!(matches!(preflight(&alice, new_query()).await, Err(SessionError::Exhausted { .. })));
    assert_eq!(preflight(&alice, QueryDigest::of(&[1.0]).into()).await?, Preflight::Known);
    let (again, _) = ask(&alice, None, keyed(1.0, false, None)).await?;
    assert!(again.cached && again.charge == Nats::ZERO);
    Ok(())
}

/// Issue 40 §4: every refusal that does not depend on the draw — a noisy
/// vector that was not kept, an answer gone since the preflight, an answer
/// the request's own earlier rows evict, the wrong number of teachers, an
/// α outside (0, 1) — is found by the request's cost,
/// before its first row draws (so neither the refusal's timing nor its
/// text can follow from secret-centred draws), and the request changes
/// nothing.
#[tokio::test]
async fn refusals_that_do_not_depend_on_the_draw_come_before_any_draw() -> TestResult {
    let (s, _dir) = sessions(Scope::PerPrincipal, Policy::Contested).await?;
    let alice = login(&s, Credential::ApiKey("ka")).await?;
    let unanimous = || TeacherOutputs::Labels { labels: vec![2; 4], classes: 3 };
    // The cache (capacity 2) holds 1.0 (noisy vector not kept), then 2.0.
    ask(&alice, Some(split()), keyed(1.0, false, None)).await?;
    ask(&alice, Some(unanimous()), keyed(2.0, false, None)).await?;
    // A new contested row first: it would draw if it were stepped.
    let fresh = || (Some(split()), keyed(7.0, false, None));
    type Case = (Vec<(Option<TeacherOutputs>, Asking)>, fn(&SessionError) -> bool);
    let five = || TeacherOutputs::Labels { labels: vec![0, 1, 1, 0, 2], classes: 3 };
    let cases: [Case; 5] = [
        (vec![fresh(), (None, keyed(2.0, true, None))], |e| matches!(e, SessionError::NoisyNotKept)),
        (vec![fresh(), (Some(five()), keyed(5.0, false, None))], |e| {
            matches!(e, SessionError::Privacy(PrivacyError::TeacherCount { .. }))
        }),
        (vec![fresh(), (Some(split()), keyed(6.0, false, Some(1.5)))], |e| {
            matches!(e, SessionError::Privacy(PrivacyError::Domain(_)))
        }),
        (vec![fresh(), (None, keyed(9.0, false, None))], |e| matches!(e, SessionError::CacheMoved)),
        // Row 0's answer evicts 1.0, the oldest: row 1 repeats it.
        (vec![fresh(), (None, keyed(1.0, false, None))], |e| matches!(e, SessionError::EvictedRepeat)),
    ];
    let p = params(Policy::Contested)?;
    for (rows, expected) in cases {
        let before = (alice.budget().await?, posterior_of(&alice).await?);
        let found = alice.session.read(&[], |v| charged_rows(&p, v, &rows).map(|_| ())).await?;
        assert!(matches!(&found, Err((Some(1), e)) if expected(e)), "{found:?}");
        let refused = alice.begin(rows, Vec::new()).await.err().ok_or("refused")?;
        assert!(expected(&refused), "{refused:?}");
        assert_eq!((alice.budget().await?, posterior_of(&alice).await?), before);
    }
    // Under "charge", the row whose answer its own request evicts is
    // priced as new before any draw, and answered so.
    let mut charge = params(Policy::Contested)?;
    charge.cache.on_evicted = OnEvicted::Charge;
    let rows = vec![fresh(), (Some(split()), keyed(1.0, false, None))];
    let charged = alice.session.read(&[], |v| charged_rows(&charge, v, &rows).map_err(|(_, e)| e)).await??;
    assert_eq!(charged, 2);
    // Unanimity is judged as the mechanism judges it, on the release grid:
    // vectors 10⁻¹² apart are one release, free under contested.
    let close = ndarray::Array2::from_shape_fn((4, 3), |(i, j)| j as f64 + i as f64 * 1e-12);
    let rows = vec![(Some(TeacherOutputs::Vectors(close)), keyed(8.0, false, None))];
    let charged = alice.session.read(&[], |v| charged_rows(&p, v, &rows).map_err(|(_, e)| e)).await??;
    assert_eq!(charged, 0);
    Ok(())
}

/// The all-or-nothing step on a state value alone — no cell, no store:
/// a request whose last row is refused leaves the posterior, the ledger
/// and the version as they were (the refusal becomes one journal event);
/// the same request without that row is answered whole, one journal entry
/// per step.
#[test]
fn a_step_on_a_bare_state_is_all_or_nothing() -> TestResult {
    use pacpriv_store::CacheRows;
    use pacpriv_store::cell::State;
    let terms = Terms { params: params(Policy::UnanimousOnly)?.into(), limit: Nats::new(1.0)? };
    let mut v = Versioned::resume(&terms, "s", None, CacheRows::default())?;
    let unanimous = TeacherOutputs::Labels { labels: vec![1; 4], classes: 3 };
    let rows = vec![
        (Some(unanimous), Asking::uncached(None, "q-1".into())),
        (Some(split()), Asking::uncached(None, "q-2".into())),
    ];
    let before = v.state.clone();

    let (outcome, change) = step::step_all(&terms.params, &site(), &mut v, &rows)?;
    assert!(matches!(outcome, Err(SessionError::Privacy(PrivacyError::Contested))), "{outcome:?}");
    assert_eq!((v.version, &v.state), (0, &before), "a refused request changes nothing");
    assert_eq!((change.steps, change.journal.len(), change.events.len()), (0, 0, 1));

    let (outcome, change) = step::step_all(&terms.params, &site(), &mut v, &rows[..1])?;
    let (replies, view) = outcome?;
    assert_eq!((replies.len(), replies[0].label, replies[0].unanimous), (1, 1, true));
    assert_eq!((v.version, view.spent, view.answered), (1, 0.0, 1), "unanimous: answered, free");
    assert_eq!((change.steps, change.journal.len(), change.events.len()), (1, 1, 0));
    Ok(())
}

/// Issue 53 §6: a row that fails after an earlier row drew (an internal
/// failure, injected here) refuses the request without releasing
/// anything, but the row that drew stays stepped, charged and journaled,
/// its answer kept: the retry receives it from the cache, free, and steps
/// the failed row. Whether the request is refused never turns on draws
/// left uncharged.
#[test]
fn rows_that_drew_before_a_failure_stay_charged() -> TestResult {
    use pacpriv_store::CacheRows;
    use pacpriv_store::cell::State;
    let terms = Terms { params: params(Policy::Paper)?.into(), limit: Nats::new(1.0)? };
    let mut v = Versioned::resume(&terms, "s", None, CacheRows::default())?;
    let rows = vec![(Some(split()), keyed(1.0, false, None)), (Some(split()), keyed(2.0, false, None))];

    step::fault::fail_row(1);
    let (outcome, change) = step::step_all(&terms.params, &site(), &mut v, &rows)?;
    assert!(matches!(outcome, Err(SessionError::RowFailed { row: 1, drew: 1 })), "{outcome:?}");
    assert_eq!((v.version, v.state.ledger.charged(), v.state.ledger.spent().get()), (1, 1, 0.125));
    assert_eq!((change.steps, change.journal.len(), change.release), (1, 1, Release::Durable));

    let (outcome, change) = step::step_all(&terms.params, &site(), &mut v, &rows)?;
    let (replies, view) = outcome?;
    assert!(replies[0].cached && replies[0].charge == Nats::ZERO && !replies[1].cached, "{replies:?}");
    assert_eq!((v.version, view.charged, view.answered, change.steps), (2, 2, 2, 1));
    Ok(())
}

/// Issue 67 §2: a session record commits to its dataset's noise key, and
/// a record another dataset's session wrote is not resumed — the stored
/// `fashion/alice` of a principal an earlier release let be named so is
/// not the posterior of `alice` in a later dataset `fashion`. A record
/// from before the commitment resumes, and the next write stamps it.
#[test]
fn a_record_of_another_datasets_secret_is_not_resumed() -> TestResult {
    use pacpriv_store::CacheRows;
    use pacpriv_store::cell::State;
    let terms = Terms { params: params(Policy::Contested)?.into(), limit: Nats::new(1.0)? };
    let mut v = Versioned::resume(&terms, "s", None, CacheRows::default())?;
    let (record, _) = v.record();
    assert_eq!(record.dataset, Some(terms.params.noise.commitment()), "every record names its dataset");
    Versioned::resume(&terms, "s", Some(&record), CacheRows::default())?;

    let other = Terms {
        params: SessionParams { noise: NoiseKey::from_bytes([8; 32]), ..params(Policy::Contested)? }.into(),
        ..terms
    };
    match Versioned::resume(&other, "fashion/alice", Some(&record), CacheRows::default()) {
        Err(SessionError::OtherDataset { session }) => assert_eq!(session, "fashion/alice"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("another dataset's session was resumed"),
    }
    let before = pacpriv_store::SessionRecord { dataset: None, ..record };
    let mut resumed = Versioned::resume(&other, "s", Some(&before), CacheRows::default())?;
    assert_eq!(resumed.record().0.dataset, Some(other.params.noise.commitment()));
    Ok(())
}

/// Issue 67 §1 (third review's L2): a server listening off loopback
/// refuses the published demo key whoever stored a principal with it —
/// another replica's configuration sharing the store, an earlier release
/// — while the other principals are served.
#[tokio::test]
async fn a_refused_key_names_no_one_whoever_stored_it() -> TestResult {
    use sha2::{Digest, Sha256};
    let dir = tempfile::tempdir()?;
    let s = sessions_in(dir.path(), Scope::PerPrincipal, Policy::Contested).await?;
    login(&s, Credential::ApiKey("ka")).await?;
    let s = s.refusing(Some(Sha256::digest("ka").into()));
    assert!(matches!(login(&s, Credential::ApiKey("ka")).await, Err(SessionError::Unauthenticated)));
    login(&s, Credential::ApiKey("kb")).await?;
    Ok(())
}
