#!/usr/bin/env python3
"""Recorder overhead benchmark (docs/benchmarks.md).

Workload: bench/alloc_pairs.c, PAIRS malloc(32)+free pairs plus LEAKS blocks
leaked through a three-deep call chain, DEPTH frames below main. In one
run, alternating ROUNDS times:
  bare        the workload alone
  floor       `memleak record --count-only`: the same probes at the same
              places, only counting hits (no state, event, stack or ring)
  record      `memleak record --capture bpf` writing a trace (the probes)
  preload     `memleak record --capture preload`: memleak's agent inside
              the workload (LD_PRELOAD), the same trace
  inject      `memleak record -p PID --capture inject`: the workload
              started first (ALLOC_PAIRS_WAIT), the agent loaded into it
              and its call sites patched, then the loop runs
  sample      (with --sample SIZE) `memleak record --sample SIZE`: the agent
              recording a byte-weighted sample of one allocation per SIZE
              bytes on average; the pairs it does not sample cost a
              countdown and a set lookup
  heaptrack   `heaptrack -o FILE` (Debian's heaptrack: an LD_PRELOAD hook),
              the peer a user would pick for this job
  valgrind    `valgrind --tool=memcheck --leak-check=full` (with --peers;
              slow, so it runs on PAIRS/VALGRIND_DIV pairs and is scaled)
Reports the median µs per pair of each (and ns above bare), by the workload thread's CPU time
(user + system: the probes run in the thread and are charged to it, time
spent preempted by other work on the machine is not) and by wall time, the
ratios to bare and to heaptrack, the end-to-end wall time and CPU of
every process of the command (recorder and heaptrack's writer included),
lost events, and the recorder's own CPU per event (consumer +
Parquet + symbolization).

BPF run-time statistics (kernel.bpf_stats_enabled) add two clock reads to
every program run, floor and record alike, which flatters the ratio; they
are switched off for the run and restored after.

With --threads N the workload runs N threads of PAIRS pairs each: the
thread figures are per thread, the end-to-end ones per pair of all.

usage: bench/record_overhead.py [--pairs N] [--leaks N] [--depth N] [--rounds N] [--threads N]
                                [--no-peers] [--valgrind] [--cflags "-O2 ..."]
                                [--unwind auto|fp|dwarf] [--memleak PATH] [--sample SIZE]
"""
import argparse, json, os, resource, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=2_000_000)
    ap.add_argument("--leaks", type=int, default=2000)
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--memleak", default=os.path.join(ROOT, "target/release/memleak"))
    ap.add_argument("--no-peers", action="store_true", help="skip heaptrack")
    ap.add_argument("--valgrind", action="store_true", help="also valgrind (slow)")
    ap.add_argument("--valgrind-div", type=int, default=20,
                    help="valgrind runs PAIRS/N pairs; its per-pair figures are per pair all the same")
    ap.add_argument("--cflags", default="-O2 -g -fno-omit-frame-pointer")
    ap.add_argument("--sample", default=None, metavar="SIZE",
                    help="also a `record --sample SIZE` row (e.g. 512k)")
    ap.add_argument("--unwind", default=None,
                    help="memleak record --unwind (auto, fp, dwarf); default: memleak's")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="memleak-bench-")
    exe = os.path.join(tmp, "alloc_pairs")
    subprocess.run(["gcc", "-pthread"] + a.cflags.split() + ["-o", exe,
                    os.path.join(ROOT, "bench/alloc_pairs.c")], check=True)
    args = [exe, str(a.pairs), str(a.leaks), str(a.depth), str(a.threads)]
    stats = "/proc/sys/kernel/bpf_stats_enabled"
    saved = open(stats).read().strip()
    try:
        open(stats, "w").write("0")
        run(a, args, tmp)
    finally:
        open(stats, "w").write(saved)


