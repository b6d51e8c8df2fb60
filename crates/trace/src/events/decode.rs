//! Fast decoding of event row groups into the columns replay reads.
//!
//! Decoding dominates the cost of an analysis. `Trace::read_unit` is the
//! reference decoder; it filters every value through a dynamic call (to
//! drop rows of unknown kinds), which makes it several times slower than
//! the Parquet decoder underneath. This module decodes the same row groups
//! page by page itself ([`super::pages`]), falling back to the Parquet
//! reader's Arrow buffers, and then to `read_unit`, for anything it does
//! not expect (encodings or codecs it does not decode). It reads the
//! footers the reader loaded and checked when it opened the trace, so
//! its segments are exactly the ones the trace's units number. Rows of
//! kinds this version does not know are kept, with a kind code replay
//! ignores.
//!
//! [`Decoder::read`] decodes a whole row group into [`Columns`] (what the
//! replay of several partitions reads); [`Decoder::stream`] hands a row
//! group over a page of every column at a time, for the single-partition
//! replay, which packs the rows into operations while they are in the
//! cache.

use std::cell::RefCell;
use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int8Type, UInt32Type, UInt64Type};
use arrow_array::{Array, RecordBatch, UInt64Array};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;

use super::columns::{Columns, Slices, UNKNOWN_KIND};
use super::pages;
use crate::checksum::Deferred;
use crate::guarded;
use crate::reader::RowGroupUnit;
use crate::{EventBatch, EventColumns, EventKind, Trace};

impl Columns {
    fn from_batch(b: EventBatch) -> Columns {
        Columns {
            rows: b.len(),
            ts: b.ts_ns,
            pid: b.pid,
            tid: b.tid,
            kind: b.kind.iter().map(|&k| k as u8).collect(),
            addr: b.addr,
            size: b.size,
            old_addr: b.old_addr,
            stack_id: b.stack_id,
            old_size: b.old_size,
        }
    }
}

struct Segment<'t> {
    path: &'t Path,
    /// The footer, as the reader loaded it.
    meta: &'t ArrowReaderMetadata,
    /// Leaf column index of each of [`NAMES`], if the file has it.
    leaves: [Option<usize>; 9],
    /// The checksum to note each read in, if it is checked as read.
    deferred: Option<&'t Deferred>,
}

/// Decodes the event row groups of a trace.
pub struct Decoder<'t> {
    trace: &'t Trace,
    /// The events segments, as the trace's units number them.
    segments: Vec<Segment<'t>>,
    /// Decoded row groups replay is done with, and read buffers, kept for
    /// reuse: fresh multi-megabyte buffers for every row group cost more
    /// in page faults than decoding into them.
    spare: Mutex<Vec<Columns>>,
    bufs: Mutex<Vec<Vec<u8>>>,
}

/// Spare [`Columns`] kept for reuse. With several replay partitions the
/// columns are what replay reads, and the row groups decoded ahead plus
/// the one being replayed are in use at once (up to 2 × threads + 1); a
/// single partition reads packed operations and uses `Columns` only when
/// the page decoder falls back.
const SPARE: usize = 8;

/// Locks a pool of spare buffers, even one a panicking replay worker left
/// poisoned: a pool holds only buffers to reuse, never half-written state.
fn lock_pool<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    static SCRATCH: RefCell<pages::Scratch> = RefCell::default();
}

const NAMES: [&str; 9] = [
    "ts_ns", "pid", "kind", "addr", "size", "old_addr", "stack_id", "old_size", "tid",
];

impl<'t> Decoder<'t> {
    /// Prepares to decode `trace`'s events.
    pub fn new(trace: &'t Trace) -> Self {
        Decoder {
            trace,
            segments: segments(trace),
            spare: Mutex::new(Vec::new()),
            bufs: Mutex::new(Vec::new()),
        }
    }

    /// Hands back a decoded row group whose buffers the next reads can
    /// reuse.
    pub fn recycle(&self, c: Columns) {
        let mut spare = lock_pool(&self.spare);
        if spare.len() < SPARE {
            spare.push(c);
        }
    }

