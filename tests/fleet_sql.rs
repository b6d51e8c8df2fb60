//! `memleak sql` run on DuckDB and on Spark (local mode) gives, stack for
//! stack, the outstanding bytes and counts `memleak analyze` gives: over
//! traces recorded with the real probes (mappings cut by munmap and moved
//! by mremap, reallocs, an exec), and over a generated 200-host dataset
//! with 3 leaky hosts.
//!
//! Needs python3 with duckdb (scripts/setup.sh), and for Spark a Java
//! runtime and a python with pyspark: `$SPARK_PYTHON`, else
//! /opt/memleak-spark/bin/python (what scripts/setup.sh installs). The
//! recorded traces need root. Without them the tests skip with a line
//! (and fail under MEMLEAK_REQUIRE_ALL, as in CI).
#![cfg(feature = "bpf")]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::fixtures::{fixtures_dir, memleak, recording_guard, root};
use memleak_analyze::diff::normalize_function;
use memleak_trace::{Event, EventKind, FrameRecord, Meta, StackRecord, TraceWriter};
use serde_json::Value;

/// (host, trace, frames) -> (bytes, count).
type ByStack = BTreeMap<(String, String, String), (u64, u64)>;

#[derive(Clone, Copy, Debug)]
enum Engine {
    DuckDb,
    Spark,
}

