//! Fast decoding of event row groups into the columns replay reads.
//!
//! Decoding dominates the cost of an analysis. `Trace::read_unit` is the
//! reference decoder; it filters every value through a dynamic call (to
//! drop rows of unknown kinds), which makes it several times slower than
//! the Parquet decoder underneath. This module decodes the same row groups
//! with the Parquet reader directly and borrows the Arrow buffers as they
//! are, falling back to `read_unit` for anything it does not expect
//! (segments it cannot match to the trace's units, kinds stored as plain
//! strings). Rows of kinds this version does not know are kept, with a
//! kind code replay ignores.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int8Type, UInt32Type, UInt64Type};
use arrow_array::{Array, RecordBatch, UInt32Array, UInt64Array};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;

use memleak_trace::reader::RowGroupUnit;
use memleak_trace::{EventBatch, EventColumns, EventKind, Trace};

/// Kind code of rows whose kind this version does not know.
pub const UNKNOWN_KIND: u8 = 255;

/// The columns of one row group that replay reads. Nulls are 0.
pub struct Columns {
    rows: usize,
    ts: UInt64Array,
    pid: UInt32Array,
    kind: Vec<u8>,
    addr: UInt64Array,
    size: UInt64Array,
    old_addr: UInt64Array,
    stack_id: UInt64Array,
    old_size: UInt64Array,
}

/// Borrowed slices of [`Columns`].
#[derive(Clone, Copy)]
pub struct Slices<'a> {
    /// `ts_ns`.
    pub ts: &'a [u64],
    /// `pid`.
    pub pid: &'a [u32],
    /// `kind` as [`EventKind`] codes ([`UNKNOWN_KIND`] if unknown).
    pub kind: &'a [u8],
    /// `addr`.
    pub addr: &'a [u64],
    /// `size`.
    pub size: &'a [u64],
    /// `old_addr`.
    pub old_addr: &'a [u64],
    /// `stack_id`.
    pub stack_id: &'a [u64],
    /// `old_size`.
    pub old_size: &'a [u64],
}

impl Columns {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The first `n` rows as slices.
    pub fn slices(&self, n: usize) -> Slices<'_> {
        Slices {
            ts: &self.ts.values()[..n],
            pid: &self.pid.values()[..n],
            kind: &self.kind[..n],
            addr: &self.addr.values()[..n],
            size: &self.size.values()[..n],
            old_addr: &self.old_addr.values()[..n],
            stack_id: &self.stack_id.values()[..n],
            old_size: &self.old_size.values()[..n],
        }
    }

    fn from_batch(b: EventBatch) -> Columns {
        Columns {
            rows: b.len(),
            ts: b.ts_ns.into(),
            pid: b.pid.into(),
            kind: b.kind.iter().map(|&k| k as u8).collect(),
            addr: b.addr.into(),
            size: b.size.into(),
            old_addr: b.old_addr.into(),
            stack_id: b.stack_id.into(),
            old_size: b.old_size.into(),
        }
    }
}

struct Segment {
    path: PathBuf,
    meta: ArrowReaderMetadata,
}

/// Decodes the event row groups of a trace.
pub struct Decoder<'t> {
    trace: &'t Trace,
    /// The events segments, as the trace's units number them; `None` when
    /// they could not be matched (then every unit takes the slow path).
    segments: Option<Vec<Segment>>,
}

const NAMES: [&str; 8] = [
    "ts_ns", "pid", "kind", "addr", "size", "old_addr", "stack_id", "old_size",
];

impl<'t> Decoder<'t> {
    /// Prepares to decode `trace`'s events.
    pub fn new(trace: &'t Trace) -> Self {
        Decoder {
            trace,
            segments: match_segments(trace),
        }
    }

    /// Decodes one row group.
    pub fn read(&self, unit: &RowGroupUnit) -> memleak_trace::Result<Columns> {
        if let Some(seg) = self.segments.as_ref().and_then(|s| s.get(unit.segment)) {
            if let Some(cols) = read_fast(seg, unit) {
                return Ok(cols);
            }
        }
        Ok(Columns::from_batch(
            self.trace.read_unit(unit, EventColumns::REPLAY)?,
        ))
    }
}

/// Lists the events segments the way the trace does (sorted, the last one
/// skipped if its footer is unreadable) and checks that their row groups
/// are exactly the trace's units.
fn match_segments(trace: &Trace) -> Option<Vec<Segment>> {
    let dir = trace.path().join("events");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    paths.sort();
    let mut segments = Vec::with_capacity(paths.len());
    let last = paths.len().saturating_sub(1);
    for (i, path) in paths.into_iter().enumerate() {
        match load_footer(&path) {
            Some(meta) => segments.push(Segment { path, meta }),
            None if i == last => {}
            None => return None,
        }
    }
    let units = trace.event_units();
    let ok = units.iter().all(|u| {
        segments.get(u.segment).is_some_and(|s| {
            let md = s.meta.metadata();
            u.row_group < md.num_row_groups()
                && md.row_group(u.row_group).num_rows() as u64 == u.rows
        })
    });
    let total: usize = segments
        .iter()
        .map(|s| s.meta.metadata().num_row_groups())
        .sum();
    (ok && total == units.len()).then_some(segments)
}

