//! Issue 41: the three replicas on a highly-available PostgreSQL — three
//! nodes under Patroni with synchronous replication and three etcd members
//! (compose.yaml's `ha` profile; deploy/README.md) — under load through:
//! the primary killed (automatic failover), the killed node back (it
//! rejoins as a standby), a planned switchover, the primary cut off from
//! etcd and from its standbys while the replicas still reach it (split
//! brain: it must stop committing), the primary killed while a replica is
//! too, and every standby gone (commits wait: `synchronous_mode_strict`;
//! waits cancelled from outside release nothing either).
//!
//! After every phase the accounts are checked as on one database
//! ([`check::accounts_agree`]), on whichever node is the primary by then:
//! every answer a client received has its charge there, whatever node it
//! was committed on. `PACPRIV_CLUSTER_ROUNDS=N` repeats the phases.

use super::{HEALTHY_WITHIN, LOAD_KEYS, REPLICAS, engine_answers, load_args, rounds, unix_ms};
use crate::check::{self, Counts, Db, Seen};
use crate::compose::{self, Project, run};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const NODES: [&str; 3] = ["pg-1", "pg-2", "pg-3"];
/// The replicas' `store.postgres_url`: every node, by its fixed address
/// on `db` (compose.yaml), the one that accepts writes, one second per
/// host.
fn url(project: &Project) -> String {
    let [a, b, c] = [21, 22, 23].map(|host| project.address("db", host));
    format!(
        "postgres://pacpriv@pg-1,pg-2,pg-3/pacpriv?hostaddr={a},{b},{c}\
         &target_session_attrs=read-write&connect_timeout=1"
    )
}
const PATRONICTL: [&str; 3] = ["patronictl", "-c", "/etc/patroni/patroni.yml"];
/// Cancels every backend waiting for a synchronous standby (as pacpriv's
/// role may its own); returns how many.
const CANCEL_STANDBY_WAITS: &str =
    "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'";
/// How long the cluster may take to have a primary and a synchronous
/// standby again (Patroni's ttl is 10 s; a rejoin may rewind).
const SETTLES_WITHIN: Duration = Duration::from_secs(90);

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// `docker kill` of the primary node.
    KillPrimary,
    /// The node killed before started again: it rejoins as a standby.
    Rejoin,
    /// `patronictl switchover` to the synchronous standby.
    Switchover,
    /// The primary's `dcs` network cut (etcd and the standbys gone, the
    /// replicas still there), healed once another node leads.
    Partition,
    /// The primary and a replica killed together; the replica started
    /// during the failover, the old primary after it.
    Combined,
    /// Both standbys stopped for a while, then started.
    NoStandby,
}

/// One row of the table in docs/assurance/reliability.md.
struct Figures {
    fault: Fault,
    /// Milliseconds from the fault to a new primary's promotion (Patroni's
    /// history), or for NoStandby how long commits had no standby.
    unwritable_ms: Option<u64>,
    counts: Counts,
    /// p99 and maximum latency of the answers to queries in flight during
    /// the fault window (from the fault until the cluster settled).
    p99_ms: u64,
    max_ms: u64,
}

#[test]
fn replicas_on_ha_postgres_survive_failover_switchover_and_split_brain() {
    if !engine_answers() {
        return;
    }
    let turn = compose::one_at_a_time();
    let (dir, mut project) = super::project(&turn);
    build_ha_image();
    project.set("PACPRIV_POSTGRES_URL", &url(&project));
    let mut up = vec!["--profile", "ha", "up", "-d", "etcd-1", "etcd-2", "etcd-3"];
    up.extend(NODES);
    run(&mut project.compose(&up));
    settled(&project);
    let mut up = vec!["up", "-d", "pacpriv-teachers"];
    up.extend(REPLICAS);
    run(&mut project.compose(&up));
    project.wait_healthy(&REPLICAS, HEALTHY_WITHIN);

    let rounds = rounds();
    let per_principal = |key: &str| key.trim_end_matches("-key").to_owned();
    let mut seen: Vec<Seen> = Vec::new();
    let mut figures = Vec::new();
    for round in 0..rounds {
        for fault in
            [Fault::KillPrimary, Fault::Rejoin, Fault::Switchover, Fault::Partition, Fault::Combined, Fault::NoStandby]
        {
            let (unwritable_ms, (p99_ms, max_ms), lines, primary) =
                phase(&project, fault, &format!("ha{round}-{fault:?}"));
            let before = seen.len();
            seen.extend(lines);
            let charges =
                check::accounts_agree(&Db::read(&project, &primary, "pacpriv"), &seen, super::B, &per_principal);
            figures.push(Figures {
                fault,
                unwritable_ms,
                counts: Counts::of(&seen[before..], charges),
                p99_ms,
                max_ms,
            });
        }
    }
    // Issue 66: the journal these failovers wrote, exported with the
    // dataset's noise key (kept in PostgreSQL, replicated by Patroni).
    let keyed = check::export_verifies(&project, REPLICAS[0], dir.path());
    eprintln!("the HA export verifies with its noise key: {keyed} noisy steps checked exactly");
    report(&figures);
}

