#!/usr/bin/env python3
"""Benchmark `memleak analyze` against DuckDB on synthetic traces.

For each size: generate the trace (crates/analyze/examples/gen_trace.rs)
unless it exists, run `memleak analyze --format json -T 0` and a DuckDB
query computing outstanding bytes per stack over the same Parquet files,
each in its own process (for peak RSS), best wall time of --reps runs,
and check that both give the same bytes and counts for every stack.

    cargo build --release --no-default-features
    cargo build --release -p memleak-analyze --example gen_trace
    python3 crates/analyze/bench/bench.py --events 10000000 100000000

Prints a Markdown table row per trace for docs/benchmarks.md.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

# Outstanding bytes per stack, in SQL. The last operation on each key
# decides: an allocation that is the last operation on its address is
# outstanding. Kernel slab/per-CPU addresses are one address space (key
# -1), pages another (-2); user addresses are per process. realloc is a
# free of old_addr and an allocation of addr at the same instant (the free
# ordered first: ts*2 < ts*2+1). The generator's mmaps are unmapped whole,
# so they pair by start address like heap blocks.
SQL = """
WITH ev AS (
  SELECT ts_ns, pid, kind::VARCHAR AS kind, addr, size, old_addr, stack_id
  FROM read_parquet('{glob}')
), ops AS (
  SELECT CASE WHEN kind IN ('kmalloc', 'kmem_cache_alloc', 'percpu_alloc') THEN -1
              WHEN kind = 'page_alloc' THEN -2 ELSE pid END AS k,
         addr AS a, ts_ns * 2 + 1 AS o, size, stack_id
  FROM ev
  WHERE kind IN ('malloc', 'calloc', 'posix_memalign', 'memalign', 'aligned_alloc', 'valloc',
                 'pvalloc', 'new', 'new[]', 'mmap', 'kmalloc', 'kmem_cache_alloc',
                 'page_alloc', 'percpu_alloc') AND addr <> 0
  UNION ALL
  SELECT CASE WHEN kind IN ('kfree', 'kmem_cache_free', 'percpu_free') THEN -1
              WHEN kind = 'page_free' THEN -2 ELSE pid END,
         addr, ts_ns * 2, NULL, NULL
  FROM ev
  WHERE kind IN ('free', 'delete', 'delete[]', 'munmap', 'kfree', 'kmem_cache_free',
                 'page_free', 'percpu_free') AND addr <> 0
  UNION ALL
  SELECT pid, old_addr, ts_ns * 2, NULL, NULL
  FROM ev
  WHERE kind IN ('realloc', 'reallocarray') AND old_addr IS NOT NULL AND NOT (addr = 0 AND size > 0)
  UNION ALL
  SELECT pid, addr, ts_ns * 2 + 1, size, stack_id
  FROM ev WHERE kind IN ('realloc', 'reallocarray') AND addr <> 0
), last AS (
  SELECT arg_max(size, o) AS size, arg_max(stack_id, o) AS stack_id, max(o) % 2 AS is_alloc
  FROM ops GROUP BY k, a
)
SELECT coalesce(stack_id, 0) AS stack_id, sum(size)::UBIGINT AS bytes, count(*) AS count
FROM last WHERE is_alloc = 1 GROUP BY 1
"""

DUCKDB_CHILD = """
import duckdb, json, sys
con = duckdb.connect()
con.execute("SET threads = {threads}")
rows = con.execute(sys.argv[1]).fetchall()
json.dump([[int(s), int(b), int(c)] for s, b, c in rows], open(sys.argv[2], "w"))
"""


def run(cmd):
    """Runs cmd; returns (wall seconds, peak RSS in MiB, user+sys seconds)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    if status != 0:
        sys.exit(f"failed ({status}): {' '.join(cmd)}")
    return wall, ru.ru_maxrss / 1024, ru.ru_utime + ru.ru_stime


def best(cmd, reps):
    runs = [run(cmd) for _ in range(reps)]
    wall = min(r[0] for r in runs)
    return wall, max(r[1] for r in runs), min(r[2] for r in runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, nargs="+", default=[10_000_000])
    ap.add_argument("--dir", default="/tmp/mlbench")
    ap.add_argument("--max-leaked", type=int, default=None,
                    help="cap on leaked blocks (fixed outstanding set)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--memleak", default=os.path.join(ROOT, "target/release/memleak"))
    ap.add_argument("--gen", default=os.path.join(ROOT, "target/release/examples/gen_trace"))
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    print("| trace | events | outstanding | memleak wall | events/s | CPU s | peak RSS | "
          "DuckDB wall | DuckDB RSS | speedup | same numbers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in a.events:
        tag = f"{n // 1_000_000}m" + (f"-cap{a.max_leaked}" if a.max_leaked is not None else "")
        trace = os.path.join(a.dir, f"bench-{tag}.parquet")
        if not os.path.exists(os.path.join(trace, "meta.json")):
            cmd = [a.gen, "--events", str(n), "--out", trace]
            if a.max_leaked is not None:
                cmd += ["--max-leaked", str(a.max_leaked)]
            subprocess.run(cmd, check=True)
        out = os.path.join(a.dir, f"bench-{tag}.json")
        ours = best([a.memleak, "analyze", trace, "--format", "json", "-T", "0", "-q",
                     "-j", str(a.threads), "-o", out], a.reps)
        dout = os.path.join(a.dir, f"bench-{tag}.duckdb.json")
        sql = SQL.format(glob=os.path.join(trace, "events", "*.parquet"))
        duck = best([sys.executable, "-c", DUCKDB_CHILD.format(threads=a.threads), sql, dout], a.reps)

        report = json.load(open(out))
        mine = {s["stack_id"]: (s["bytes"], s["count"]) for s in report["stacks"]}
        theirs = {s: (b, c) for s, b, c in json.load(open(dout))}
        same = mine == theirs
        if not same:
            diff = sorted(set(mine.items()) ^ set(theirs.items()))[:5]
            print(f"MISMATCH on {tag}: {len(mine)} vs {len(theirs)} stacks; e.g. {diff}", file=sys.stderr)
        summ = report["summary"]
        print(f"| {tag} | {summ['events']:,} | {summ['outstanding_allocations']:,} blocks, "
              f"{summ['outstanding_bytes'] / 2**20:,.0f} MiB | {ours[0]:.2f} s | "
              f"{summ['events'] / ours[0] / 1e6:.1f} M | {ours[2]:.2f} | {ours[1]:.0f} MiB | "
              f"{duck[0]:.2f} s | {duck[1]:.0f} MiB | {duck[0] / ours[0]:.2f}x | "
              f"{'yes' if same else 'NO'} ({len(mine)} stacks) |", flush=True)


if __name__ == "__main__":
    main()
