//! What the writer writes, the reader reads back: every column, every
//! table, the edge values, and the forward-compatibility promises.

mod common;

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use arrow_array::types::Int8Type;
use arrow_array::{
    Array, ArrayRef, DictionaryArray, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema};
use common::*;
use memleak_trace::schema::{Table, TABLE_KEY};
use memleak_trace::{Event, EventColumns, EventKind, Trace, TraceWriter, WriterOptions};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

#[test]
fn every_column_of_every_table_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let trace = Trace::open(&root).unwrap();
    assert!(trace.warnings().is_empty(), "{:?}", trace.warnings());

    let events = every_kind_events();
    assert_eq!(read_events(&trace), events);
    assert_eq!(trace.event_count(), events.len() as u64);
    assert_eq!(trace.stacks().unwrap(), stacks());
    assert_eq!(trace.frames().unwrap(), frames());
    assert_eq!(trace.maps().unwrap(), maps());
    let scans = scans();
    let rows: Vec<_> = scans.iter().flat_map(|(_, r)| r.clone()).collect();
    assert_eq!(trace.scans().unwrap(), rows);
    let infos: Vec<_> = scans.iter().map(|(i, _)| i.clone()).collect();
    assert_eq!(trace.meta().scans, infos);

    let meta = trace.meta();
    assert!(meta.complete);
    assert_eq!(meta.host, "testhost");
    assert_eq!(meta.pids, vec![4242]);
    assert_eq!(meta.end_ns, 3_500_000_000);
    assert_eq!(meta.counters.events_total(), events.len() as u64);
    for &k in EventKind::ALL {
        assert_eq!(meta.counters.events.get(k.name()), Some(&1), "{k}");
    }
    for t in Table::ALL {
        let st = trace.table_stats(t);
        assert_eq!(st.segments, 1, "{t:?}");
        assert!(st.bytes > 0);
    }
    assert_eq!(trace.table_stats(Table::Stacks).rows, 3);
}

#[test]
fn huge_values_and_nulls_survive() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let trace = Trace::open(&root).unwrap();
    let got = read_events(&trace);
    assert_eq!(got[0].addr, u64::MAX);
    assert_eq!(got[1].size, u64::MAX);
    let mremap = got.iter().find(|e| e.kind == EventKind::Mremap).unwrap();
    assert_eq!(mremap.old_size, Some(u64::MAX));
    let malloc = got.iter().find(|e| e.kind == EventKind::Malloc).unwrap();
    assert_eq!(malloc.old_addr, None);
    assert_eq!(malloc.old_size, None);
    let realloc = got.iter().find(|e| e.kind == EventKind::Realloc).unwrap();
    assert!(realloc.old_addr.is_some());
    assert!(got.iter().any(|e| e.stack_id.is_none()));

    // Nulls are real Parquet nulls, not zeros, for other readers.
    let seg = &segments(&root, "events")[0];
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(seg).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let mut nulls = 0;
    for b in reader {
        nulls += b.unwrap().column_by_name("old_addr").unwrap().null_count();
    }
    let expected = every_kind_events()
        .iter()
        .filter(|e| e.old_addr.is_none())
        .count();
    assert_eq!(nulls, expected);
}

#[test]
fn empty_trace_is_valid_with_zero_events() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("empty.parquet");
    write_trace(&root, WriterOptions::default(), &[], &[], &[], &[]);
    let trace = Trace::open(&root).unwrap();
    assert!(trace.warnings().is_empty(), "{:?}", trace.warnings());
    assert!(trace.meta().complete);
    assert_eq!(trace.event_count(), 0);
    assert!(trace.event_units().is_empty());
    assert_eq!(trace.events(EventColumns::ALL).unwrap().count(), 0);
    assert!(trace.stacks().unwrap().is_empty());
    assert!(trace.frames().unwrap().is_empty());
    assert!(trace.maps().unwrap().is_empty());
    assert!(trace.scans().unwrap().is_empty());
    assert!(trace.meta().scans.is_empty());
    assert_eq!(trace.table_stats(Table::Events).segments, 0);
}

