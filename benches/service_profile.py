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

# A symbol goes by its subject: the self type of `<T as Trait>::f`, what
# `drop_in_place<T>` drops, else its own leading path; then by that
# path's crate. Symbols without a path (libc, BLAS kernels, the kernel's)
# go by name.
CRATES = [
    ("privacy math (pacpriv_privacy, ndarray, BLAS)", {"pacpriv_privacy", "ndarray", "ndarray_linalg", "lax"}),
    ("SHA-256", {"sha2", "digest"}),
    ("the store's queue (pacpriv_store, pacpriv_records)", {"pacpriv_store", "pacpriv_records"}),
    ("pacpriv's request code (pacpriv_service)", {"pacpriv_service"}),
    ("the proxy's own code (pacpriv_bench)", {"pacpriv_bench"}),
    ("h2", {"h2"}),
    ("hyper", {"hyper", "hyper_util"}),
    ("tonic, tower, axum", {"tonic", "tower", "tower_http", "tower_layer", "tower_service", "axum", "axum_core"}),
    ("prost", {"prost"}),
    ("tokio, mio", {"tokio", "tokio_util", "tokio_stream", "mio"}),
    ("tracing", {"tracing", "tracing_core", "tracing_subscriber"}),
    ("prometheus-client", {"prometheus_client"}),
    ("bytes", {"bytes"}),
    ("allocation", {"alloc"}),
    ("hashing", {"hashbrown", "ahash"}),
    ("std and core", {"std", "core"}),
]
UNPATHED = [
    ("privacy math (pacpriv_privacy, ndarray, BLAS)", r"^(d|s)(gemm|gemv|syrk|dot|axpy|scal|nrm2)|openblas|lapack"),
    ("allocation", r"malloc|^free$|^cfree|realloc|_int_free|_int_malloc|__rust_alloc|__rust_dealloc"),
]
DROP = re.compile(r"^core::ptr::drop_in_place<(.*)>$")


def subject(symbol):
    """The path a symbol is about: see CRATES."""
    while True:
        dropped = DROP.match(symbol)
        if dropped:
            symbol = dropped.group(1)
        elif symbol.startswith(("<", "&", "*const ", "*mut ", "mut ", "dyn ")):
            symbol = symbol.split(" ", 1)[1] if symbol[0] in "*md" else symbol[1:]
        elif re.match(r"[A-Z]\w* as ", symbol):
            # A generic self type (`<T as Trait>`): the trait's path.
            symbol = symbol.split(" as ", 1)[1]
        else:
            return symbol


def category(symbol):
    if symbol.startswith("[k]"):
        return "kernel"
    symbol = re.sub(r"^\[\.\]\s*", "", symbol)
    crate = re.match(r"([A-Za-z_][A-Za-z0-9_]*)::", subject(symbol))
    if crate:
        for name, crates in CRATES:
            if crate.group(1) in crates:
                return name
        return "other crates"
    for name, pattern in UNPATHED:
        if re.search(pattern, symbol):
            return name
    return "libc and unresolved"


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
    # the samples; start-up and teardown add a little to them).
    answers = int(re.search(r"Checks passed on all (\d+) answers", out).group(1))
    return by_category(data, answers), answers


def by_category(data, answers):
    """µs per answer of the service threads in `data`, by category."""
    # cpu-clock's period is the CPU time a sample stands for, in ns: summed,
    # it holds however perf throttled the rate.
    report = subprocess.run(
        ["perf", "report", "-i", data, "--no-children", "--comms", "bench-service", "--sort", "sym", "-F",
         "period,sym", "-g", "none", "--stdio"], capture_output=True, text=True, check=True).stdout
    by = {}
    for line in report.splitlines():
        m = re.match(r"\s*(\d+)\s+(\[.\].*)$", line)
        if m:
            name = category(m.group(2).strip())
            by[name] = by.get(name, 0.0) + int(m.group(1)) / 1e3 / answers
    return by


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=128)
    p.add_argument("--layout", choices=["per-teacher", "stacked"], default="stacked")
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--frequency", type=int, default=1999, help="perf samples per second per CPU")
    p.add_argument("--state-dir", default=tempfile.gettempdir())
    p.add_argument("--bench", default="target/release/pacpriv-bench")
    p.add_argument("--keep", metavar="DIR", help="keep the perf.data files here (for `perf report` by symbol)")
    args = p.parse_args()
    suffix = "-stacked" if args.layout == "stacked" else ""
    with tempfile.TemporaryDirectory(dir=args.state_dir) as workdir:
        keep = args.keep or workdir
        os.makedirs(keep, exist_ok=True)
        private, n_private = profile(args.bench, "privatizer" + suffix, args, keep)
        proxy, n_proxy = profile(args.bench, "proxy" + suffix, args, keep)
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
