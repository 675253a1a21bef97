//! What the process did during a measured window, to explain its numbers:
//!
//! - CPU time per component: this process's threads, read from
//!   `/proc/self/task/*/stat` and grouped by thread name. The bench names
//!   its runtimes' threads (`bench-teachers`, `bench-service`,
//!   `bench-clients`); the embedded store's writer names its own.
//! - The target's own histograms (Prometheus text): queries per fan-out
//!   (`pacpriv_teacher_batch_size`) and records per store commit
//!   (`pacpriv_store_commit_batch_size`).
//!
//! Each is optional: without `/proc` or metrics the report leaves the
//! cells out. CPU accuracy: the kernel counts in clock ticks (`USER_HZ`,
//! 100 per second on every mainstream Linux ABI), so a 10 s window is read
//! to about 1 %; a thread that exits inside the window takes its time with
//! it (tokio's idle blocking threads, rarely under load).

use pacpriv_service::metrics::Metrics;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

/// Thread-name prefixes and the component they stand for, in report order.
pub const GROUPS: &[(&str, &str)] = &[
    ("bench-teachers", "teachers"),
    ("bench-service", "service"),
    ("pacpriv-store", "store writer"),
    ("bench-clients", "load clients"),
];

/// Name of the group of threads matching no prefix.
pub const OTHER: &str = "other";

/// Clock ticks per second of `/proc` CPU times (`USER_HZ`).
const TICKS_PER_SECOND: f64 = 100.0;

/// Where a target's metrics are read.
#[derive(Clone)]
pub enum MetricsSource {
    /// None to read.
    None,
    /// In this process (the proxy's).
    Local(Arc<Metrics>),
    /// A `/metrics` endpoint over HTTP (the privatizer's).
    Http(SocketAddr),
}

impl MetricsSource {
    /// The Prometheus text now, if it can be had.
    async fn scrape(&self) -> Option<String> {
        match self {
            MetricsSource::None => None,
            MetricsSource::Local(metrics) => metrics.encode().ok(),
            MetricsSource::Http(addr) => {
                let addr = *addr;
                tokio::task::spawn_blocking(move || http_get(addr)).await.ok().flatten()
            }
        }
    }
}

/// `GET /metrics` over plain HTTP/1.1: the body.
fn http_get(addr: SocketAddr) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5)).ok()?;
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// The state at one instant: thread CPU times and the target's metrics.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    cpu: Option<Threads>,
    metrics: Option<String>,
}

impl Snapshot {
    /// Reads both.
    pub async fn take(source: &MetricsSource) -> Snapshot {
        Snapshot { cpu: Threads::take(), metrics: source.scrape().await }
    }
}

/// What happened between two snapshots.
#[derive(Clone, Debug, Default)]
pub struct Window {
    /// CPU seconds by component ([`GROUPS`], [`OTHER`]).
    pub cpu: Option<BTreeMap<&'static str, f64>>,
    /// Mean queries per fan-out.
    pub fanout_batch: Option<f64>,
    /// Mean session records per store commit.
    pub commit_batch: Option<f64>,
    /// Store commits.
    pub commits: Option<f64>,
}

impl Window {
    /// From `before` to `after`.
    pub fn between(before: &Snapshot, after: &Snapshot) -> Window {
        let cpu = before.cpu.as_ref().zip(after.cpu.as_ref()).map(|(b, a)| a.since(b));
        let (b, a) = (before.metrics.as_deref(), after.metrics.as_deref());
        let delta = |series: &str| Some(sample(a?, series)? - b.and_then(|b| sample(b, series)).unwrap_or(0.0));
        let mean = |histogram: &str| {
            let count = delta(&format!("{histogram}_count"))?;
            (count > 0.0).then_some(delta(&format!("{histogram}_sum"))? / count)
        };
        Window {
            cpu,
            fanout_batch: mean("pacpriv_teacher_batch_size"),
            commit_batch: mean("pacpriv_store_commit_batch_size"),
            // The proxy registers the store series too, but never commits.
            commits: delta("pacpriv_store_commit_batch_size_count").filter(|&c| c > 0.0),
        }
    }
}

