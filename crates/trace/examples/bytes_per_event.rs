//! Measures how many bytes an event costs on disk, and how fast events
//! decode, on a synthetic two-thread malloc/free workload.
//!
//! ```text
//! cargo run --release -p memleak-trace --example bytes_per_event -- [--events N] [--compare] [--keep DIR]
//! ```
//!
//! Without `--compare` it writes the workload through [`TraceWriter`] with
//! the default options (what `memleak record` writes) and prints bytes per
//! event for the `events` table, per column, plus the decode rate through
//! [`Trace::events`]. With `--compare` it first writes the same events with
//! a list of candidate Parquet settings and prints one line per candidate;
//! that table is how the writer's settings were chosen (docs/format.md).
//!
//! The workload imitates what the tracer sees from a program whose two
//! threads malloc blocks of random sizes and free them soon after:
//!
//! - timestamps advance by 1–3 µs per event with nanosecond jitter (the
//!   cost of a uprobe round trip), plus a longer gap now and then;
//! - the two threads take turns in bursts (the ring buffer delivers a run
//!   of one CPU's events, then the other's);
//! - sizes are skewed towards small blocks (log-uniform up to 4 KiB, with a
//!   tail up to 1 MiB);
//! - addresses come from a per-thread arena with a LIFO free list per
//!   16-byte size class, as glibc's tcache/fastbins hand back the block
//!   freed last, so addresses are reused heavily;
//! - a block is freed a few events after it was allocated;
//! - allocations carry one of a handful of stack ids; frees carry none.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::types::Int8Type;
use arrow_array::{
    ArrayRef, DictionaryArray, Int8Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use memleak_trace::schema::{events_schema, Table, TABLE_KEY};
use memleak_trace::{Event, EventColumns, EventKind, Meta, Trace, TraceWriter, WriterOptions};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterPropertiesBuilder};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::ColumnPath;

#[path = "common/workload.rs"]
mod workload;
use workload::workload;

/// Builds events batches the way the writer does (dictionary `kind`).
fn batch(events: &[Event]) -> RecordBatch {
    let dict = Arc::new(StringArray::from_iter_values(
        EventKind::ALL.iter().map(|k| k.name()),
    ));
    let key = |k: EventKind| EventKind::ALL.iter().position(|&x| x == k).unwrap() as i8;
    let kinds = DictionaryArray::<Int8Type>::try_new(
        Int8Array::from_iter_values(events.iter().map(|e| key(e.kind))),
        dict,
    )
    .unwrap();
    let u64s = |f: fn(&Event) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from_iter_values(events.iter().map(f)))
    };
    let opt = |f: fn(&Event) -> Option<u64>| -> ArrayRef {
        Arc::new(UInt64Array::from_iter(events.iter().map(f)))
    };
    let cols: Vec<ArrayRef> = vec![
        u64s(|e| e.ts_ns),
        Arc::new(UInt32Array::from_iter_values(events.iter().map(|e| e.pid))),
        Arc::new(UInt32Array::from_iter_values(events.iter().map(|e| e.tid))),
        Arc::new(kinds),
        u64s(|e| e.addr),
        u64s(|e| e.size),
        opt(|e| e.old_addr),
        opt(|e| e.old_size),
        opt(|e| e.stack_id),
    ];
    RecordBatch::try_new(events_schema(), cols).unwrap()
}

/// Per-column compressed bytes over every `*.parquet` file in `dir` (or
/// the file itself), and the total file size.
fn column_sizes(path: &Path) -> (Vec<(String, u64)>, u64) {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
            .collect();
        v.sort();
        v
    } else {
        vec![path.to_path_buf()]
    };
    let mut cols: Vec<(String, u64)> = Vec::new();
    let mut total = 0;
    for f in files {
        total += std::fs::metadata(&f).unwrap().len();
        let reader = SerializedFileReader::new(File::open(&f).unwrap()).unwrap();
        for rg in reader.metadata().row_groups() {
            for (i, c) in rg.columns().iter().enumerate() {
                if cols.len() <= i {
                    cols.push((c.column_path().string(), 0));
                }
                cols[i].1 += c.compressed_size() as u64;
            }
        }
    }
    (cols, total)
}

