"""Issue 26 §3's matrix, restated by issue 44 §1: privatizer vs proxy at
several client counts, in both teacher layouts, RUNS times each; prints the
median throughput ratio, the lowest, the p99 latency ratio and the share of
unanimous answers per cell as Markdown.

The privatizer runs under --policy (default `contested`, where a unanimous
answer is free and leaves without waiting for the disk); `paper` charges
every answer, so every answer waits for its group commit.

Each run is one `pacpriv-bench service` invocation (proxy and privatizer
measured back to back against the same teachers, as that bench does), so
every ratio compares targets of the same process and minute.

Run (from the repository root, after `cargo build --release`):
  OPENBLAS_NUM_THREADS=1 python3 benches/service_matrix.py \
      --clients 1,8,32,64,128 --runs 5 --seconds 5 --state-dir .
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

LAYOUTS = {"per-teacher": ("proxy", "privatizer"), "stacked": ("proxy-stacked", "privatizer-stacked")}


def goal(clients):
    """(median ratio, lowest ratio, p99 ratio) a cell is held to: issue 44
    up to 32 clients (latency-bound), issue 56 §2 at saturation."""
    return (0.9, 0.85, 1.25) if clients >= 64 else (0.95, 0.9, 1.2)


def rows(report):
    """target -> (answers/s, p99 ms) from the bench's results table."""
    out = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[0] in {t for pair in LAYOUTS.values() for t in pair}:
            try:
                out[cells[0]] = (float(cells[4]), float(cells[7]))
            except ValueError:
                pass
    return out


def cpu(report):
    """target -> (service, store writer) CPU µs per answer, from the bench's
    table of the kernel's per-thread accounting."""
    out = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and cells[0] in {t for pair in LAYOUTS.values() for t in pair}:
            try:
                service = float(cells[2].split()[0])
                writer = float(cells[3].split()[0]) if cells[3] != "–" else 0.0
            except ValueError:
                continue
            out[cells[0]] = (service, writer)
    return out


def unanimous(report, target):
    """The share of `target`'s answers the teachers were unanimous on, in %."""
    m = re.search(rf"Unanimous answers .*?[:,] {re.escape(target)} ([0-9.]+) %", report)
    return float(m.group(1)) if m else float("nan")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clients", default="1,8,32,64,128")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--seconds", default="5")
    p.add_argument("--state-dir", default=".")
    p.add_argument("--bench", default="target/release/pacpriv-bench")
    p.add_argument("--policy", default="contested", choices=["paper", "contested"])
    a = p.parse_args()
    env = dict(os.environ, PACPRIV__PRIVACY__POLICY=a.policy)
    targets = ",".join(t for pair in LAYOUTS.values() for t in pair)
    results = {}  # (layout, clients) -> [(throughput ratio, p99 ratio, unanimous %)]
    cpus = {}  # (layout, clients) -> [(proxy service µs, privatizer service µs, store writer µs)]
    for n in [int(c) for c in a.clients.split(",")]:
        for run in range(a.runs):
            report = subprocess.run(
                [a.bench, "service", "--only", targets, "--principals", str(n), "--seconds", a.seconds,
                 "--state-dir", a.state_dir],
                check=True, capture_output=True, text=True, env=env).stdout
            got = rows(report)
            for layout, (proxy, priv) in LAYOUTS.items():
                if proxy not in got or priv not in got:
                    sys.exit(f"run {run} at {n} clients reported no {proxy}/{priv} row:\n{report}")
                ratio = got[priv][0] / got[proxy][0]
                p99 = got[priv][1] / got[proxy][1]
                share = unanimous(report, priv)
                results.setdefault((layout, n), []).append((ratio, p99, share))
                used = cpu(report)
                if proxy in used and priv in used:
                    cpus.setdefault((layout, n), []).append((used[proxy][0], used[priv][0], used[priv][1]))
                print(f"# {layout} {n} clients run {run + 1}: throughput {ratio:.3f}x, p99 {p99:.3f}x "
                      f"(proxy {got[proxy][0]:.0f}/s, privatizer {got[priv][0]:.0f}/s), "
                      f"unanimous {share:.1f} %", flush=True)
    print()
    print(f"policy = {a.policy}")
    print()
    print(f"| layout | clients | privatizer / proxy, median of {a.runs} | lowest | goal "
          f"| p99 ratio, median | goal | unanimous answers |")
    print("|---|---:|---:|---:|---|---:|---|---:|")
    for (layout, n), xs in sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        med = statistics.median(r for r, _, _ in xs)
        low = min(r for r, _, _ in xs)
        p99 = statistics.median(q for _, q, _ in xs)
        share = statistics.median(u for _, _, u in xs)
        (want, floor, tail) = goal(n)
        ok = "met" if med >= want and low >= floor else "missed"
        print(f"| {layout} | {n} | {med:.2f}× | {low:.2f}× | ≥ {want}×, none < {floor}×: {ok} | {p99:.2f}× "
              f"| ≤ {tail}×: {'met' if p99 <= tail else 'missed'} | {share:.1f} % |")

    print()
    print(f"CPU µs per answer, median of {a.runs} (the kernel's per-thread accounting: the service's runtime threads, "
          "and the privatizer's store writer):")
    print()
    print("| layout | clients | proxy service | privatizer service | privatizer / proxy | goal ≤ 1.25× "
          "| store writer |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for (layout, n), xs in sorted(cpus.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        prox = statistics.median(p for p, _, _ in xs)
        priv = statistics.median(q for _, q, _ in xs)
        writer = statistics.median(w for _, _, w in xs)
        ratio = statistics.median(q / p for p, q, _ in xs if p > 0)
        print(f"| {layout} | {n} | {prox:.1f} | {priv:.1f} | {ratio:.2f}× | {'met' if ratio <= 1.25 else 'missed'} "
              f"| {writer:.1f} |")


if __name__ == "__main__":
    main()