#[test]
fn many_segments_are_read_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("many.parquet");
    let events = synthetic_events(1000);
    write_trace(
        &root,
        small_opts(64),
        &events,
        &stacks(),
        &frames(),
        &maps(),
    );
    let segs = segments(&root, "events");
    assert_eq!(segs.len(), 1000usize.div_ceil(64), "{segs:?}");
    let trace = Trace::open(&root).unwrap();
    assert_eq!(trace.table_stats(Table::Events).segments, segs.len() as u64);
    assert_eq!(read_events(&trace), events);
    // Row groups of 7 rows are the units, in time order.
    let units = trace.event_units();
    assert_eq!(units.iter().map(|u| u.rows).sum::<u64>(), 1000);
    assert!(units.iter().all(|u| u.rows <= 7));
    let mut last = 0;
    for u in &units {
        let b = trace.read_unit(u, EventColumns::TS).unwrap();
        assert_eq!(b.len() as u64, u.rows);
        assert!(b.ts_ns[0] > last);
        last = *b.ts_ns.last().unwrap();
        // The footer's range of each row group is its rows'.
        let range = trace.unit_ts_range(u).unwrap();
        assert_eq!(range, Some((b.ts_ns[0], last)));
    }
}

/// The writer encodes the events columns itself (src/events/encode/):
/// check them across data pages (64Ki rows) and row groups, with one, two
/// and all kinds in a chunk, constant, regular and arbitrary integers
/// (every bit width up to 64), and nullable columns never, sometimes and
/// always null, through `Trace` and, for `kind`, through the Arrow reader
/// as strings.
#[test]
fn custom_encoded_columns_survive_across_pages_and_row_groups() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("kinds.parquet");
    let rows = 250_000;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let events: Vec<Event> = synthetic_events(rows)
        .into_iter()
        .enumerate()
        .map(|(i, mut e)| {
            // Row group 0: malloc only; 1: malloc and free (as generated);
            // 2: every kind, pseudo-random.
            if i < 100_000 {
                e.kind = EventKind::Malloc;
                e.stack_id = None;
                e.old_addr = Some(i as u64 + 1);
            } else if i >= 200_000 {
                let mut next = || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                e.kind = EventKind::ALL[(next() % EventKind::ALL.len() as u64) as usize];
                // Arbitrary values, of every magnitude.
                let shift = next() % 64;
                e.ts_ns = next() >> shift;
                e.pid = (next() >> (shift / 2 + 32)) as u32;
                e.tid = if i % 1000 == 0 {
                    u32::MAX
                } else {
                    next() as u32
                };
            }
            e
        })
        .collect();
    let opts = WriterOptions {
        row_group_rows: 100_000,
        ..WriterOptions::default()
    };
    write_trace(&root, opts, &events, &stacks(), &frames(), &maps());

    let trace = Trace::open(&root).unwrap();
    assert_eq!(trace.event_units().len(), 3);
    let got = read_events(&trace);
    assert_eq!(got.len(), events.len());
    if let Some(i) = got.iter().zip(&events).position(|(a, b)| a != b) {
        panic!("row {i}: read {:?}, wrote {:?}", got[i], events[i]);
    }

    let mut names = Vec::new();
    let mut optional: [Vec<Option<u64>>; 3] = Default::default();
    for seg in segments(&root, "events") {
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(seg).unwrap())
            .unwrap()
            .build()
            .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let kind = batch.column_by_name("kind").unwrap();
            let kind = kind
                .as_any()
                .downcast_ref::<DictionaryArray<Int8Type>>()
                .expect("kind reads back as a dictionary");
            let values = kind
                .values()
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap();
            names.extend(
                kind.keys()
                    .iter()
                    .map(|k| values.value(k.unwrap() as usize).to_string()),
            );
            // Nulls as nulls (the `Trace` reader maps them to 0).
            for (col, out) in ["old_addr", "old_size", "stack_id"]
                .iter()
                .zip(&mut optional)
            {
                let a = batch.column_by_name(col).unwrap();
                let a = a.as_any().downcast_ref::<UInt64Array>().unwrap();
                out.extend(a.iter());
            }
        }
    }
    // zstd is kept where it pays (the regular row groups' times) and
    // dropped where it does not (the arbitrary ones).
    let seg = File::open(&segments(&root, "events")[0]).unwrap();
    let md = ParquetRecordBatchReaderBuilder::try_new(seg)
        .unwrap()
        .metadata()
        .clone();
    let codec = |rg: usize| md.row_group(rg).column(0).compression();
    assert_eq!(md.row_group(0).column(0).column_path().string(), "ts_ns");
    assert!(matches!(codec(0), Compression::ZSTD(_)), "{:?}", codec(0));
    assert_eq!(codec(2), Compression::UNCOMPRESSED);
    assert!(optional[0].iter().eq(events.iter().map(|e| &e.old_addr)));
    assert!(optional[1].iter().eq(events.iter().map(|e| &e.old_size)));
    assert!(optional[2].iter().eq(events.iter().map(|e| &e.stack_id)));
    let want: Vec<String> = events.iter().map(|e| e.kind.name().to_string()).collect();
    assert_eq!(names.len(), want.len());
    assert!(
        names == want,
        "kinds differ from row {:?}",
        names.iter().zip(&want).position(|(a, b)| a != b)
    );
}