/// The Patroni image (on the test's PostgreSQL image, which
/// [`super::build_images`] made).
fn build_ha_image() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    run(Command::new("docker")
        .env("DOCKER_BUILDKIT", "0")
        .args(["build", "-q", "-t", "pacpriv-patroni:local"])
        .arg(root.join("tests/cluster/patroni")));
}

/// One fault under load: when no node could commit (ms), the p99 and
/// maximum latency of answers in the fault window, the load generator's
/// lines, the primary once the cluster settled.
fn phase(project: &Project, fault: Fault, prefix: &str) -> (Option<u64>, (u64, u64), Vec<Seen>, String) {
    // Load long enough to see every replica answer after the fault's
    // recovery: Combined (a failover, a replica restarted mid-failover and
    // the old primary rejoining through pg_rewind) has settled as late as
    // 58 s into the load on a 2-core CI machine.
    let seconds = match fault {
        Fault::Rejoin | Fault::Switchover => 40,
        Fault::KillPrimary | Fault::NoStandby => 50,
        Fault::Partition => 60,
        Fault::Combined => 90,
    };
    let load = project.load(&load_args(LOAD_KEYS, prefix, seconds, &[]));
    let t0 = load.started;
    let at = |secs: u64| std::thread::sleep((t0 + Duration::from_secs(secs)).saturating_duration_since(Instant::now()));
    at(5);
    let primary = settled(project);
    let from = unix_ms();
    let mut standby_gone = None;
    match fault {
        Fault::KillPrimary => {
            run(&mut project.compose(&["kill", "-s", "SIGKILL", &primary]));
        }
        Fault::Rejoin => {
            let down: Vec<&str> = NODES.iter().copied().filter(|n| !running(project, n)).collect();
            assert_eq!(down.len(), 1, "Rejoin follows KillPrimary: one node down, not {down:?}");
            run(&mut project.compose(&["start", down[0]]));
        }
        Fault::Switchover => {
            let candidate = member_with_role(project, "sync_standby");
            let mut cmd = project.compose(&["exec", "-T", &primary]);
            cmd.args(PATRONICTL).args(["switchover", "--leader", &primary, "--candidate", &candidate, "--force"]);
            run(&mut cmd);
        }
        Fault::Partition => {
            let container = project.container(&primary);
            let dcs = project.network("dcs");
            run(Command::new("docker").args(["network", "disconnect", &dcs, &container]));
            let next = new_primary(project, &primary);
            eprintln!("Partition: {primary} cut off from etcd and its standbys; {next} leads");
            let ip = project.address("dcs", 20 + primary[3..].parse::<u8>().expect("pg-N"));
            run(Command::new("docker").args(["network", "connect", "--ip", &ip, &dcs, &container]));
        }
        Fault::Combined => {
            run(&mut project.compose(&["kill", "-s", "SIGKILL", &primary, "pacpriv-2"]));
            // Mid-failover — no node accepts writes until Patroni's ttl
            // (10 s) runs out — the replica starts again.
            start_during_failover(project, "pacpriv-2");
            // Back only once another node leads: a node restarted within
            // the ttl would simply keep its leadership.
            new_primary(project, &primary);
            run(&mut project.compose(&["start", &primary]));
        }
        Fault::NoStandby => {
            let standbys: Vec<&str> = NODES.iter().copied().filter(|n| *n != primary).collect();
            let mut stop = vec!["stop", "-t", "10"];
            stop.extend(&standbys);
            run(&mut project.compose(&stop));
            let gone = unix_ms();
            // Waits ended early — cancelled, as statement_timeout or an
            // operator would — commit on the primary alone: neither their
            // answers nor a retry's cached copy may leave (asserted below).
            let mut cancelled = 0;
            while t0.elapsed() < Duration::from_secs(20) {
                let rows = project.sql(&primary, "pacpriv", CANCEL_STANDBY_WAITS);
                cancelled += rows.first().and_then(|r| r.first()).and_then(|n| n.parse::<usize>().ok()).unwrap_or(0);
                std::thread::sleep(Duration::from_millis(250));
            }
            assert!(cancelled > 0, "no COMMIT waited for a standby while none was up");
            eprintln!("NoStandby: {cancelled} waits for a standby cancelled");
            at(20);
            let mut start = vec!["start"];
            start.extend(&standbys);
            run(&mut project.compose(&start));
            standby_gone = Some((gone, unix_ms()));
        }
    }
    let now = settled(project);
    let to = unix_ms();
    let took = t0.elapsed();
    let seen: Vec<Seen> = load.finish().iter().map(Seen::of).collect();
    assert!(
        took + Duration::from_secs(4) < Duration::from_secs(seconds),
        "{fault:?}: the fault and recovery took {took:?} of the {seconds} s of load, too little left to see recovery"
    );
    eprintln!("{fault:?}: primary {primary} before, {now} after, settled {took:?} into the load");
    match fault {
        Fault::KillPrimary | Fault::Switchover | Fault::Partition | Fault::Combined => {
            assert_ne!(now, primary, "{fault:?}: another node leads")
        }
        Fault::Rejoin | Fault::NoStandby => assert_eq!(now, primary, "{fault:?}: the primary stays"),
    }
    for replica in REPLICAS {
        let again = seen.iter().any(|s| s.answered() && s.target.starts_with(replica) && s.sent_ms > to);
        assert!(again, "{fault:?}: {replica} answered nothing after the cluster settled");
    }
    let unwritable = if let Some((gone, back)) = standby_gone {
        // Strict synchronous mode: with no standby, nothing is answered
        // (a commit waits for one; the replicas time out, UNAVAILABLE).
        let released: Vec<&str> = seen
            .iter()
            .filter(|s| s.answered() && s.done_ms > gone + 1000 && s.done_ms < back)
            .map(|s| s.query_id.as_str())
            .collect();
        assert!(released.is_empty(), "answered with no synchronous standby: {released:?}");
        // Held back, not lost: the replica's STORE_UNAVAILABLE comes after
        // store.postgres_timeout_ms (5 s), so these clients' 3 s deadline
        // usually passes first; either way they retry.
        // (Each client waits for its query, so these were sent before.)
        let held = seen.iter().any(|s| !s.retried.is_empty() && s.sent_ms < back && s.done_ms > gone + 1000);
        assert!(held, "no query was held back while no standby could confirm a commit");
        Some(back - gone)
    } else {
        promoted_at(project, &now).filter(|&t| t > from).map(|t| t - from)
    };
    // Answers to queries in flight at any time in the fault window.
    let mut latencies: Vec<u64> = seen
        .iter()
        .filter(|s| s.answered() && s.sent_ms <= to && s.done_ms >= from)
        .map(|s| s.done_ms - s.sent_ms)
        .collect();
    latencies.sort_unstable();
    let p99 = latencies.get((latencies.len() * 99).div_ceil(100).saturating_sub(1)).copied().unwrap_or(0);
    let max = latencies.last().copied().unwrap_or(0);
    (unwritable, (p99, max), seen, now)
}

