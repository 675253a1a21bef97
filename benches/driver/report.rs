//! The Markdown `pacpriv-bench service` prints: what ran and on what, one
//! row per target (throughput, latency percentiles, errors), the ratios of
//! the same run, and where the time went (CPU per component, batch sizes).
//! Formatting only; the numbers come from [`super::load`] and
//! [`super::observe`].

use super::load::Run;
use super::observe;
use super::plan::{Knobs, Measured, RATIOS, Target};
use std::io::Write;
use std::path::Path;

/// `Unavailable × 3, DeadlineExceeded × 1`, or `none`.
pub(super) fn codes(run: &Run) -> String {
    let errors = run.errors();
    if errors.is_empty() {
        return "none".into();
    }
    errors.iter().map(|(code, n)| format!("{code} × {n}")).collect::<Vec<_>>().join(", ")
}

/// The Markdown report of the in-process targets: what ran, one row per
/// target, the ratios, and where the time went.
pub(super) fn service(
    results: &[(&Target, Measured)],
    knobs: &Knobs,
    images: usize,
    state_dir: &Path,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let cap = knobs.queries.map(|q| format!(" or {q} answers, whichever comes first")).unwrap_or_default();
    writeln!(
        out,
        "m = {} demo teachers (seed {}) on loopback gRPC; {} principals, each one closed-loop client (unary \
         Predict, own connection and API key); per target {:.1} s warm-up, then {:.1} s{cap}; {images} held-out \
         images cycled.",
        knobs.models,
        knobs.seed,
        knobs.principals,
        knobs.warmup.as_secs_f64(),
        knobs.measure.as_secs_f64(),
    )?;
    writeln!(
        out,
        "Machine: {}. Teachers, service and load clients all share these CPUs. Privatizer store: embedded, fresh \
         per target, under {} ({}).",
        machine(),
        state_dir.display(),
        filesystem(state_dir)
    )?;
    let env: Vec<String> =
        std::env::vars().filter(|(k, _)| k.starts_with("PACPRIV__")).map(|(k, v)| format!("`{k}={v}`")).collect();
    if !env.is_empty() {
        writeln!(out, "Environment overrides (all targets, under each target's own): {}.", env.join(", "))?;
    }
    let overrides: Vec<String> = results
        .iter()
        .filter(|(t, _)| !t.env.is_empty())
        .map(|(t, _)| {
            let env: Vec<String> = t.env.iter().map(|(k, v)| format!("`{k}={v}`")).collect();
            format!("{}: {}", t.name, env.join(" "))
        })
        .collect();
    if !overrides.is_empty() {
        writeln!(out, "Configuration: built-in defaults, except {}.", overrides.join("; "))?;
    }
    writeln!(out)?;
    writeln!(out, "| target | fan-out | answered | errors | answers/s | p50 ms | p90 ms | p99 ms |")?;
    writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|")?;
    for (target, m) in results {
        let latency = match m.run.percentiles(&[0.5, 0.9, 0.99]) {
            Some(p) => p.iter().map(|d| format!("{:.2}", d.as_secs_f64() * 1e3)).collect::<Vec<_>>().join(" | "),
            None => "– | – | –".into(),
        };
        let errors: u64 = m.run.errors().values().sum();
        writeln!(
            out,
            "| {} | {} | {} | {errors} | {:.1} | {latency} |",
            target.name,
            m.fanout,
            m.run.answered(),
            m.run.throughput()
        )?;
    }
    for (target, m) in results {
        if !m.run.errors().is_empty() {
            writeln!(out, "\nErrors of {}: {}.", target.name, codes(&m.run))?;
        }
    }
    // Under `contested` a unanimous answer is free and leaves without
    // waiting for the disk (issue 44 §1): the share says how much of the
    // stream that is.
    let shares: Vec<String> = results
        .iter()
        .filter_map(|(t, m)| {
            let answers = m.run.clients.iter().flat_map(|c| &c.answers);
            let (all, unanimous) = answers.fold((0usize, 0usize), |(n, u), a| (n + 1, u + usize::from(a.unanimous)));
            (all > 0).then(|| format!("{} {:.1} %", t.name, 100.0 * unanimous as f64 / all as f64))
        })
        .collect();
    writeln!(out, "\nUnanimous answers (all teachers agreed; warm-up included): {}.", shares.join(", "))?;
    let throughput = |name: &str| results.iter().find(|(t, _)| t.name == name).map(|(_, m)| m.run.throughput());
    let ratios: Vec<String> = RATIOS
        .iter()
        .filter_map(|r| {
            let (num, den) = (throughput(r.numerator)?, throughput(r.denominator)?);
            let ratio = if den > 0.0 { num / den } else { f64::NAN };
            let goal = match r.goal {
                Some(g) if ratio >= g => format!("≥ {g}× (met)"),
                Some(g) => format!("≥ {g}× (missed: {:.0} % of the goal)", 100.0 * ratio / g),
                None => "–".into(),
            };
            Some(format!("| {} | {} / {} | {ratio:.2}× | {goal} |", r.what, r.numerator, r.denominator))
        })
        .collect();
    if !ratios.is_empty() {
        writeln!(out, "\n| throughput ratio (same run) | targets | value | goal |")?;
        writeln!(out, "|---|---|---:|---|")?;
        for r in ratios {
            writeln!(out, "{r}")?;
        }
    }
    cpu_table(results, out)
}

