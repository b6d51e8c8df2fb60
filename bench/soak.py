#!/usr/bin/env python3
"""Soak test of the recorder: `memleak record -p` of bench/steady.c at a
steady rate for a long time, sampling the recorder's RSS; prints the rate,
RSS over time, lost events and the trace's files, and fails if RSS grows
or events are lost.

    sudo bench/soak.py [--seconds 600] [--pairs 120000] [--memleak target/release/memleak]

Not part of the test suite (it takes ten minutes); docs/benchmarks.md
has its latest figures.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--pairs", type=int, default=120000, help="malloc+free pairs per second")
    ap.add_argument("--memleak", default=os.path.join(ROOT, "target/release/memleak"))
    ap.add_argument("--sample", type=float, default=10.0, help="seconds between RSS samples")
    a = ap.parse_args()

    work = tempfile.mkdtemp(prefix="memleak-soak-")
    steady = os.path.join(work, "steady")
    subprocess.run(["cc", "-O2", "-o", steady, os.path.join(ROOT, "bench/steady.c")], check=True)
    trace = os.path.join(work, "soak.parquet")
    load = subprocess.Popen([steady, str(a.pairs), str(a.seconds + 30)])
    rec = subprocess.Popen([a.memleak, "record", "-q", "-p", str(load.pid), "-o", trace])
    t0 = time.monotonic()
    samples = []
    try:
        while time.monotonic() - t0 < a.seconds:
            time.sleep(a.sample)
            samples.append((round(time.monotonic() - t0), rss_kib(rec.pid)))
            print(f"{samples[-1][0]:>5} s  recorder RSS {samples[-1][1] / 1024:.1f} MiB", flush=True)
    finally:
        rec.send_signal(signal.SIGINT)
        rec.wait()
        load.kill()
        load.wait()
    with open(os.path.join(trace, "meta.json")) as f:
        meta = json.load(f)
    events = sum(meta["counters"]["events"].values())
    lost = sum(meta["counters"]["lost"].values())
    secs = (meta["end_ns"] - meta["start_ns"]) / 1e9
    files = sum(len(fs) for _, _, fs in os.walk(trace))
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(trace) for f in fs)
    # After the first minute (buffers and caches fill), RSS must stay flat.
    settled = [r for t, r in samples if t >= 60] or [r for _, r in samples]
    growth = (max(settled) - min(settled)) / 1024
    print(json.dumps({
        "seconds": round(secs, 1),
        "events": events,
        "events_per_s": round(events / secs),
        "lost": meta["counters"]["lost"],
        "rss_mib_first": round(samples[0][1] / 1024, 1) if samples else None,
        "rss_mib_settled_min": round(min(settled) / 1024, 1) if settled else None,
        "rss_mib_settled_max": round(max(settled) / 1024, 1) if settled else None,
        "files": files,
        "bytes": size,
        "bytes_per_event": round(size / max(events, 1), 3),
        "recorder_cpu_s": meta.get("recorder_cpu_ns", 0) / 1e9,
    }, indent=1))
    # The rate counts from the recorder's start, before its probes are in.
    rate_ok = events / secs >= 2 * a.pairs * 0.9
    ok = lost == 0 and growth <= 8.0 and rate_ok
    if not ok:
        print(f"soak: FAILED (lost {lost}, RSS grew {growth:.1f} MiB after the first minute, "
              f"{events / secs:.0f} events/s for {2 * a.pairs} wanted)", file=sys.stderr)
    subprocess.run(["rm", "-rf", work])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
