//! The store conformance suite: the same behaviour checked against the
//! embedded store and a real PostgreSQL, through the session layer the
//! service uses.

use crate::util::{Postgres, Process, budget, client, digit, image, predict, replay, small_demo};
use pacpriv_privacy::Nats;
use pacpriv_privacy::ledger::Policy;
use pacpriv_privacy::mechanism::{SecretIndex, TeacherOutputs};
use pacpriv_privacy::posterior::Form;
use pacpriv_service::session::cache::{CacheSettings, OnEvicted, QueryDigest};
use pacpriv_service::session::{
    Asking, Caller, Credential, DatasetTerms, Handle, ModelTag, Preflight, PrincipalConfig, Scope, SessionError,
    SessionParams, Sessions,
};
use pacpriv_store::{
    DEFAULT_DATASET, EmbeddedStore, LegacyKey, Meta, Origin, PgLink, PgStore, PgTls, PrincipalRecord, SslMode, Store,
    StoreError, VersionIdentity,
};
use sha2::{Digest, Sha256};
use std::sync::Arc;

const M: usize = 8;
const B: f64 = 1.0 / 256.0;

fn principals() -> Vec<PrincipalConfig> {
    ["alice", "bob"]
        .iter()
        .map(|name| PrincipalConfig {
            name: (*name).into(),
            key_sha256: Sha256::digest(format!("{name}-key").as_bytes()).into(),
            budget: Nats::new(40.0 * B).expect("budget"),
            dataset_budgets: Default::default(),
        })
        .collect()
}

async fn sessions(store: &Store) -> Sessions {
    let params = SessionParams {
        per_query: Nats::new(B).expect("b"),
        policy: Policy::Paper,
        m: M,
        secret: SecretIndex::new(3, M).expect("secret"),
        noise: pacpriv_privacy::keyed::NoiseKey::from_bytes([3; 32]),
        journal: true,
        cache: CacheSettings { capacity: 4, on_evicted: OnEvicted::Refuse },
        calibration: Default::default(),
    };
    let dataset = |name: &str, secret: usize| DatasetTerms {
        name: name.into(),
        scope: Scope::PerPrincipal,
        global_budget: Nats::new(1.0).expect("global"),
        params: SessionParams { secret: SecretIndex::new(secret, M).expect("secret"), ..params }.into(),
    };
    let datasets = vec![dataset(DEFAULT_DATASET, 3), dataset("other", 5)];
    Sessions::new(&principals(), datasets, store).await.expect("sessions")
}

/// The caller's handle on its session in the default dataset.
fn default(caller: Caller) -> Handle {
    caller.on(0).expect("the default dataset").clone()
}

/// Teachers that disagree in a pattern depending on `n`.
fn outputs(n: usize) -> TeacherOutputs {
    TeacherOutputs::Labels { labels: (0..M).map(|i| (i * n + i / 3) % 3).collect(), classes: 3 }
}