struct Candidate {
    name: &'static str,
    row_group: usize,
    build: fn(WriterPropertiesBuilder) -> WriterPropertiesBuilder,
}

fn zstd(level: i32) -> Compression {
    Compression::ZSTD(ZstdLevel::try_new(level).unwrap())
}

fn delta(b: WriterPropertiesBuilder, col: &str) -> WriterPropertiesBuilder {
    b.set_column_dictionary_enabled(ColumnPath::from(col), false)
        .set_column_encoding(ColumnPath::from(col), Encoding::DELTA_BINARY_PACKED)
}

fn big_pages(b: WriterPropertiesBuilder) -> WriterPropertiesBuilder {
    b.set_data_page_row_count_limit(1 << 20)
        .set_data_page_size_limit(8 << 20)
        .set_dictionary_page_size_limit(8 << 20)
}

fn small_miniblocks(b: WriterPropertiesBuilder) -> WriterPropertiesBuilder {
    let o = parquet::file::properties::DeltaBinaryPackedEncoderOptions::try_new(128, 4).unwrap();
    b.set_column_delta_binary_packed_encoder_options(ColumnPath::from("ts_ns"), o)
}

fn bss(b: WriterPropertiesBuilder, col: &str) -> WriterPropertiesBuilder {
    b.set_column_dictionary_enabled(ColumnPath::from(col), false)
        .set_column_encoding(ColumnPath::from(col), Encoding::BYTE_STREAM_SPLIT)
}

fn candidates() -> Vec<Candidate> {
    vec![
        Candidate {
            name: "parquet defaults, uncompressed",
            row_group: 1 << 20,
            build: |b| b,
        },
        Candidate {
            name: "parquet defaults + zstd(3)",
            row_group: 1 << 20,
            build: |b| b.set_compression(zstd(3)),
        },
        Candidate {
            name: "ts delta, rest dict, zstd(3) [initial]",
            row_group: 1 << 20,
            build: |b| {
                delta(b.set_compression(zstd(3)), "ts_ns").set_dictionary_page_size_limit(4 << 20)
            },
        },
        Candidate {
            name: "  + chunk stats only",
            row_group: 1 << 20,
            build: |b| {
                delta(b.set_compression(zstd(3)), "ts_ns")
                    .set_dictionary_page_size_limit(4 << 20)
                    .set_statistics_enabled(EnabledStatistics::Chunk)
            },
        },
        Candidate {
            name: "  + no stats",
            row_group: 1 << 20,
            build: |b| {
                delta(b.set_compression(zstd(3)), "ts_ns")
                    .set_dictionary_page_size_limit(4 << 20)
                    .set_statistics_enabled(EnabledStatistics::None)
            },
        },
        Candidate {
            name: "  + addr delta",
            row_group: 1 << 20,
            build: |b| {
                delta(delta(b.set_compression(zstd(3)), "ts_ns"), "addr")
                    .set_dictionary_page_size_limit(4 << 20)
            },
        },
        Candidate {
            name: "  + size delta",
            row_group: 1 << 20,
            build: |b| {
                delta(delta(b.set_compression(zstd(3)), "ts_ns"), "size")
                    .set_dictionary_page_size_limit(4 << 20)
            },
        },
        Candidate {
            name: "  + stack_id delta",
            row_group: 1 << 20,
            build: |b| {
                delta(delta(b.set_compression(zstd(3)), "ts_ns"), "stack_id")
                    .set_dictionary_page_size_limit(4 << 20)
            },
        },
        Candidate {
            name: "  + ts byte_stream_split",
            row_group: 1 << 20,
            build: |b| {
                b.set_compression(zstd(3))
                    .set_column_dictionary_enabled(ColumnPath::from("ts_ns"), false)
                    .set_column_encoding(ColumnPath::from("ts_ns"), Encoding::BYTE_STREAM_SPLIT)
                    .set_dictionary_page_size_limit(4 << 20)
            },
        },
        Candidate {
            name: "  + big pages (1M rows, 8 MiB)",
            row_group: 1 << 20,
            build: |b| big_pages(delta(b.set_compression(zstd(3)), "ts_ns")),
        },
        Candidate {
            name: "  + big pages, zstd(1)",
            row_group: 1 << 20,
            build: |b| big_pages(delta(b.set_compression(zstd(1)), "ts_ns")),
        },
        Candidate {
            name: "  + big pages, zstd(6)",
            row_group: 1 << 20,
            build: |b| big_pages(delta(b.set_compression(zstd(6)), "ts_ns")),
        },
        Candidate {
            name: "  + big pages, zstd(9)",
            row_group: 1 << 20,
            build: |b| big_pages(delta(b.set_compression(zstd(9)), "ts_ns")),
        },
        Candidate {
            name: "  + big pages, zstd(15)",
            row_group: 1 << 20,
            build: |b| big_pages(delta(b.set_compression(zstd(15)), "ts_ns")),
        },
        Candidate {
            name: "  + big pages, zstd(3), 256K-row groups",
            row_group: 1 << 18,
            build: |b| big_pages(delta(b.set_compression(zstd(3)), "ts_ns")),
        },
        Candidate {
            name: "  + big pages, zstd(3), 128K-row groups",
            row_group: 1 << 17,
            build: |b| big_pages(delta(b.set_compression(zstd(3)), "ts_ns")),
        },
        Candidate {
            name: "  + big pages, zstd(3), 512K-row groups",
            row_group: 1 << 19,
            build: |b| big_pages(delta(b.set_compression(zstd(3)), "ts_ns")),
        },
        Candidate {
            name: "  + big pages, ts 32-value miniblocks",
            row_group: 1 << 20,
            build: |b| big_pages(small_miniblocks(delta(b.set_compression(zstd(3)), "ts_ns"))),
        },
        Candidate {
            name: "  + big pages, ts 32-value miniblocks, 256K",
            row_group: 1 << 18,
            build: |b| big_pages(small_miniblocks(delta(b.set_compression(zstd(3)), "ts_ns"))),
        },
        Candidate {
            name: "  + big pages, 256K, size byte_stream_split",
            row_group: 1 << 18,
            build: |b| {
                big_pages(bss(
                    small_miniblocks(delta(b.set_compression(zstd(3)), "ts_ns")),
                    "size",
                ))
            },
        },
        Candidate {
            name: "  + big pages, 256K, addr byte_stream_split",
            row_group: 1 << 18,
            build: |b| {
                big_pages(bss(
                    small_miniblocks(delta(b.set_compression(zstd(3)), "ts_ns")),
                    "addr",
                ))
            },
        },
        Candidate {
            name: "  + big pages, 256K, stack byte_stream_split",
            row_group: 1 << 18,
            build: |b| {
                big_pages(bss(
                    small_miniblocks(delta(b.set_compression(zstd(3)), "ts_ns")),
                    "stack_id",
                ))
            },
        },
        Candidate {
            name: "  + big pages, zstd(3), 4M-row groups",
            row_group: 1 << 22,
            build: |b| big_pages(delta(b.set_compression(zstd(3)), "ts_ns")),
        },
    ]
}

