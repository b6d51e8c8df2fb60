#!/usr/bin/env python3
"""Cost of following many processes (docs/benchmarks.md).

Workloads:
  forks   fixtures/forks: 200 children, one after the other, each leaking
          a block and freeing a temporary, then exiting.
  shell   `sh -c` running /bin/true N times (a script, a build): each
          child forks and execs.
In one run, alternating ROUNDS times, the end-to-end wall time of:
  bare       the workload alone
  bpf        `memleak record --follow-forks --capture bpf`
  preload    `memleak record --follow-forks --capture preload`
  heaptrack  `heaptrack -o FILE` (its LD_PRELOAD hook reaches the children)
  valgrind   `valgrind --trace-children=yes --leak-check=full`
Prints the median of each and its ratio to bare and to heaptrack.

Usage: sudo bench/follow_forks.py [--rounds 3] [--programs 1000]
       [--memleak target/release/memleak]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env=None):
    t = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=env)
    return time.monotonic() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--programs", type=int, default=1000)
    ap.add_argument("--memleak", default=os.path.join(ROOT, "target/release/memleak"))
    a = ap.parse_args()
    forks = os.path.join(ROOT, "target/fixtures/forks")
    if not os.path.exists(forks):
        os.makedirs(os.path.dirname(forks), exist_ok=True)
        subprocess.run(["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-I",
                        os.path.join(ROOT, "fixtures"), "-o", forks,
                        os.path.join(ROOT, "fixtures/forks.c")], check=True)
    script = f"i=0; while [ $i -lt {a.programs} ]; do /bin/true; i=$((i+1)); done"
    workloads = {"forks (200 children)": [forks],
                 f"shell ({a.programs} programs)": ["sh", "-c", script]}
    tmp = tempfile.mkdtemp()
    trace = os.path.join(tmp, "t.parquet")

    def modes(cmd):
        def memleak(capture):
            def go():
                shutil.rmtree(trace, ignore_errors=True)
                return run([a.memleak, "record", "-q", "--follow-forks", "--capture",
                            capture, "-o", trace, "--"] + cmd)
            return go
        out = {"bare": lambda: run(cmd),
               "bpf": memleak("bpf"),
               "preload": memleak("preload")}
        if shutil.which("heaptrack"):
            out["heaptrack"] = lambda: run(["heaptrack", "-o", os.path.join(tmp, "ht")] + cmd)
        if shutil.which("valgrind"):
            out["valgrind"] = lambda: run(["valgrind", "-q", "--trace-children=yes",
                                           "--leak-check=full"] + cmd)
        return out

    for name, cmd in workloads.items():
        ms = modes(cmd)
        times = {m: [] for m in ms}
        for _ in range(a.rounds):
            for m, go in ms.items():
                times[m].append(go())
        med = {m: statistics.median(t) for m, t in times.items()}
        print(f"{name}: median of {a.rounds} rounds, wall s")
        for m, t in med.items():
            line = f"  {m:10s} {t:7.3f}  x bare {t / med['bare']:6.1f}"
            if "heaptrack" in med:
                line += f"  x heaptrack {t / med['heaptrack']:5.2f}"
            print(line)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
