#!/usr/bin/env python3
"""Reads a memleak trace with DuckDB and with pyarrow, and checks it against
the expectations the Rust test wrote.

    python3 tests/python/read_trace.py TRACE_DIR EXPECTED_JSON

Run by crates/trace/tests/external_readers.rs. Exits non-zero, naming every
mismatch, if either reader disagrees with what was written. Missing modules
are an error, not a skip: CI installs them (scripts/setup.sh).
"""

import glob
import json
import os
import sys

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

TABLES = ("events", "stacks", "frames", "maps")

failures = []


def check(reader, what, got, want):
    if got != want:
        failures.append(f"{reader}: {what}: got {got!r}, want {want!r}")


def files(trace, table):
    # Only closed segments: an unfinished one ends in .parquet.inprogress.
    return sorted(glob.glob(os.path.join(trace, table, "*.parquet")))


def with_duckdb(trace, exp):
    con = duckdb.connect()

    def q(sql, table):
        src = f"read_parquet('{os.path.join(trace, table)}/*.parquet')"
        return con.execute(sql.replace("@T", src)).fetchall()

    for table in TABLES:
        check("duckdb", f"{table} rows", q("SELECT count(*) FROM @T", table)[0][0], exp[table]["rows"])

    e = exp["events"]
    kinds = dict(q("SELECT kind, count(*) FROM @T GROUP BY kind", "events"))
    check("duckdb", "events per kind", kinds, e["kinds"])
    (s, n), = q("SELECT sum(size), count(*) FROM @T WHERE size < 1099511627776", "events")
    check("duckdb", "sum of small sizes", int(s), e["small_size_sum"])
    check("duckdb", "rows with small sizes", n, e["small_size_rows"])
    row = q(
        "SELECT max(addr), max(size), count(old_addr), count(old_size), count(*) - count(stack_id),"
        " min(ts_ns), max(ts_ns) FROM @T",
        "events",
    )[0]
    check("duckdb", "max addr", row[0], e["max_addr"])
    check("duckdb", "max size (u64::MAX)", row[1], e["max_size"])
    check("duckdb", "non-null old_addr", row[2], e["old_addr_nonnull"])
    check("duckdb", "non-null old_size", row[3], e["old_size_nonnull"])
    check("duckdb", "null stack_id", row[4], e["stack_id_null"])
    check("duckdb", "first ts", row[5], e["first_ts"])
    check("duckdb", "last ts", row[6], e["last_ts"])
    tids = [t for (t,) in q("SELECT DISTINCT tid FROM @T ORDER BY tid", "events")]
    check("duckdb", "tids", tids, e["tids"])
    # seq numbers the rows 0, 1, 2… in the order they were written.
    row = q("SELECT min(seq), max(seq), count(DISTINCT seq) FROM @T", "events")[0]
    check("duckdb", "seq min, max, distinct", list(row), [0, e["rows"] - 1, e["rows"]])
    m = q("SELECT addr, old_addr, old_size FROM @T WHERE kind = 'mremap'", "events")
    check("duckdb", "mremap row", [list(r) for r in m], [[e["mremap"]["addr"], e["mremap"]["old_addr"], e["mremap"]["old_size"]]])

    s = exp["stacks"]
    for sid, frames in s["frames_of"].items():
        got = q(f"SELECT frames FROM @T WHERE stack_id = {int(sid)}", "stacks")
        check("duckdb", f"frames of stack {sid}", [list(r[0]) for r in got], [frames])
    check("duckdb", "kernel stacks", q("SELECT count(*) FROM @T WHERE kernel", "stacks")[0][0], s["kernel"])
    check("duckdb", "truncated stacks", q("SELECT count(*) FROM @T WHERE truncated", "stacks")[0][0], s["truncated"])

    f = exp["frames"]
    check("duckdb", "frames without function", q("SELECT count(*) - count(function) FROM @T", "frames")[0][0], f["function_null"])
    got = q(f"SELECT function, line, len(inlined), inlined FROM @T WHERE addr = {f['addr']}", "frames")
    check("duckdb", "frame rows at addr", len(got), 1)
    if got:
        function, line, n, inlined = got[0]
        check("duckdb", "frame function", function, f["function"])
        check("duckdb", "frame line", line, f["line"])
        check("duckdb", "inlined length", n, len(f["inlined"]))
        check("duckdb", "inlined chain", inlined, f["inlined"])
    got = q(f"SELECT inlined[1].function, inlined[2].file FROM @T WHERE addr = {f['addr']}", "frames")
    check("duckdb", "inlined[1].function, inlined[2].file", list(got[0]) if got else None, [f["inlined"][0]["function"], f["inlined"][1]["file"]])

    mp = exp["maps"]
    check("duckdb", "heap start", q("SELECT start FROM @T WHERE path = '[heap]'", "maps"), [(mp["heap_start"],)])
    check("duckdb", "maps without path", q("SELECT count(*) - count(path) FROM @T", "maps")[0][0], mp["path_null"])
    check("duckdb", "max end", q('SELECT max("end") FROM @T', "maps")[0][0], mp["max_end"])
    print("duckdb: ok" if not failures else "duckdb: FAILED")