fn run_candidate(
    c: &Candidate,
    events: &[Event],
    dir: &Path,
    name: &str,
) -> (f64, f64, f64, Vec<(String, u64)>) {
    let path = dir.join(format!("{name}.parquet"));
    let kv = vec![KeyValue::new(
        TABLE_KEY.to_string(),
        Table::Events.name().to_string(),
    )];
    let props = (c.build)(WriterProperties::builder().set_key_value_metadata(Some(kv)))
        .set_max_row_group_row_count(Some(c.row_group))
        .build();
    let t = Instant::now();
    let mut w =
        ArrowWriter::try_new(File::create(&path).unwrap(), events_schema(), Some(props)).unwrap();
    for chunk in events.chunks(64 * 1024) {
        w.write(&batch(chunk)).unwrap();
    }
    w.close().unwrap();
    let write_rate = events.len() as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap())
        .unwrap()
        .with_batch_size(64 * 1024)
        .build()
        .unwrap();
    let mut rows = 0;
    for b in reader {
        rows += b.unwrap().num_rows();
    }
    assert_eq!(rows, events.len());
    let read_rate = events.len() as f64 / t.elapsed().as_secs_f64();
    let (cols, total) = column_sizes(&path);
    std::fs::remove_file(&path).unwrap();
    (
        total as f64 / events.len() as f64,
        write_rate,
        read_rate,
        cols,
    )
}