/// Starts `replica` while no node accepts writes and waits until it is
/// ready: it must wait for the new primary (issue 53 §7: its log says it
/// waited), not exit and need a restart.
fn start_during_failover(project: &Project, replica: &str) {
    let name = project.container_name(replica);
    let deadline = Instant::now() + HEALTHY_WITHIN;
    let since = unix_ms();
    run(&mut project.compose(&["start", replica]));
    loop {
        let out =
            run(Command::new("docker").args(["inspect", "-f", "{{.State.Status}} {{.State.Health.Status}}", &name]));
        let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if state == "running healthy" {
            break;
        }
        assert!(
            !state.starts_with("exited"),
            "{replica} exited at start instead of waiting for a node that accepts writes:\n{}",
            project.logs(replica)
        );
        assert!(Instant::now() < deadline, "{replica} not ready within {HEALTHY_WITHIN:?}:\n{}", project.logs(replica));
        std::thread::sleep(Duration::from_millis(250));
    }
    // This start's log only (the container's earlier runs' are kept too).
    let since = format!("{}.{:03}", since / 1000, since % 1000);
    let out = run(Command::new("docker").args(["logs", "--since", &since, &name]));
    let logs = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let waited = logs.matches("no database node accepts writes yet").count();
    assert!(waited > 0, "{replica} found a writable node at once: the phase did not start it mid-failover:\n{logs}");
    eprintln!("Combined: {replica} started mid-failover, waited ({waited} attempts refused), then became ready");
}