#[test]
fn rotation_by_hand_and_by_time_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rot.parquet");
    let events = synthetic_events(300);
    let opts = WriterOptions {
        segment_duration: std::time::Duration::ZERO,
        merge_segments: 0,
        ..WriterOptions::default()
    };
    let mut w = TraceWriter::create(&root, meta(), opts).unwrap();
    for (i, e) in events.iter().enumerate() {
        w.push_event(e).unwrap();
        if i % 100 == 99 {
            w.tick().unwrap();
        }
    }
    w.rotate().unwrap(); // nothing buffered: must not make an empty segment
    w.finish().unwrap();
    assert_eq!(segments(&root, "events").len(), 3);
    let trace = Trace::open(&root).unwrap();
    assert_eq!(read_events(&trace), events);
}

#[test]
fn checkpoints_are_merged_without_changing_a_row() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("merged.parquet");
    let events = synthetic_events(1000);
    let opts = WriterOptions {
        merge_segments: 3,
        row_group_rows: 40,
        ..WriterOptions::default()
    };
    let mut w = TraceWriter::create(&root, meta(), opts).unwrap();
    for (i, e) in events.iter().enumerate() {
        w.push_event(e).unwrap();
        if i % 100 == 99 {
            // A checkpoint every 100 events, with a stack each time.
            w.push_stack(&stacks()[i / 100 % stacks().len()]).unwrap();
            w.rotate().unwrap();
        }
    }
    w.finish().unwrap();
    // 10 checkpoints: merged as 0-2, 3-5, 6-8, and 9 alone at the end.
    let names: Vec<String> = segments(&root, "events")
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "part-00000-00002.parquet",
            "part-00003-00005.parquet",
            "part-00006-00008.parquet",
            "part-00009.parquet"
        ]
    );
    let trace = Trace::open(&root).unwrap();
    assert!(trace.warnings().is_empty(), "{:?}", trace.warnings());
    let listed: Vec<(String, u64)> = trace.meta().segments.as_ref().unwrap()["events"]
        .iter()
        .map(|e| (e.file.clone(), e.rows))
        .collect();
    assert_eq!(
        listed,
        [
            ("part-00000-00002.parquet".to_string(), 300),
            ("part-00003-00005.parquet".to_string(), 300),
            ("part-00006-00008.parquet".to_string(), 300),
            ("part-00009.parquet".to_string(), 100),
        ]
    );
    assert_eq!(read_events(&trace), events);
    assert_eq!(trace.stacks().unwrap().len(), 10);
    // A merged segment keeps its parts' row groups.
    assert_eq!(trace.table_stats(Table::Events).row_groups, 3 * 9 + 3);
}

#[test]
fn full_segments_are_never_copied_by_a_merge() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("big.parquet");
    let events = synthetic_events(170);
    let opts = WriterOptions {
        segment_rows: 100,
        row_group_rows: 40,
        ..WriterOptions::default()
    };
    let mut w = TraceWriter::create(&root, meta(), opts).unwrap();
    // Two checkpoints of 30 events, a segment closed full (100 rows),
    // then 10 more at the end.
    for (i, e) in events.iter().enumerate() {
        w.push_event(e).unwrap();
        if i == 29 || i == 59 {
            w.rotate().unwrap();
        }
    }
    w.finish().unwrap();
    let names: Vec<String> = segments(&root, "events")
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "part-00000-00001.parquet",
            "part-00002.parquet",
            "part-00003.parquet"
        ]
    );
    let trace = Trace::open(&root).unwrap();
    assert!(trace.warnings().is_empty(), "{:?}", trace.warnings());
    assert_eq!(read_events(&trace), events);
}

