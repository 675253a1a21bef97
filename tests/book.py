#!/usr/bin/env python3
"""The book (docs/, mdBook) as a test: it builds, its links resolve, its
pictures are what their sources draw, every command and configuration
snippet in it runs, and a browser renders it.

    python3 tests/book.py [--only PAGE] [--no-run] [--render]
    python3 tests/book.py --install-mdbook   # only install mdBook (.ci/run does it early)

Run by tests/smoke.sh (so by the README's test command) after the release
binary is built; needs mdBook (installed into target/mdbook from crates.io
when missing), Graphviz's `dot` and Chromium (Debian's `graphviz` and
`chromium`, which .ci/run installs).

What "every command runs" means. The pages are README.md and every chapter
SUMMARY.md lists, with the files they {{#include}}. Every fenced block in
`sh`, `bash`, `console`, `python` or `toml` must be preceded by a tag line

    <!-- check: run[; server[=ENV …]][; python=PATH][; output=exact] -->
    <!-- check: skip — why it cannot run here, and what runs it instead -->

(or sit in a file of SKIPPED_FILES, which says why once). A block tagged
`run` is run, one page at a time, in a fresh working directory holding
links to the repository's `clients/`, `examples/`, `data/`, `config/` and
`proto/`, with `target/release` first on PATH (so `pacpriv` is the binary
just built): `sh` blocks line by line, `console` blocks command by command
with the output shown under each command compared to what it printed, a
`python` block by the page's `python3` (or the interpreter named), and a
`toml` block through `pacpriv serve --check --config`. `server` first runs
the README's serve command verbatim (with the variables given, and the
store in the page's directory), and keeps it for the page's next block if
the variables are the same; a command line that starts `pacpriv serve … &`
itself is waited for until it reports SERVING.
Output comparison: numbers are masked (they carry the noise and the
secret), `…` in a shown line matches anything, and the shown lines must
appear in order among those printed; `output=exact` compares verbatim.
A command whose shown output has a line starting `error:` must fail
(unless it ends in `echo "exit $?"`, which shows the status); every other
command must succeed.
"""
import argparse
import html.parser
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BUILD = ROOT / "target" / "book"
MDBOOK_VERSION = "0.5.4"
CHECKED_LANGS = {"sh", "bash", "console", "python", "toml"}
SKIPPED_FILES = {
    "BENCHMARKS.md": "benchmark commands run for minutes under load and print "
    "figures, never asserted; tests/it/bench.rs runs each driver's short form",
}
# The service's default listeners, as the README's commands address them.
PORTS = (50051, 8000, 9464, 50052)
SERVER_TIMEOUT = 180


def say(msg):
    print(f"book: {msg}", file=sys.stderr, flush=True)


class Failure(Exception):
    pass


# ---------------------------------------------------------------- the pages


def chapters():
    """README.md and every chapter of SUMMARY.md, in the book's order."""
    pages = [ROOT / "README.md"]
    for m in re.finditer(r"\]\(([^)]+\.md)\)", (DOCS / "SUMMARY.md").read_text()):
        pages.append(DOCS / m.group(1))
    return pages


INCLUDE = re.compile(r"\{\{#include ([^}:\s]+)(?::([^}\s]*))?\}\}")


def expand(path):
    """The page's text with its {{#include}}s resolved, as (text, file) runs:
    each block is then attributed to the file that holds it."""
    text = path.read_text()
    parts, pos = [], 0
    for m in INCLUDE.finditer(text):
        parts.append((text[pos:m.start()], path))
        target = (path.parent / m.group(1)).resolve()
        inc = target.read_text()
        sel = m.group(2)
        if sel and re.fullmatch(r"\d*:?\d*", sel) and sel != "":
            a, _, b = sel.partition(":")
            lines = inc.split("\n")
            inc = "\n".join(lines[(int(a) - 1 if a else 0):(int(b) if b else None)])
        elif sel:
            got = re.search(rf"<!-- ANCHOR: {re.escape(sel)} -->\n(.*?)<!-- ANCHOR_END: {re.escape(sel)} -->", inc, re.S)
            if not got:
                raise Failure(f"{path.relative_to(ROOT)}: no anchor {sel!r} in {target.relative_to(ROOT)}")
            inc = got.group(1)
        parts.append((inc, target))
        pos = m.end()
    parts.append((text[pos:], path))
    return parts


