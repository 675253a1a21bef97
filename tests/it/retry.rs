//! Issue 21 §5: a charge always ends in an answer, and retries are safe.
//!
//! PostgreSQL is reached through a proxy that, when armed, lets the next
//! `COMMIT` through, waits until PostgreSQL has answered it — the step is
//! durable, its charge stands — and then cuts the connection instead of
//! relaying the answer. pacpriv cannot tell whether its step committed:
//! it withholds the answer with `UNAVAILABLE`, ErrorInfo
//! `STORE_UNAVAILABLE`, `charged = "true"`. A real grpcio client with a
//! retry policy (service config) then retries by itself and must receive
//! the answer the charge paid for, charged once.

use crate::util::pg_proxy::PgProxy;
use crate::util::{Postgres, Process, budget, client, digit, image, interop_python, predict, refusal, small_demo};
use pacpriv_service::proto::pacpriv::PredictResponse;
use pacpriv_service::session::cache::{AnswerCache, CacheKey, Lookup, QueryDigest};
use pacpriv_store::CacheProbe;
use pacpriv_store::{PgLink, PgStore};
use prost::Message;
use tonic::Code;
use tonic_types::StatusExt;

/// The cache key of `pixels` asked of the default model's version 1,
/// whose stored identity is `identity`.
fn key_of(pixels: &[f32], identity: &str) -> QueryDigest {
    QueryDigest::of(&pixels.iter().map(|&x| f64::from(x)).collect::<Vec<_>>()).of_identity("private", "1", identity)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_withheld_answer_is_retried_to_the_same_answer_with_one_charge() {
    let pg = Postgres::start();
    let cutter = PgProxy::start(&pg.url);
    let env = small_demo(&[
        ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
        ("PACPRIV__STORE__POSTGRES_URL", cutter.url.clone()),
        ("PACPRIV__PRIVACY__POLICY", "paper".to_owned()),
    ]);
    let server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("warm-up", &digit(0))).await.expect("answered");

    // A client without retries sees the withheld answer as UNAVAILABLE,
    // STORE_UNAVAILABLE, charged = "true" ...
    cutter.arm();
    let first = predict(&mut c, "alice-key", image("q1", &digit(1))).await.expect_err("the commit was cut");
    assert_eq!(cutter.cuts(), 1);
    assert_eq!(first.code(), Code::Unavailable, "{first:?}");
    let info = first.get_error_details().error_info().cloned().expect("ErrorInfo");
    assert_eq!((info.reason.as_str(), info.domain.as_str()), ("STORE_UNAVAILABLE", "pacpriv"));
    assert_eq!(info.metadata.get("charged").map(String::as_str), Some("true"), "{info:?}");
    assert!(first.message().contains("retry the same query"), "{}", first.message());
    // Issue 40 §7: the client learns the failure's kind, not where the
    // database is; the operator's log has the detail.
    let place = cutter.url.split('@').nth(1).and_then(|p| p.split('/').next()).expect("host:port");
    assert!(!first.message().contains(place) && !first.message().contains("127.0.0.1"), "{}", first.message());
    assert_eq!(budget(&mut c, "alice-key").await.charged, 2, "the cut step committed: its charge stands");
    // ... and asking again gets the answer that charge paid for, free.
    let again = predict(&mut c, "alice-key", image("q1", &digit(1))).await.expect("answered on retry");
    assert!(again.cached && again.mi_charged == 0.0, "{again:?}");
    assert_eq!(budget(&mut c, "alice-key").await.charged, 2);

    // A real grpcio client with a retry policy does the same by itself.
    cutter.arm();
    let request = hex_of(image("q2", &digit(2)));
    let out = std::process::Command::new(interop_python())
        .args([concat!(env!("CARGO_MANIFEST_DIR"), "/tests/retry_client.py"), &server.addr, "alice-key", &request])
        .output()
        .expect("python runs");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("retry_client.py: {e}\n{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(cutter.cuts(), 2, "the grpcio client's first attempt was cut after its COMMIT");
    assert_eq!(doc["ok"], true, "{doc}");
    let hex = doc["response"].as_str().expect("response bytes");
    let bytes: Vec<u8> =
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
    let answer = PredictResponse::decode(bytes.as_slice()).expect("a PredictResponse");
    assert!(answer.cached && answer.mi_charged == 0.0, "the retry received the stored answer: {answer:?}");
    let account = budget(&mut c, "alice-key").await;
    assert_eq!((account.charged, account.answered), (3, 3), "one charge per query, none for the retries");

    // The answer received is the one recorded with the charge.
    let store = PgStore::connect(&pg.url, &PgLink::plain(1)).await.expect("connects");
    let (admin, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls).await.expect("psql");
    tokio::spawn(connection);
    let identity: String = admin
        .query_one("SELECT teachers FROM pacpriv_model_versions WHERE model = 'private' AND version = '1'", &[])
        .await
        .expect("version 1's identity")
        .get(0);
    let q2: CacheKey = key_of(&digit(2), &identity).into();
    let (record, rows) = store.load_probed("alice", &[CacheProbe::from(&q2)]).await.expect("load");
    let record = record.expect("alice's session");
    assert_eq!(record.version, 3, "three steps: warm-up, q1, q2");
    let cache = AnswerCache::from_rows(&record.cache_owners, rows).expect("alice's answer cache");
    match cache.lookup(&q2) {
        Lookup::Hit(kept) => assert_eq!(kept.label, answer.label as usize),
        other => panic!("q2's answer is not kept with the session: {other:?}"),
    }
}

/// Issue 41: on a strict synchronous primary whose standbys are gone, a
/// COMMIT waits for a confirmation that does not come. The step is bounded
/// by `store.postgres_timeout_ms` all the same: the answer is withheld
/// (`charged = "true"`: the COMMIT may yet land), a next query of the same
/// session — blocked by the waiting COMMIT's row lock — is refused with
/// nothing charged instead of hanging, and once a standby confirms (here:
/// the requirement lifted) the retry receives the answer that charge paid
/// for, charged once.
#[tokio::test(flavor = "multi_thread")]
async fn a_commit_no_standby_confirms_is_withheld_then_retrieved_once() {
    let pg = Postgres::start();
    let env = small_demo(&[
        ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
        ("PACPRIV__STORE__POSTGRES_URL", pg.url.clone()),
        ("PACPRIV__STORE__POSTGRES_TIMEOUT_MS", "1000".to_owned()),
        ("PACPRIV__PRIVACY__POLICY", "paper".to_owned()),
    ]);
    let server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("warm-up", &digit(0))).await.expect("answered");

    let (admin, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls).await.expect("psql");
    tokio::spawn(connection);
    require_standbys(&admin, &pg.url, "gone_standby").await;

    let first = predict(&mut c, "alice-key", image("q1", &digit(1))).await.expect_err("no standby confirms");
    assert_eq!(refusal(&first), (Code::Unavailable, "STORE_UNAVAILABLE".into(), Some("true".into())), "{first:?}");
    let second = predict(&mut c, "alice-key", image("q2", &digit(2))).await.expect_err("the row is locked");
    assert_eq!(refusal(&second), (Code::Unavailable, "STORE_UNAVAILABLE".into(), Some("false".into())), "{second:?}");

    require_standbys(&admin, &pg.url, "").await;
    // The waiting COMMIT completes: q1's charge stands, q2's never began.
    let mut account = budget(&mut c, "alice-key").await;
    for _ in 0..100 {
        if account.charged == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        account = budget(&mut c, "alice-key").await;
    }
    assert_eq!(account.charged, 2, "warm-up and q1: the COMMIT that waited landed");
    let again = predict(&mut c, "alice-key", image("q1", &digit(1))).await.expect("answered on retry");
    assert!(again.cached && again.mi_charged == 0.0, "the retry receives the answer q1's charge paid for: {again:?}");
    let q2 = predict(&mut c, "alice-key", image("q2", &digit(2))).await.expect("answered on retry");
    assert!(!q2.cached && q2.mi_charged > 0.0, "q2 was never charged: answered afresh {q2:?}");
    assert_eq!(budget(&mut c, "alice-key").await.charged, 3, "one charge per query");
}

