//! Measures what writing the `events` table costs the recorder: CPU
//! nanoseconds per event (user + sys from `getrusage(RUSAGE_SELF)`, so
//! every thread counts), wall nanoseconds per event, bytes per event, and
//! how fast the result decodes through [`Trace::events`].
//!
//! ```text
//! cargo run --release -p memleak-trace --example write_speed -- \
//!     [--events N] [--repeat R] [--only SUBSTRING]... [--no-decode] [--mallopt]
//! ```
//!
//! The events are the synthetic two-thread malloc/free workload of
//! `bytes_per_event` (generated before any clock starts). Every
//! configuration is run `R` times, round-robin so that noise from other
//! processes on a shared machine spreads over all of them, and the medians
//! are printed.
//!
//! Every configuration but the first is the real write path:
//! `TraceWriter::push_event` per event, then `finish` (footer, fsync,
//! rename, `meta.json`), with the events table's Parquet settings changed
//! through `WriterOptions::events_tuning`. "push into column vectors only"
//! is the floor under any Parquet setting. Decode rates are one thread
//! through `Trace::events` with the replay columns and with all columns.
//! `--mallopt` raises glibc's mmap and trim thresholds first, so freed
//! buffers are reused instead of being returned to the kernel and faulted
//! in again.

use std::path::Path;
use std::time::Instant;

use memleak_trace::{Event, EventColumns, Meta, Trace, TraceWriter, WriterOptions};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterPropertiesBuilder};
use parquet::schema::types::ColumnPath;

#[path = "common/workload.rs"]
mod workload;
use workload::workload;

