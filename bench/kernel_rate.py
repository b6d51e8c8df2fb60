#!/usr/bin/env python3
"""Kernel allocation recording: event rate, recorder cost, losses
(docs/benchmarks.md, "Kernel allocations").

Modes, each run ROUNDS times (median reported):
  idle        `memleak record --kernel -d 5s`, nothing started by us: the
              machine's own background rate
  workload    `memleak record --kernel -- kernel_workload N 0`
              (fixtures/kernel_workload.c: open/close, socket/close,
              socketpair + 1 byte, pipe + 1 byte, N times)
  no-stacks   the same with --no-kernel-stacks
Recording is system-wide in every mode: the rate is of the whole machine
while the workload runs, not of the workload alone.

Per mode: events/s (events in meta.json over the trace's duration), the
recorder's CPU per event (meta.json recorder_cpu_ns / events: consumer,
Parquet, symbolization; the BPF programs run in the allocating tasks and
are not in it), events lost as the recorder counts them (meta.json lost:
ring full, stack failures), and kernel-side misses the recorder does not
count: `recursion_misses` of its tracepoint programs (the kernel skips a
program that fires while another BPF program runs on that CPU), read with
bpftool while the recorder runs (a lower bound: the last sample is up to
100 ms before the end). The workload's own wall time, bare and recorded,
gives the slowdown.

usage: bench/kernel_rate.py [--iterations N] [--idle-seconds S] [--rounds N]
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_PROGS = ("on_kmalloc", "on_kfree", "on_kmem_cache_alloc", "on_kmem_cache_free",
                "on_page_alloc", "on_page_free", "on_percpu_alloc", "on_percpu_free")


def prog_ids(pid):
    """Ids of the BPF programs `pid` holds open (from /proc/PID/fdinfo)."""
    ids = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return ids
    for fd in fds:
        try:
            for line in open(f"/proc/{pid}/fdinfo/{fd}"):
                if line.startswith("prog_id:"):
                    ids.add(int(line.split()[1]))
        except OSError:
            pass
    return ids


def recursion_misses(pid):
    """Sum of recursion_misses over the kernel programs `pid` has loaded."""
    ids = prog_ids(pid)
    if not ids or not shutil.which("bpftool"):
        return None
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True)
    try:
        progs = json.loads(out.stdout or "[]")
    except json.JSONDecodeError:
        return None
    total, found = 0, False
    for p in progs:
        if p.get("id") in ids and p.get("name") in KERNEL_PROGS:
            found = True
            total += p.get("recursion_misses", 0)
    return total if found else None


def record(cmd):
    """Runs a recorder command to completion, sampling its programs' misses."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    misses = None
    while proc.poll() is None:
        m = recursion_misses(proc.pid)
        if m is not None:
            misses = m
        time.sleep(0.1)
    err = proc.stderr.read()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err}")
    return misses


def measure(cmd, trace):
    misses = record(cmd)
    meta = json.load(open(os.path.join(trace, "meta.json")))
    events = sum(v for k, v in meta["counters"]["events"].items()
                 if k not in ("exec", "exit", "fork"))
    secs = (meta["end_ns"] - meta["start_ns"]) / 1e9
    return {
        "events": events,
        "secs": secs,
        "rate": events / secs,
        "cpu_ns": meta["recorder_cpu_ns"] / max(events, 1),
        "cpu_pct": meta["recorder_cpu_ns"] / 1e9 / secs * 100,
        "lost": sum(meta["counters"]["lost"].values()),
        "misses": misses,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=10_000)
    ap.add_argument("--idle-seconds", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memleak", default=os.path.join(ROOT, "target/release/memleak"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    tmp = tempfile.mkdtemp(prefix="memleak-kbench-")
    exe = os.path.join(tmp, "kernel_workload")
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-I", os.path.join(ROOT, "fixtures"),
                    "-o", exe, os.path.join(ROOT, "fixtures/kernel_workload.c")], check=True)
    trace = os.path.join(tmp, "t.parquet")
    base = [a.memleak, "record", "--kernel", "-q", "--force", "-o", trace]
    work = ["--", exe, str(a.iterations), "0"]
    modes = {
        "idle": base + ["-d", f"{a.idle_seconds}s"],
        "workload": base + work,
        "no-stacks": base + ["--no-kernel-stacks"] + work,
    }
    res = {m: [] for m in modes}
    bare = []
    for _ in range(a.rounds):
        t0 = time.monotonic()
        subprocess.run([exe, str(a.iterations), "0"], check=True)
        bare.append(time.monotonic() - t0)
        for m, cmd in modes.items():
            res[m].append(measure(cmd, trace))

    def med(m, k):
        vals = [r[k] for r in res[m] if r[k] is not None]
        return statistics.median(vals) if vals else None

    print(f"{os.cpu_count()} CPUs, kernel {os.uname().release}; workload: {a.iterations} iterations; "
          f"{a.rounds} rounds, median (lost and misses: max)")
    print("| mode | events | seconds | events/s | recorder CPU/event | recorder CPU | lost (recorder) | recursion misses |")
    print("|---|---|---|---|---|---|---|---|")
    for m in modes:
        misses = [r["misses"] for r in res[m] if r["misses"] is not None]
        print(f"| {m} | {med(m, 'events'):.0f} | {med(m, 'secs'):.2f} | {med(m, 'rate'):,.0f} "
              f"| {med(m, 'cpu_ns'):,.0f} ns | {med(m, 'cpu_pct'):.0f}% "
              f"| {max(r['lost'] for r in res[m])} | {max(misses) if misses else 'n/a'} |")
    b = statistics.median(bare)
    print(f"\nworkload wall time: bare {b:.2f}s, recorded {med('workload', 'secs'):.2f}s "
          f"(×{med('workload', 'secs') / b:.1f}), without stacks {med('no-stacks', 'secs'):.2f}s "
          f"(×{med('no-stacks', 'secs') / b:.1f})")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
