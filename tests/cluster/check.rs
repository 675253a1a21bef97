//! What must hold after every phase, checked from the database and from
//! what the clients received (the load generator's JSON lines).

use crate::compose::Project;
use pacpriv_store::{JournalEntry, SessionRecord};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// One query as a client saw it.
pub struct Seen {
    pub key: String,
    pub query_id: String,
    pub outcome: String,
    pub target: String,
    /// The model asked ("": the default) and the version that answered.
    pub model: String,
    pub model_version: String,
    pub charged: Option<f64>,
    pub cached: bool,
    pub sent_ms: u64,
    pub done_ms: u64,
    /// Retryable statuses on the way, by "Code/REASON".
    pub retried: BTreeMap<String, u64>,
    pub status: String,
}

impl Seen {
    pub fn of(v: &Value) -> Seen {
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        Seen {
            key: s("key"),
            query_id: s("query_id"),
            outcome: s("outcome"),
            target: s("target"),
            model: s("model"),
            model_version: s("model_version"),
            charged: v["charged"].as_f64(),
            cached: v["cached"].as_bool().unwrap_or(false),
            sent_ms: v["sent_ms"].as_u64().unwrap_or(0),
            done_ms: v["done_ms"].as_u64().unwrap_or(0),
            retried: v["retried"]
                .as_object()
                .map(|m| m.iter().map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0))).collect())
                .unwrap_or_default(),
            status: s("status"),
        }
    }

    pub fn answered(&self) -> bool {
        self.outcome == "answered"
    }
}

/// The database's view: every session's record and journal.
pub struct Db {
    pub sessions: BTreeMap<String, SessionRecord>,
    pub journal: BTreeMap<String, Vec<JournalEntry>>,
}

impl Db {
    /// Database `db` on the PostgreSQL container `service`.
    pub fn read(project: &Project, service: &str, db: &str) -> Db {
        let mut sessions = BTreeMap::new();
        for row in
            project.sql(service, db, "SELECT session, encode(record, 'hex') FROM pacpriv_sessions WHERE version > 0")
        {
            let record =
                SessionRecord::decode(&unhex(&row[1])).unwrap_or_else(|| panic!("session {} undecodable", row[0]));
            sessions.insert(row[0].clone(), record);
        }
        let mut journal: BTreeMap<String, Vec<JournalEntry>> = BTreeMap::new();
        let rows = project.sql(
            service,
            db,
            "SELECT session, encode(entry, 'hex') FROM pacpriv_journal ORDER BY session, version",
        );
        for row in rows {
            let entry =
                JournalEntry::decode(&unhex(&row[1])).unwrap_or_else(|| panic!("journal of {} undecodable", row[0]));
            journal.entry(row[0].clone()).or_default().push(entry);
        }
        Db { sessions, journal }
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex from encode()")).collect()
}

/// Totals of one check, for the table in docs/assurance/reliability.md.
#[derive(Default, Clone)]
pub struct Counts {
    pub queries: usize,
    pub answered: usize,
    pub retrieved: usize,
    pub refused: usize,
    /// Retried attempts by status.
    pub retried: BTreeMap<String, u64>,
    pub charges: usize,
}

impl Counts {
    /// `seen`'s totals, with `charges` checked in the database.
    pub fn of(seen: &[Seen], charges: usize) -> Counts {
        Counts {
            queries: seen.len(),
            answered: seen.iter().filter(|s| s.answered() && !s.cached).count(),
            retrieved: seen.iter().filter(|s| s.answered() && s.cached).count(),
            refused: seen.iter().filter(|s| s.outcome == "refused").count(),
            retried: seen.iter().flat_map(|s| &s.retried).fold(BTreeMap::new(), |mut all, (status, n)| {
                *all.entry(status.clone()).or_default() += n;
                all
            }),
            charges,
        }
    }