fn main() {
    let mut n = 10_000_000usize;
    let mut compare = false;
    let mut keep: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--events" => {
                n = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--events N")
            }
            "--compare" => compare = true,
            "--keep" => keep = Some(args.next().expect("--keep DIR").into()),
            other => panic!("unknown argument {other}; see the doc comment"),
        }
    }
    let t = Instant::now();
    let events = workload(n, 0x5eed);
    let mallocs = events
        .iter()
        .filter(|e| e.kind == EventKind::Malloc)
        .count();
    let distinct: std::collections::HashSet<u64> = events.iter().map(|e| e.addr).collect();
    println!(
        "workload: {n} events ({mallocs} malloc, {} free), {} distinct addresses, {:.1} s of trace time, generated in {:.1?}",
        n - mallocs,
        distinct.len(),
        (events[n - 1].ts_ns - events[0].ts_ns) as f64 / 1e9,
        t.elapsed()
    );
    let scratch = tempfile::tempdir().unwrap();

    if compare {
        println!();
        println!(
            "{:<44} {:>8} {:>10} {:>10}   per column (bytes/event)",
            "candidate", "B/event", "write ev/s", "read ev/s"
        );
        for (i, c) in candidates().iter().enumerate() {
            let (bpe, w, r, cols) = run_candidate(c, &events, scratch.path(), &format!("c{i}"));
            let per: Vec<String> = cols
                .iter()
                .map(|(name, b)| format!("{name}={:.3}", *b as f64 / n as f64))
                .collect();
            println!(
                "{:<44} {:>8.3} {:>9.1}M {:>9.1}M   {}",
                c.name,
                bpe,
                w / 1e6,
                r / 1e6,
                per.join(" ")
            );
        }
        // The same events with microsecond timestamps: how much of the cost
        // is the nanosecond jitter.
        let coarse: Vec<Event> = events
            .iter()
            .map(|e| Event {
                ts_ns: e.ts_ns / 1000 * 1000,
                ..*e
            })
            .collect();
        let c = &candidates()[9];
        let (bpe, _, _, cols) = run_candidate(c, &coarse, scratch.path(), "coarse");
        let ts = cols
            .iter()
            .find(|(name, _)| name == "ts_ns")
            .map(|(_, b)| *b as f64 / n as f64)
            .unwrap_or(0.0);
        println!(
            "{:<44} {:>8.3}   ts_ns={ts:.3}",
            "big pages, ts rounded to 1 us (not used)", bpe
        );
        println!();
    }

    // What `memleak record` writes.
    let root = keep.unwrap_or_else(|| scratch.path().join("trace.parquet"));
    let t = Instant::now();
    let opts = WriterOptions {
        force: true,
        ..WriterOptions::default()
    };
    let mut w = TraceWriter::create(&root, Meta::default(), opts).unwrap();
    for e in &events {
        w.push_event(e).unwrap();
    }
    w.finish().unwrap();
    let write = t.elapsed();
    let (cols, total) = column_sizes(&root.join("events"));
    println!(
        "TraceWriter defaults: {:.3} bytes/event ({} bytes for {n} events, written at {:.1} M events/s)",
        total as f64 / n as f64,
        total,
        n as f64 / write.as_secs_f64() / 1e6
    );
    let col_total: u64 = cols.iter().map(|(_, b)| b).sum();
    for (name, b) in &cols {
        println!(
            "  {name:<10} {:>7.3} bytes/event {:>5.1}%",
            *b as f64 / n as f64,
            *b as f64 * 100.0 / col_total as f64
        );
    }
    println!(
        "  {:<10} {:>7.3} bytes/event (footers, page headers, indexes)",
        "overhead",
        (total - col_total) as f64 / n as f64
    );

    let trace = Trace::open(&root).unwrap();
    for (label, cols) in [
        ("all columns", EventColumns::ALL),
        ("replay columns", EventColumns::REPLAY),
    ] {
        let t = Instant::now();
        let mut rows = 0;
        for b in trace.events(cols).unwrap() {
            rows += b.unwrap().len();
        }
        assert_eq!(rows, n);
        let dt = t.elapsed();
        println!(
            "decode through Trace::events ({label}): {:.1} M events/s",
            n as f64 / dt.as_secs_f64() / 1e6
        );
    }
}
