//! Shared fixtures of the trace tests: rows that exercise every column,
//! and helpers to write traces and foreign files.
#![allow(dead_code)]

#[path = "../../../../tests/common/skip.rs"]
pub mod skip;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, UInt32Array, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use memleak_trace::schema::TABLE_KEY;
use memleak_trace::{
    Event, EventColumns, EventKind, FrameRecord, InlinedFrame, MapRecord, Meta, ScanInfo,
    ScanRecord, ScanVerdict, StackRecord, Trace, TraceWriter, WriterOptions,
};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

/// A meta with recognizable values.
pub fn meta() -> Meta {
    Meta {
        tool_version: "0.1.0-test".into(),
        host: "testhost".into(),
        kernel: "6.1.0-test".into(),
        command: vec![
            "memleak".into(),
            "record".into(),
            "--".into(),
            "./seed".into(),
        ],
        pids: vec![4242],
        start_ns: 1_000_000_000,
        end_ns: 3_500_000_000,
        ..Meta::default()
    }
}

/// Small segments, so a few hundred events make several of them.
pub fn small_opts(segment_rows: usize) -> WriterOptions {
    WriterOptions {
        segment_rows,
        row_group_rows: 7,
        // Keep the segments apart: these tests are about several of them.
        merge_segments: 0,
        ..WriterOptions::default()
    }
}

/// One event of every kind, with the edge values of every column: the
/// largest u64, null and non-null `old_addr`/`old_size`/`stack_id`.
pub fn every_kind_events() -> Vec<Event> {
    EventKind::ALL
        .iter()
        .enumerate()
        .map(|(i, &kind)| {
            let i = i as u64;
            let (old_addr, old_size) = match kind {
                EventKind::Realloc | EventKind::Reallocarray => (Some(0x5000 + i), None),
                EventKind::Mremap => (Some(0x7f00_0000_0000), Some(u64::MAX)),
                _ => (None, None),
            };
            Event {
                ts_ns: 1_000_000_000 + i * 1_500,
                pid: 4242,
                tid: 4242 + (i as u32 % 3),
                kind,
                addr: if i == 0 {
                    u64::MAX
                } else {
                    0x55aa_0000_1000 + i * 16
                },
                size: if i == 1 { u64::MAX } else { i * 8 },
                old_addr,
                old_size,
                stack_id: if i.is_multiple_of(2) {
                    Some(1 + i)
                } else {
                    None
                },
            }
        })
        .collect()
}

/// `n` deterministic malloc/free events.
pub fn synthetic_events(n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| {
            let malloc = i % 2 == 0;
            Event {
                ts_ns: 10_000 + i as u64 * 1_234,
                pid: 77,
                tid: 77 + (i / 10 % 2) as u32,
                kind: if malloc {
                    EventKind::Malloc
                } else {
                    EventKind::Free
                },
                addr: 0x1000 + (i as u64 / 2) * 32,
                size: if malloc { 1 + i as u64 % 500 } else { 0 },
                old_addr: None,
                old_size: None,
                stack_id: if malloc { Some(1 + i as u64 % 5) } else { None },
            }
        })
        .collect()
}

pub fn stacks() -> Vec<StackRecord> {
    vec![
        StackRecord {
            stack_id: 1,
            pid: 4242,
            kernel: false,
            truncated: false,
            frames: vec![0x401000, 0x401234, 0x7f00_1234_5678],
        },
        StackRecord {
            stack_id: 3,
            pid: 0,
            kernel: true,
            truncated: true,
            frames: vec![u64::MAX, 0xffff_ffff_8100_0000],
        },
        StackRecord {
            stack_id: 5,
            pid: 4242,
            kernel: false,
            truncated: false,
            frames: vec![],
        },
    ]
}

pub fn frames() -> Vec<FrameRecord> {
    vec![
        FrameRecord {
            pid: 4242,
            addr: 0x401234,
            build_id: Some("0123456789abcdef0123456789abcdef01234567".into()),
            path: Some("/usr/bin/seed".into()),
            file_offset: Some(0x1234),
            function: Some("leaky_function".into()),
            func_offset: Some(0x34),
            file: Some("seed.c".into()),
            line: Some(42),
            column: Some(7),
            inlined: vec![
                InlinedFrame {
                    function: "inner_helper".into(),
                    file: Some("helper.h".into()),
                    line: Some(10),
                    column: None,
                },
                InlinedFrame {
                    function: "middle".into(),
                    file: None,
                    line: None,
                    column: None,
                },
            ],
        },
        // Everything unknown: an address in no mapping.
        FrameRecord {
            pid: 4242,
            addr: 0xdead,
            ..FrameRecord::default()
        },
        FrameRecord {
            pid: 0,
            addr: u64::MAX,
            path: Some("[kernel]".into()),
            function: Some("kmalloc_trace".into()),
            ..FrameRecord::default()
        },
    ]
}

pub fn maps() -> Vec<MapRecord> {
    vec![
        MapRecord {
            ts_ns: 999,
            pid: 4242,
            start: 0x400000,
            end: 0x402000,
            perms: "r-xp".into(),
            offset: 0x1000,
            inode: 123456,
            path: Some("/usr/bin/seed".into()),
            build_id: Some("0123456789abcdef0123456789abcdef01234567".into()),
        },
        MapRecord {
            ts_ns: 999,
            pid: 4242,
            start: 0x5555_0000,
            end: 0x5556_0000,
            perms: "rw-p".into(),
            path: Some("[heap]".into()),
            ..MapRecord::default()
        },
        MapRecord {
            ts_ns: 1000,
            pid: 4242,
            start: 0x7f00_0000_0000,
            end: u64::MAX,
            perms: "rw-p".into(),
            ..MapRecord::default()
        },
    ]
}