class Block:
    def __init__(self, file, line, lang, body, tag):
        self.file, self.line, self.lang, self.body, self.tag = file, line, lang, body, tag

    def where(self):
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def blocks_of(page):
    """Every checked block of a page, once per file (an included file's
    blocks belong to it, and are run with the page that includes it)."""
    out = []
    for text, file in expand(page):
        src = file.read_text()
        lines = text.split("\n")
        i = 0
        while i < len(lines):
            m = re.match(r"^```(\w+)", lines[i])
            if not m:
                i += 1
                continue
            lang, start = m.group(1), i
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            body = "\n".join(lines[i + 1:j])
            if lang in CHECKED_LANGS:
                k = start - 1
                while k >= 0 and not lines[k].strip():
                    k -= 1
                tag = None
                if k >= 0:
                    t = re.fullmatch(r"<!-- check: (.*?) -->", lines[k].strip())
                    tag = t.group(1) if t else None
                line_no = src[: src.find("\n".join(lines[start:j]))].count("\n") + 1
                out.append(Block(file, line_no, lang, body, tag))
            i = j + 1
    return out


def parse_tag(tag):
    opts = {}
    for part in tag.split(";"):
        part = part.strip()
        key, _, value = part.partition("=")
        opts[key.strip()] = value.strip()
    return opts


# ------------------------------------------------------------ running blocks


def commands(block):
    """(command, shown output lines) pairs of a block."""
    def complete(text):  # as bash reads it: no open quote, no trailing backslash
        if text.endswith("\\"):
            return False
        return subprocess.run(["bash", "-n", "-c", text], capture_output=True).returncode == 0

    out, lines = [], block.body.split("\n")
    if block.lang == "console":
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                raise Failure(f"{block.where()}: console line is neither a command nor its output: {lines[i]!r}")
            cmd = lines[i][2:]
            i += 1
            while not complete(cmd) and i < len(lines):
                cmd += "\n" + lines[i]
                i += 1
            shown = []
            while i < len(lines) and not lines[i].startswith("$ "):
                shown.append(lines[i])
                i += 1
            out.append((cmd, shown))
    else:
        cmd = ""
        for line in lines:
            if not cmd and (not line.strip() or line.lstrip().startswith("#")):
                continue
            cmd = f"{cmd}\n{line}" if cmd else line
            if complete(cmd):
                out.append((cmd, None))
                cmd = ""
        if cmd:
            raise Failure(f"{block.where()}: unterminated command {cmd!r}")
    return out


NUMBER = re.compile(r"\d(?:[\d,]*\d)?(?:\.\d*)?(?:e[-+]?\d+)?|\.\d+", re.I)


def mask(line):
    return NUMBER.sub("#", line.rstrip())


def matches(shown, printed):
    pattern = "^" + ".*".join(re.escape(mask(p)) for p in shown.split("…")) + "$"
    return re.match(pattern, mask(printed)) is not None


def compare(block, cmd, shown, printed, exact):
    got = printed.rstrip("\n").split("\n") if printed.strip() else []
    if exact:
        if got != shown:
            raise Failure(f"{block.where()}: `{cmd}` printed\n" + "\n".join(got) + "\nbut the book shows\n" + "\n".join(shown))
        return
    k = 0
    for want in shown:
        while k < len(got) and not matches(want, got[k]):
            k += 1
        if k == len(got):
            raise Failure(f"{block.where()}: `{cmd}` printed\n" + "\n".join(got) + f"\nwith no line like the book's\n{want}")
        k += 1


