#!/usr/bin/env python3
"""Recorder overhead benchmark (docs/benchmarks.md).

Workload: bench/alloc_pairs.c, PAIRS malloc(32)+free pairs plus LEAKS blocks
leaked through a three-deep chain. In one run, alternating ROUNDS times:
  bare        the workload alone
  floor       `memleak record --count-only`: the same probes at the same
              places, only counting hits (no state, event, stack or ring)
  record      `memleak record` writing a trace
Reports the median µs per pair of each, the ratios, lost events, and the
recorder's own CPU per event (consumer + Parquet + symbolization).

usage: bench/record_overhead.py [--pairs N] [--leaks N] [--rounds N]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=2_000_000)
    ap.add_argument("--leaks", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--memleak", default=os.path.join(ROOT, "target/release/memleak"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="memleak-bench-")
    exe = os.path.join(tmp, "alloc_pairs")
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", exe,
                    os.path.join(ROOT, "bench/alloc_pairs.c")], check=True)
    args = [exe, str(a.pairs), str(a.leaks)]
    trace = os.path.join(tmp, "t.parquet")
    res = {"bare": [], "floor": [], "record": []}
    cpu, lost, events = [], [], []
    for _ in range(a.rounds):
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
        res["bare"].append(int(out) / a.pairs / 1000)
        out = subprocess.run([a.memleak, "record", "-q", "--count-only", "--force", "-o", trace, "--"] + args,
                             check=True, capture_output=True, text=True).stdout
        res["floor"].append(int(out) / a.pairs / 1000)
        out = subprocess.run([a.memleak, "record", "-q", "--force", "-o", trace, "--"] + args,
                             check=True, capture_output=True, text=True).stdout
        res["record"].append(int(out) / a.pairs / 1000)
        meta = json.load(open(os.path.join(trace, "meta.json")))
        n = sum(meta["counters"]["events"].values())
        events.append(n)
        lost.append(sum(meta["counters"]["lost"].values()))
        cpu.append(meta["recorder_cpu_ns"] / n)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"workload: {a.pairs} malloc(32)+free pairs + {a.leaks} leaks, {a.rounds} rounds, median")
    print("| mode | µs per pair | × bare | × floor |")
    print("|---|---|---|---|")
    for k in ("bare", "floor", "record"):
        print(f"| {k} | {med[k]:.3f} | {med[k]/med['bare']:.0f} | {med[k]/med['floor']:.2f} |")
    print(f"events per run: {events[0]}; lost: {max(lost)}; recorder CPU per event: "
          f"{statistics.median(cpu):.0f} ns (min {min(cpu):.0f}, max {max(cpu):.0f})")

if __name__ == "__main__":
    sys.exit(main())