/// Issue 53 §1: PostgreSQL may end a synchronous COMMIT's wait early — a
/// cancel, as `statement_timeout`, `pg_cancel_backend` or an operator
/// does — and commit on the primary alone, saying so only with a WARNING;
/// and a role's `synchronous_commit = local` would make it not wait at
/// all. Neither the answer whose COMMIT's wait was cancelled nor its
/// cached copy on a retry leaves before a standby has the step: both are
/// withheld (the retry's own COMMIT waits, and is cancelled too), and
/// once a standby confirms (here: the requirement lifted) the retry
/// receives the answer, charged once.
#[tokio::test(flavor = "multi_thread")]
async fn no_answer_leaves_before_a_standby_has_its_charge_even_when_the_wait_is_cancelled() {
    let pg = Postgres::start();
    let (admin, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls).await.expect("psql");
    tokio::spawn(connection);
    // What a role's default must not undo: pacpriv pins its own.
    admin.batch_execute("ALTER ROLE CURRENT_USER SET synchronous_commit = 'local'").await.expect("ALTER ROLE");
    let env = small_demo(&[
        ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
        ("PACPRIV__STORE__POSTGRES_URL", pg.url.clone()),
        ("PACPRIV__STORE__POSTGRES_TIMEOUT_MS", "20000".to_owned()),
        ("PACPRIV__PRIVACY__POLICY", "paper".to_owned()),
    ]);
    let server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("warm-up", &digit(0))).await.expect("answered");
    require_standbys(&admin, &pg.url, "gone_standby").await;

    let withheld = |e: &tonic::Status| {
        let (code, reason, _) = refusal(e);
        (code, reason)
    };
    let unavailable = (Code::Unavailable, "STORE_UNAVAILABLE".to_owned());
    // q1's COMMIT waits for the standby; its wait is cancelled.
    let asked = tokio::spawn({
        let mut c = c.clone();
        async move { predict(&mut c, "alice-key", image("q1", &digit(1))).await }
    });
    assert!(cancel_standby_wait(&admin, &asked).await, "q1's COMMIT did not wait for the standby");
    let first = asked.await.expect("joins").expect_err("committed on the primary alone: withheld");
    assert_eq!(withheld(&first), unavailable, "{first:?}");
    assert_eq!(budget(&mut c, "alice-key").await.charged, 2, "q1's charge is on the primary");

    // The retry finds q1's answer cached: it waits for the standby too.
    let asked = tokio::spawn({
        let mut c = c.clone();
        async move { predict(&mut c, "alice-key", image("q1", &digit(1))).await }
    });
    assert!(
        cancel_standby_wait(&admin, &asked).await,
        "the cached answer was released without waiting for the standby"
    );
    let retried = asked.await.expect("joins").expect_err("not confirmed: withheld");
    assert_eq!(withheld(&retried), unavailable, "{retried:?}");

    require_standbys(&admin, &pg.url, "").await;
    let again = predict(&mut c, "alice-key", image("q1", &digit(1))).await.expect("answered once confirmed");
    assert!(again.cached && again.mi_charged == 0.0, "the answer q1's charge paid for: {again:?}");
    assert_eq!(budget(&mut c, "alice-key").await.charged, 2, "one charge for q1");
}