class Page:
    """One page's working directory, shell state and server."""

    def __init__(self, page):
        self.name = page.relative_to(ROOT)
        self.dir = Path(tempfile.mkdtemp(prefix="pacpriv-book."))
        for d in ("clients", "examples", "data", "config", "proto"):
            (self.dir / d).symlink_to(ROOT / d)
        self.env = dict(os.environ)
        for k in list(self.env):
            if k.startswith("PACPRIV"):
                del self.env[k]
        self.env["PATH"] = f"{ROOT / 'target' / 'release'}:{self.env['PATH']}"
        self.env["OPENBLAS_NUM_THREADS"] = "1"
        self.server, self.server_env = None, None
        self.state = self.dir / ".shell-state"
        self.state.write_text("")
        self.jobs = []

    # the shell: every command runs in bash with the page's exported state
    def sh(self, cmd, timeout=900):
        """Runs one command in bash with the page's shell state (variables
        set or exported by earlier commands), and keeps the state it leaves.
        Output goes to a file: a background job may keep writing to it."""
        q = shlex.quote
        state, out = q(str(self.state)), self.dir / f".out.{len(self.jobs)}.{time.monotonic_ns()}"
        script = (
            f"set -o pipefail\nsource {state}\n{cmd}\n__rc=$?\n"
            f"{{ export -p; declare -p | grep -E '^declare -- [a-zA-Z][a-zA-Z0-9_]*=' | grep -vE '^declare -- (BASH|SECONDS|RANDOM|LINENO|SRANDOM|EPOCH|_=)'; }} > {state}.new 2>/dev/null\n"
            f"mv {state}.new {state}\nexit $__rc\n"
        )
        with open(out, "w") as sink:
            proc = subprocess.Popen(["bash", "-c", script], cwd=self.dir, env=self.env, stdout=sink,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                raise Failure(f"{self.name}: `{cmd}` did not finish in {timeout} s")
        # Whatever it left running (`pacpriv serve … &`) is stopped with the page.
        self.jobs.append(proc.pid)
        return rc, out.read_text(errors="replace")

    def wait_serving(self, what):
        deadline = time.time() + SERVER_TIMEOUT
        while time.time() < deadline:
            r = subprocess.run([str(ROOT / "target/release/pacpriv"), "health", "--addr", "127.0.0.1:50051"],
                               capture_output=True, env=self.env)
            if r.returncode == 0:
                return
            time.sleep(0.5)
        raise Failure(f"{self.name}: {what} did not report SERVING on 127.0.0.1:50051 within {SERVER_TIMEOUT} s")

    def start_server(self, env):
        if self.server and self.server_env == env:
            return
        self.stop_server()
        free_ports()
        extra = dict(kv.split("=", 1) for kv in env.split()) if env else {}
        # The store goes where the README's command puts it, the working
        # directory: the page's, not the repository the command runs in.
        extra["PACPRIV__STORE__PATH"] = str(self.dir / extra.get("PACPRIV__STORE__PATH", "pacpriv-state.redb"))
        log = open(self.dir / "server.log", "a")
        self.server = subprocess.Popen(["bash", "-c", serve_command()], cwd=ROOT, env={**self.env, **extra},
                                       stdout=log, stderr=log, start_new_session=True)
        self.server_env = env
        self.wait_serving("the README's serve command" + (f" with {env}" if env else ""))

    def stop_server(self):
        if self.server:
            os.killpg(self.server.pid, signal.SIGTERM)  # cargo and the server it runs
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
            self.server = None

    def close(self):
        self.stop_server()
        for pid in self.jobs:
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        free_ports()
        shutil.rmtree(self.dir, ignore_errors=True)

    def run(self, block):
        opts = parse_tag(block.tag)
        if "server" in opts:
            self.start_server(opts["server"])
        elif re.search(r"pacpriv serve\b", block.body):
            self.stop_server()  # the block starts its own
        if block.lang == "python":
            # Run by the page's `python3` (a venv an earlier block activated).
            script = self.dir / f"block-{block.line}.py"
            script.write_text(block.body + "\n")
            py = opts.get("python", "python3")
            py = shlex.quote(str(ROOT / py)) if "/" in py else py  # a path from the repository's root
            rc, out = self.sh(f"{py} {shlex.quote(script.name)}", timeout=300)
            if rc != 0:
                raise Failure(f"{block.where()}: the Python block failed:\n{out}")
            return
        if block.lang == "toml":
            conf = self.dir / "snippet.toml"
            conf.write_text(block.body + "\n")
            r = subprocess.run([str(ROOT / "target/release/pacpriv"), "serve", "--check", "--config", str(conf)],
                               cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                raise Failure(f"{block.where()}: `pacpriv serve --check` refused the snippet:\n{r.stdout}{r.stderr}")
            return
        for cmd, shown in commands(block):
            rc, out = self.sh(cmd)
            starts_server = re.search(r"pacpriv serve\b[^\n]*&\s*$", cmd) is not None
            if starts_server:
                self.wait_serving(f"`{cmd}`")
                continue
            fails = any(line.startswith("error:") for line in shown or []) and not cmd.endswith('echo "exit $?"')
            if fails and rc == 0:
                raise Failure(f"{block.where()}: `{cmd}` succeeded, but the book shows it failing:\n{out}")
            if not fails and rc != 0:
                raise Failure(f"{block.where()}: `{cmd}` exited {rc}:\n{out}")
            if shown is not None:
                compare(block, cmd, shown, out, opts.get("output") == "exact")


def serve_command():
    """The README's command that runs the service, verbatim."""
    for line in (ROOT / "README.md").read_text().split("\n"):
        if line.endswith("cargo run --release -- serve"):
            return line
    raise Failure("README.md has no `… cargo run --release -- serve` line")


def free_ports():
    """Nothing of an earlier page may still hold the default ports."""
    deadline = time.time() + 30
    import socket
    while time.time() < deadline:
        busy = []
        for port in PORTS:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    busy.append(port)
        if not busy:
            return
        time.sleep(0.5)
    raise Failure(f"ports {busy} on 127.0.0.1 are still in use: another pacpriv (or something else) holds them")


def run_blocks(pages, only):
    ran = skipped = 0
    seen = set()
    for page in pages:
        # README.md is a page and is included by two more: each block once.
        blocks = [b for b in blocks_of(page) if (b.file, b.line) not in seen]
        seen.update((b.file, b.line) for b in blocks)
        if only and only not in str(page):
            continue
        todo = []
        for b in blocks:
            rel = str(b.file.relative_to(ROOT))
            if rel in SKIPPED_FILES:
                skipped += 1
            elif b.tag is None:
                raise Failure(f"{b.where()}: a ```{b.lang} block with no `<!-- check: … -->` line before it")
            elif b.tag.startswith("skip"):
                if not re.match(r"skip — \S", b.tag):
                    raise Failure(f"{b.where()}: a skipped block must say why: `<!-- check: skip — … -->`")
                skipped += 1
            elif b.tag.startswith("run"):
                todo.append(b)
            else:
                raise Failure(f"{b.where()}: unknown check tag {b.tag!r}")
        if not todo:
            continue
        started = time.time()
        p = Page(page)
        try:
            for b in todo:
                p.run(b)
                ran += 1
        except Failure:
            log = p.dir / "server.log"
            if log.exists():
                say(f"server log of {p.name} (last 20 lines):\n" + "\n".join(log.read_text().split("\n")[-20:]))
            raise
        finally:
            p.close()
        say(f"{page.relative_to(ROOT)}: {len(todo)} blocks ran ({time.time() - started:.0f} s)")
    return ran, skipped


# ------------------------------------------------------------- build, links


def mdbook():
    found = shutil.which("mdbook")
    local = ROOT / "target" / "mdbook" / "bin" / "mdbook"
    for exe in (found, str(local)):
        if exe and os.path.exists(exe):
            v = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
            if MDBOOK_VERSION in v:
                return exe
    say(f"installing mdBook {MDBOOK_VERSION} from crates.io into target/mdbook (a few minutes)")
    subprocess.run(["cargo", "install", "mdbook", "--locked", "--version", MDBOOK_VERSION, "--root",
                    str(ROOT / "target" / "mdbook")], check=True)
    return str(local)


def build():
    shutil.rmtree(BUILD, ignore_errors=True)
    r = subprocess.run([mdbook(), "build", str(DOCS)], capture_output=True, text=True)
    if r.returncode != 0 or "[ERROR]" in r.stderr or "ERROR" in r.stdout:
        raise Failure(f"mdbook build failed:\n{r.stdout}{r.stderr}")
    if "WARN" in r.stderr:
        raise Failure(f"mdbook build warned:\n{r.stderr}")


class Refs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and "name" in a:
            self.ids.add(a["name"])
        for key in ("href", "src"):
            if a.get(key) and tag in ("a", "img", "link", "script"):
                self.refs.append(a[key])


def check_links():
    """Every relative link and image of every built page resolves to a file
    of the book, and every #fragment to an id on that page."""
    pages = {}
    for f in BUILD.rglob("*.html"):
        p = Refs()
        p.feed(f.read_text())
        pages[f.resolve()] = p
    bad, n = [], 0
    for f, p in pages.items():
        if f.name in ("print.html", "404.html", "toc.html"):
            continue
        for ref in p.refs:
            u = urllib.parse.urlsplit(ref)
            if u.scheme or ref.startswith("//") or ref.startswith("mailto:"):
                continue
            n += 1
            target = (f.parent / urllib.parse.unquote(u.path)).resolve() if u.path else f
            if not str(target).startswith(str(BUILD.resolve())) or not target.exists():
                bad.append(f"{f.relative_to(BUILD.resolve())}: {ref} (no such file in the book)")
                continue
            if u.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if urllib.parse.unquote(u.fragment) not in ids:
                    bad.append(f"{f.relative_to(BUILD.resolve())}: {ref} (no such heading)")
    if bad:
        raise Failure("broken links in the book:\n  " + "\n  ".join(sorted(set(bad))))
    return n


def check_sources_linked():
    """Every Markdown file under docs/ is a chapter (none is left out of the
    book), and every md link in README.md points at a file."""
    listed = {p.resolve() for p in chapters()}
    stray = [p.relative_to(ROOT) for p in DOCS.rglob("*.md") if p.name != "SUMMARY.md" and p.resolve() not in listed]
    if stray:
        raise Failure(f"pages under docs/ that SUMMARY.md does not list: {stray}")
    readme = (ROOT / "README.md").read_text()
    for m in re.finditer(r"\]\(([^)#\s]+)(#[^)]*)?\)", readme):
        if not urllib.parse.urlsplit(m.group(1)).scheme and not (ROOT / m.group(1)).exists():
            raise Failure(f"README.md links to {m.group(1)}, which does not exist")
    lines = readme.count("\n")
    if lines > 200:
        raise Failure(f"README.md has {lines} lines; the front page stays within 200 (move the rest into the book)")


def check_diagrams(render):
    """The committed SVGs are what Graphviz draws from their sources."""
    n = 0
    for src in sorted((DOCS / "diagrams").glob("*.dot")):
        svg = src.with_suffix(".svg")
        drawn = subprocess.run(["dot", "-Tsvg", str(src)], capture_output=True, check=True).stdout
        if render:
            svg.write_bytes(drawn)
        elif not svg.exists() or svg.read_bytes() != drawn:
            raise Failure(f"{svg.relative_to(ROOT)} is not what {src.relative_to(ROOT)} draws: "
                          f"run `python3 tests/book.py --render` and commit it")
        n += 1
    return n


# -------------------------------------------------------------- screenshots


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB/RGBA PNG, as
    Chromium writes them."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise Failure(f"{path}: unexpected PNG format (depth {depth}, colour type {ctype})")
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, bpp)])
        prev = line
    return w, h, rows


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    raise Failure("no Chromium: apt-get install chromium (Debian's package)")