/// The whole suite against one store; `reopen` gives a new handle on the
/// same data (a restart).
async fn conformance(store: Store, reopen: impl AsyncFn() -> Store) {
    // Meta: absent, then written once; the first writer wins.
    assert_eq!(store.meta(DEFAULT_DATASET).await.expect("meta"), None);
    let first = Meta { secret: 3, teachers: "suite m=8".into() };
    assert_eq!(store.init_meta(DEFAULT_DATASET, &first).await.expect("init"), first);
    let second = Meta { secret: 5, teachers: "suite m=8".into() };
    assert_eq!(
        store.init_meta(DEFAULT_DATASET, &second).await.expect("init again"),
        first,
        "the stored index never changes"
    );
    // Another dataset's record is its own.
    assert_eq!(store.meta("other").await.expect("meta"), None);
    // The old store gets its noise key at its first start under this
    // release, and keeps it (the first writer's).
    assert_eq!(store.init_noise_key(DEFAULT_DATASET, &[1; 32]).await.expect("a key"), [1; 32]);
    assert_eq!(store.init_noise_key(DEFAULT_DATASET, &[2; 32]).await.expect("the key"), [1; 32]);
    assert_eq!(store.init_meta("other", &second).await.expect("init other"), second);
    assert_eq!(store.meta(DEFAULT_DATASET).await.expect("meta"), Some(first.clone()));
    // A model version's identity: the first claim's, per dataset (kept
    // across a restart: checked below). A dataset written by this release
    // is keyed by identity from its record on (one from an earlier
    // release: `postgres_schema_changes_go_through_numbered_migrations`).
    assert!(store.identity_keyed("other").await.expect("marked"), "written with its record");
    assert!(!store.identity_keyed("third").await.expect("no record"));
    let one = VersionIdentity { teachers: "aaaa".into(), legacy: Some(LegacyKey::InputOnly) };
    let two = VersionIdentity { teachers: "bbbb".into(), legacy: Some(LegacyKey::NameAndVersion) };
    let other = VersionIdentity { teachers: "cccc".into(), legacy: None };
    assert_eq!(store.claim_version(DEFAULT_DATASET, "private", "1", &one).await.expect("claim"), one);
    assert_eq!(store.claim_version(DEFAULT_DATASET, "private", "1", &other).await.expect("claimed"), one);
    assert_eq!(store.claim_version(DEFAULT_DATASET, "private", "2", &two).await.expect("claim"), two);
    assert_eq!(store.claim_version(DEFAULT_DATASET, "private", "3", &other).await.expect("claim"), other);
    assert_eq!(store.claim_version("other", "private", "1", &other).await.expect("claim"), other);

    // 20 concurrent answers on one session: each is one version, charged once.
    let s = Arc::new(sessions(&store).await);
    let mut steps = tokio::task::JoinSet::new();
    for n in 0..20 {
        let alice = s.authenticate(Credential::ApiKey("alice-key")).await.map(default).expect("alice");
        steps.spawn(async move { alice.answer(outputs(n), None, format!("q{n}")).await });
    }
    while let Some(r) = steps.join_next().await {
        r.expect("task").expect("answered");
    }
    let alice = s.authenticate(Credential::ApiKey("alice-key")).await.map(default).expect("alice");
    let view = alice.budget().await.expect("budget");
    assert_eq!((view.answered, view.charged, view.spent), (20, 20, 20.0 * B));

    // A refusal changes nothing: exhaust the remaining 20 answers, then one more.
    for n in 20..40 {
        alice.answer(outputs(n), None, format!("q{n}")).await.expect("fits");
    }
    assert!(matches!(
        alice.preflight(&[QueryDigest::of(&[-1.0]).into()], Some("q")).await,
        Err(SessionError::Exhausted { .. })
    ));
    assert!(matches!(alice.answer(outputs(41), None, "q41".into()).await, Err(SessionError::Exhausted { .. })));
    // Another dataset is another secret, with its own session: her spent
    // budget in the default dataset leaves her answered there.
    {
        let caller = s.authenticate(Credential::ApiKey("alice-key")).await.expect("alice");
        let elsewhere = caller.on(1).expect("the other dataset");
        assert_eq!((elsewhere.dataset(), elsewhere.session_name()), ("other", "other/alice"));
        elsewhere.answer(outputs(7), None, "o1".into()).await.expect("the other dataset answers");
    }

    // A restart resumes; the journal replays the stored posterior exactly.
    drop((alice, s, store));
    let store = reopen().await;
    assert_eq!(store.claim_version(DEFAULT_DATASET, "private", "1", &other).await.expect("claimed"), one);
    let s = sessions(&store).await;
    let alice = s.authenticate(Credential::ApiKey("alice-key")).await.map(default).expect("alice");
    assert_eq!(alice.budget().await.expect("budget").answered, 40);
    assert_eq!(
        s.authenticate(Credential::ApiKey("bob-key"))
            .await
            .map(default)
            .expect("bob")
            .budget()
            .await
            .expect("bob")
            .answered,
        0
    );
    let record = store.load("alice").await.expect("load").expect("alice has a record");
    let journal = store.journal("alice").await.expect("journal");
    assert_eq!(journal.iter().map(|j| j.version).collect::<Vec<_>>(), (1..=40).collect::<Vec<_>>());
    assert_eq!(replay(M, &journal), record.posterior);
    assert_eq!(journal.iter().map(|j| j.charge).sum::<f64>(), record.spent);
    let other = store.load("other/alice").await.expect("load").expect("her other session has a record");
    let other_journal = store.journal("other/alice").await.expect("journal");
    assert_eq!((other.version, other_journal.len()), (1, 1), "one step in the other dataset, kept apart");
    assert_eq!(replay(M, &other_journal), other.posterior);

    // The answer cache is durable session state: a repeat is answered from
    // it (no charge, no new version) before and after a restart.
    let keyed = || Asking {
        alpha: Some(0.1),
        query_id: "cached".into(),
        key: Some(QueryDigest::of(&[1.0, 2.0]).into()),
        return_noisy: true,
        model: ModelTag { name: "private".into(), version: "1".into() },
    };
    let bob = s.authenticate(Credential::ApiKey("bob-key")).await.map(default).expect("bob");
    let (first, _) =
        bob.begin(vec![(Some(outputs(3)), keyed())], Vec::new()).await.expect("step").release().await.expect("fresh");
    let first = &first[0];
    assert!(!first.cached);
    let (again, view) =
        bob.begin(vec![(None, keyed())], Vec::new()).await.expect("step").release().await.expect("cached");
    let again = &again[0];
    assert!(again.cached && again.charge.get() == 0.0 && again.label == first.label);
    assert_eq!((again.published.clone(), view.answered), (first.published.clone(), 1));
    drop((alice, bob, s, store));
    let store = reopen().await;
    let s = sessions(&store).await;
    let bob = s.authenticate(Credential::ApiKey("bob-key")).await.map(default).expect("bob");
    assert_eq!(
        bob.preflight(&[QueryDigest::of(&[1.0, 2.0]).into()], Some("q")).await.expect("preflight"),
        [Preflight::Known]
    );
    let (after, view) =
        bob.begin(vec![(None, keyed())], Vec::new()).await.expect("step").release().await.expect("cached");
    assert_eq!((&after[0], view.answered), (again, 1));
    assert_eq!(store.load("bob").await.expect("load").expect("record").version, 1, "a hit writes no step");

    // Eviction is FIFO per principal and durable (capacity 4, refuse): six
    // more queries evict [1, 2] and the first two of them; after a restart
    // those are refused and the newest four answered from the cache. In
    // one request or alone, the rows move with the step that moved them.
    let key = |n: usize| QueryDigest::of(&[100.0 + n as f64]).into();
    let asking = |n: usize| Asking { key: Some(key(n)), ..Asking::uncached(None, format!("e{n}")) };
    let mut labels = Vec::new();
    bob.begin(vec![(Some(outputs(0)), asking(0)), (Some(outputs(1)), asking(1))], Vec::new())
        .await
        .expect("two rows")
        .release()
        .await
        .expect("durable")
        .0
        .iter()
        .for_each(|r| labels.push(r.label));
    for n in 2..6 {
        let (r, _) = bob
            .begin(vec![(Some(outputs(n)), asking(n))], Vec::new())
            .await
            .expect("step")
            .release()
            .await
            .expect("ok");
        labels.push(r[0].label);
    }
    drop((bob, s, store));
    let store = reopen().await;
    let s = sessions(&store).await;
    let bob = s.authenticate(Credential::ApiKey("bob-key")).await.map(default).expect("bob");
    assert!(matches!(bob.begin(vec![(None, keyed())], Vec::new()).await, Err(SessionError::EvictedRepeat)));
    for n in 0..2 {
        assert!(
            matches!(bob.begin(vec![(None, asking(n))], Vec::new()).await, Err(SessionError::EvictedRepeat)),
            "e{n}"
        );
    }
    for (n, &label) in labels.iter().enumerate().skip(2) {
        let (r, _) =
            bob.begin(vec![(None, asking(n))], Vec::new()).await.expect("hit").release().await.expect("durable");
        assert!(r[0].cached && r[0].label == label, "e{n}: {:?}", r[0]);
    }
    assert_eq!(bob.budget().await.expect("budget").answered, 7, "six more steps, no hit charged");
    let record = store.load("bob").await.expect("load").expect("record");
    let span: Vec<(u64, u64)> = record.cache_owners.iter().map(|o| (o.oldest, o.next)).collect();
    assert_eq!(span, [(3, 7)], "bob's answers 3..6 are cached, 0..2 evicted");

    // The principal registry: a created principal answers, a revoked one
    // stops at once, and both facts (and the spending) survive a restart.
    let (carol, key) =
        s.create("carol", Nats::new(4.0 * B).expect("budget"), &Default::default()).await.expect("create");
    assert_eq!((carol.datasets[0].budget.limit, carol.datasets[0].budget.spent), (4.0 * B, 0.0));
    let handle = s.authenticate(Credential::ApiKey(&key)).await.map(default).expect("carol");
    handle.answer(outputs(1), None, "c1".into()).await.expect("answered");
    assert!(matches!(
        s.create("carol", Nats::new(1.0).expect("b"), &Default::default()).await,
        Err(SessionError::Registry(_))
    ));
    s.revoke("carol").await.expect("revoke");
    assert!(matches!(s.authenticate(Credential::ApiKey(&key)).await, Err(SessionError::Unauthenticated)));
    drop((bob, handle, s, store));
    let store = reopen().await;
    let s = sessions(&store).await;
    assert!(matches!(s.authenticate(Credential::ApiKey(&key)).await, Err(SessionError::Unauthenticated)));
    let carol = s.inspect("carol").await.expect("inspect");
    assert_eq!(
        (carol.principal.active(), carol.datasets[0].budget.spent, carol.datasets[0].budget.answered),
        (false, B, 1)
    );
    let names: Vec<String> = s.list().await.expect("list").into_iter().map(|a| a.principal.name).collect();
    assert_eq!(names, ["alice", "bob", "carol"]);

    // Bulk provisioning is all or nothing: a key given to two principals of
    // one batch is refused, naming the second, and neither is stored.
    let record = |name: &str, key: &str| PrincipalRecord {
        name: name.into(),
        key_sha256: Sha256::digest(key.as_bytes()).into(),
        budget: 1.0,
        origin: Origin::Config,
        created_unix: 1,
        revoked_unix: None,
        dataset_budgets: Default::default(),
    };
    let batch = [record("dave", "dave-key"), record("erin", "shared-key"), record("frank", "shared-key")];
    assert!(matches!(store.provision_all(&batch).await, Err(StoreError::KeyInUse { name }) if name == "frank"));
    for name in ["dave", "erin", "frank"] {
        assert_eq!(store.principal(name).await.expect("read"), None, "{name} was not stored");
    }
    let stored = store.provision_all(&batch[..2]).await.expect("a consistent batch");
    assert_eq!(stored.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["dave", "erin"]);
    // Re-applied (a restart), config records keep their creation time.
    let again = store
        .provision_all(&[PrincipalRecord { created_unix: 99, ..record("dave", "dave-key-2") }])
        .await
        .expect("update");
    assert_eq!((again[0].created_unix, again[0].key_sha256), (1, Sha256::digest(b"dave-key-2").into()));
    // A configured principal's budgets in other datasets are stored and
    // replaced with the configuration's at the next start.
    let budgets: std::collections::BTreeMap<_, _> = [("census".to_owned(), 0.125), ("other".to_owned(), 0.0)].into();
    let dave = PrincipalRecord { dataset_budgets: budgets.clone(), ..record("dave", "dave-key-2") };
    store.provision_all(std::slice::from_ref(&dave)).await.expect("budgets");
    let stored = store.principal("dave").await.expect("read").expect("dave");
    assert_eq!((&stored.dataset_budgets, stored.budget_in("census"), stored.budget_in("x")), (&budgets, 0.125, 1.0));
    store.provision_all(&[record("dave", "dave-key-2")]).await.expect("budgets dropped");
    assert!(store.principal("dave").await.expect("read").expect("dave").dataset_budgets.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn embedded_store_conforms() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.redb");
    let open = || Store::Embedded(Arc::new(EmbeddedStore::open(&path).expect("opens")));
    conformance(open(), async || open()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_store_conforms() {
    let pg = Postgres::start();
    let open =
        async || Store::Postgres(Arc::new(PgStore::connect(&pg.url, &PgLink::plain(8)).await.expect("connects")));
    conformance(open().await, open).await;
}

/// Replicas starting together on a fresh database provision the same
/// configured principals at once; every one of them starts (none takes the
/// others' insert of a principal for another principal holding its key).
#[tokio::test(flavor = "multi_thread")]
async fn replicas_provisioning_the_same_principals_at_once_all_start() {
    let pg = Postgres::start();
    let mut replicas = Vec::new();
    for _ in 0..4 {
        replicas.push(Arc::new(PgStore::connect(&pg.url, &PgLink::plain(2)).await.expect("connects")));
    }
    for round in 0..25 {
        let records: Vec<PrincipalRecord> = ["a", "b", "c"]
            .iter()
            .map(|p| {
                let name = format!("r{round}-{p}");
                PrincipalRecord {
                    key_sha256: Sha256::digest(format!("{name}-key").as_bytes()).into(),
                    name,
                    budget: 1.0,
                    origin: Origin::Config,
                    created_unix: 1,
                    revoked_unix: None,
                    dataset_budgets: Default::default(),
                }
            })
            .collect();
        let mut starting = tokio::task::JoinSet::new();
        for store in &replicas {
            let (store, records) = (Arc::clone(store), records.clone());
            starting.spawn(async move { store.provision_all(&records).await });
        }
        for provisioned in starting.join_all().await {
            let names: Vec<String> =
                provisioned.expect("every replica provisions").into_iter().map(|p| p.name).collect();
            assert_eq!(names, records.iter().map(|p| p.name.clone()).collect::<Vec<_>>(), "round {round}");
        }
    }
}

/// The schema goes through numbered migrations recorded in the database:
/// a database an earlier release created (tables, no migrations table,
/// format-1 records) is recorded at migration 1 and read without loss;
/// replicas starting together apply each migration once; a database
/// migrated by a newer release is refused with a message that says so.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_schema_changes_go_through_numbered_migrations() {
    let pg = Postgres::start();
    let (client, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls).await.expect("connects");
    tokio::spawn(connection);
    // What releases before numbered migrations created, and a record of
    // the format they wrote (tests/fixtures/store-format-1/).
    client
        .batch_execute(
            "CREATE TABLE pacpriv_meta (id INT PRIMARY KEY CHECK (id = 1), secret BIGINT NOT NULL, teachers TEXT NOT NULL);
             INSERT INTO pacpriv_meta VALUES (1, 2, 'demo digits seed=1 m=4');
             CREATE TABLE pacpriv_sessions (session TEXT PRIMARY KEY, version BIGINT NOT NULL, record BYTEA NOT NULL);
             CREATE TABLE pacpriv_journal (session TEXT NOT NULL, version BIGINT NOT NULL, entry BYTEA NOT NULL,
                                           PRIMARY KEY (session, version));",
        )
        .await
        .expect("old schema");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-format-1");
    let old = std::fs::read(dir.join("session-alice.bin")).expect("fixture");
    let old_entry = std::fs::read(dir.join("journal-alice-1.bin")).expect("fixture");
    client.execute("INSERT INTO pacpriv_sessions VALUES ('alice', 3, $1)", &[&old]).await.expect("old record");
    client
        .execute("INSERT INTO pacpriv_journal VALUES ('alice', 1, $1)", &[&old_entry])
        .await
        .expect("old journal entry");

    // Four replicas start at once.
    let mut starting = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let url = pg.url.clone();
        starting.spawn(async move { PgStore::connect(&url, &PgLink::plain(2)).await });
    }
    let replicas = starting.join_all().await;
    let store = replicas.into_iter().map(|r| r.expect("every replica starts")).next().expect("a replica");
    let rows = client
        .query("SELECT version, description FROM pacpriv_schema_migrations ORDER BY version", &[])
        .await
        .expect("migrations recorded");
    let applied: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let expected = [
        (1, "meta, sessions, journal and principals"),
        (2, "journal events (cache hits and refusals)"),
        (3, "answer cache in its own tables"),
        (4, "datasets besides the default one: each its secret index and teacher set"),
        (5, "principals' budgets in datasets other than the default one"),
        (6, "each dataset's noise key (committed noise, issue 66)"),
        (7, "each model version's identity (its teachers' digest) per dataset"),
    ];
    let expected: Vec<(i32, String)> = expected.iter().map(|&(v, d)| (v, d.to_owned())).collect();
    assert_eq!(applied, expected, "each migration once");
    assert!(store.principals().await.expect("the missing tables were created").is_empty());
    // Its secret is the default dataset's; no other dataset has one yet.
    let meta = store.meta(DEFAULT_DATASET).await.expect("meta");
    assert_eq!(meta, Some(Meta { secret: 2, teachers: "demo digits seed=1 m=4".into() }));
    assert_eq!(store.meta("other").await.expect("meta"), None);
    // Its dataset predates stored identities until marked.
    assert!(!store.identity_keyed(DEFAULT_DATASET).await.expect("read"), "an earlier release's dataset");
    store.mark_identity_keyed(DEFAULT_DATASET).await.expect("marked");
    assert!(store.identity_keyed(DEFAULT_DATASET).await.expect("read"));

    let record = store.load("alice").await.expect("load").expect("the old record");
    assert_eq!((record.version, record.answered, record.charged), (3, 3, 2));
    assert_eq!(record.posterior.values()[..3], [-0.5, -1e250, 0.0]);
    assert!(record.cache.is_some_and(|c| c.entries.len() == 2 && c.evicted.len() == 1));
    let journal = store.journal("alice").await.expect("journal");
    assert_eq!((journal[0].version, journal[0].query_id.as_str()), (1, "q1"));

    // A newer release migrated this database further: refuse, say why.
    client
        .execute("INSERT INTO pacpriv_schema_migrations (version, description) VALUES (99, 'future')", &[])
        .await
        .expect("future migration");
    let refused =
        PgStore::connect(&pg.url, &PgLink::plain(1)).await.err().expect("a newer schema is refused").to_string();
    let known = format!("migration 99, newer than this release knows ({})", pacpriv_store::postgres::SCHEMA_VERSION);
    assert!(refused.contains(&known), "{refused}");
}

/// Issue 23 §4: TLS to PostgreSQL with libpq's sslmodes, against a real
/// server with `ssl = on` that refuses plaintext and whose certificate
/// names `localhost` only.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_over_tls_verifies_what_the_sslmode_says() {
    let (ca, cert, key) = crate::util::certificate::server_certificate(&["localhost"]);
    let (other_ca, _, _) = crate::util::certificate::server_certificate(&["localhost"]);
    let pg = Postgres::start_tls(&cert, &key);
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca_file, other_file) = (dir.path().join("ca.pem"), dir.path().join("other.pem"));
    std::fs::write(&ca_file, ca).expect("CA written");
    std::fs::write(&other_file, other_ca).expect("CA written");
    let by_ip = pg.url.clone();
    let by_name = pg.url.replace("@127.0.0.1:", "@localhost:");
    let tls = |mode, root: &std::path::Path| PgTls { mode, root_cert: Some(root.to_owned()) };
    let connect = async |url: &str, tls: PgTls| {
        PgStore::connect(url, &PgLink { tls, ..PgLink::plain(1) }).await.map(|_| ()).map_err(|e| e.to_string())
    };

    // Plaintext is refused by this server: TLS below is real.
    assert!(connect(&by_ip, PgTls::DISABLE).await.is_err());
    // require: encrypted, nothing verified.
    connect(&by_ip, PgTls { mode: SslMode::Require, root_cert: None }).await.expect("require");
    // verify-ca: the chain, whatever the name; another CA is refused.
    connect(&by_ip, tls(SslMode::VerifyCa, &ca_file)).await.expect("verify-ca");
    let e = connect(&by_ip, tls(SslMode::VerifyCa, &other_file)).await.expect_err("an unknown CA");
    assert!(e.contains("store.postgres_sslmode = verify-ca") && e.contains("invalid peer certificate"), "{e}");
    // verify-full: the name too.
    connect(&by_name, tls(SslMode::VerifyFull, &ca_file)).await.expect("verify-full by the certificate's name");
    let e = connect(&by_ip, tls(SslMode::VerifyFull, &ca_file)).await.expect_err("127.0.0.1 is not localhost");
    assert!(e.contains("store.postgres_sslmode = verify-full") && e.contains("not valid for name"), "{e}");

    // Issue 40 §6: a URL that asks for TLS is never connected in
    // plaintext because the setting kept its default: refused before any
    // connection, naming both keys; met by the setting, it connects (the
    // setting decides how).
    let asks = format!("{by_ip}?sslmode=require");
    let e = connect(&asks, PgTls::DISABLE).await.expect_err("sslmode=require under disable");
    assert!(e.contains("sslmode=require") && e.contains("store.postgres_sslmode = disable"), "{e}");
    connect(&asks, PgTls { mode: SslMode::Require, root_cert: None }).await.expect("require, as the URL asks");
    let full = format!("{by_name}?sslmode=verify-full");
    connect(&full, tls(SslMode::VerifyFull, &ca_file)).await.expect("a libpq mode tokio-postgres cannot parse");
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_pacpriv"))
        .arg("serve")
        .envs(small_demo(&[
            ("PACPRIV__STORE__BACKEND", "postgres".into()),
            ("PACPRIV__STORE__POSTGRES_URL", asks.clone()),
        ]))
        .output()
        .expect("pacpriv runs");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(64), "{said}");
    assert!(said.contains("store.postgres_url") && said.contains("store.postgres_sslmode = disable"), "{said}");

    // The service itself, configured through the same keys, answers.
    let server = Process::serve(
        None,
        &small_demo(&[
            ("PACPRIV__STORE__BACKEND", "postgres".into()),
            ("PACPRIV__STORE__POSTGRES_URL", by_name.clone()),
            ("PACPRIV__STORE__POSTGRES_SSLMODE", "verify-full".into()),
            ("PACPRIV__STORE__POSTGRES_SSLROOTCERT", ca_file.display().to_string()),
        ]),
    );
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("pg-tls", &digit(1))).await.expect("answered, charged in PostgreSQL over TLS");
    assert_eq!(budget(&mut c, "alice-key").await.answered, 1);
}