def run(a, args, tmp):
    trace = os.path.join(tmp, "t.parquet")
    modes = ["bare", "floor", "record", "preload", "inject"]
    recorded = ["record", "preload", "inject"]
    if a.sample:
        modes.append("sample")
        recorded.append("sample")
    peers = []
    if not a.no_peers and shutil.which("heaptrack"):
        peers.append("heaptrack")
    elif not a.no_peers:
        print("skipping heaptrack: not installed", file=sys.stderr)
    if a.valgrind and shutil.which("valgrind"):
        peers.append("valgrind")
    modes += peers
    cpu_us = {m: [] for m in modes}
    wall_us = {m: [] for m in modes}
    e2e_wall_us = {m: [] for m in modes}
    e2e_cpu_us = {m: [] for m in modes}
    cpu = {m: [] for m in recorded}
    lost = {m: [] for m in recorded}
    events = {m: [] for m in recorded}
    unwinds = []

    def timed(mode, cmd, pairs=a.pairs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        p = subprocess.run(cmd, check=True, capture_output=True, text=True)
        t1 = time.monotonic()
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # heaptrack prints its own lines on stdout: take the workload's.
        out = [l.split() for l in p.stdout.splitlines()
               if len(l.split()) == 2 and all(w.isdigit() for w in l.split())][-1]
        wall_us[mode].append(int(out[0]) / pairs / 1000)
        cpu_us[mode].append(int(out[1]) / pairs / 1000)
        total = pairs * a.threads
        e2e_wall_us[mode].append((t1 - t0) * 1e6 / total)
        used = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        e2e_cpu_us[mode].append(used * 1e6 / total)

    def timed_inject(cmd_args):
        """The workload started first, waiting; memleak attached with
        --capture inject; then the loop runs. End to end: from the go to
        the recorder's exit."""
        env = dict(os.environ, ALLOC_PAIRS_WAIT="1")
        w = subprocess.Popen(cmd_args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
        assert w.stdout.readline().strip() == "ready"
        m = subprocess.Popen([a.memleak, "record", "-v", "--force", "--capture", "inject",
                              "-p", str(w.pid), "-o", trace],
                             stderr=subprocess.PIPE, text=True)
        for line in m.stderr:
            if "call sites patched" in line:
                break
        else:
            raise SystemExit("memleak did not attach")
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        w.stdin.write("go\n")
        w.stdin.flush()
        out = w.stdout.read().split()
        w.wait()
        m.stderr.read()
        m.wait()
        t1 = time.monotonic()
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall_us["inject"].append(int(out[0]) / a.pairs / 1000)
        cpu_us["inject"].append(int(out[1]) / a.pairs / 1000)
        total = a.pairs * a.threads
        e2e_wall_us["inject"].append((t1 - t0) * 1e6 / total)
        used = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        e2e_cpu_us["inject"].append(used * 1e6 / total)

    ht = os.path.join(tmp, "heaptrack.out")
    for _ in range(a.rounds):
        timed("bare", args)
        timed("floor", [a.memleak, "record", "-q", "--count-only", "--force", "-o", trace, "--"] + args)
        unwind = ["--unwind", a.unwind] if a.unwind else []
        for mode in recorded:
            capture = "bpf" if mode == "record" else "preload"
            sample = ["--sample", a.sample] if mode == "sample" else []
            timed(mode, [a.memleak, "record", "-q", "--force", "--capture", capture] + unwind
                  + sample + ["-o", trace, "--"] + args)
            meta = json.load(open(os.path.join(trace, "meta.json")))
            n = sum(meta["counters"]["events"].values())
            events[mode].append(n)
            if mode == "record":
                unwinds.append(meta.get("unwind"))
            lost[mode].append(sum(v for k, v in meta["counters"]["lost"].items()
                                  if k != "failed_alloc"))
            cpu[mode].append(meta["recorder_cpu_ns"] / n)
        timed_inject(args)
        meta = json.load(open(os.path.join(trace, "meta.json")))
        n = sum(meta["counters"]["events"].values())
        lost["inject"].append(sum(v for k, v in meta["counters"]["lost"].items()
                                  if k != "failed_alloc"))
        cpu["inject"].append(meta["recorder_cpu_ns"] / n)
        if "heaptrack" in peers:
            for f in os.listdir(tmp):
                if f.startswith("heaptrack.out"):
                    os.remove(os.path.join(tmp, f))
            timed("heaptrack", ["heaptrack", "-o", ht] + args)
        if "valgrind" in peers:
            vp = max(a.pairs // a.valgrind_div, 1)
            vargs = [args[0], str(vp), str(max(a.leaks // a.valgrind_div, 0)), args[3], args[4]]
            timed("valgrind", ["valgrind", "-q", "--tool=memcheck", "--leak-check=full",
                               "--log-file=/dev/null"] + vargs, pairs=vp)
    print(f"workload: {a.threads} thread(s) x {a.pairs} malloc(32)+free pairs + {a.leaks} leaks, "
          f"{a.depth} frames deep, built with {a.cflags}, --unwind {a.unwind or 'default'}, "
          f"{a.rounds} rounds, median" + (f"; sample: --sample {a.sample}" if a.sample else ""))
    print("| mode | µs per pair (thread CPU) | ns above bare | × bare | × floor | × heaptrack "
          "| µs per pair (end-to-end wall) | µs per pair (CPU of all processes) |")
    print("|---|---|---|---|---|---|---|---|")
    mc = {k: statistics.median(v) for k, v in cpu_us.items()}
    ew = {k: statistics.median(v) for k, v in e2e_wall_us.items()}
    ec = {k: statistics.median(v) for k, v in e2e_cpu_us.items()}
    ref = mc.get("heaptrack")
    for k in modes:
        vs_ht = f"{mc[k]/ref:.2f}" if ref else "–"
        vs_floor = "–" if k == "bare" else f"{mc[k]/mc['floor']:.2f}"
        above = "–" if k == "bare" else f"{(mc[k] - mc['bare']) * 1000:+.1f}"
        print(f"| {k} | {mc[k]:.3f} | {above} | {mc[k]/mc['bare']:.1f} | {vs_floor} | {vs_ht} "
              f"| {ew[k]:.3f} | {ec[k]:.3f} |")
    for mode in recorded:
        c = cpu[mode]
        print(f"{mode}: events per run: {events[mode][0]}; lost: {max(lost[mode])}; recorder CPU "
              f"per event: {statistics.median(c):.0f} ns (min {min(c):.0f}, max {max(c):.0f})")
    print(f"stack walks (last run): {unwinds[-1]}")


if __name__ == "__main__":
    sys.exit(main())
