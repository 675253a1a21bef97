//! Soak: a bounded load on one `pacpriv serve` (demo teachers, embedded
//! store) — four clients, fresh queries with a repeat (a cached answer)
//! every tenth — while the server's resident memory and open file
//! descriptors are sampled. Checked: no query fails, the account counts
//! every fresh answer, and neither memory nor descriptors keep growing (bounds
//! far above what a healthy run uses, far below what a leak reaches in
//! ten minutes). Prints the figures docs/assurance/reliability.md quotes.
//!
//! CI runs 20 s. The long soak is opt-in:
//! `PACPRIV_SOAK_SECONDS=600 cargo test --release --test it soak -- --nocapture`.

use crate::util::{Process, budget, client, distinct, image, predict};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const CLIENTS: u32 = 4;

/// Resident set size in MiB, from /proc.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib / 1024.0
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(Iterator::count).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_bounded_load_neither_fails_nor_leaks() {
    let seconds: u64 = std::env::var("PACPRIV_SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let env = [
        ("PACPRIV__DEMO__MODELS", "16".to_owned()),
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-30".to_owned()),
        ("PACPRIV__PRINCIPALS__DEMO__BUDGET_MI", "1".to_owned()),
    ];
    let server = Process::serve(None, &env);
    let pid = server.pid();
    let c = client(&server.addr).await;

    let until = Instant::now() + Duration::from_secs(seconds);
    let mut clients = tokio::task::JoinSet::new();
    for k in 0..CLIENTS {
        let mut c = c.clone();
        clients.spawn(async move {
            let (mut answered, mut cached) = (0u64, 0u64);
            let mut errors: BTreeMap<String, u64> = BTreeMap::new();
            let mut n = 0u32;
            while Instant::now() < until {
                // Every tenth query repeats the one before it.
                let seed = if n % 10 == 9 { n - 1 } else { n };
                let pixels = distinct((0..64).map(|j| ((seed + j * 3 + k) % 17) as f32).collect(), k << 24 | seed);
                match predict(&mut c, "demo-key", image(&format!("c{k}-{n}"), &pixels)).await {
                    Ok(r) => {
                        answered += 1;
                        cached += u64::from(r.cached);
                    }
                    Err(e) => *errors.entry(format!("{:?}: {}", e.code(), e.message())).or_default() += 1,
                }
                n += 1;
            }
            (answered, cached, errors)
        });
    }

    // Samples: the first after a warm-up (caches, connections, the
    // allocator's arenas), then every few seconds.
    let warm_up = Duration::from_secs(seconds.min(60) / 4);
    tokio::time::sleep(warm_up).await;
    let (rss_start, fds_start) = (rss_mib(pid), open_fds(pid));
    let (mut rss_max, mut fds_max) = (rss_start, fds_start);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(2)).await;
        rss_max = rss_max.max(rss_mib(pid));
        fds_max = fds_max.max(open_fds(pid));
    }
    let (mut answered, mut cached, mut errors) = (0, 0, BTreeMap::new());
    while let Some(r) = clients.join_next().await {
        let (a, h, e) = r.expect("client task");
        (answered, cached) = (answered + a, cached + h);
        for (k, v) in e {
            *errors.entry(k).or_insert(0) += v;
        }
    }
    let (rss_end, fds_end) = (rss_mib(pid), open_fds(pid));

    println!(
        "soak: {seconds} s, {CLIENTS} clients, {answered} answered ({:.0}/s, {cached} cached), errors {errors:?}; \
         RSS after {} s warm-up {rss_start:.1} MiB, max {rss_max:.1}, end {rss_end:.1} (growth {:+.1} MiB); \
         open fds {fds_start} → max {fds_max}, end {fds_end}",
        answered as f64 / seconds as f64,
        warm_up.as_secs(),
        rss_end - rss_start,
    );
    assert!(errors.is_empty(), "queries failed under steady load: {errors:?}");
    assert!(answered > 0 && cached > 0);
    let mut c = c.clone();
    // The account counts fresh answers (a cached one is not a new step).
    assert_eq!(budget(&mut c, "demo-key").await.answered, answered - cached, "every fresh answer counted");
    assert!(rss_end - rss_start < 128.0, "resident memory grew by {:.1} MiB", rss_end - rss_start);
    assert!(fds_end <= fds_start + 32, "open descriptors grew from {fds_start} to {fds_end}");
}