/// Patroni's view of one node.
struct Member {
    name: String,
    role: String,
    state: String,
    timeline: u64,
}

/// The members as the first node that answers sees them (Patroni's
/// `GET /cluster` on the node itself), skipping `avoid`.
fn members(project: &Project, avoid: &[&str]) -> Option<Vec<Member>> {
    for node in NODES.iter().filter(|n| !avoid.contains(n) && running(project, n)) {
        let url = "http://127.0.0.1:8008/cluster";
        let name = project.container_name(node);
        let Ok(out) = Command::new("docker").args(["exec", &name, "curl", "-fsS", "-m", "2", url]).output() else {
            continue;
        };
        let Ok(cluster) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else { continue };
        let list = cluster["members"].as_array()?;
        return Some(
            list.iter()
                .map(|m| Member {
                    name: m["name"].as_str().unwrap_or_default().to_owned(),
                    role: m["role"].as_str().unwrap_or_default().to_owned(),
                    state: m["state"].as_str().unwrap_or_default().to_owned(),
                    timeline: m["timeline"].as_u64().unwrap_or(0),
                })
                .collect(),
        );
    }
    None
}

/// Waits until a running node leads, every running node is a running
/// member on its timeline, and one is its synchronous standby; the leader.
fn settled(project: &Project) -> String {
    let deadline = Instant::now() + SETTLES_WITHIN;
    loop {
        if let Some(members) = members(project, &[]) {
            let up: Vec<&str> = NODES.iter().copied().filter(|n| running(project, n)).collect();
            // etcd still names a killed leader until its key expires.
            let leader = members.iter().find(|m| m.role == "leader" && m.state == "running" && up.contains(&&*m.name));
            if let Some(leader) = leader {
                let joined = up.iter().all(|n| {
                    members.iter().any(|m| m.name == *n && m.state == "running" && m.timeline == leader.timeline)
                });
                if joined && members.iter().any(|m| m.role == "sync_standby") {
                    return leader.name.clone();
                }
            }
        }
        assert!(Instant::now() < deadline, "no settled Patroni cluster within {SETTLES_WITHIN:?}:\n{}", logs(project));
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The leader other than `old`, once there is one (`old` cut off).
fn new_primary(project: &Project, old: &str) -> String {
    let deadline = Instant::now() + SETTLES_WITHIN;
    loop {
        let members = members(project, &[old]).unwrap_or_default();
        if let Some(m) = members.iter().find(|m| m.role == "leader" && m.state == "running" && m.name != old) {
            return m.name.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no node took over from {old} within {SETTLES_WITHIN:?}:\n{}",
            logs(project)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn member_with_role(project: &Project, role: &str) -> String {
    let members = members(project, &[]).expect("patronictl list");
    members.into_iter().find(|m| m.role == role).map(|m| m.name).unwrap_or_else(|| panic!("no {role}"))
}

/// Whether `node`'s container runs.
fn running(project: &Project, node: &str) -> bool {
    let name = project.container_name(node);
    let out = run(Command::new("docker").args(["inspect", "-f", "{{.State.Running}}", &name]));
    String::from_utf8_lossy(&out.stdout).trim() == "true"
}

/// When the latest timeline began (Patroni's history, asked of `primary`),
/// Unix milliseconds.
fn promoted_at(project: &Project, primary: &str) -> Option<u64> {
    let mut cmd = project.compose(&["exec", "-T", primary]);
    cmd.args(PATRONICTL).args(["history", "-f", "json"]);
    let out = run(&mut cmd);
    let history: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).ok()?;
    let stamp = history.last()?["Timestamp"].as_str()?.to_owned();
    let out = run(Command::new("date").args(["-d", &stamp, "+%s%3N"]));
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn logs(project: &Project) -> String {
    NODES.iter().map(|n| project.logs(n)).collect::<Vec<_>>().join("\n")
}

/// The figures as the table in docs/assurance/reliability.md, on standard error and in
/// `target/tmp/cluster-ha-figures.md` (a passing test's output is not shown).
fn report(figures: &[Figures]) {
    let mut table = String::from(
        "| fault | no writable primary (s) | queries | answered | retrieved on retry | retried attempts (by status) | charges checked | lost | p99 / max of answers in the fault window (ms) |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for f in figures {
        let c = &f.counts;
        let unwritable = f.unwritable_ms.map_or("0".to_owned(), |ms| format!("{:.1}", ms as f64 / 1000.0));
        table += &format!(
            "| {:?} | {unwritable} | {} | {} | {} | {} | {} | 0 | {} / {} |\n",
            f.fault,
            c.queries,
            c.answered,
            c.retrieved,
            c.retried_summary(),
            c.charges,
            f.p99_ms,
            f.max_ms
        );
    }
    eprintln!("\n{table}");
    let _ = std::fs::write(Path::new(env!("CARGO_TARGET_TMPDIR")).join("cluster-ha-figures.md"), table);
}

/// Issue 41 §6, a benchmark (BENCHMARKS.md): durable charges per second
/// through one, two and three replicas, on the single node and on the
/// Patroni cluster (synchronous replication). 24 clients over the six load
/// sessions, each sending its next query as soon as the last is answered,
/// for 20 s a setting.
#[test]
#[ignore = "a benchmark: cargo test --release --test cluster -- --ignored --nocapture charges_per_second"]
fn charges_per_second_on_one_node_and_on_ha() {
    if !engine_answers() {
        return;
    }
    const SECONDS: u64 = 20;
    let turn = compose::one_at_a_time();
    let (_dir, mut project) = super::project(&turn);
    build_ha_image();
    let mut up = vec!["--profile", "ha", "up", "-d", "postgres", "pacpriv-teachers", "etcd-1", "etcd-2", "etcd-3"];
    up.extend(NODES);
    run(&mut project.compose(&up));
    settled(&project);
    let mut rows = Vec::new();
    let ha = url(&project);
    for (database, url) in [("one node", "postgres://pacpriv@postgres/pacpriv"), ("Patroni, synchronous", ha.as_str())]
    {
        project.set("PACPRIV_POSTGRES_URL", url);
        let mut recreate = vec!["up", "-d", "--force-recreate", "--no-deps"];
        recreate.extend(REPLICAS);
        run(&mut project.compose(&recreate));
        project.wait_healthy(&REPLICAS, HEALTHY_WITHIN);
        for n in 1..=REPLICAS.len() {
            let targets = REPLICAS[..n].iter().map(|r| format!("{r}:50051")).collect::<Vec<_>>().join(",");
            let prefix = format!("tput-{}-{n}", rows.len());
            let seconds = SECONDS.to_string();
            let args = [
                "--targets",
                &targets,
                "--keys",
                LOAD_KEYS,
                "--prefix",
                &prefix,
                "--seconds",
                &seconds,
                "--clients",
                "24",
                "--rate",
                "100000",
            ]
            .map(str::to_owned);
            let seen: Vec<Seen> = project.load(&args).finish().iter().map(Seen::of).collect();
            let first = seen.iter().map(|s| s.sent_ms).min().unwrap_or(0);
            let last = seen.iter().map(|s| s.done_ms).max().unwrap_or(0);
            let charged = seen.iter().filter(|s| s.answered() && !s.cached).count();
            rows.push((database, n, charged as f64 * 1000.0 / (last - first).max(1) as f64));
        }
    }
    eprintln!("\n| database | replicas | durable charges/s | against one node, same replicas |\n|---|---|---|---|");
    for (database, n, rate) in &rows {
        let single = rows.iter().find(|(d, m, _)| *d == "one node" && m == n).map_or(f64::NAN, |r| r.2);
        eprintln!("| {database} | {n} | {rate:.0} | {:.2}× |", rate / single);
    }
}
