#!/usr/bin/env python3
"""Recorder overhead benchmark (docs/benchmarks.md).

Workload: bench/alloc_pairs.c, PAIRS malloc(32)+free pairs plus LEAKS blocks
leaked through a three-deep call chain, DEPTH frames below main. In one
run, alternating ROUNDS times:
  bare        the workload alone
  floor       `memleak record --count-only`: the same probes at the same
              places, only counting hits (no state, event, stack or ring)
  record      `memleak record` writing a trace
Reports the median µs per pair of each, by the workload thread's CPU time
(user + system: the probes run in the thread and are charged to it, time
spent preempted by other work on the machine is not) and by wall time, the
ratios, lost events, and the recorder's own CPU per event (consumer +
Parquet + symbolization).

BPF run-time statistics (kernel.bpf_stats_enabled) add two clock reads to
every program run, floor and record alike, which flatters the ratio; they
are switched off for the run and restored after.

usage: bench/record_overhead.py [--pairs N] [--leaks N] [--depth N] [--rounds N]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=2_000_000)
    ap.add_argument("--leaks", type=int, default=2000)
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--memleak", default=os.path.join(ROOT, "target/release/memleak"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="memleak-bench-")
    exe = os.path.join(tmp, "alloc_pairs")
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", exe,
                    os.path.join(ROOT, "bench/alloc_pairs.c")], check=True)
    args = [exe, str(a.pairs), str(a.leaks), str(a.depth)]
    stats = "/proc/sys/kernel/bpf_stats_enabled"
    saved = open(stats).read().strip()
    try:
        open(stats, "w").write("0")
        run(a, args, tmp)
    finally:
        open(stats, "w").write(saved)


def run(a, args, tmp):
    trace = os.path.join(tmp, "t.parquet")
    cpu_us = {"bare": [], "floor": [], "record": []}
    wall_us = {"bare": [], "floor": [], "record": []}
    cpu, lost, events = [], [], []

    def timed(mode, cmd):
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()
        wall_us[mode].append(int(out[0]) / a.pairs / 1000)
        cpu_us[mode].append(int(out[1]) / a.pairs / 1000)

    for _ in range(a.rounds):
        timed("bare", args)
        timed("floor", [a.memleak, "record", "-q", "--count-only", "--force", "-o", trace, "--"] + args)
        timed("record", [a.memleak, "record", "-q", "--force", "-o", trace, "--"] + args)
        meta = json.load(open(os.path.join(trace, "meta.json")))
        n = sum(meta["counters"]["events"].values())
        events.append(n)
        lost.append(sum(meta["counters"]["lost"].values()))
        cpu.append(meta["recorder_cpu_ns"] / n)
    print(f"workload: {a.pairs} malloc(32)+free pairs + {a.leaks} leaks, {a.depth} frames deep, "
          f"{a.rounds} rounds, median")
    print("| mode | µs per pair (thread CPU) | × floor | µs per pair (wall) | × floor |")
    print("|---|---|---|---|---|")
    mc = {k: statistics.median(v) for k, v in cpu_us.items()}
    mw = {k: statistics.median(v) for k, v in wall_us.items()}
    print(f"| bare | {mc['bare']:.3f} | – | {mw['bare']:.3f} | – |")
    for k in ("floor", "record"):
        print(f"| {k} | {mc[k]:.3f} | {mc[k]/mc['floor']:.2f} | {mw[k]:.3f} | {mw[k]/mw['floor']:.2f} |")
    print(f"events per run: {events[0]}; lost: {max(lost)}; recorder CPU per event: "
          f"{statistics.median(cpu):.0f} ns (min {min(cpu):.0f}, max {max(cpu):.0f})")


if __name__ == "__main__":
    sys.exit(main())