def screenshot(page, out, size=(1280, 900)):
    profile = tempfile.mkdtemp(prefix="pacpriv-chromium.")
    try:
        subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                        "--virtual-time-budget=3000", f"--screenshot={out}", page.as_uri()],
                       capture_output=True, timeout=120, check=True)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if not out.exists():
        raise Failure(f"Chromium wrote no screenshot of {page}")
    return png_pixels(out)


def check_screenshots():
    """The book's first page and a chapter with a plot, as a browser shows
    them: the page is drawn (text, the sidebar, the diagram), and the plot
    is there with its curves' colours. Kept in target/book-screenshots."""
    shots = ROOT / "target" / "book-screenshots"
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    w, h, rows = screenshot(BUILD / "index.html", shots / "index.png")
    pixels = [p for row in rows for p in row]
    dark = sum(1 for p in pixels if max(p) < 100) / len(pixels)
    colours = len(set(pixels))
    if (w, h) != (1280, 900) or dark < 0.01 or colours < 50:
        raise Failure(f"the first page renders blank or broken ({w}×{h}, {dark:.1%} dark text pixels, {colours} colours): "
                      f"see {shots / 'index.png'}")
    # The diagram's pale blue boxes (#eef3fb) are drawn.
    if not any(abs(p[0] - 0xee) < 4 and abs(p[1] - 0xf3) < 4 and abs(p[2] - 0xfb) < 4 for p in pixels):
        raise Failure(f"the first page shows no query-path diagram: see {shots / 'index.png'}")
    # The audit chapter's plot: its curves (plotters' RED and BLUE) are drawn. The window is
    # tall enough that the plot stands clear of its bottom edge whatever fonts
    # the machine has (their line heights move it by hundreds of pixels).
    w, h, rows = screenshot(BUILD / "tools" / "audit.html", shots / "audit.png", size=(1280, 4000))
    pixels = [p for row in rows for p in row]
    red = sum(1 for p in pixels if p[0] > 200 and p[1] < 60 and p[2] < 60)
    blue = sum(1 for p in pixels if p[2] > 200 and p[0] < 60 and p[1] < 60)
    if red < 200 or blue < 200:
        raise Failure(f"the audit chapter shows no plot ({red} red, {blue} blue pixels): see {shots / 'audit.png'}")
    return 2


# --------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="run the blocks of pages whose path contains this")
    ap.add_argument("--no-run", action="store_true", help="build and check, run no block")
    ap.add_argument("--render", action="store_true", help="redraw docs/diagrams/*.svg from their sources")
    ap.add_argument("--install-mdbook", action="store_true",
                    help="only install the pinned mdBook into target/mdbook if it is missing, and exit")
    args = ap.parse_args()
    if args.install_mdbook:
        say(f"mdBook: {mdbook()}")
        return 0
    started = time.time()
    try:
        check_sources_linked()
        diagrams = check_diagrams(args.render)
        build()
        links = check_links()
        shots = check_screenshots()
        say(f"built into {BUILD.relative_to(ROOT)}: {links} internal links resolve, {diagrams} diagrams current, "
            f"{shots} screenshots drawn")
        ran = skipped = 0
        if not args.no_run:
            ran, skipped = run_blocks(chapters(), args.only)
    except Failure as e:
        say(f"FAILED — {e}")
        return 1
    print(f"book: OK — built, links and diagrams checked, {ran} blocks ran, {skipped} skipped with their reason "
          f"({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
