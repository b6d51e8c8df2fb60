#!/usr/bin/env python3
"""Benchmark the analysis of a fleet: many hosts, one program, 3 leaking.

Generates (unless it exists) a Hive-style dataset ROOT/host=hNNN/trace=1/
of --hosts synthetic traces (crates/analyze/examples/gen_trace.rs), one
per host, all of one program: the same stacks, in two builds whose
addresses differ (odd hosts are shifted), each host with its own events.
Three hosts (LEAKY) also leak from one more stack, `fleet_leak`. Then runs
every engine of ENGINES over ROOT, each in its own process, and reports
wall time, CPU time, peak RSS and load average; checks that every engine
gives the same outstanding bytes and count per stack (matched by
symbolized frames: memleak's `key`, see docs/json.md) and per host, and
that the 3 leaky hosts are found.

    cargo build --release --no-default-features
    cargo build --release -p memleak-analyze --example gen_trace
    python3 crates/analyze/bench/fleet.py [--hosts 200] [--events 300000] [--engines memleak,duckdb]

The engines: `memleak analyze ROOT --group-by host`, and the statement
`memleak sql --group-by host ROOT` prints, run on DuckDB (python module)
and on Spark in local mode (pyspark, with Java; its wall time includes
starting Spark). Each gives the outstanding bytes and count per stack
(keyed by memleak's stack key, which the SQL writes too) and per host; the
first engine is the reference the others are checked against.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))



def leaky(hosts):
    """The indices of the hosts that leak from `fleet_leak`: 17, 101 and
    163 of 200."""
    return sorted({hosts * 17 // 200, hosts * 101 // 200, hosts * 163 // 200})


@dataclass
class Result:
    """What one engine made of the dataset, and what it cost."""
    engine: str
    wall: float = 0.0
    cpu: float = 0.0
    rss_mib: float = 0.0
    load: tuple = ()
    # stack key -> (bytes, count)
    stacks: dict = field(default_factory=dict)
    # host -> (bytes, count)
    hosts: dict = field(default_factory=dict)


def timed(cmd, stdout=subprocess.DEVNULL):
    """Runs cmd in its own process; returns (wall s, user+sys s, peak RSS MiB)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=stdout)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    if status != 0:
        sys.exit(f"failed ({status}): {' '.join(cmd)}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def generate(a, root):
    """Writes the dataset, host by host; returns the events written."""
    events = 0
    for i in range(a.hosts):
        host = f"h{i:03d}"
        out = os.path.join(root, f"host={host}", "trace=1")
        if os.path.exists(os.path.join(out, "meta.json")):
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = [a.gen, "--events", str(a.events), "--out", out, "--host", host,
               "--command", "app --serve", "--program-seed", "7", "--seed", str(1000 + i),
               "--threads", "16", "--working-set", "32", "--leak-fraction", "0.001",
               "--max-leaked", "500"]
        if i % 2:
            # Another build: every user frame elsewhere, same functions and lines.
            cmd += ["--addr-shift", str(0x10000), "--build-id", "b2"]
        if i in leaky(a.hosts):
            cmd += ["--fleet-leak", str(a.fleet_leak)]
        subprocess.run(["nice", "-n", "10"] + cmd, check=True, stderr=subprocess.DEVNULL)
        events += a.events
    return events


def stack_key(frames, kernel=False, truncated=False):
    """memleak's key of a stack (docs/json.md, `memleak diff`): each frame
    `function @ file:line` (file's base name), or `[object+0xoffset]`
    without a function; ` | ` between frames. Clone suffixes (`.isra.0`)
    are not removed here: SQL engines should give the names as the
    frames table has them, which for generated traces have none."""
    parts = []
    if kernel:
        parts.append("[kernel]")
    if truncated:
        parts.append("[truncated]")
    for f in frames:
        if f.get("function") is not None:
            k = f["function"]
            if f.get("file") is not None:
                k += " @ " + f["file"].rsplit("/", 1)[-1]
                if f.get("line") is not None:
                    k += f":{f['line']}"
        elif f.get("path") is not None:
            k = "[" + f["path"].rsplit("/", 1)[-1]
            if f.get("file_offset") is not None:
                k += f"+0x{f['file_offset']:x}"
            k += "]"
        else:
            k = "[unknown]"
        for inl in f.get("inlined", []):
            k += " <- " + inl["function"]
            if inl.get("file") is not None:
                k += " @ " + inl["file"].rsplit("/", 1)[-1]
                if inl.get("line") is not None:
                    k += f":{inl['line']}"
        parts.append(k)
    return " | ".join(parts) if frames else " | ".join(parts + ["[no stack]"])


def run_memleak(a, root):
    out = os.path.join(a.dir, "memleak.json")
    before = os.getloadavg()
    wall, cpu, rss = timed([a.memleak, "analyze", root, "--format", "json", "-T", "0", "-q",
                            "-j", str(a.threads), "--group-by", "host", "-o", out])
    r = Result("memleak analyze ROOT", wall, cpu, rss, (before, os.getloadavg()))
    report = json.load(open(out))
    for s in report["stacks"]:
        # The key memleak gives, checked against the one built here
        # (what the SQL engines' rows are keyed by).
        if s["frames"]:
            assert s["key"] == stack_key(s["frames"], s["kernel"], s["truncated"]), s["key"]
        r.stacks[s["key"]] = (s["bytes"], s["count"])
    r.hosts = {g["group"]: (g["bytes"], g["count"]) for g in report["groups"]}
    r.report = report
    return r


def run_sql(a, root, dialect, python, name):
    """The SQL of `memleak sql --dialect DIALECT --group-by host ROOT`,
    run by tests/python/fleet_sql.py on `python`: per stack and per host
    from its rows (host, frames = memleak's stack key, bytes, count)."""
    if python is None:
        print(f"{name}: skipped (no python with it)", file=sys.stderr)
        return None
    sql = os.path.join(a.dir, f"{dialect}.sql")
    with open(sql, "w") as f:
        subprocess.run([a.memleak, "sql", "--dialect", dialect, "--group-by", "host", root],
                       stdout=f, check=True)
    out = os.path.join(a.dir, f"{dialect}.json")
    before = os.getloadavg()
    with open(out, "w") as f:
        wall, cpu, rss = timed([python, os.path.join(ROOT, "tests/python/fleet_sql.py"),
                                dialect, sql], stdout=f)
    r = Result(name, wall, cpu, rss, (before, os.getloadavg()))
    for row in json.load(open(out)):
        for d, k in ((r.stacks, row["frames"]), (r.hosts, row["host"])):
            b, c = d.get(k, (0, 0))
            d[k] = (b + row["bytes"], c + row["count"])
    return r


def has_module(python, module):
    ok = subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0
    return python if ok else None


def run_duckdb(a, root):
    return run_sql(a, root, "duckdb", has_module("python3", "duckdb"), "DuckDB (memleak sql)")


def run_spark(a, root):
    return run_sql(a, root, "spark", has_module(a.spark_python, "pyspark"),
                   "Spark local[2] (memleak sql)")


ENGINES = {"memleak": run_memleak, "duckdb": run_duckdb, "spark": run_spark}


def check_same(results):
    """Every engine's per-stack and per-host figures equal the first's."""
    ref = results[0]
    ok = True
    for r in results[1:]:
        for what in ("stacks", "hosts"):
            mine, theirs = getattr(ref, what), getattr(r, what)
            if mine != theirs:
                ok = False
                diff = sorted(set(mine.items()) ^ set(theirs.items()))[:5]
                print(f"MISMATCH {r.engine} vs {ref.engine} by {what}: {len(theirs)} vs "
                      f"{len(mine)}; e.g. {diff}", file=sys.stderr)
    return ok


def check_leaky(ref, hosts):
    """The 3 leaky hosts hold the most, and only they hold `fleet_leak`."""
    want = {f"h{i:03d}" for i in leaky(hosts)}
    top = sorted(ref.hosts, key=lambda h: -ref.hosts[h][0])[:len(want)]
    leak = [s for s in ref.report["stacks"] if s["frames"][0]["function"] == "fleet_leak"]
    holders = {g["group"] for s in leak for g in s["groups"]}
    found = set(top) == want and holders == want
    if not found:
        print(f"LEAKY HOSTS: want {sorted(want)}, top by bytes {top}, fleet_leak on "
              f"{sorted(holders)}", file=sys.stderr)
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=200)
    ap.add_argument("--events", type=int, default=50_000, help="events per host")
    ap.add_argument("--fleet-leak", type=float, default=0.1,
                    help="fraction of the leaky hosts' blocks leaked from fleet_leak")
    ap.add_argument("--dir", default="/tmp/mlfleet")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the dataset afterwards")
    ap.add_argument("--memleak", default=os.path.join(ROOT, "target/release/memleak"))
    ap.add_argument("--gen", default=os.path.join(ROOT, "target/release/examples/gen_trace"))
    ap.add_argument("--spark-python", default="/opt/memleak-spark/bin/python",
                    help="a python with pyspark (scripts/setup.sh installs it there)")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help="which engines to run, comma-separated (memleak first: the reference); "
                         "--engines memleak,duckdb skips Spark")
    a = ap.parse_args()
    engines = a.engines.split(",")
    if engines[0] != "memleak" or any(e not in ENGINES for e in engines):
        sys.exit(f"--engines: memleak first, then any of {', '.join(ENGINES)}")
    if len(leaky(a.hosts)) < 3:
        sys.exit("--hosts: at least 8")
    root = os.path.join(a.dir, f"fleet-{a.hosts}x{a.events}")
    os.makedirs(root, exist_ok=True)
    t = time.perf_counter()
    generate(a, root)
    print(f"dataset {root}: {a.hosts} hosts, generated in {time.perf_counter() - t:.1f}s",
          file=sys.stderr)
    results = [r for r in (ENGINES[e](a, root) for e in engines) if r is not None]
    same = check_same(results)
    found = check_leaky(results[0], a.hosts)
    events = results[0].report["summary"]["events"]
    print("| engine | hosts | events | wall | CPU s | peak RSS | load avg (1 min) before, after "
          "| same per-stack bytes/counts | 3 leaky hosts found |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r.engine} | {a.hosts} | {events:,} | {r.wall:.2f} s | {r.cpu:.2f} | "
              f"{r.rss_mib:.0f} MiB | {r.load[0][0]:.2f}, {r.load[1][0]:.2f} | "
              f"{'yes' if same else 'NO'} ({len(r.stacks)} stacks) | "
              f"{'yes' if found else 'NO'} |", flush=True)
    if not a.keep:
        shutil.rmtree(root)
    sys.exit(0 if same and found else 1)


if __name__ == "__main__":
    main()