    /// Decodes one row group.
    pub fn read(&self, unit: &RowGroupUnit) -> crate::Result<Columns> {
        if let Some(seg) = self.segments.get(unit.segment) {
            if let Some(cols) = self.read_pages(seg, unit) {
                return Ok(cols);
            }
            if let Some(cols) = read_fast(seg, unit) {
                return Ok(cols);
            }
        }
        Ok(Columns::from_batch(
            self.trace.read_unit(unit, EventColumns::REPLAY)?,
        ))
    }
}

/// The trace's events segments with the leaf columns of [`NAMES`]: the
/// reader's own footers, whose row groups are the trace's units.
fn segments(trace: &Trace) -> Vec<Segment<'_>> {
    trace
        .event_segments()
        .iter()
        .map(|s| {
            let schema = s.meta.parquet_schema();
            let leaves = NAMES.map(|name| {
                (0..schema.num_columns()).find(|&i| schema.column(i).path().string() == name)
            });
            Segment {
                path: &s.path,
                meta: &s.meta,
                leaves,
                deferred: s.deferred.as_ref(),
            }
        })
        .collect()
}

impl Decoder<'_> {
    /// Decodes a row group page by page with [`super::pages`] into spare
    /// buffers; `None` when anything is unexpected.
    fn read_pages(&self, seg: &Segment, unit: &RowGroupUnit) -> Option<Columns> {
        let md = seg.meta.metadata().row_group(unit.row_group);
        let rows = usize::try_from(md.num_rows()).ok()?;
        let leaves = page_leaves(seg, md)?;
        let chunk = self.read_chunk(seg, md, &leaves)?;
        let mut c = lock_pool(&self.spare).pop().unwrap_or_default();
        c.rows = rows;
        let ok =
            SCRATCH.with(|s| decode_into(&chunk, md, &leaves, rows, &mut s.borrow_mut(), &mut c));
        self.give_back(chunk);
        match ok {
            Some(()) => Some(c),
            None => {
                self.recycle(c);
                None
            }
        }
    }

    /// Reads the byte range of a row group's columns the page decoder
    /// reads, in one read.
    fn read_chunk(
        &self,
        seg: &Segment,
        md: &parquet::file::metadata::RowGroupMetaData,
        leaves: &[usize; 9],
    ) -> Option<Arc<pages::Chunk>> {
        let ranges = leaves.map(|l| md.column(l).byte_range());
        let start = ranges.iter().map(|r| r.0).min()?;
        let end = ranges.iter().map(|r| r.0.checked_add(r.1)).max()??;
        let len = usize::try_from(end - start).ok()?;
        let mut data = lock_pool(&self.bufs).pop().unwrap_or_default();
        // Zero only what was never used: the read overwrites it all.
        if data.len() < len {
            data.resize(len, 0);
        }
        data.truncate(len);
        let file = File::open(seg.path).ok()?;
        match seg.deferred {
            Some(d) => d.read_at(&file, &mut data, start).ok()?,
            None => std::os::unix::fs::FileExt::read_exact_at(&file, &mut data, start).ok()?,
        }
        Some(Arc::new(pages::Chunk {
            base: start,
            data: data.into(),
        }))
    }

    /// Takes the read buffer back once the pages referring to it are gone.
    fn give_back(&self, chunk: Arc<pages::Chunk>) {
        if let Ok(chunk) = Arc::try_unwrap(chunk) {
            if let Ok(b) = chunk.data.try_into_mut() {
                lock_pool(&self.bufs).push(b.into());
            }
        }
    }

    /// Hands the rows of one row group to `sink` in order, a piece at a
    /// time, until it returns false. Pieces are as long as the pages
    /// allow: the page decoder decodes a page of every column, then
    /// hands them over while they are still in the cache (a row group's
    /// columns, decoded whole, are several times the caches' size). In a
    /// piece without mremap rows `old_size` may be empty. Anything the
    /// page decoder does not expect sends the rest of the row group
    /// through [`Decoder::read`].
    pub fn stream(
        &self,
        unit: &RowGroupUnit,
        sink: &mut dyn FnMut(Slices<'_>) -> bool,
    ) -> crate::Result<()> {
        let mut done = 0;
        if let Some(seg) = self.segments.get(unit.segment) {
            if self.stream_pages(seg, unit, &mut done, sink).is_some() {
                return Ok(());
            }
        }
        let cols = self.read(unit)?;
        let n = cols.len();
        if done < n {
            sink(cols.slices(n).range(done, n));
        }
        self.recycle(cols);
        Ok(())
    }

    /// [`Decoder::stream`] by the page decoder; `None` when it stopped at
    /// something unexpected, after `done` rows went to `sink`.
    fn stream_pages(
        &self,
        seg: &Segment,
        unit: &RowGroupUnit,
        done: &mut usize,
        sink: &mut dyn FnMut(Slices<'_>) -> bool,
    ) -> Option<()> {
        let md = seg.meta.metadata().row_group(unit.row_group);
        let rows = usize::try_from(md.num_rows()).ok()?;
        let leaves = page_leaves(seg, md)?;
        let chunk = self.read_chunk(seg, md, &leaves)?;
        let r = SCRATCH
            .with(|s| stream_chunk(&chunk, md, &leaves, rows, &mut s.borrow_mut(), done, sink));
        self.give_back(chunk);
        r
    }
}

/// The leaf columns of [`NAMES`] in a segment, if the page decoder can
/// read them: only the optional columns may hold nulls (which become 0);
/// a nullable `addr` or `kind` is not ours, so the reference path decides.
fn page_leaves(
    seg: &Segment,
    md: &parquet::file::metadata::RowGroupMetaData,
) -> Option<[usize; 9]> {
    let mut leaves = [0usize; 9];
    for (l, s) in leaves.iter_mut().zip(seg.leaves) {
        *l = s?;
    }
    for (i, name) in NAMES.iter().enumerate() {
        let nullable = md.column(leaves[i]).column_descr().max_def_level() > 0;
        if nullable && !matches!(*name, "old_addr" | "stack_id" | "old_size") {
            return None;
        }
    }
    Some(leaves)
}

/// The page loop of [`Decoder::stream_pages`].
fn stream_chunk(
    chunk: &Arc<pages::Chunk>,
    md: &parquet::file::metadata::RowGroupMetaData,
    leaves: &[usize; 9],
    rows: usize,
    scratch: &mut pages::Scratch,
    done: &mut usize,
    sink: &mut dyn FnMut(Slices<'_>) -> bool,
) -> Option<()> {
    use pages::{Cursor, Values};
    let meta = |i: usize| md.column(leaves[i]);
    let mut ts = Cursor::<u64>::new(chunk, meta(0), rows, Values::Int)?;
    let mut pid = Cursor::<u32>::new(chunk, meta(1), rows, Values::Int)?;
    let mut tid = Cursor::<u32>::new(chunk, meta(8), rows, Values::Int)?;
    let mut kind = Cursor::<u8>::new(chunk, meta(2), rows, Values::Codes)?;
    let mut addr = Cursor::<u64>::new(chunk, meta(3), rows, Values::Int)?;
    let mut size = Cursor::<u64>::new(chunk, meta(4), rows, Values::Int)?;
    let mut old_addr = Cursor::<u64>::new(chunk, meta(5), rows, Values::Int)?;
    let mut stack = Cursor::<u64>::new(chunk, meta(6), rows, Values::Int)?;
    // Buffers of the thread's earlier row groups; kept again at the end
    // (a row group the page decoder gives up on drops them).
    let mut spare = std::mem::take(&mut scratch.cursors);
    ts.reuse(&mut spare);
    pid.reuse(&mut spare);
    tid.reuse(&mut spare);
    kind.reuse(&mut spare);
    for c in [&mut addr, &mut size, &mut old_addr, &mut stack] {
        c.reuse(&mut spare);
    }
    // Only mremap rows have an old size: the column is decoded whole, and
    // only for row groups that have some.
    let mut old_size: Option<Vec<u64>> = None;
    let same = |v: u64| v;
    // INT32 values come zero-extended: the cast is exact.
    let narrow = |v: u64| v as u32;
    let code = |v: u64| v as u8;
    while *done < rows {
        if ts.values().is_empty() {
            ts.next_page(&kind_code, same, scratch)?;
        }
        if pid.values().is_empty() {
            pid.next_page(&kind_code, narrow, scratch)?;
        }
        if tid.values().is_empty() {
            tid.next_page(&kind_code, narrow, scratch)?;
        }
        if kind.values().is_empty() {
            kind.next_page(&kind_code, code, scratch)?;
        }
        for c in [&mut addr, &mut size, &mut old_addr, &mut stack] {
            if c.values().is_empty() {
                c.next_page(&kind_code, same, scratch)?;
            }
        }
        let n = [
            ts.values().len(),
            pid.values().len(),
            tid.values().len(),
            kind.values().len(),
            addr.values().len(),
            size.values().len(),
            old_addr.values().len(),
            stack.values().len(),
        ]
        .into_iter()
        .min()?
        .min(rows - *done);
        let kinds = &kind.values()[..n];
        if old_size.is_none() && kinds.contains(&(EventKind::Mremap as u8)) {
            let mut v = Vec::new();
            pages::read_column(
                chunk,
                meta(7),
                rows,
                Values::Int,
                &kind_code,
                same,
                scratch,
                &mut v,
            )?;
            old_size = Some(v);
        }
        let b = Slices {
            ts: &ts.values()[..n],
            pid: &pid.values()[..n],
            tid: &tid.values()[..n],
            kind: kinds,
            addr: &addr.values()[..n],
            size: &size.values()[..n],
            old_addr: &old_addr.values()[..n],
            stack_id: &stack.values()[..n],
            old_size: old_size.as_deref().map_or(&[], |v| &v[*done..*done + n]),
        };
        let more = sink(b);
        *done += n;
        if !more {
            break;
        }
        ts.consume(n);
        pid.consume(n);
        tid.consume(n);
        kind.consume(n);
        for c in [&mut addr, &mut size, &mut old_addr, &mut stack] {
            c.consume(n);
        }
    }
    ts.give_back(&mut spare);
    pid.give_back(&mut spare);
    tid.give_back(&mut spare);
    kind.give_back(&mut spare);
    for c in [addr, size, old_addr, stack] {
        c.give_back(&mut spare);
    }
    scratch.cursors = spare;
    Some(())
}

fn decode_into(
    chunk: &Arc<pages::Chunk>,
    md: &parquet::file::metadata::RowGroupMetaData,
    leaves: &[usize; 9],
    rows: usize,
    scratch: &mut pages::Scratch,
    c: &mut Columns,
) -> Option<()> {
    let meta = |i: usize| md.column(leaves[i]);
    let int = pages::Values::Int;
    let same = |v: u64| v;
    pages::read_column(
        chunk,
        meta(0),
        rows,
        int,
        &kind_code,
        same,
        scratch,
        &mut c.ts,
    )?;
    // INT32 values come zero-extended: the cast is exact.
    let narrow = |v: u64| v as u32;
    pages::read_column(
        chunk,
        meta(1),
        rows,
        int,
        &kind_code,
        narrow,
        scratch,
        &mut c.pid,
    )?;
    pages::read_column(
        chunk,
        meta(8),
        rows,
        int,
        &kind_code,
        narrow,
        scratch,
        &mut c.tid,
    )?;
    let codes = pages::Values::Codes;
    let code = |v: u64| v as u8;
    pages::read_column(
        chunk,
        meta(2),
        rows,
        codes,
        &kind_code,
        code,
        scratch,
        &mut c.kind,
    )?;
    for (i, out) in [
        (3, &mut c.addr),
        (4, &mut c.size),
        (5, &mut c.old_addr),
        (6, &mut c.stack_id),
    ] {
        pages::read_column(chunk, meta(i), rows, int, &kind_code, same, scratch, out)?;
    }
    // Only mremap rows have an old size (replay reads it for them alone):
    // without them the all-null column is not worth 8 bytes a row of zeros.
    if c.kind[..rows].contains(&(EventKind::Mremap as u8)) {
        pages::read_column(
            chunk,
            meta(7),
            rows,
            int,
            &kind_code,
            same,
            scratch,
            &mut c.old_size,
        )?;
    } else {
        // Sized like the other columns; a recycled vector keeps its values.
        c.old_size.resize(rows, 0);
    }
    Some(())
}

/// The [`EventKind`] code of a `kind` name, [`UNKNOWN_KIND`] if unknown.
fn kind_code(name: &[u8]) -> u64 {
    std::str::from_utf8(name)
        .ok()
        .and_then(EventKind::from_name)
        .map_or(UNKNOWN_KIND, |k| k as u8) as u64
}

/// Decodes a row group with the Parquet reader; `None` when anything is
/// unexpected, so the caller takes the reference path (which reports the
/// error properly if there is one).
fn read_fast(seg: &Segment, unit: &RowGroupUnit) -> Option<Columns> {
    let file = File::open(seg.path).ok()?;
    let mask = ProjectionMask::columns(seg.meta.parquet_schema(), NAMES);
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, seg.meta.clone())
        .with_projection(mask)
        .with_row_groups(vec![unit.row_group])
        .with_batch_size(unit.rows.max(1) as usize)
        .build()
        .ok()?;
    // One batch per row group was asked for; anything else takes the
    // reference path.
    let batches: Vec<RecordBatch> = guarded::decode(|| reader.collect::<Result<_, _>>())
        .ok()?
        .ok()?;
    let [batch] = <[RecordBatch; 1]>::try_from(batches).ok()?;
    let u64col = |name: &str| -> Option<Vec<u64>> {
        let a = batch
            .column_by_name(name)?
            .as_primitive_opt::<UInt64Type>()?
            .clone();
        Some(zero_nulls(a).values().to_vec())
    };
    let pid = batch
        .column_by_name("pid")?
        .as_primitive_opt::<UInt32Type>()?
        .clone();
    let tid = batch
        .column_by_name("tid")?
        .as_primitive_opt::<UInt32Type>()?
        .clone();
    if pid.null_count() > 0 || tid.null_count() > 0 {
        return None;
    }
    let kind = kind_codes(batch.column_by_name("kind")?.as_ref())?;
    Some(Columns {
        rows: batch.num_rows(),
        ts: u64col("ts_ns")?,
        pid: pid.values().to_vec(),
        tid: tid.values().to_vec(),
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
    use crate::{Event, Meta, TraceWriter, WriterOptions};
    use parquet::file::properties::WriterPropertiesBuilder;

    type Tuning = Option<fn(WriterPropertiesBuilder) -> WriterPropertiesBuilder>;

    fn write_trace(path: &Path, tuning: Tuning) {
        let opts = WriterOptions {
            row_group_rows: 300,
            segment_rows: 700,
            merge_segments: 0,
            events_tuning: tuning,
            ..WriterOptions::default()
        };
        let mut w = TraceWriter::create(path, Meta::default(), opts).unwrap();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for i in 0..2000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut kind = EventKind::ALL[(x % EventKind::ALL.len() as u64) as usize];
            // Every other row group without mremap, whose old sizes the
            // page decoder skips.
            if kind == EventKind::Mremap && (i / 300) % 2 == 1 {
                kind = EventKind::Malloc;
            }
            // Long null and non-null stretches as well as mixed ones.
            let phase = (i / 150) % 3;
            w.push_event(&Event {
                ts_ns: 100 + i * 7 + (x >> 60),
                pid: if i % 500 < 3 {
                    u32::MAX - 5
                } else {
                    7 + (i % 3) as u32
                },
                tid: 1000 + (x % 5) as u32,
                kind,
                addr: match i % 4 {
                    0 => u64::MAX - (x % 10),
                    _ => 0x1000 * (x % 97),
                },
                size: x >> (x % 64),
                old_addr: (phase == 1 || (phase == 2 && x.is_multiple_of(3))).then_some(x >> 3),
                old_size: (i % 5 == 0).then_some(i),
                stack_id: (phase != 0 && x.is_multiple_of(2)).then_some(x % 50),
            })
            .unwrap();
        }
        w.finish().unwrap();
    }

    fn same_as_reference(trace: &Trace, dec: &Decoder<'_>) {
        for u in trace.event_units() {
            let fast = dec.read(&u).unwrap();
            let slow = Columns::from_batch(trace.read_unit(&u, EventColumns::REPLAY).unwrap());
            let (a, b) = (fast.slices(fast.len()), slow.slices(slow.len()));
            assert_eq!(a.ts, b.ts);
            assert_eq!(a.pid, b.pid);
            assert_eq!(a.tid, b.tid);
            assert_eq!(a.kind, b.kind);
            assert_eq!(a.addr, b.addr);
            assert_eq!(a.size, b.size);
            assert_eq!(a.old_addr, b.old_addr);
            assert_eq!(a.stack_id, b.stack_id);
            assert_eq!(a.old_size.len(), b.old_size.len());
            for (i, &k) in a.kind.iter().enumerate() {
                if k == EventKind::Mremap as u8 {
                    assert_eq!(a.old_size[i], b.old_size[i], "row {i}");
                }
            }
            dec.recycle(fast);
        }
    }

    /// The rows [`Decoder::stream`] hands out, gathered, against the
    /// reference reader; and a sink that stops after the first piece.
    fn streams_as_the_reference(trace: &Trace, dec: &Decoder<'_>, t: usize) {
        let segs = &dec.segments;
        for u in trace.event_units() {
            let slow = Columns::from_batch(trace.read_unit(&u, EventColumns::REPLAY).unwrap());
            let b = slow.slices(slow.len());
            let mut at = 0usize;
            let mut pieces = 0;
            let mut sink = |p: Slices<'_>| {
                let n = p.ts.len();
                let want = b.range(at, at + n);
                assert_eq!(p.ts, want.ts);
                assert_eq!(p.pid, want.pid);
                assert_eq!(p.tid, want.tid);
                assert_eq!(p.kind, want.kind);
                assert_eq!(p.addr, want.addr);
                assert_eq!(p.size, want.size);
                assert_eq!(p.old_addr, want.old_addr);
                assert_eq!(p.stack_id, want.stack_id);
                for (i, &k) in p.kind.iter().enumerate() {
                    if k == EventKind::Mremap as u8 {
                        assert_eq!(p.old_size[i], want.old_size[i], "row {}", at + i);
                    }
                }
                at += n;
                pieces += 1;
                true
            };
            let mut done = 0;
            let r = dec.stream_pages(&segs[u.segment], &u, &mut done, &mut sink);
            assert!(r.is_some(), "tuning {t}: streaming declined");
            assert_eq!((done, at), (slow.len(), slow.len()));
            assert!(pieces >= 1);
            let mut first = 0;
            dec.stream(&u, &mut |p| {
                assert_eq!(first, 0, "a piece after the sink said stop");
                first = p.ts.len();
                false
            })
            .unwrap();
            assert!(first > 0);
        }
    }

    #[test]
    fn page_decoder_matches_the_reference_reader() {
        use parquet::basic::{Compression, Encoding};
        use parquet::file::properties::WriterVersion;
        let tunings: [Tuning; 8] = [
            None,
            // Every column plain, uncompressed.
            Some(|b| {
                b.set_dictionary_enabled(false)
                    .set_encoding(Encoding::PLAIN)
                    .set_compression(Compression::UNCOMPRESSED)
            }),
            // Dictionaries everywhere, small pages.
            Some(|b| {
                b.set_dictionary_enabled(true)
                    .set_column_dictionary_enabled("pid".into(), true)
                    .set_column_dictionary_enabled("size".into(), true)
                    .set_data_page_row_count_limit(64)
            }),
            // Delta for the nullable columns and size.
            Some(|b| {
                b.set_dictionary_enabled(false)
                    .set_encoding(Encoding::DELTA_BINARY_PACKED)
                    .set_column_encoding("kind".into(), Encoding::PLAIN)
            }),
            // Byte stream split for pid and the nullable columns.
            Some(|b| {
                b.set_dictionary_enabled(false)
                    .set_encoding(Encoding::BYTE_STREAM_SPLIT)
                    .set_column_encoding("kind".into(), Encoding::PLAIN)
            }),
            // Data pages v2.
            Some(|b| b.set_writer_version(WriterVersion::PARQUET_2_0)),
            // Statistics in the page headers, which the page reader skips.
            Some(|b| {
                b.set_write_page_header_statistics(true)
                    .set_statistics_enabled(parquet::file::properties::EnabledStatistics::Page)
            }),
            // The same with v2 pages, uncompressed.
            Some(|b| {
                b.set_writer_version(WriterVersion::PARQUET_2_0)
                    .set_write_page_header_statistics(true)
                    .set_statistics_enabled(parquet::file::properties::EnabledStatistics::Page)
                    .set_compression(Compression::UNCOMPRESSED)
            }),
        ];
        for (t, tuning) in tunings.into_iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.parquet");
            write_trace(&path, tuning);
            let trace = Trace::open(&path).unwrap();
            let dec = Decoder::new(&trace);
            let segs = &dec.segments;
            // The page decoder handles all of these itself.
            for u in trace.event_units() {
                let c = dec.read_pages(&segs[u.segment], &u);
                assert!(c.is_some(), "tuning {t}: page decoder declined");
            }
            same_as_reference(&trace, &dec);
            // Twice, on recycled buffers.
            same_as_reference(&trace, &dec);
            streams_as_the_reference(&trace, &dec, t);
        }
    }
}