/// The value of the unlabelled sample `series` in Prometheus text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// CPU ticks so far of every live thread, by thread id, with its name.
#[derive(Clone, Debug, Default)]
struct Threads(HashMap<u64, (String, u64)>);

impl Threads {
    /// Reads every thread of this process; `None` without `/proc`.
    fn take() -> Option<Threads> {
        let mut threads = HashMap::new();
        for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else { continue };
            // A thread may exit between the listing and the read.
            if let Some(parsed) = std::fs::read_to_string(entry.path().join("stat")).ok().as_deref().and_then(parse) {
                threads.insert(tid, parsed);
            }
        }
        Some(Threads(threads))
    }

    /// CPU seconds per group from `before` to `self`; threads started in
    /// between count from zero.
    fn since(&self, before: &Threads) -> BTreeMap<&'static str, f64> {
        let mut by_group = BTreeMap::new();
        for (tid, (name, ticks)) in &self.0 {
            let earlier = before.0.get(tid).map_or(0, |(_, t)| *t);
            let group = GROUPS.iter().find(|(prefix, _)| name.starts_with(prefix)).map_or(OTHER, |(_, g)| *g);
            *by_group.entry(group).or_insert(0.0) += ticks.saturating_sub(earlier) as f64 / TICKS_PER_SECOND;
        }
        by_group
    }
}

/// Name and utime + stime of one `stat` line. The name is in parentheses
/// and may itself contain spaces or parentheses, so fields are counted
/// from the last `)`: state is field 3, utime 14, stime 15.
fn parse(stat: &str) -> Option<(String, u64)> {
    let (head, tail) = stat.rsplit_once(')')?;
    let (_, name) = head.split_once('(')?;
    let fields: Vec<&str> = tail.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name.to_owned(), utime + stime))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn stat_lines_parse_with_odd_names() {
        let line = "4066 (bench-service) S 4063 4063 4004 0 -1 4194304 125 0 1 0 250 30 0 0 20 0 1 0 2499658";
        assert_eq!(parse(line), Some(("bench-service".into(), 280)));
        let odd = "7 (a) b (c) R 1 1 1 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1";
        assert_eq!(parse(odd), Some(("a) b (c".into(), 7)));
        assert_eq!(parse("garbage"), None);
    }

    #[test]
    fn usage_groups_threads_and_counts_new_ones_from_zero() {
        let t = |name: &str, ticks| (name.to_owned(), ticks);
        let before = Threads(HashMap::from([(1, t("bench-teachers", 100)), (2, t("pacpriv", 5))]));
        let after = Threads(HashMap::from([
            (1, t("bench-teachers", 300)),
            (2, t("pacpriv", 5)),
            (3, t("pacpriv-store-w", 50)),
        ]));
        let usage = after.since(&before);
        assert_eq!(usage.get("teachers"), Some(&2.0));
        assert_eq!(usage.get("store writer"), Some(&0.5));
        assert_eq!(usage.get(OTHER), Some(&0.0));
    }

    #[test]
    fn histogram_means_are_taken_over_the_window() {
        let text = |count: f64, sum: f64| {
            format!(
                "# TYPE pacpriv_teacher_batch_size histogram\npacpriv_teacher_batch_size_sum {sum}\n\
                 pacpriv_teacher_batch_size_count {count}\npacpriv_teacher_batch_size_bucket{{le=\"1.0\"}} 3\n"
            )
        };
        let before = Snapshot { cpu: None, metrics: Some(text(10.0, 40.0)) };
        let after = Snapshot { cpu: None, metrics: Some(text(30.0, 240.0)) };
        let window = Window::between(&before, &after);
        assert_eq!(window.fanout_batch, Some(10.0));
        assert_eq!(window.commit_batch, None);
        assert_eq!(Window::between(&Snapshot::default(), &Snapshot::default()).fanout_batch, None);
    }
}
