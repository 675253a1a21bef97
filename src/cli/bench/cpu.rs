//! Where the CPU went: this process's CPU time per thread, read from
//! `/proc/self/task/*/stat` and grouped by thread name. The bench names its
//! runtimes' threads (`bench-teachers`, `bench-service`, `bench-clients`);
//! the embedded store's writer names its own. On machines without
//! `/proc` there is simply no CPU table.
//!
//! Accuracy: the kernel counts in clock ticks (`USER_HZ`, 100 per second
//! on every mainstream Linux ABI), so a 10 s window is read to about 1 %;
//! a thread that exits inside the window takes its time with it (tokio's
//! idle blocking threads, rarely under load).

use std::collections::{BTreeMap, HashMap};

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

/// CPU ticks so far of every live thread, by thread id, with its name.
#[derive(Clone, Debug, Default)]
pub struct Snapshot(HashMap<u64, (String, u64)>);

impl Snapshot {
    /// Reads every thread of this process; `None` without `/proc`.
    pub fn take() -> Option<Snapshot> {
        let mut threads = HashMap::new();
        for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else { continue };
            // A thread may exit between the listing and the read.
            if let Some(parsed) = std::fs::read_to_string(entry.path().join("stat")).ok().as_deref().and_then(parse) {
                threads.insert(tid, parsed);
            }
        }
        Some(Snapshot(threads))
    }

    /// CPU seconds per group from `before` to `self`; threads started in
    /// between count from zero.
    pub fn since(&self, before: &Snapshot) -> BTreeMap<&'static str, f64> {
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
        let before = Snapshot(HashMap::from([(1, t("bench-teachers", 100)), (2, t("pacpriv", 5))]));
        let after = Snapshot(HashMap::from([
            (1, t("bench-teachers", 300)),
            (2, t("pacpriv", 5)),
            (3, t("pacpriv-store-w", 50)),
        ]));
        let usage = after.since(&before);
        assert_eq!(usage.get("teachers"), Some(&2.0));
        assert_eq!(usage.get("store writer"), Some(&0.5));
        assert_eq!(usage.get(OTHER), Some(&0.0));
    }
}
