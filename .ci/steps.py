#!/usr/bin/env python3
"""Passes the test command's output through unchanged and times its steps.

    cargo test ... 2>&1 | python3 .ci/steps.py ROWS_FILE

A step starts at a line that names one — cargo's `Running <test binary>`
and `Doc-tests <crate>`, and the `step: <name>` lines tests/smoke.sh
prints — and ends where the next starts; what comes before the first is
the build. Each step's wall time is appended to ROWS_FILE as
`<seconds>\t<name>`, for .ci/run's table. Standard library only.
"""

import re
import sys
import time

RUNNING = re.compile(r"^\s+Running (?:unittests )?(\S+)(?: \(.*/([^/]+?)-[0-9a-f]+\))?")
DOC_TESTS = re.compile(r"^\s+Doc-tests (\S+)")
STEP = re.compile(r"^step: (.+)$")


def name_of(line):
    """The step `line` starts, or None."""
    if m := RUNNING.match(line):
        # `src/lib.rs` is in every crate: the binary's name says which.
        return f"test {m.group(1)} ({m.group(2)})" if m.group(2) else "test " + m.group(1)
    if m := DOC_TESTS.match(line):
        return "doc-tests " + m.group(1)
    if m := STEP.match(line):
        return m.group(1)
    return None


def main():
    rows = open(sys.argv[1], "a", encoding="utf-8")
    step, since = "build (cargo test --all-targets)", time.monotonic()
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        name = name_of(line.rstrip("\n"))
        if name is not None:
            now = time.monotonic()
            rows.write(f"{now - since:.0f}\t{step}\n")
            step, since = name, now
    rows.write(f"{time.monotonic() - since:.0f}\t{step}\n")


if __name__ == "__main__":
    main()