/// The python that runs `engine`, if this machine has it (else the test
/// is skipped, saying why).
fn python_for(engine: Engine) -> Option<PathBuf> {
    let works = |py: &Path, module: &str| {
        Command::new(py)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    match engine {
        Engine::DuckDb => {
            let py = PathBuf::from("python3");
            if works(&py, "duckdb") {
                return Some(py);
            }
            common::skip("python3 has no duckdb module (scripts/setup.sh installs it)");
            None
        }
        Engine::Spark => {
            let py = std::env::var_os("SPARK_PYTHON")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/opt/memleak-spark/bin/python"));
            let java = Command::new("java").arg("-version").output().is_ok();
            if !java {
                common::skip("no Java runtime for Spark (apt install openjdk-17-jre-headless)");
                return None;
            }
            if !works(&py, "pyspark") {
                common::skip(format_args!(
                    "{} has no pyspark (scripts/setup.sh installs it)",
                    py.display()
                ));
                return None;
            }
            Some(py)
        }
    }
}

/// Runs `memleak sql` with `args` on `engine`: its rows, keyed.
fn run_sql(py: &Path, engine: Engine, args: &[&str], paths: &[&Path]) -> ByStack {
    let dialect = match engine {
        Engine::DuckDb => "duckdb",
        Engine::Spark => "spark",
    };
    let out = memleak()
        .args(["sql", "--dialect", dialect, "--group-by", "trace"])
        .args(args)
        .args(paths)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "memleak sql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("q.sql");
    std::fs::write(&file, &out.stdout).unwrap();
    let run = Command::new(py)
        .arg(root().join("tests/python/fleet_sql.py"))
        .arg(dialect)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{dialect} failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let rows: Vec<Value> = serde_json::from_slice(&run.stdout).unwrap();
    let mut got = ByStack::new();
    for r in rows {
        let key = (
            r["host"].as_str().unwrap().to_string(),
            r["trace"].as_str().unwrap().to_string(),
            r["frames"].as_str().unwrap().to_string(),
        );
        let v = (r["bytes"].as_u64().unwrap(), r["count"].as_u64().unwrap());
        assert!(got.insert(key.clone(), v).is_none(), "{key:?} twice");
    }
    got
}

/// A frame's key as `memleak diff` (and the SQL) writes it:
/// `function @ file:line` with the file's base name and the function
/// without clone suffixes, each inlined function after ` <- `;
/// `[object+0xoffset]` without a function.
fn frame_key(f: &Value) -> String {
    let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    let located = |f: &Value| {
        let mut k = normalize_function(f["function"].as_str().unwrap()).to_string();
        if let Some(file) = f["file"].as_str() {
            k += &format!(" @ {}", base(file));
            if let Some(line) = f["line"].as_u64() {
                k += &format!(":{line}");
            }
        }
        k
    };
    let mut k = if f["function"].is_string() {
        located(f)
    } else {
        match (f["path"].as_str(), f["file_offset"].as_u64()) {
            (Some(p), Some(o)) => format!("[{}+0x{o:x}]", base(p)),
            (Some(p), None) => format!("[{}]", base(p)),
            (None, _) => "[unknown]".to_string(),
        }
    };
    for inl in f["inlined"].as_array().into_iter().flatten() {
        k += " <- ";
        k += &located(inl);
    }
    k
}

/// `memleak analyze`'s stacks of `trace`, keyed as the SQL keys them.
fn analyze(trace: &Path, host: &str, name: &str, into: &mut ByStack) {
    let out = memleak()
        .args(["analyze", "-q", "--format", "json", "-T", "0"])
        .arg(trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "analyze {}: {}",
        trace.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    for s in report["stacks"].as_array().unwrap() {
        let mut parts = Vec::new();
        if s["kernel"] == true {
            parts.push("[kernel]".to_string());
        }
        if s["truncated"] == true {
            parts.push("[truncated]".to_string());
        }
        match s["stack_id"].as_u64() {
            Some(0) => parts.push("[no stack]".to_string()),
            _ => parts.extend(s["frames"].as_array().unwrap().iter().map(frame_key)),
        }
        let frames = parts.join(" | ");
        let e = into
            .entry((host.to_string(), name.to_string(), frames))
            .or_default();
        e.0 += s["bytes"].as_u64().unwrap();
        e.1 += s["count"].as_u64().unwrap();
    }
}

fn record(fixture: &str, dir: &Path) -> PathBuf {
    let trace = dir.join(format!("{fixture}.parquet"));
    let out = memleak()
        .args(["record", "-q", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(fixtures_dir().join(fixture))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "record {fixture}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    trace
}

#[test]
fn sql_matches_analyze_on_recorded_traces() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let traces: Vec<PathBuf> = {
        let _guard = recording_guard(false);
        ["mmap", "realloc", "execer"]
            .iter()
            .map(|f| record(f, dir.path()))
            .collect()
    };
    let host = Meta::load(&traces[0]).unwrap().host;
    let mut want = ByStack::new();
    for t in &traces {
        let name = t.file_name().unwrap().to_string_lossy().into_owned();
        analyze(t, &host, &name, &mut want);
    }
    // What the comparison covers: cut and moved mappings, reallocs, exec.
    let kinds = ["munmap", "mremap", "realloc", "exec"];
    for k in kinds {
        let n: u64 = traces
            .iter()
            .map(|t| {
                let m = Meta::load(t).unwrap();
                m.counters.events.get(k).copied().unwrap_or(0)
            })
            .sum();
        assert!(n > 0, "no {k} event in the recordings");
    }
    let paths: Vec<&Path> = traces.iter().map(PathBuf::as_path).collect();
    for engine in [Engine::DuckDb, Engine::Spark] {
        let Some(py) = python_for(engine) else {
            continue;
        };
        let got = run_sql(&py, engine, &[], &paths);
        assert_eq!(got, want, "{engine:?} against analyze");
    }
}

/// Writes a trace like a host of a fleet: `stacks` stacks allocate and
/// free; the leaky hosts also leak from `leaky_stack`. Addresses differ
/// by host (each host's build is loaded elsewhere), frames do not.
fn fleet_host(root: &Path, host: usize, leaky: bool) -> PathBuf {
    let dir = root.join(format!("host=h{host:03}")).join("trace=1");
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    let mut meta = Meta::for_this_host("test");
    meta.host = format!("h{host:03}");
    let mut w = TraceWriter::create(&dir, meta, Default::default()).unwrap();
    let pid = 1000 + host as u32;
    let base = 0x5500_0000_0000u64 + (host as u64) * 0x10_0000;
    let functions = ["handle_request", "parse_header", "cache_put", "leak_here"];
    for (i, f) in functions.iter().enumerate() {
        let addr = base + 0x100 * (i as u64 + 1);
        w.push_stack(&StackRecord {
            stack_id: i as u64 + 1,
            pid,
            kernel: false,
            truncated: false,
            frames: vec![addr, base + 0x10],
        })
        .unwrap();
        for (a, func, line) in [(addr, *f, 10 + i as u32), (base + 0x10, "main", 99)] {
            if a == base + 0x10 && i > 0 {
                continue;
            }
            w.push_frame(&FrameRecord {
                pid,
                addr: a,
                // A clone suffix on one host only: the key drops it.
                function: Some(if host % 7 == 0 && func == "parse_header" {
                    "parse_header.isra.0".to_string()
                } else {
                    func.to_string()
                }),
                // Each host built in a directory of its own.
                file: Some(format!("/build/{host}/src/server.c")),
                line: Some(line),
                ..Default::default()
            })
            .unwrap();
        }
    }
    // A kernel stack: its frames are the kernel's (pid 0).
    w.push_stack(&StackRecord {
        stack_id: 10,
        pid: 0,
        kernel: true,
        truncated: false,
        frames: vec![0xffff_ffff_8100_1000],
    })
    .unwrap();
    w.push_frame(&FrameRecord {
        pid: 0,
        addr: 0xffff_ffff_8100_1000,
        function: Some("alloc_skb".to_string()),
        file: Some("net/core/skbuff.c".to_string()),
        line: Some(640),
        ..Default::default()
    })
    .unwrap();
    let mut ts = 1_000;
    let mut ev = |kind: EventKind, addr: u64, size: u64, stack: Option<u64>, pid: u32| {
        ts += 1;
        // Ties, as the recorder's clock gives them: only seq orders.
        let e = Event {
            ts_ns: ts / 4,
            pid,
            tid: pid,
            kind,
            addr,
            size,
            old_addr: None,
            old_size: None,
            stack_id: stack,
        };
        w.push_event(&e).unwrap();
    };
    let heap = 0x7000_0000u64;
    for round in 0..40u64 {
        for s in 0..3u64 {
            let a = heap + s * 0x1000;
            ev(EventKind::Malloc, a, 64 + s, Some(s + 1), pid);
            if !(s == 2 && round == 39) {
                ev(EventKind::Free, a, 0, None, pid);
            }
        }
        // Kernel blocks, freed from another process's context (the
        // kernel's table is one for all) but for the last round's; a user
        // block at the same number is another table's.
        let k = 0xffff_8880_0000_0000u64 + round * 64;
        ev(EventKind::Kmalloc, k, 256, Some(10), pid);
        if round < 39 {
            ev(EventKind::Kfree, k, 0, None, pid + 5000);
        }
        ev(EventKind::Free, k, 0, None, pid);
        if leaky {
            ev(
                EventKind::Malloc,
                heap + 0x10_0000 + round * 0x100,
                4096,
                Some(4),
                pid,
            );
        }
    }
    w.finish().unwrap();
    dir
}

#[test]
fn sql_over_a_generated_fleet_finds_the_leaky_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet");
    let leaky = [17, 101, 188];
    let mut want = ByStack::new();
    for h in 0..200 {
        let t = fleet_host(&fleet, h, leaky.contains(&h));
        analyze(&t, &format!("h{h:03}"), "1", &mut want);
    }
    let leaking: Vec<&str> = want
        .iter()
        .filter(|((_, _, f), _)| f.starts_with("leak_here"))
        .map(|((h, _, _), _)| h.as_str())
        .collect();
    assert_eq!(leaking, ["h017", "h101", "h188"]);
    for engine in [Engine::DuckDb, Engine::Spark] {
        let Some(py) = python_for(engine) else {
            continue;
        };
        let got = run_sql(&py, engine, &[], &[&fleet]);
        assert_eq!(got, want, "{engine:?} against analyze");
    }
}

#[test]
fn sql_refuses_what_it_cannot_read_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let trace = fleet_host(dir.path(), 1, false);
    let run = |path: &Path| {
        let out = memleak().arg("sql").arg(path).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(run(&trace).0, Some(0));
    // A directory that is neither a trace nor a dataset.
    let (code, err) = run(dir.path().join("host=h001").as_path());
    assert_ne!(code, Some(0));
    assert!(
        err.contains("neither a trace") && err.lines().count() == 1,
        "{err}"
    );
    // A trace older than the seq column.
    let meta = trace.join("meta.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["format_version"] = "1.4".into();
    v.as_object_mut().unwrap().remove("meta_crc32");
    std::fs::write(&meta, v.to_string()).unwrap();
    let (code, err) = run(&trace);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("no seq column") && err.lines().count() == 1,
        "{err}"
    );
}

/// `record --dataset` lays recordings out as `memleak sql ROOT` reads them.
#[test]
fn recordings_into_a_dataset_are_read_as_one() {
    if !common::can_record() {
        return;
    }
    let Some(py) = python_for(Engine::DuckDb) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet");
    {
        let _guard = recording_guard(false);
        for _ in 0..2 {
            let out = memleak()
                .args(["record", "-q", "--dataset"])
                .arg(&fleet)
                .arg("--")
                .arg(fixtures_dir().join("realloc"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let hosts: Vec<PathBuf> = std::fs::read_dir(&fleet)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    let host = Meta::load(
        &std::fs::read_dir(&hosts[0])
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path(),
    )
    .unwrap()
    .host;
    assert_eq!(
        hosts[0].file_name().unwrap().to_string_lossy(),
        format!("host={host}")
    );
    let mut want = ByStack::new();
    let mut traces = 0;
    for t in std::fs::read_dir(&hosts[0]).unwrap() {
        let t = t.unwrap().path();
        let name = t.file_name().unwrap().to_string_lossy().into_owned();
        let id = name.strip_prefix("trace=").expect("trace=ID");
        analyze(&t, &host, id, &mut want);
        traces += 1;
    }
    assert_eq!(traces, 2, "one directory per recording");
    assert!(!want.is_empty());
    assert_eq!(run_sql(&py, Engine::DuckDb, &[], &[&fleet]), want);
}
