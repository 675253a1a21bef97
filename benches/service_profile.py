"""Where the privatizer's service threads spend their CPU beyond the proxy's:
`perf record` over one `pacpriv-bench service` run per target, then the
samples of the service threads (`bench-service`) per answer, grouped by
what the code is (the privacy math, pacpriv's own request code, h2, tokio,
the kernel, ...), as a Markdown table: privatizer, proxy, difference.

Each target runs in its own bench process, so the two profiles come one
after the other (not interleaved as in `service_matrix.py`): compare the
difference between categories, and repeat a run to see its spread.
perf's cpu-clock samples in a VM count less CPU than the kernel's
per-thread accounting the bench prints (~80 % on the 2-core VMs of
BENCHMARKS.md); the shares between categories are what this is for.

Run (from the repository root, as root or with perf_event_paranoid <= 0,
after `cargo build --release --bin pacpriv-bench`; needs `perf`, Debian's
`linux-perf`):
  OPENBLAS_NUM_THREADS=1 python3 benches/service_profile.py \
      --clients 128 --layout stacked --seconds 5 --state-dir /tmp
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

# First match wins: a symbol is counted once.
CATEGORIES = [
    ("kernel", r"^\[k\]"),
    ("privacy math (pacpriv_privacy, ndarray, BLAS)", r"pacpriv_privacy|ndarray|openblas|lapack|dgemm|dsyrk|dgemv"),
    ("SHA-256", r"sha2::"),
    ("the store's queue (pacpriv_store, records)", r"pacpriv_store|pacpriv_records"),
    ("pacpriv's request code (pacpriv_service)", r"pacpriv_service"),
    ("h2", r"\bh2::"),
    ("hyper", r"\bhyper::"),
    ("tonic, tower, axum", r"\btonic::|\btower|\baxum::"),
    ("prost", r"\bprost::"),
    ("tokio", r"\btokio"),
    ("tracing", r"\btracing"),
    ("prometheus-client", r"prometheus_client"),
    ("bytes", r"\bbytes::"),
    ("allocation", r"malloc|\bfree\b|realloc|cfree|_int_free|_int_malloc|alloc::"),
    ("hashing (SipHash, ahash)", r"Hasher|hash::|ahash"),
]


def category(symbol):
    for name, pattern in CATEGORIES:
        if re.search(pattern, symbol):
            return name
    return "other"


def profile(bench, target, args, workdir):
    """(µs per answer by category, answers) of one target's run."""
    data = os.path.join(workdir, f"{target}.data")
    state = os.path.join(workdir, f"state-{target}")
    os.makedirs(state, exist_ok=True)
    cmd = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(args.frequency), "-a", "-o", data, "--",
           bench, "service", "--principals", str(args.clients), "--seconds", str(args.seconds),
           "--only", target, "--state-dir", state]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    # Every answer the service threads served, warm-up included (so are
    # the samples).
    answers = int(re.search(r"Checks passed on all (\d+) answers", out).group(1))
    report = subprocess.run(
        ["perf", "report", "-i", data, "--no-children", "--comms", "bench-service", "--sort", "sym", "-g", "none",
         "--stdio", "-n"], capture_output=True, text=True, check=True).stdout
    by = {}
    for line in report.splitlines():
        m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(.*)$", line)
        if m:
            name = category(m.group(2).strip())
            by[name] = by.get(name, 0.0) + int(m.group(1)) / args.frequency / answers * 1e6
    return by, answers


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=128)
    p.add_argument("--layout", choices=["per-teacher", "stacked"], default="stacked")
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--frequency", type=int, default=1999, help="perf samples per second per CPU")
    p.add_argument("--state-dir", default=tempfile.gettempdir())
    p.add_argument("--bench", default="target/release/pacpriv-bench")
    args = p.parse_args()
    suffix = "-stacked" if args.layout == "stacked" else ""
    with tempfile.TemporaryDirectory(dir=args.state_dir) as workdir:
        private, n_private = profile(args.bench, "privatizer" + suffix, args, workdir)
        proxy, n_proxy = profile(args.bench, "proxy" + suffix, args, workdir)
    print(f"{args.clients} clients, {args.layout}: service threads' perf samples, µs per answer "
          f"(privatizer {n_private} answers, proxy {n_proxy}, warm-up included)\n")
    print("| what | privatizer | proxy | difference |")
    print("|---|---:|---:|---:|")
    names = sorted(set(private) | set(proxy), key=lambda k: -(private.get(k, 0) - proxy.get(k, 0)))
    for name in names:
        a, b = private.get(name, 0.0), proxy.get(name, 0.0)
        print(f"| {name} | {a:.2f} | {b:.2f} | {a - b:+.2f} |")
    a, b = sum(private.values()), sum(proxy.values())
    print(f"| **total** | {a:.2f} | {b:.2f} | {a - b:+.2f} |")


if __name__ == "__main__":
    sys.exit(main())