fn load_footer(path: &Path) -> Option<ArrowReaderMetadata> {
    let file = File::open(path).ok()?;
    ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).ok()
}

/// Decodes a row group with the Parquet reader; `None` when anything is
/// unexpected, so the caller takes the reference path (which reports the
/// error properly if there is one).
fn read_fast(seg: &Segment, unit: &RowGroupUnit) -> Option<Columns> {
    let file = File::open(&seg.path).ok()?;
    let mask = ProjectionMask::columns(seg.meta.parquet_schema(), NAMES);
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, seg.meta.clone())
        .with_projection(mask)
        .with_row_groups(vec![unit.row_group])
        .with_batch_size(unit.rows.max(1) as usize)
        .build()
        .ok()?;
    // One batch per row group was asked for; anything else takes the
    // reference path.
    let mut batches: Vec<RecordBatch> = Vec::new();
    for b in reader {
        batches.push(b.ok()?);
    }
    if batches.len() != 1 {
        return None;
    }
    let batch = batches.pop()?;
    let u64col = |name: &str| -> Option<UInt64Array> {
        let a = batch
            .column_by_name(name)?
            .as_primitive_opt::<UInt64Type>()?
            .clone();
        Some(zero_nulls(a))
    };
    let pid = batch
        .column_by_name("pid")?
        .as_primitive_opt::<UInt32Type>()?
        .clone();
    if pid.null_count() > 0 {
        return None;
    }
    let kind = kind_codes(batch.column_by_name("kind")?.as_ref())?;
    Some(Columns {
        rows: batch.num_rows(),
        ts: u64col("ts_ns")?,
        pid,
        kind,
        addr: u64col("addr")?,
        size: u64col("size")?,
        old_addr: u64col("old_addr")?,
        stack_id: u64col("stack_id")?,
        old_size: u64col("old_size")?,
    })
}

/// The values with nulls replaced by 0, without copying when there are
/// no nulls.
fn zero_nulls(a: UInt64Array) -> UInt64Array {
    match a.nulls() {
        Some(nulls) if nulls.null_count() > 0 => {
            let mut v = vec![0u64; a.len()];
            let vals = a.values();
            for i in nulls.valid_indices() {
                v[i] = vals[i];
            }
            UInt64Array::from(v)
        }
        _ => a,
    }
}

/// Kind codes from the dictionary-encoded `kind` column.
fn kind_codes(col: &dyn Array) -> Option<Vec<u8>> {
    let dict = col.as_dictionary_opt::<Int8Type>()?;
    let names = dict.values().as_string_opt::<i32>()?;
    let mut table = [UNKNOWN_KIND; 256];
    for (i, slot) in table.iter_mut().enumerate().take(names.len()) {
        if let Some(k) = EventKind::from_name(names.value(i)) {
            *slot = k as u8;
        }
    }
    if dict.keys().null_count() > 0 {
        return None;
    }
    Some(
        dict.keys()
            .values()
            .iter()
            .map(|&k| table[k as u8 as usize])
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use memleak_trace::{Event, Meta, TraceWriter, WriterOptions};

    #[test]
    fn fast_path_matches_the_reference_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let opts = WriterOptions {
            row_group_rows: 5,
            segment_rows: 12,
            ..WriterOptions::default()
        };
        let mut w = TraceWriter::create(&path, Meta::default(), opts).unwrap();
        for i in 0..40u64 {
            let kind = EventKind::ALL[i as usize % EventKind::ALL.len()];
            w.push_event(&Event {
                ts_ns: 100 + i,
                pid: 7 + (i % 3) as u32,
                tid: 1,
                kind,
                addr: 0x1000 * i,
                size: i * 3,
                old_addr: (i % 4 == 0).then_some(0x99 + i),
                old_size: (i % 5 == 0).then_some(i),
                stack_id: (i % 2 == 0).then_some(i),
            })
            .unwrap();
        }
        w.finish().unwrap();
        let trace = Trace::open(&path).unwrap();
        let dec = Decoder::new(&trace);
        assert!(dec.segments.is_some(), "segments match the trace's units");
        for u in trace.event_units() {
            let fast = dec.read(&u).unwrap();
            let slow = Columns::from_batch(trace.read_unit(&u, EventColumns::REPLAY).unwrap());
            let (a, b) = (fast.slices(fast.len()), slow.slices(slow.len()));
            assert_eq!(a.ts, b.ts);
            assert_eq!(a.pid, b.pid);
            assert_eq!(a.kind, b.kind);
            assert_eq!(a.addr, b.addr);
            assert_eq!(a.size, b.size);
            assert_eq!(a.old_addr, b.old_addr);
            assert_eq!(a.stack_id, b.stack_id);
            assert_eq!(a.old_size, b.old_size);
        }
    }
}