/// What a release of format-2 session records wrote (see its README).
fn format_2_fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-format-2")
}

/// Issue 27 §3: a release that kept the answer cache inside the session
/// record (format 2, `tests/fixtures/store-format-2/`) left sessions whose
/// cached answers and remembered evictions must survive the move to their
/// own tables: every cached answer comes back as released, every evicted
/// repeat is still refused, the FIFO goes on from where it was, and after
/// the first write the record keeps no cache and the tables hold it.
async fn format_2_caches_survive(store: Store, reopen: impl AsyncFn() -> Store) {
    // What the old release released, from its own journal.
    let fixtures = format_2_fixtures();
    let copy = tempfile::tempdir().expect("temp dir");
    std::fs::copy(fixtures.join("state.redb"), copy.path().join("state.redb")).expect("copy");
    let old = EmbeddedStore::open(&copy.path().join("state.redb")).expect("the old file opens");
    let mut released = std::collections::HashMap::new();
    for session in ["alice", "*global*"] {
        for entry in old.journal(session).expect("journal") {
            let step = entry.step.expect("journaled in full");
            released.insert((session, step.digest), step.label as usize);
        }
    }
    drop(old);

    let params = SessionParams {
        per_query: Nats::new(B).expect("b"),
        policy: Policy::Paper,
        m: M,
        secret: SecretIndex::new(5, M).expect("secret"),
        noise: pacpriv_privacy::keyed::NoiseKey::from_bytes([5; 32]),
        journal: true,
        cache: CacheSettings { capacity: 2, on_evicted: OnEvicted::Refuse },
        calibration: Default::default(),
    };
    let principals: Vec<PrincipalConfig> = ["alice", "bob"]
        .iter()
        .map(|name| PrincipalConfig {
            name: (*name).into(),
            key_sha256: Sha256::digest(format!("{name}-key").as_bytes()).into(),
            budget: Nats::new(1.0).expect("budget"),
            dataset_budgets: Default::default(),
        })
        .collect();
    let open = async |store: &Store, scope| {
        Sessions::new(
            &principals,
            vec![DatasetTerms::default_dataset(scope, Nats::new(1.0).expect("global"), params)],
            store,
        )
        .await
        .expect("sessions")
    };
    let ask = |x: f64, fresh: bool| Asking {
        alpha: Some(0.1),
        query_id: format!("after-{x}"),
        key: None,
        return_noisy: fresh,
        model: ModelTag::default(),
    };
    // Whose queries, in which session: (scope, session, principal, cached, evicted).
    type Case = (Scope, &'static str, &'static str, &'static [f64], &'static [f64]);
    let cases: [Case; 3] = [
        (Scope::PerPrincipal, "alice", "alice", &[2.0, 3.0], &[0.0, 1.0]),
        (Scope::Global, "*global*", "alice", &[2.0, 3.0], &[0.0, 1.0]),
        (Scope::Global, "*global*", "bob", &[11.0, 12.0], &[10.0]),
    ];
    let check = async |store: &Store, cases: &[Case], new: &[(f64, usize)]| {
        for &(scope, session, who, cached, evicted) in cases {
            let s = open(store, scope).await;
            let h = s.authenticate(Credential::ApiKey(&format!("{who}-key"))).await.map(default).expect(who);
            let key = |x: f64| h.cache_key(QueryDigest::of(&[x]));
            for &x in cached {
                let want = released.get(&(session, key(x).digest.as_bytes().to_vec())).copied();
                let step = h.begin(vec![(None, Asking { key: Some(key(x)), ..ask(x, false) })], Vec::new()).await;
                let got = step.expect("a cached answer").release().await.expect("durable").0[0].clone();
                assert!(got.cached && got.charge.get() == 0.0, "{session} {who} [{x}]: {got:?}");
                assert_eq!(Some(got.label), want, "{session} {who} [{x}]: the label the old release released");
            }
            for &x in evicted {
                let step = h.begin(vec![(None, Asking { key: Some(key(x)), ..ask(x, false) })], Vec::new()).await;
                assert!(matches!(step, Err(SessionError::EvictedRepeat)), "{session} {who} [{x}] is still refused");
            }
            if scope == Scope::PerPrincipal {
                for &(x, label) in new {
                    let step = h.begin(vec![(None, Asking { key: Some(key(x)), ..ask(x, false) })], Vec::new()).await;
                    assert_eq!(step.expect("hit").release().await.expect("durable").0[0].label, label);
                }
            }
        }
    };
    check(&store, &cases, &[]).await;

    // Alice's new query evicts her oldest cached answer ([2.0]), as the
    // old release's FIFO would have; after a restart the move is complete.
    let s = open(&store, Scope::PerPrincipal).await;
    let alice = s.authenticate(Credential::ApiKey("alice-key")).await.map(default).expect("alice");
    let four = alice.cache_key(QueryDigest::of(&[4.0]));
    let (fresh, _) = alice
        .begin(vec![(Some(outputs(4)), Asking { key: Some(four), ..ask(4.0, true) })], Vec::new())
        .await
        .expect("a new query")
        .release()
        .await
        .expect("durable");
    drop((alice, s, store));
    let store = reopen().await;
    let record = store.load("alice").await.expect("load").expect("alice");
    assert!(record.cache.is_none(), "the record keeps no cache once written");
    // The old release's steps (per-subset renormalisation, log form) and
    // the new one (linear form) replay to the stored posterior bit for bit,
    // each by its rule. (The PostgreSQL copy of the fixture holds the records only.)
    if matches!(store, Store::Embedded(_)) {
        let journal = store.journal("alice").await.expect("journal");
        let rules: Vec<u32> = journal.iter().map(|j| j.update_rule).collect();
        assert_eq!(rules, [0, 0, 0, 0, 2], "four old steps, then the new query's");
        assert!(matches!(record.posterior, Form::Linear(_)), "the new step left linear weights");
        assert_eq!(replay(M, &journal), record.posterior);
    }
    assert_eq!(record.cache_owners.len(), 1);
    // Numbers 0 and 1 went to the old record's evictions, 2 and 3 to its
    // entries; [4.0] is number 4 and evicted number 2.
    assert_eq!((record.cache_owners[0].oldest, record.cache_owners[0].next), (3, 5));
    // [2.0] was evicted by [4.0].
    let after = [(Scope::PerPrincipal, "alice", "alice", &[3.0][..], &[0.0, 1.0, 2.0][..]), cases[1], cases[2]];
    check(&store, &after, &[(4.0, fresh[0].label)]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn format_2_caches_move_to_their_tables_without_loss_embedded() {
    let fixtures = format_2_fixtures();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.redb");
    std::fs::copy(fixtures.join("state.redb"), &path).expect("copy");
    let open = || Store::Embedded(Arc::new(EmbeddedStore::open(&path).expect("opens")));
    format_2_caches_survive(open(), async || open()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn format_2_caches_move_to_their_tables_without_loss_postgres() {
    let pg = Postgres::start();
    let open =
        async || Store::Postgres(Arc::new(PgStore::connect(&pg.url, &PgLink::plain(4)).await.expect("connects")));
    let store = open().await;
    let (client, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls).await.expect("connects");
    tokio::spawn(connection);
    let fixtures = format_2_fixtures();
    for (session, file, version) in [("alice", "session-alice.bin", 4i64), ("*global*", "session-global.bin", 7)] {
        let bytes = std::fs::read(fixtures.join(file)).expect("fixture");
        client
            .execute("INSERT INTO pacpriv_sessions VALUES ($1, $2, $3)", &[&session, &version, &bytes])
            .await
            .expect("an old release's row");
    }
    format_2_caches_survive(store, open).await;
    let rows = client
        .query("SELECT session, count(*) FROM pacpriv_answer_cache GROUP BY session ORDER BY session", &[])
        .await
        .expect("rows");
    let counts: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(counts, [("*global*".to_owned(), 4), ("alice".to_owned(), 2)], "each session's answers, in rows");
    let rows = client
        .query("SELECT session, count(*) FROM pacpriv_answer_cache_evicted GROUP BY session ORDER BY session", &[])
        .await
        .expect("rows");
    let counts: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(counts, [("*global*".to_owned(), 3), ("alice".to_owned(), 3)], "each session's evictions, in rows");
}

/// Issue 67 §2 on PostgreSQL: a principal an earlier release let be named
/// `fashion/alice` left a session under that key; a dataset `fashion`
/// added later refuses its first start, naming it, instead of letting its
/// principal `alice` resume another secret's posterior. (The embedded
/// store: `session::secret::test::a_new_dataset_refuses_sessions_already_under_its_prefix`.)
#[tokio::test(flavor = "multi_thread")]
async fn a_new_dataset_refuses_sessions_under_its_prefix_on_postgres() {
    use pacpriv_service::session::secret::{SecretError, establish};
    let pg = Postgres::start();
    let store = Store::Postgres(Arc::new(PgStore::connect(&pg.url, &PgLink::plain(2)).await.expect("connects")));
    establish(&store, DEFAULT_DATASET, None, 8, "t8", None).await.expect("the default dataset");
    let (client, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls).await.expect("connects");
    tokio::spawn(connection);
    client
        .execute("INSERT INTO pacpriv_sessions (session, version, record) VALUES ('fashion/alice', 0, '')", &[])
        .await
        .expect("an earlier release's session");
    match establish(&store, "fashion", None, 8, "f8", None).await {
        Err(e @ SecretError::SessionsUnderPrefix { .. }) => {
            assert!(e.to_string().contains("\"fashion/alice\""), "{e}")
        }
        other => panic!("{:?}", other.map(|s| s.expose())),
    }
    assert!(store.meta("fashion").await.expect("reads").is_none(), "nothing was established");
    establish(&store, "garden", None, 8, "g8", None).await.expect("another name starts");
}