/// Where each target's CPU went in its measured window — CPU milliseconds
/// per answer by component, with its share, and how busy the machine was —
/// and the batch sizes that explain it.
fn cpu_table(results: &[(&Target, Measured)], out: &mut dyn Write) -> anyhow::Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let groups: Vec<&str> = observe::GROUPS.iter().map(|(_, g)| *g).chain([observe::OTHER]).collect();
    let or_dash = |v: Option<f64>, digits: usize| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"));
    let mut rows = Vec::new();
    for (target, m) in results {
        let answered = m.run.answered();
        let seen = &m.run.observed;
        let total: f64 = seen.cpu.iter().flat_map(|u| u.values()).sum();
        let cells: Vec<String> = groups
            .iter()
            .map(|g| match seen.cpu.as_ref().and_then(|u| u.get(g)) {
                Some(secs) if answered > 0 && total > 0.0 => {
                    format!("{:.1} ({:.0} %)", 1e6 * secs / answered as f64, 100.0 * secs / total)
                }
                Some(_) | None => "–".into(),
            })
            .collect();
        let (per_answer, busy) = if answered > 0 && total > 0.0 {
            let busy = 100.0 * total / (m.run.elapsed.as_secs_f64() * cpus).max(f64::MIN_POSITIVE);
            (format!("{:.1}", 1e6 * total / answered as f64), format!("{busy:.0} %"))
        } else {
            ("–".into(), "–".into())
        };
        let commits_per_s = seen.commits.map(|c| c / m.run.elapsed.as_secs_f64().max(f64::MIN_POSITIVE));
        rows.push(format!(
            "| {} | {} | {per_answer} | {busy} | {} | {} | {} |",
            target.name,
            cells.join(" | "),
            or_dash(seen.fanout_batch, 1),
            or_dash(seen.commit_batch, 1),
            or_dash(commits_per_s, 0),
        ));
    }
    writeln!(
        out,
        "\nWhere the time went in each measured window: CPU µs per answer by component, from the kernel's per-thread \
         accounting (/proc; share of the process's CPU time), how busy the CPUs were, mean queries per fan-out (per teacher call), and for the privatizer mean \
         session records per store commit and commits (fsyncs) per second:\n"
    )?;
    writeln!(
        out,
        "| target | {} | CPU µs/answer | CPUs busy | queries/fan-out | records/commit | commits/s |",
        groups.join(" | ")
    )?;
    writeln!(out, "|---|{}---:|---:|---:|---:|---:|", "---:|".repeat(groups.len()))?;
    for r in rows {
        writeln!(out, "{r}")?;
    }
    Ok(())
}

/// The CPU model and how many CPUs this process may use.
pub(super) fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim().to_owned()))
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{model}, {cpus} CPU(s)")
}

/// The file system type `dir` lives on (the longest matching mount point
/// in /proc/self/mounts), e.g. `ext4`; `unknown file system` elsewhere.
fn filesystem(dir: &Path) -> String {
    let Ok(dir) = std::fs::canonicalize(dir) else { return "unknown file system".into() };
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, kind) = (f.next()?, f.next()?, f.next()?);
            dir.starts_with(point).then(|| (point.len(), kind.to_owned()))
        })
        .max()
        .map_or_else(|| "unknown file system".into(), |(_, kind)| kind)
}