/// Two scans of pid 4242: one with a row of every verdict and the edge
/// values (empty and null contents, the largest address), and one that
/// failed, without rows.
pub fn scans() -> Vec<(ScanInfo, Vec<ScanRecord>)> {
    let info = ScanInfo {
        pid: 4242,
        ts_ns: 3_000_000_000,
        pause_ns: 1_234_567,
        threads: 3,
        roots_bytes: 1 << 20,
        heap_bytes: 4096,
        blocks: 4,
        error: None,
    };
    let row = |addr: u64, size: u64, verdict, contents: Option<&[u8]>| ScanRecord {
        ts_ns: info.ts_ns,
        pid: 4242,
        addr,
        size,
        verdict,
        contents: contents.map(|c| c.to_vec()),
    };
    let rows = vec![
        row(
            0x5000,
            16,
            ScanVerdict::DefinitelyLost,
            Some(b"leak\0\xff\x01"),
        ),
        row(0x6000, 32, ScanVerdict::IndirectlyLost, Some(b"")),
        row(0x7000, 48, ScanVerdict::PossiblyLost, None),
        row(u64::MAX - 15, u64::MAX, ScanVerdict::Reachable, None),
    ];
    let failed = ScanInfo {
        pid: 4242,
        ts_ns: 3_400_000_000,
        error: Some("the process exited during the scan".into()),
        ..ScanInfo::default()
    };
    vec![(info, rows), (failed, Vec::new())]
}

/// Writes a finished trace with the given rows.
pub fn write_trace(
    root: &Path,
    opts: WriterOptions,
    events: &[Event],
    stacks: &[StackRecord],
    frames: &[FrameRecord],
    maps: &[MapRecord],
) -> Meta {
    let mut w = TraceWriter::create(root, meta(), opts).expect("create trace");
    for m in maps {
        w.push_map(m).unwrap();
    }
    for s in stacks {
        w.push_stack(s).unwrap();
    }
    for f in frames {
        w.push_frame(f).unwrap();
    }
    for e in events {
        w.push_event(e).unwrap();
    }
    w.finish().expect("finish trace")
}

/// A finished trace with every table filled, under `dir/name`.
pub fn full_trace(dir: &Path, name: &str) -> PathBuf {
    let root = dir.join(name);
    let mut w = TraceWriter::create(&root, meta(), WriterOptions::default()).expect("create");
    for m in maps() {
        w.push_map(&m).unwrap();
    }
    for s in stacks() {
        w.push_stack(&s).unwrap();
    }
    for f in frames() {
        w.push_frame(&f).unwrap();
    }
    for e in every_kind_events() {
        w.push_event(&e).unwrap();
    }
    for (info, rows) in scans() {
        w.write_scan(info, &rows).unwrap();
    }
    w.finish().expect("finish trace");
    root
}

/// Every event of a trace, in order.
pub fn read_events(trace: &Trace) -> Vec<Event> {
    let mut out = Vec::new();
    for b in trace.events(EventColumns::ALL).unwrap() {
        let b = b.unwrap();
        out.extend((0..b.len()).map(|i| b.event(i)));
    }
    out
}

/// Sorted `*.parquet` files of one table.
pub fn segments(root: &Path, table: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root.join(table))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    v.sort();
    v
}

/// Cuts a file to half its length, as a killed writer would leave it.
pub fn truncate_half(path: &Path) {
    let len = std::fs::metadata(path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(len / 2).unwrap();
}

/// Writes a Parquet file with two integer columns and, if `table` is
/// given, the `memleak.table` key claiming it for that table.
pub fn write_foreign_parquet(path: &Path, table: Option<&str>) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::UInt64, false),
        Field::new("b", DataType::UInt32, false),
    ]));
    let cols: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from(vec![1u64, 2, 3])),
        Arc::new(UInt32Array::from(vec![4u32, 5, 6])),
    ];
    let batch = RecordBatch::try_new(schema.clone(), cols).unwrap();
    let kv = table.map(|t| vec![KeyValue::new(TABLE_KEY.to_string(), t.to_string())]);
    let props = WriterProperties::builder()
        .set_key_value_metadata(kv)
        .build();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// Rewrites `meta.json` through a JSON edit.
pub fn edit_meta(root: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let path = root.join("meta.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // Edited by hand: without its checksum, which would no longer match.
    v.as_object_mut().unwrap().remove("meta_crc32");
    f(&mut v);
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// Makes a trace look like one of format 1.0, whose meta.json lists no
/// segments: the reader then takes every `*.parquet` file it finds.
pub fn as_format_1_0(root: &Path) {
    edit_meta(root, |m| {
        let m = m.as_object_mut().unwrap();
        m.remove("segments");
        m.remove("checkpoint_ns");
        m.insert("format_version".into(), "1.0".into());
    });
}

/// Lists a segment a test wrote by hand in meta.json, as a writer of a
/// newer minor version would.
pub fn list_segment(root: &Path, table: &str, file: &str, rows: u64) {
    let bytes = std::fs::read(root.join(table).join(file)).unwrap();
    let entry = serde_json::json!({
        "file": file,
        "rows": rows,
        "bytes": bytes.len(),
        "crc32": crc32fast::hash(&bytes),
    });
    edit_meta(root, |m| {
        m["segments"][table].as_array_mut().unwrap().push(entry);
    });
}
