//! Two `pacpriv serve` replicas on one PostgreSQL, one principal's queries
//! spread over both: every answer is one step of one shared session, so the
//! total charge equals the answers and the posterior equals the replay.

use crate::util::{Postgres, Process, client, distinct, image, predict, replay};
use pacpriv_store::{PgLink, PgStore};

const M: usize = 16;
const QUERIES: usize = 60;

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_share_one_session_without_double_or_lost_charges() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("teachers.toml");
    let _teachers = Process::teachers(M, 1, &cfg);
    let env = vec![
        ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
        ("PACPRIV__STORE__POSTGRES_URL", pg.url.clone()),
        ("PACPRIV__STORE__JOURNAL", "true".to_owned()),
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8".to_owned()),
        ("PACPRIV__PRINCIPALS__DEMO__BUDGET_MI", "1".to_owned()),
    ];
    // Started together on the empty database, as a Deployment's replicas
    // are: one writes the dataset's record, both claim the model's identity.
    let program = std::path::Path::new(env!("CARGO_BIN_EXE_pacpriv"));
    let mut replicas =
        [Process::serve_unready(program, Some(&cfg), &env), Process::serve_unready(program, Some(&cfg), &env)];
    for replica in &mut replicas {
        replica.wait_ready();
    }
    let clients = [client(&replicas[0].addr).await, client(&replicas[1].addr).await];

    let mut calls = tokio::task::JoinSet::new();
    for n in 0..QUERIES {
        let mut c = clients[n % 2].clone();
        let pixels = distinct((0..64).map(|j| ((n * 11 + j * 3) % 17) as f32).collect(), n as u32);
        calls.spawn(async move { predict(&mut c, "demo-key", image(&format!("q{n}"), &pixels)).await });
    }
    let mut answered = 0;
    while let Some(r) = calls.join_next().await {
        r.expect("task").expect("answered by a replica");
        answered += 1;
    }
    assert_eq!(answered, QUERIES);

    let store = PgStore::connect(&pg.url, &PgLink::plain(2)).await.expect("connects");
    let record = store.load("demo").await.expect("load").expect("the session exists");
    let journal = store.journal("demo").await.expect("journal");
    assert_eq!(record.version as usize, QUERIES, "one version per answer, none applied twice");
    assert_eq!(journal.len(), QUERIES);
    assert_eq!(record.spent, QUERIES as f64 / 256.0, "total charge equals answers");
    assert_eq!(replay(M, &journal), record.posterior, "posterior equals replaying the answers");
    // A database this release created keys every version by its identity
    // (issue 68 §3), however the replicas' starts interleaved.
    let (sql, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls).await.expect("psql");
    tokio::spawn(connection);
    let rows = sql.query("SELECT model, version, legacy_key FROM pacpriv_model_versions", &[]).await.expect("rows");
    let claimed: Vec<(String, String, Option<String>)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert_eq!(claimed, [("private".to_owned(), "1".to_owned(), None)], "one claim, keyed by its identity");
    // Both replicas report the same account.
    for c in &clients {
        let b = crate::util::budget(&mut c.clone(), "demo-key").await;
        assert_eq!(b.answered as usize, QUERIES);
    }
}

/// Issue 22 §3: a Predict on PostgreSQL reads its session row once before
/// the charge (the preflight: cached? can the budget pay?) and once more
/// inside the step's transaction, under the row lock — not three times
/// before it. Counted on the wire, by a proxy in front of PostgreSQL.
#[tokio::test(flavor = "multi_thread")]
async fn a_predict_on_postgres_reads_its_session_once_before_the_charge() {
    use crate::util::pg_proxy::PgProxy;
    use crate::util::{digit, small_demo};
    let pg = Postgres::start();
    let proxy = PgProxy::start(&pg.url);
    let env = small_demo(&[
        ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
        ("PACPRIV__STORE__POSTGRES_URL", proxy.url.clone()),
    ]);
    let server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("warm-up", &digit(0))).await.expect("answered");
    for (n, seed) in [(1, 1), (2, 2), (3, 1)] {
        let before = proxy.session_reads();
        let answer = predict(&mut c, "alice-key", image(&format!("q{n}"), &digit(seed))).await.expect("answered");
        assert_eq!(answer.cached, n == 3, "q3 repeats q1");
        assert_eq!(proxy.session_reads() - before, 2, "q{n}: one preflight read, one locked read");
    }
}

/// Issue 67 §5: every transaction that writes — a step's charge, the
/// secret, provisioning, an admin's create and revoke — sets
/// `synchronous_commit = on` for itself (`SET LOCAL`), so a pooler that
/// shares server connections between clients (PgBouncer's transaction
/// pooling) cannot leak another client's `off` into it. Seen on the wire.
#[tokio::test(flavor = "multi_thread")]
async fn every_writing_transaction_on_postgres_sets_synchronous_commit_itself() {
    use crate::util::pg_proxy::PgProxy;
    use crate::util::{ADMIN_TOKEN, admin_client, bearer, digit, key_hash, small_demo};
    use pacpriv_service::proto::pacpriv::{CreatePrincipalRequest, RevokePrincipalRequest};
    let pg = Postgres::start();
    let proxy = PgProxy::start(&pg.url);
    let env = small_demo(&[
        ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
        ("PACPRIV__STORE__POSTGRES_URL", proxy.url.clone()),
        ("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN)),
    ]);
    let server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    for n in 0..3 {
        predict(&mut c, "alice-key", image(&format!("q{n}"), &digit(n))).await.expect("answered");
    }
    let mut admin = admin_client(&server.listener("admin")).await;
    let create = CreatePrincipalRequest { name: "erin".into(), budget_mi: "1".into(), ..Default::default() };
    admin.create_principal(bearer(create, ADMIN_TOKEN)).await.expect("created");
    admin.revoke_principal(bearer(RevokePrincipalRequest { name: "erin".into() }, ADMIN_TOKEN)).await.expect("revoked");
    let (guarded, unguarded) = proxy.writing_commits();
    assert_eq!(
        unguarded, 0,
        "{unguarded} writing transactions relied on the connection's setting ({guarded} set their own)"
    );
    assert!(guarded >= 3 + 2, "three steps, a create and a revoke at least: {guarded}");
}