/// CPU time of the whole process (all threads), user + system, in ns.
fn cpu_ns() -> u64 {
    // SAFETY: getrusage only writes the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0, "getrusage");
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

const BATCH: usize = 64 * 1024;

/// Column vectors like the writer's: the floor under any Parquet setting.
struct Cols {
    ts: Vec<u64>,
    pid: Vec<u32>,
    tid: Vec<u32>,
    kind: Vec<i8>,
    addr: Vec<u64>,
    size: Vec<u64>,
    /// Present values of the nullable columns, with their rows.
    opt: [Vec<(u32, u64)>; 3],
}

impl Cols {
    fn new() -> Self {
        let opt = || Vec::with_capacity(BATCH);
        Cols {
            ts: Vec::with_capacity(BATCH),
            pid: Vec::with_capacity(BATCH),
            tid: Vec::with_capacity(BATCH),
            kind: Vec::with_capacity(BATCH),
            addr: Vec::with_capacity(BATCH),
            size: Vec::with_capacity(BATCH),
            opt: [opt(), opt(), opt()],
        }
    }

    fn push(&mut self, e: &Event) {
        self.ts.push(e.ts_ns);
        self.pid.push(e.pid);
        self.tid.push(e.tid);
        self.kind.push(e.kind as u8 as i8);
        self.addr.push(e.addr);
        self.size.push(e.size);
        let row = self.ts.len() as u32 - 1;
        for (i, v) in [e.old_addr, e.old_size, e.stack_id].into_iter().enumerate() {
            if let Some(v) = v {
                self.opt[i].push((row, v));
            }
        }
    }

    /// Hands the batch over (to nobody) and starts the next in the same
    /// memory, as the writer does once Parquet has encoded a batch.
    fn clear(&mut self) -> usize {
        let n = std::hint::black_box(&self.ts).len();
        self.ts.clear();
        self.pid.clear();
        self.tid.clear();
        self.kind.clear();
        self.addr.clear();
        self.size.clear();
        for present in &mut self.opt {
            std::hint::black_box(&present);
            present.clear();
        }
        n
    }
}

type Tune = fn(WriterPropertiesBuilder) -> WriterPropertiesBuilder;

enum How {
    /// `TraceWriter`, with the events settings changed by the function.
    Writer(Option<Tune>),
    /// Column vectors only.
    PushOnly,
    /// Reads every field of every input event, nothing else.
    ReadOnly,
}

struct Config {
    name: &'static str,
    how: How,
}

fn zstd(level: i32) -> Compression {
    Compression::ZSTD(ZstdLevel::try_new(level).unwrap())
}

fn col(name: &str) -> ColumnPath {
    ColumnPath::from(name)
}

/// The writer's settings before this benchmark, expressed on top of the
/// current ones: zstd(3) on every column, chunk statistics on every column,
/// one page per row group, mini-batches of 1024 values, `pid`/`tid`
/// dictionary-encoded.
fn old(b: WriterPropertiesBuilder) -> WriterPropertiesBuilder {
    dict(dict(b, "pid"), "tid")
        .set_compression(zstd(3))
        .set_column_compression(col("ts_ns"), zstd(3))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_data_page_row_count_limit(256 << 10)
        .set_write_batch_size(1024)
}

/// `c` without dictionary, in encoding `e`.
fn enc(b: WriterPropertiesBuilder, c: &str, e: Encoding) -> WriterPropertiesBuilder {
    b.set_column_dictionary_enabled(col(c), false)
        .set_column_encoding(col(c), e)
}

/// `c` dictionary-encoded (plain fallback).
fn dict(b: WriterPropertiesBuilder, c: &str) -> WriterPropertiesBuilder {
    b.set_column_dictionary_enabled(col(c), true)
        .set_column_encoding(col(c), Encoding::PLAIN)
}

macro_rules! configs {
    ($($name:literal => $tune:expr,)*) => {
        vec![$(Config { name: $name, how: How::Writer($tune) },)*]
    };
}

fn configs() -> Vec<Config> {
    let mut v = vec![
        Config {
            name: "read the input events only",
            how: How::ReadOnly,
        },
        Config {
            name: "push into column vectors only",
            how: How::PushOnly,
        },
    ];
    v.extend(configs![
        "old writer settings" => Some(old),
        "old, zstd(1)" => Some(|b| {
            old(b)
                .set_compression(zstd(1))
                .set_column_compression(col("ts_ns"), zstd(1))
        }),
        "old, statistics on ts_ns only" => Some(|b| {
            old(b)
                .set_statistics_enabled(EnabledStatistics::None)
                .set_column_statistics_enabled(col("ts_ns"), EnabledStatistics::Chunk)
        }),
        "old, pages of 64Ki rows" => Some(|b| old(b).set_data_page_row_count_limit(64 << 10)),
        "old, pid+tid delta" => Some(|b| {
            let b = enc(old(b), "pid", Encoding::DELTA_BINARY_PACKED);
            enc(b, "tid", Encoding::DELTA_BINARY_PACKED)
        }),
        "new defaults" => None,
        "new, zstd(3)" => Some(|b| b.set_compression(zstd(3))),
        "new, zstd(-1)" => Some(|b| b.set_compression(zstd(-1))),
        "new, ts_ns zstd(1)" => Some(|b| b.set_column_compression(col("ts_ns"), zstd(1))),
        "new, pages of 256Ki rows" => Some(|b| b.set_data_page_row_count_limit(256 << 10)),
        "new, pages of 32Ki rows" => Some(|b| b.set_data_page_row_count_limit(32 << 10)),
        "new, pages of 16Ki rows" => Some(|b| b.set_data_page_row_count_limit(16 << 10)),
        "new, mini-batches of 8Ki" => Some(|b| b.set_write_batch_size(8 << 10)),
        "new, mini-batches of 32Ki" => Some(|b| b.set_write_batch_size(32 << 10)),
        "new, pid+tid dictionary" => Some(|b| dict(dict(b, "pid"), "tid")),
        "new, size dictionary" => Some(|b| dict(b, "size")),
        "new, size delta" => Some(|b| enc(b, "size", Encoding::DELTA_BINARY_PACKED)),
        "new, addr plain" => Some(|b| enc(b, "addr", Encoding::PLAIN)),
        "new, addr byte_stream_split" => Some(|b| enc(b, "addr", Encoding::BYTE_STREAM_SPLIT)),
        "new, addr delta" => Some(|b| enc(b, "addr", Encoding::DELTA_BINARY_PACKED)),
        "new, stack_id delta" => Some(|b| enc(b, "stack_id", Encoding::DELTA_BINARY_PACKED)),
        "new, kind+stack_id uncompressed" => Some(|b| {
            b.set_column_compression(col("kind"), Compression::UNCOMPRESSED)
                .set_column_compression(col("stack_id"), Compression::UNCOMPRESSED)
        }),
        "new, 512Ki-row groups" => Some(|b| b.set_max_row_group_row_count(Some(512 << 10))),
        "new, statistics everywhere" => {
            Some(|b| b.set_statistics_enabled(EnabledStatistics::Chunk))
        },
    ]);
    v
}

/// One run: (cpu ns, wall ns, bytes of the events table).
fn run(c: &Config, events: &[Event], root: &Path) -> (u64, u64, u64) {
    if root.exists() {
        std::fs::remove_dir_all(root).unwrap();
    }
    let (cpu0, t0) = (cpu_ns(), Instant::now());
    match &c.how {
        How::Writer(tune) => {
            let opts = WriterOptions {
                force: true,
                events_tuning: *tune,
                ..WriterOptions::default()
            };
            let mut w = TraceWriter::create(root, Meta::default(), opts).unwrap();
            for e in events {
                w.push_event(e).unwrap();
            }
            w.finish().unwrap();
        }
        How::ReadOnly => {
            let mut acc = 0u64;
            for e in events {
                let e = std::hint::black_box(e);
                acc = acc
                    .wrapping_add(e.ts_ns ^ e.addr ^ e.size)
                    .wrapping_add((e.pid ^ e.tid) as u64 + e.kind as u64)
                    .wrapping_add(e.old_addr.unwrap_or(1) ^ e.old_size.unwrap_or(2))
                    .wrapping_add(e.stack_id.unwrap_or(3));
            }
            std::hint::black_box(acc);
        }
        How::PushOnly => {
            let mut cols = Cols::new();
            let mut rows = 0;
            for e in events {
                cols.push(e);
                if cols.ts.len() == BATCH {
                    rows += cols.clear();
                }
            }
            rows += cols.clear();
            assert_eq!(rows, events.len());
        }
    }
    let (cpu, wall) = (cpu_ns() - cpu0, t0.elapsed().as_nanos() as u64);
    let bytes = match std::fs::read_dir(root.join("events")) {
        Ok(d) => d.map(|e| e.unwrap().metadata().unwrap().len()).sum(),
        Err(_) => 0,
    };
    (cpu, wall, bytes)
}

/// Events per second through `Trace::events` (one thread).
fn decode(root: &Path, cols: EventColumns, n: usize) -> f64 {
    let trace = Trace::open(root).unwrap();
    let t = Instant::now();
    let mut rows = 0;
    for b in trace.events(cols).unwrap() {
        rows += b.unwrap().len();
    }
    assert_eq!(rows, n);
    n as f64 / t.elapsed().as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn main() {
    let mut n = 4_000_000usize;
    let mut repeat = 5usize;
    let mut only: Vec<String> = Vec::new();
    let mut do_decode = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what} needs a number"))
        };
        match a.as_str() {
            "--events" => n = num("--events"),
            "--repeat" => repeat = num("--repeat"),
            "--only" => only.push(args.next().expect("--only SUBSTRING")),
            "--no-decode" => do_decode = false,
            "--mallopt" => {
                // What a recorder could do: keep freed memory instead of
                // returning it to the kernel and faulting it in again for
                // the next batch and page.
                // SAFETY: plain glibc tuning calls, before any thread.
                unsafe {
                    libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
                    libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
                }
            }
            other => panic!("unknown argument {other}; see the doc comment"),
        }
    }
    let events = workload(n, 0x5eed);
    let configs: Vec<Config> = configs()
        .into_iter()
        .filter(|c| only.is_empty() || only.iter().any(|o| c.name.contains(o.as_str())))
        .collect();
    let scratch = tempfile::tempdir().unwrap();
    let k = configs.len();
    let (mut cpu, mut wall) = (vec![Vec::new(); k], vec![Vec::new(); k]);
    let (mut replay, mut all) = (vec![Vec::new(); k], vec![Vec::new(); k]);
    let mut bytes = vec![0u64; k];
    for _ in 0..repeat {
        for (i, c) in configs.iter().enumerate() {
            let root = scratch.path().join(format!("c{i}"));
            let (c_ns, w_ns, b) = run(c, &events, &root);
            cpu[i].push(c_ns as f64 / n as f64);
            wall[i].push(w_ns as f64 / n as f64);
            bytes[i] = b;
            if do_decode && b > 0 {
                replay[i].push(decode(&root, EventColumns::REPLAY, n) / 1e6);
                all[i].push(decode(&root, EventColumns::ALL, n) / 1e6);
            }
            if root.exists() {
                std::fs::remove_dir_all(&root).unwrap();
            }
        }
    }
    println!("{n} events, {repeat} runs each, medians; decode through Trace::events, one thread");
    println!(
        "{:<34} {:>8} {:>8} {:>8} {:>11} {:>11}",
        "configuration", "cpu ns", "wall ns", "B/event", "replay M/s", "all M/s"
    );
    for (i, c) in configs.iter().enumerate() {
        let dec = |v: &mut Vec<f64>| {
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{:.1}", median(v))
            }
        };
        println!(
            "{:<34} {:>8.1} {:>8.1} {:>8.3} {:>11} {:>11}",
            c.name,
            median(&mut cpu[i]),
            median(&mut wall[i]),
            bytes[i] as f64 / n as f64,
            dec(&mut replay[i]),
            dec(&mut all[i]),
        );
    }
}
