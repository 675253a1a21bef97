#!/usr/bin/env python3
"""What one durable write costs on this machine's disk, appending against
writing over blocks the file already has (the embedded store's log keeps a
spare segment to write over: BENCHMARKS.md, "The store's log").

Each mode writes `--commits` times `--bytes` and fdatasyncs after each, in
a file under `--dir`, twice, alternating; prints wall and process CPU time
per commit (CPU from os.times(): 10 ms ticks, so read it to ~10 µs over
2 000 commits)."""

import argparse
import os
import time


def run(mode, directory, commits, size):
    path = os.path.join(directory, "pacpriv-fsync-bench.bin")
    if os.path.exists(path):
        os.remove(path)
    flags = os.O_CREAT | os.O_WRONLY | (os.O_APPEND if mode == "append" else 0)
    fd = os.open(path, flags)
    block = b"x" * size
    try:
        if mode == "overwrite":
            os.write(fd, b"\0" * (size * commits))
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        t0, w0 = os.times(), time.monotonic()
        for _ in range(commits):
            os.write(fd, block)
            os.fdatasync(fd)
        t1, w1 = os.times(), time.monotonic()
    finally:
        os.close(fd)
        os.remove(path)
    cpu = (t1.user - t0.user) + (t1.system - t0.system)
    print(f"| {mode} | {(w1 - w0) / commits * 1e6:.1f} | {cpu / commits * 1e6:.1f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dir", default=".")
    p.add_argument("--commits", type=int, default=2000)
    p.add_argument("--bytes", type=int, default=16384)
    a = p.parse_args()
    print("| mode | wall µs per commit | process CPU µs per commit |")
    print("|---|---:|---:|")
    for mode in ["append", "overwrite", "append", "overwrite"]:
        run(mode, a.dir, a.commits, a.bytes)


if __name__ == "__main__":
    main()
