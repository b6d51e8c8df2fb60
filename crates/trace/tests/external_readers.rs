//! Readers we did not write open our traces: DuckDB and pyarrow read every
//! table of a trace written by this crate and find what was written.
//!
//! Needs `python3` with the `duckdb` and `pyarrow` modules
//! (`scripts/setup.sh` installs them). Without them this test fails rather
//! than skips: the point of it is to run in CI.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use common::*;
use memleak_trace::{Event, EventKind, Trace};
use serde_json::json;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

#[test]
fn duckdb_and_pyarrow_read_every_table() {
    let have_readers = Command::new("python3")
        .args(["-c", "import duckdb, pyarrow"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_readers {
        common::skip::skip(
            "python3 with duckdb and pyarrow is not installed (scripts/setup.sh installs them)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ext.parquet");

    // Several segments per table, so the readers must glob them together.
    let mut events = synthetic_events(1000);
    events.extend(every_kind_events().into_iter().map(|e| Event {
        ts_ns: e.ts_ns + 1_000_000_000_000,
        ..e
    }));
    let mut w = memleak_trace::TraceWriter::create(&root, meta(), small_opts(400)).unwrap();
    for (i, e) in events.iter().enumerate() {
        if i == 500 {
            for s in stacks() {
                w.push_stack(&s).unwrap();
            }
            for m in maps() {
                w.push_map(&m).unwrap();
            }
        }
        if i == 900 {
            for f in frames() {
                w.push_frame(&f).unwrap();
            }
        }
        w.push_event(e).unwrap();
    }
    w.finish().unwrap();
    assert!(segments(&root, "events").len() >= 3);
    let trace = Trace::open(&root).unwrap();
    assert_eq!(read_events(&trace), events, "our own reader first");

    let mut kinds: BTreeMap<&str, u64> = BTreeMap::new();
    for e in &events {
        *kinds.entry(e.kind.name()).or_default() += 1;
    }
    let small: Vec<&Event> = events.iter().filter(|e| e.size < 1 << 40).collect();
    let frame = &frames()[0];
    let expected = json!({
        "meta": { "format": "memleak-trace", "host": "testhost", "pids": [4242], "complete": true },
        "events": {
            "rows": events.len(),
            "kinds": kinds,
            // Sizes below 2^40, so no reader's 64-bit sum overflows.
            "small_size_sum": small.iter().map(|e| e.size).sum::<u64>(),
            "small_size_rows": small.len(),
            "max_addr": events.iter().map(|e| e.addr).max().unwrap(),
            "max_size": events.iter().map(|e| e.size).max().unwrap(),
            "old_addr_nonnull": events.iter().filter(|e| e.old_addr.is_some()).count(),
            "old_size_nonnull": events.iter().filter(|e| e.old_size.is_some()).count(),
            "stack_id_null": events.iter().filter(|e| e.stack_id.is_none()).count(),
            "tids": events.iter().map(|e| e.tid).collect::<std::collections::BTreeSet<_>>(),
            "first_ts": events[0].ts_ns,
            "last_ts": events.last().unwrap().ts_ns,
            "mremap": events.iter().find(|e| e.kind == EventKind::Mremap).map(|e| json!({
                "addr": e.addr, "old_addr": e.old_addr, "old_size": e.old_size,
            })),
        },
        "stacks": {
            "rows": stacks().len(),
            "frames_of": stacks().iter().map(|s| (s.stack_id.to_string(), s.frames.clone())).collect::<BTreeMap<_, _>>(),
            "kernel": stacks().iter().filter(|s| s.kernel).count(),
            "truncated": stacks().iter().filter(|s| s.truncated).count(),
        },
        "frames": {
            "rows": frames().len(),
            "function_null": frames().iter().filter(|f| f.function.is_none()).count(),
            "addr": frame.addr,
            "function": frame.function,
            "line": frame.line,
            "inlined": frame.inlined.iter().map(|i| json!({
                "function": i.function, "file": i.file, "line": i.line, "column": i.column,
            })).collect::<Vec<_>>(),
        },
        "maps": {
            "rows": maps().len(),
            "heap_start": maps().iter().find(|m| m.path.as_deref() == Some("[heap]")).unwrap().start,
            "path_null": maps().iter().filter(|m| m.path.is_none()).count(),
            "max_end": maps().iter().map(|m| m.end).max().unwrap(),
            "perms": maps().iter().map(|m| m.perms.clone()).collect::<Vec<_>>(),
        },
    });
    let expected_path = dir.path().join("expected.json");
    std::fs::write(
        &expected_path,
        serde_json::to_string_pretty(&expected).unwrap(),
    )
    .unwrap();

    let script = repo_root().join("tests/python/read_trace.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&root)
        .arg(&expected_path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 (install it with scripts/setup.sh): {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}",
        script.display(),
        out.status
    );
    assert!(
        stdout.contains("duckdb: ok") && stdout.contains("pyarrow: ok"),
        "{stdout}\n{stderr}"
    );
}
