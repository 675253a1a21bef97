#!/usr/bin/env bash
# The README quick start as a script, then the book (tests/book.py): build,
# start `pacpriv serve` on the
# built-in defaults (loopback, any free port), talk to it with the stock
# Python gRPC client (tests/smoke_client.py), stop it with SIGTERM.
#
#   bash tests/smoke.sh        # from any directory
#
# Needs cargo, python3 (pip installs grpcio and friends if missing).
# Ends with one line `smoke: OK — ...`; any failure exits non-zero.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

STARTUP_TIMEOUT="${SMOKE_STARTUP_TIMEOUT:-120}" # seconds until the server must be listening
CLIENT_TIMEOUT="${SMOKE_CLIENT_TIMEOUT:-300}"   # seconds for the whole client run
STOP_TIMEOUT="${SMOKE_STOP_TIMEOUT:-15}"        # seconds for the server to exit after SIGTERM

say() { echo "smoke: $*" >&2; }
die() { say "FAILED — $*"; exit 1; }

TMP="$(mktemp -d "${TMPDIR:-/tmp}/pacpriv-smoke.XXXXXX")"
SERVER_PID=""
cleanup() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

started=$SECONDS

# 1. Build. Under CI this follows `cargo test --release --locked
#    --all-targets` (the README's test command), which built every library
#    with the same features (one feature set: docs/architecture.md), so the
#    build — and the README's run command — must compile nothing.
echo "step: smoke: build (cargo build --release --locked)" >&2
say "cargo build --release --locked"
cargo build --release --locked 2>&1 | tee "$TMP/build.log" >&2
if [[ "${CI:-}" == true ]]; then
    # What the README's run command (`cargo run --release -- serve`) builds.
    cargo build --release --locked -p pacpriv --bin pacpriv 2>&1 | tee -a "$TMP/build.log" >&2
    if grep -q '^ *Compiling ' "$TMP/build.log"; then
        die "the build after the tests compiled again (features differ between cargo test --all-targets and cargo build; docs/architecture.md, \"One feature set\"): $(grep '^ *Compiling ' "$TMP/build.log" | head -5 | tr -s ' ')"
    fi
    say "the build after the tests compiled nothing"
fi
BIN="$ROOT/target/release/pacpriv"
[[ -x "$BIN" ]] || die "$BIN was not built"

echo "step: smoke: quick start (server, Python client, metrics, curl, deploy check)" >&2
# 2. Client dependencies (third-party: grpcio, not this project's code).
if ! python3 -c 'import grpc, grpc_tools, grpc_health, grpc_status' 2>/dev/null; then
    say "installing grpcio grpcio-tools grpcio-health-checking grpcio-status"
    python3 -m pip install --quiet grpcio grpcio-tools grpcio-health-checking grpcio-status
fi

# 3. Python stubs from the proto.
python3 -m grpc_tools.protoc -I proto --python_out="$TMP" --grpc_python_out="$TMP" pacpriv/v1/privatizer.proto

# 4. Start the server: default config, any free loopback port, a fresh store
#    in the temp dir, plus a principal "tiny" whose budget is exactly three
#    answers of b = 2^-16.
#    Other PACPRIV__* variables of the caller's environment are dropped so the
#    run is on the shipped defaults.
while read -r var; do unset "$var"; done < <(compgen -e | grep '^PACPRIV__' || true)
tiny_hash="$(printf %s tiny-key | sha256sum | cut -d' ' -f1)"
say "starting $BIN serve"
OPENBLAS_NUM_THREADS=1 \
PACPRIV__SERVER__LISTEN=127.0.0.1:0 \
PACPRIV__METRICS__LISTEN=127.0.0.1:0 \
PACPRIV__SERVER__HTTP_LISTEN=127.0.0.1:0 \
PACPRIV__STORE__PATH="$TMP/state.redb" \
PACPRIV__PRIVACY__PER_QUERY_MI=2^-16 \
PACPRIV__PRINCIPALS__TINY__KEY_SHA256="$tiny_hash" \
PACPRIV__PRINCIPALS__TINY__BUDGET_MI=0.0000457763671875 \
    "$BIN" serve >"$TMP/stdout" 2>"$TMP/stderr" &
SERVER_PID=$!

server_log() { say "server stderr (last 30 lines):"; tail -n 30 "$TMP/stderr" >&2 || true; }

ADDR=""
deadline=$((SECONDS + STARTUP_TIMEOUT))
while ((SECONDS < deadline)); do
    line="$(grep -m1 '^pacpriv listening on ' "$TMP/stdout" || true)"
    if [[ -n "$line" ]]; then
        ADDR="${line#pacpriv listening on }"
        break
    fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        server_log
        die "server exited before listening"
    fi
    sleep 0.2
done
if [[ -z "$ADDR" ]]; then
    server_log
    die "server not listening after ${STARTUP_TIMEOUT}s"
fi
[[ "$ADDR" =~ ^127\.0\.0\.1:[0-9]+$ ]] || die "unexpected listen address: '$ADDR'"
METRICS=""
for _ in $(seq 50); do
    METRICS="$(sed -n 's/^pacpriv metrics listening on //p' "$TMP/stdout")"
    [[ -n "$METRICS" ]] && break
    sleep 0.1
done
[[ -n "$METRICS" ]] || die "no 'pacpriv metrics listening on' line, got: $(cat "$TMP/stdout")"
HTTP="$(sed -n 's/^pacpriv http listening on //p' "$TMP/stdout")"
[[ -n "$HTTP" ]] || die "no 'pacpriv http listening on' line, got: $(cat "$TMP/stdout")"
# The admin API is off by default (no admin.key_sha256), so exactly these three.
[[ "$(wc -l <"$TMP/stdout")" -eq 3 ]] || die "stdout should be the three 'listening' lines, got: $(cat "$TMP/stdout")"
say "server listening on $ADDR after $((SECONDS - started))s"