/// Cancels the backends waiting for a synchronous standby once `asked`
/// has one waiting; false if `asked` finished first.
async fn cancel_standby_wait<T>(admin: &tokio_postgres::Client, asked: &tokio::task::JoinHandle<T>) -> bool {
    const CANCEL: &str =
        "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'";
    for _ in 0..400 {
        if asked.is_finished() {
            return false;
        }
        let cancelled: i64 = admin.query_one(CANCEL, &[]).await.expect("pg_cancel_backend").get(0);
        if cancelled > 0 {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    false
}

/// Sets `synchronous_standby_names` to `names` and waits until new
/// sessions see it (the server reloads on a signal).
async fn require_standbys(admin: &tokio_postgres::Client, url: &str, names: &str) {
    admin
        .batch_execute(&format!("ALTER SYSTEM SET synchronous_standby_names = '{names}'"))
        .await
        .expect("ALTER SYSTEM");
    admin.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
    loop {
        let (fresh, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connects");
        tokio::spawn(connection);
        let row = fresh.query_one("SHOW synchronous_standby_names", &[]).await.expect("SHOW");
        if row.get::<_, String>(0) == names {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `request` serialized as hex, for the Python client (which sends the key
/// as metadata itself).
fn hex_of(request: pacpriv_service::proto::pacpriv::PredictRequest) -> String {
    request.encode_to_vec().iter().map(|b| format!("{b:02x}")).collect()
}