    /// The retried attempts for the table in docs/assurance/reliability.mds: "N (status n, …)".
    pub fn retried_summary(&self) -> String {
        let total: u64 = self.retried.values().sum();
        let each: Vec<String> = self.retried.iter().map(|(status, n)| format!("{status} {n}")).collect();
        format!("{total} ({})", each.join(", "))
    }
}

/// Checks `db` against everything the clients of this database received
/// (`seen`, all phases so far), each charge being `b`; `session_of` maps
/// an API key to its session. Panics naming the first violation; returns
/// the number of charges checked.
pub fn accounts_agree(db: &Db, seen: &[Seen], b: f64, session_of: &dyn Fn(&str) -> String) -> usize {
    let stuck: Vec<String> = seen
        .iter()
        .filter(|s| s.outcome != "answered" && s.outcome != "refused")
        .map(|s| format!("{} via {}: {} {}", s.query_id, s.target, s.outcome, s.status))
        .collect();
    assert!(stuck.is_empty(), "queries neither answered nor refused for budget ({}): {stuck:#?}", stuck.len());

    let mut charges = 0;
    let mut charged_ids: BTreeSet<(String, String)> = BTreeSet::new();
    for (session, entries) in &db.journal {
        let record = db.sessions.get(session).unwrap_or_else(|| panic!("journal of {session} without a session row"));
        let versions: Vec<u64> = entries.iter().map(|e| e.version).collect();
        let expected: Vec<u64> = (1..=record.version).collect();
        assert_eq!(versions, expected, "{session}: the journal is one entry per version, none missing or doubled");
        for e in entries {
            assert_eq!(e.charge, b, "{session} {}: every answer costs b", e.query_id);
            assert!(
                charged_ids.insert((session.clone(), e.query_id.clone())),
                "{session}: query {} charged twice",
                e.query_id
            );
        }
        let total: f64 = entries.iter().map(|e| e.charge).sum();
        assert_eq!(record.spent, total, "{session}: the ledger's spending is the journal's charges");
        assert!(record.spent <= record.limit, "{session}: spent {} over its limit {}", record.spent, record.limit);
        assert_eq!(record.answered as usize, entries.len(), "{session}: answered = journal entries");
        charges += entries.len();
    }
    for session in db.sessions.keys() {
        assert!(db.journal.contains_key(session), "{session}: a session with steps but no journal");
    }

    let mut received: BTreeSet<(String, String)> = BTreeSet::new();
    for s in seen.iter().filter(|s| s.answered()) {
        let id = (session_of(&s.key), s.query_id.clone());
        assert!(charged_ids.contains(&id), "{id:?} was answered (via {}) but has no durable charge", s.target);
        let want = if s.cached { 0.0 } else { b };
        assert_eq!(s.charged, Some(want), "{id:?}: the charge the client was told");
        received.insert(id);
    }
    let unreceived: Vec<_> = charged_ids.difference(&received).collect();
    assert!(unreceived.is_empty(), "charged but never received by a client, even on retry: {unreceived:?}");

    charges
}

/// Issue 66: the journal as an auditor receives it — `pacpriv admin
/// export` and `export --noise-key`, run in `replica` against its own admin
/// listener — checked on this machine by `pacpriv verify --noise-key`:
/// every noisy step's release is its dataset's key's draw at its position
/// around one teacher, across every replica, fault and retry the phases
/// put it through (a draw used twice, or a step re-answered after a
/// failover with another draw, would not match), none left to statistics,
/// and the statistical audit passes too. Returns the noisy steps keyed.
pub fn export_verifies(project: &Project, replica: &str, dir: &std::path::Path) -> u64 {
    let admin = |args: &str, file: &str| {
        let script = format!(
            "PACPRIV_ADMIN_TOKEN=admin-key pacpriv admin --addr {replica}:50052 --ca /etc/pacpriv/tls/ca.crt export \
             {args} /tmp/{file} >&2 && cat /tmp/{file} && rm -f /tmp/{file}"
        );
        let out = crate::compose::run(&mut project.compose(&["exec", "-T", replica, "sh", "-c", &script]));
        let path = dir.join(file);
        std::fs::write(&path, &out.stdout).expect("write the export");
        path
    };
    let journal = admin("--out", "journal.jsonl");
    let keys = admin("--noise-key", "keys.json");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_pacpriv"))
        .args(["verify", "--noise-key", &keys.display().to_string(), &journal.display().to_string()])
        .output()
        .expect("pacpriv verify runs");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "the cluster's export verifies with its noise key: {out}{err}");
    let mut keyed = 0;
    for row in out.lines().skip_while(|l| !l.starts_with("key audit")).skip(2).take_while(|l| l.contains('\t')) {
        let fields: Vec<&str> = row.split('\t').collect();
        assert_eq!(fields.get(2), Some(&"0"), "every noisy step is keyed: {row}");
        keyed += fields.get(1).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    }
    assert!(keyed > 0, "the phases' answers are noisy steps: {out}");
    keyed
}
