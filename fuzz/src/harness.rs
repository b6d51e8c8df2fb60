//! The fuzz harness, shared by the cargo-fuzz target and the stable test
//! `crates/analyze/tests/fuzz_corpus.rs`, which replays the corpus.
//!
//! Input: one selector byte, then the contents of one file of a small,
//! valid trace (format 1.0, whose meta.json lists no segment, so the
//! whole-file checksums do not turn every input away before the readers
//! see it): `0` events, `1` stacks, `2` frames, `3` maps (their
//! `part-00000.parquet`), anything else `meta.json`. The trace is then
//! opened, every table read, and the events analyzed with one and with
//! two replay partitions.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use memleak_analyze::report::{analyze_trace, AnalyzeOptions};
use memleak_trace::{Event, EventKind, Meta, StackRecord, Trace, TraceWriter, WriterOptions};

/// The files of the base trace: (relative path, contents).
fn base() -> &'static Vec<(PathBuf, Vec<u8>)> {
    static BASE: OnceLock<Vec<(PathBuf, Vec<u8>)>> = OnceLock::new();
    BASE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("t.parquet");
        let opts = WriterOptions {
            row_group_rows: 64,
            ..WriterOptions::default()
        };
        let meta = Meta {
            start_ns: 1_000,
            pids: vec![7],
            ..Meta::default()
        };
        let mut w = TraceWriter::create(&root, meta, opts).expect("create");
        w.push_stack(&StackRecord {
            stack_id: 1,
            pid: 7,
            kernel: false,
            truncated: false,
            frames: vec![0x401000, 0x402000],
        })
        .expect("stack");
        for i in 0..300u64 {
            let kind = if i % 3 == 2 {
                EventKind::Free
            } else {
                EventKind::Malloc
            };
            w.push_event(&Event {
                ts_ns: 1_000 + i * 10,
                pid: 7,
                tid: 7,
                kind,
                addr: 0x1000 + (i / 3) * 32,
                size: if kind == EventKind::Free { 0 } else { 16 + i },
                old_addr: None,
                old_size: None,
                stack_id: (kind != EventKind::Free).then_some(1),
            })
            .expect("event");
        }
        w.finish().expect("finish");
        let mut files = Vec::new();
        collect(&root, &root, &mut files);
        // Format 1.0: no list of segments, no checksum of meta.json.
        for (path, bytes) in &mut files {
            if path == Path::new("meta.json") {
                let text = String::from_utf8(bytes.clone()).expect("utf-8");
                let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
                let o = v.as_object_mut().expect("object");
                for k in ["segments", "meta_crc32", "checkpoint_ns"] {
                    o.remove(k);
                }
                o.insert("format_version".into(), "1.0".into());
                *bytes = serde_json::to_vec_pretty(&v).expect("json");
            }
        }
        files
    })
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            collect(root, &p, out);
        } else {
            let rel = p.strip_prefix(root).expect("under root").to_path_buf();
            out.push((rel, std::fs::read(&p).expect("read")));
        }
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let Some((&selector, contents)) = data.split_first() else {
        return;
    };
    let target = match selector {
        0 => "events/part-00000.parquet",
        1 => "stacks/part-00000.parquet",
        2 => "frames/part-00000.parquet",
        3 => "maps/part-00000.parquet",
        _ => "meta.json",
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("t.parquet");
    for (rel, bytes) in base() {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        let bytes = if rel == Path::new(target) {
            contents
        } else {
            bytes
        };
        std::fs::write(&p, bytes).expect("write");
    }
    let target_path = root.join(target);
    if !target_path.exists() {
        std::fs::create_dir_all(target_path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&target_path, contents).expect("write");
    }
    let Ok(trace) = Trace::open(&root) else {
        return;
    };
    let _ = trace.stacks();
    let _ = trace.frames();
    let _ = trace.maps();
    for partitions in [1, 2] {
        let opts = AnalyzeOptions {
            partitions,
            ..AnalyzeOptions::default()
        };
        if let Ok(r) = analyze_trace(&trace, &opts, None) {
            let _ = memleak_analyze::json::render(&r);
            let _ = memleak_analyze::text::render(&r);
        }
    }
}