# 5. The client checks.
set +e
timeout "$CLIENT_TIMEOUT" python3 "$ROOT/tests/smoke_client.py" "$ADDR" "$TMP" | tee "$TMP/client.log"
client_rc=${PIPESTATUS[0]}
set -e
if ((client_rc != 0)); then
    server_log
    die "client checks failed (exit $client_rc)"
fi
summary="$(grep '^SUMMARY ' "$TMP/client.log")" || die "client printed no SUMMARY line"
checks="$(sed -E 's/.*checks=([0-9]+).*/\1/' <<<"$summary")"
answers="$(sed -E 's/.*answers=([0-9]+).*/\1/' <<<"$summary")"
spent="$(sed -E 's/.*demo_spent=([^ ]+).*/\1/' <<<"$summary")"

# 6. The Prometheus scrape after that traffic: answers counted, the demo
#    principal's budget gauge equal to what the client was told.
python3 - "$METRICS" "$spent" "$answers" >"$TMP/metrics.txt" <<'PY' || die "metrics scrape failed"
import sys, urllib.request
addr, spent, answers = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
def value(series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    sys.exit(f"{series} missing from the scrape")
got = value('pacpriv_budget_spent_nats{principal="demo",dataset="default"}')
if abs(got - spent) > 1e-6 * max(spent, 1e-300):  # the SUMMARY prints 7 digits
    sys.exit(f"demo spent gauge {got} != {spent} told to the client")
if value('pacpriv_queries_total{outcome="answered"}') < answers:
    sys.exit("answered counter below the answers received")
print(text, end="")
PY
checks=$((checks + 1))

# 7. The README's curl call on the HTTP/REST listener: a label and the
#    account after it.
reply="$(curl -s -w ' %{http_code}' "http://$HTTP/v2/models/private/infer" -H 'x-api-key: demo-key' \
    -H 'Content-Type: application/json' -d '{
      "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                  "data": [0,0,5,13,9,1,0,0,0,0,13,15,10,15,5,0,0,3,15,2,0,11,8,0,0,4,12,0,0,8,8,0,
                           0,5,8,0,0,9,8,0,0,4,11,0,1,12,7,0,0,2,14,5,10,12,0,0,0,0,6,13,10,0,0,0]}],
      "outputs": [{"name": "label"}, {"name": "mi_charged"}]}')" || die "curl to $HTTP failed"
[[ "$reply" == *'"name":"label"'* && "$reply" == *'"budget_spent"'* && "$reply" == *' 200' ]] \
    || die "the README's curl call got: $reply"
say "curl over HTTP/REST: ${reply:0:120}…"
checks=$((checks + 1))

# 8. The deployment artifacts (Dockerfile, Kubernetes, Prometheus, Grafana)
#    against this binary and this scrape.
tests/deploy_check.sh "$BIN" "$TMP/metrics.txt" || die "deployment artifacts check failed"
checks=$((checks + 1))

# 9. SIGTERM must stop the server promptly and cleanly.
kill -TERM "$SERVER_PID"
for _ in $(seq $((STOP_TIMEOUT * 10))); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$SERVER_PID" 2>/dev/null; then
    server_log
    die "server still running ${STOP_TIMEOUT}s after SIGTERM"
fi
set +e
wait "$SERVER_PID"
server_rc=$?
set -e
SERVER_PID=""
if ((server_rc != 0)); then
    server_log
    die "server exited with status $server_rc after SIGTERM"
fi
checks=$((checks + 1)) # the clean shutdown

# 10. The book (docs/): it builds, its links and pictures hold, and every
#     command and configuration snippet in it (and in the README) runs
#     against the real binary — each page on the default ports, so after
#     the server above has stopped. The tritonclient examples use the
#     interoperability tests' venv.
echo "step: smoke: the book (tests/book.py)" >&2
tests/interop_venv.sh >/dev/null || die "the interop venv (tritonclient) could not be built"
python3 tests/book.py || die "the book check failed"
checks=$((checks + 1))

# 11. Under CI: the build for remote teachers only (no `demo` feature)
#     compiles, links no linfa, and refuses the shipped configuration's
#     demo teachers naming the key. Last, because it replaces
#     target/release/pacpriv (a later `cargo build` puts the default back
#     without compiling).
if [[ "${CI:-}" == true ]]; then
    echo "step: smoke: build without the demo (cargo build --no-default-features)" >&2
    cargo build --release --locked --no-default-features --bin pacpriv
    if cargo tree --locked --no-default-features -p pacpriv -e normal -i linfa >/dev/null 2>&1; then
        die "the build without the demo feature still depends on linfa: $(cargo tree --locked --no-default-features -p pacpriv -e normal -i linfa | head -5)"
    fi
    set +e
    refused="$(PACPRIV__STORE__PATH="$TMP/nodemo.redb" timeout 30 "$BIN" serve 2>&1)"
    refused_rc=$?
    set -e
    [[ $refused_rc -eq 64 && "$refused" == *'teachers.source'*'built without them'* ]] \
        || die "the build without the demo should refuse teachers.source = \"demo\" (exit 64), got $refused_rc: $refused"
    say "the build without the demo links no linfa and refuses the demo teachers"
    checks=$((checks + 1))
fi

echo "smoke: OK — $checks checks passed, $answers answers, demo spent $spent nats ($((SECONDS - started))s)"