#[test]
fn projection_decodes_only_the_requested_columns() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("p.parquet");
    let events = synthetic_events(100);
    write_trace(&root, WriterOptions::default(), &events, &[], &[], &[]);
    let trace = Trace::open(&root).unwrap();
    let batches: Vec<_> = trace
        .events(EventColumns::TS | EventColumns::SIZE)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let b = &batches[0];
    assert_eq!(b.len(), 100);
    assert_eq!(b.ts_ns, events.iter().map(|e| e.ts_ns).collect::<Vec<_>>());
    assert_eq!(b.size, events.iter().map(|e| e.size).collect::<Vec<_>>());
    assert!(b.addr.is_empty() && b.kind.is_empty() && b.tid.is_empty() && b.stack_id.is_empty());

    let b = trace
        .events(EventColumns::REPLAY)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    // Replay reads `tid` too, for temporary allocations.
    assert_eq!(b.tid, events.iter().map(|e| e.tid).collect::<Vec<_>>());
    assert_eq!(b.kind.len(), 100);
}

#[test]
fn unknown_table_directory_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    // What a later minor version may add: RSS samples, say.
    std::fs::create_dir(root.join("rss")).unwrap();
    write_foreign_parquet(&root.join("rss/part-00000.parquet"), Some("rss"));
    std::fs::write(root.join("rss/README"), "not parquet at all").unwrap();
    let trace = Trace::open(&root).unwrap();
    assert!(trace.warnings().is_empty(), "{:?}", trace.warnings());
    assert_eq!(read_events(&trace), every_kind_events());
}

/// A segment as a newer minor version might write it: an extra column in
/// the middle of the known ones.
fn write_with_extra_column(path: &std::path::Path, table: Table, batch: RecordBatch) {
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut cols: Vec<ArrayRef> = batch.columns().to_vec();
    fields.insert(2, Field::new("cpu", DataType::UInt32, true));
    cols.insert(
        2,
        Arc::new(UInt32Array::from_iter(
            (0..batch.num_rows() as u32).map(Some),
        )),
    );
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), cols).unwrap();
    let kv = vec![KeyValue::new(
        TABLE_KEY.to_string(),
        table.name().to_string(),
    )];
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(kv))
        .build();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn unknown_extra_column_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    // Re-read our own segments as Arrow and write them back with a column
    // this version does not know, as the next segment of each table.
    for table in [Table::Events, Table::Stacks] {
        let seg = &segments(&root, table.name())[0];
        let rows = match table {
            Table::Events => every_kind_events().len(),
            _ => stacks().len(),
        };
        let batches: Vec<RecordBatch> =
            ParquetRecordBatchReaderBuilder::try_new(File::open(seg).unwrap())
                .unwrap()
                .build()
                .unwrap()
                .map(|b| b.unwrap())
                .collect();
        assert_eq!(batches.len(), 1, "test tables fit one batch");
        let batch = batches.into_iter().next().unwrap();
        write_with_extra_column(
            &root.join(table.name()).join("part-00001.parquet"),
            table,
            batch,
        );
        list_segment(&root, table.name(), "part-00001.parquet", rows as u64);
    }
    let trace = Trace::open(&root).unwrap();
    assert!(trace.warnings().is_empty(), "{:?}", trace.warnings());
    let mut twice = every_kind_events();
    twice.extend(every_kind_events());
    assert_eq!(read_events(&trace), twice);
    let mut stacks2 = stacks();
    stacks2.extend(stacks());
    assert_eq!(trace.stacks().unwrap(), stacks2);
}

#[test]
fn newer_minor_version_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    edit_meta(&root, |m| {
        m["format_version"] = "1.9".into();
        m["rss_sampling_hz"] = 10.into();
    });
    let trace = Trace::open(&root).unwrap();
    assert_eq!(trace.meta().version(), Some((1, 9)));
    assert_eq!(
        trace.meta().extra.get("rss_sampling_hz"),
        Some(&serde_json::json!(10))
    );
    assert_eq!(read_events(&trace), every_kind_events());
}