def with_pyarrow(trace, exp):
    before = len(failures)
    tables = {t: ds.dataset(files(trace, t), format="parquet").to_table() for t in TABLES}
    for t in TABLES:
        check("pyarrow", f"{t} rows", tables[t].num_rows, exp[t]["rows"])

    ev = tables["events"]
    e = exp["events"]
    kinds = {}
    for k in ev.column("kind").to_pylist():
        kinds[k] = kinds.get(k, 0) + 1
    check("pyarrow", "events per kind", kinds, e["kinds"])
    # A uint64 scalar: a Python int would make pyarrow compare as int64.
    small = ev.filter(pc.less(ev.column("size"), pa.scalar(1 << 40, pa.uint64())))
    check("pyarrow", "sum of small sizes", pc.sum(small.column("size")).as_py(), e["small_size_sum"])
    check("pyarrow", "max addr", pc.max(ev.column("addr")).as_py(), e["max_addr"])
    check("pyarrow", "max size (u64::MAX)", pc.max(ev.column("size")).as_py(), e["max_size"])
    check("pyarrow", "non-null old_addr", pc.count(ev.column("old_addr")).as_py(), e["old_addr_nonnull"])
    check("pyarrow", "non-null old_size", pc.count(ev.column("old_size")).as_py(), e["old_size_nonnull"])
    check("pyarrow", "null stack_id", ev.column("stack_id").null_count, e["stack_id_null"])
    # Files are read in name order, and rows are in time order within and across them.
    ts = ev.column("ts_ns").to_pylist()
    check("pyarrow", "first ts", ts[0], e["first_ts"])
    check("pyarrow", "last ts", ts[-1], e["last_ts"])
    check("pyarrow", "ts sorted", ts == sorted(ts), True)
    check("pyarrow", "seq is the row number", ev.column("seq").to_pylist() == list(range(ev.num_rows)), True)
    check("pyarrow", "tids", sorted(set(ev.column("tid").to_pylist())), e["tids"])

    st = tables["stacks"].to_pylist()
    s = exp["stacks"]
    check("pyarrow", "frames by stack", {str(r["stack_id"]): r["frames"] for r in st}, s["frames_of"])
    check("pyarrow", "kernel stacks", sum(r["kernel"] for r in st), s["kernel"])

    fr = tables["frames"].to_pylist()
    f = exp["frames"]
    check("pyarrow", "frames without function", sum(r["function"] is None for r in fr), f["function_null"])
    row = [r for r in fr if r["addr"] == f["addr"]]
    check("pyarrow", "frame rows at addr", len(row), 1)
    if row:
        check("pyarrow", "frame function", row[0]["function"], f["function"])
        check("pyarrow", "inlined chain", row[0]["inlined"], f["inlined"])

    mp = tables["maps"].to_pylist()
    m = exp["maps"]
    check("pyarrow", "heap start", [r["start"] for r in mp if r["path"] == "[heap]"], [m["heap_start"]])
    check("pyarrow", "perms", [r["perms"] for r in mp], m["perms"])
    check("pyarrow", "max end", max(r["end"] for r in mp), m["max_end"])
    print("pyarrow: ok" if len(failures) == before else "pyarrow: FAILED")


def main():
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} TRACE_DIR EXPECTED_JSON")
    trace, expected = sys.argv[1], sys.argv[2]
    with open(expected) as fh:
        exp = json.load(fh)
    with open(os.path.join(trace, "meta.json")) as fh:
        meta = json.load(fh)
    for key, want in exp["meta"].items():
        check("json", f"meta.json {key}", meta.get(key), want)
    for t in TABLES:
        if not files(trace, t):
            failures.append(f"{t}: no segments")
    with_duckdb(trace, exp)
    with_pyarrow(trace, exp)
    print(f"duckdb {duckdb.__version__}, pyarrow {pa.__version__}")
    if failures:
        for f in failures:
            print("MISMATCH:", f, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