#[test]
fn inprogress_segment_is_skipped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("killed.parquet");
    let events = synthetic_events(200);
    let mut w = TraceWriter::create(&root, meta(), WriterOptions::default()).unwrap();
    for e in &events[..100] {
        w.push_event(e).unwrap();
    }
    w.rotate().unwrap();
    for e in &events[100..] {
        w.push_event(e).unwrap();
    }
    // The recorder dies here: no finish. Leave what a half-written segment
    // looks like next to the closed one.
    drop(w);
    std::fs::copy(
        segments(&root, "events")[0].clone(),
        root.join("events/part-00001.parquet.inprogress"),
    )
    .unwrap();
    let trace = Trace::open(&root).unwrap();
    assert!(!trace.meta().complete);
    let w = trace.warnings().join("\n");
    assert!(
        w.contains("part-00001.parquet.inprogress: skipping unfinished segment"),
        "{w}"
    );
    assert!(
        w.contains("incomplete trace: the recording did not finish"),
        "{w}"
    );
    assert!(w.contains("are missing (1 unfinished segment"), "{w}");
    let inc = trace.incomplete().expect("incomplete");
    assert_eq!(inc.unfinished_segments, 1);
    assert!(inc.listed);
    assert_eq!(read_events(&trace), events[..100]);
}

#[test]
fn truncated_last_segment_is_skipped_and_earlier_ones_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    let events = synthetic_events(300);
    write_trace(&root, small_opts(100), &events, &[], &[], &[]);
    as_format_1_0(&root);
    let segs = segments(&root, "events");
    assert_eq!(segs.len(), 3);
    truncate_half(&segs[2]);
    let trace = Trace::open(&root).unwrap();
    let w = trace.warnings().join("\n");
    assert!(
        w.contains("part-00002.parquet: skipping truncated last segment"),
        "{w}"
    );
    assert_eq!(trace.warnings().len(), 1);
    assert_eq!(trace.event_count(), 200);
    assert_eq!(read_events(&trace), events[..200]);
}

#[test]
fn files_are_private_to_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&root), 0o700);
    assert_eq!(mode(&root.join("meta.json")), 0o600);
    for t in Table::ALL {
        assert_eq!(mode(&root.join(t.name())), 0o700, "{t:?}");
        for seg in segments(&root, t.name()) {
            assert_eq!(mode(&seg), 0o600, "{}", seg.display());
        }
    }
}

#[test]
fn force_replaces_an_existing_trace() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let opts = WriterOptions {
        force: true,
        ..WriterOptions::default()
    };
    write_trace(&root, opts, &synthetic_events(5), &[], &[], &[]);
    let trace = Trace::open(&root).unwrap();
    assert_eq!(read_events(&trace), synthetic_events(5));
    assert!(trace.stacks().unwrap().is_empty());
}

#[test]
fn scans_written_at_separate_checkpoints_are_read_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("scans.parquet");
    let mut w = TraceWriter::create(&root, meta(), small_opts(100)).unwrap();
    let mut all = Vec::new();
    for (i, e) in synthetic_events(300).iter().enumerate() {
        w.push_event(e).unwrap();
        if i % 100 == 50 {
            let info = memleak_trace::ScanInfo {
                pid: 4242,
                ts_ns: e.ts_ns,
                ..Default::default()
            };
            // More rows than a batch, so the scan spans several row groups.
            let rows: Vec<_> = (0..9000u64)
                .map(|j| memleak_trace::ScanRecord {
                    ts_ns: e.ts_ns,
                    pid: 4242,
                    addr: 0x1000 + j * 16,
                    size: j,
                    verdict: memleak_trace::ScanVerdict::ALL[j as usize % 4],
                    contents: (j % 3 == 0).then(|| j.to_le_bytes().to_vec()),
                })
                .collect();
            w.write_scan(info, &rows).unwrap();
            w.rotate().unwrap();
            all.extend(rows);
        }
    }
    w.finish().unwrap();
    let trace = Trace::open(&root).unwrap();
    assert_eq!(trace.meta().scans.len(), 3);
    assert!(trace.meta().scans.iter().all(|s| s.blocks == 9000));
    assert_eq!(trace.scans().unwrap(), all);
    assert_eq!(trace.table_stats(Table::Scan).segments, 3);
}

#[test]
fn a_format_1_2_trace_without_a_scan_table_reads_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("old.parquet");
    write_trace(
        &root,
        WriterOptions::default(),
        &every_kind_events(),
        &stacks(),
        &frames(),
        &maps(),
    );
    edit_meta(&root, |m| {
        m["format_version"] = "1.2".into();
    });
    assert!(!root.join("scan").exists());
    let trace = Trace::open(&root).unwrap();
    assert!(trace.warnings().is_empty(), "{:?}", trace.warnings());
    assert_eq!(read_events(&trace), every_kind_events());
    assert!(trace.scans().unwrap().is_empty());
    assert_eq!(trace.table_stats(Table::Scan), Default::default());
}

#[test]
fn scan_verdict_names_round_trip() {
    use memleak_trace::ScanVerdict;
    let names: Vec<_> = ScanVerdict::ALL.iter().map(|v| v.name()).collect();
    assert_eq!(names, ["definitely", "indirectly", "possibly", "reachable"]);
    for v in ScanVerdict::ALL {
        assert_eq!(ScanVerdict::from_name(v.name()), Some(v));
    }
    assert_eq!(ScanVerdict::from_name("lost"), None);
}

/// `seq` (1.5) numbers the rows from 0 in the order they were written,
/// across segments and merges, so SQL can order by it where `ts_ns` ties.
#[test]
fn seq_is_the_row_number_across_segments_and_merges() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("seq.parquet");
    let mut opts = small_opts(64);
    opts.merge_segments = 4;
    let events = synthetic_events(1000);
    write_trace(&root, opts, &events, &stacks(), &frames(), &maps());
    let mut seq = Vec::new();
    for seg in segments(&root, "events") {
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(seg).unwrap())
            .unwrap()
            .build()
            .unwrap();
        for b in reader {
            let b = b.unwrap();
            let col = b.column_by_name("seq").expect("a seq column");
            let col = col.as_any().downcast_ref::<UInt64Array>().unwrap();
            seq.extend(col.values().iter().copied());
        }
    }
    assert_eq!(seq, (0..1000).collect::<Vec<u64>>());
}

/// An events segment written before 1.5 has no `seq` and is read as
/// before; one that claims 1.5 and lacks it is not ours.
#[test]
fn events_without_seq_are_read_only_from_older_writers() {
    for (version, readable) in [("1.4", true), ("1.5", false)] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("old.parquet");
        let events = synthetic_events(300);
        write_trace(
            &root,
            small_opts(1000),
            &events,
            &stacks(),
            &frames(),
            &maps(),
        );
        let segs = segments(&root, "events");
        assert_eq!(segs.len(), 1);
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&segs[0]).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let batches: Vec<RecordBatch> = reader
            .map(|b| {
                let b = b.unwrap();
                let keep: Vec<usize> = (0..b.num_columns())
                    .filter(|&i| b.schema().field(i).name() != "seq")
                    .collect();
                b.project(&keep).unwrap()
            })
            .collect();
        let kv = vec![
            KeyValue::new(TABLE_KEY.to_string(), "events".to_string()),
            KeyValue::new("memleak.format_version".to_string(), version.to_string()),
        ];
        let props = WriterProperties::builder()
            .set_key_value_metadata(Some(kv))
            .build();
        let mut w = ArrowWriter::try_new(
            File::create(&segs[0]).unwrap(),
            batches[0].schema(),
            Some(props),
        )
        .unwrap();
        for b in &batches {
            w.write(b).unwrap();
        }
        w.close().unwrap();
        // A hand-made file: no listed length and checksum to match.
        as_format_1_0(&root);
        match Trace::open(&root) {
            Ok(trace) => {
                assert!(readable, "{version}: read without seq");
                assert_eq!(read_events(&trace), events);
            }
            Err(e) => {
                assert!(!readable, "{version}: {e}");
                assert!(e.to_string().contains("missing column seq"), "{e}");
            }
        }
    }
}
