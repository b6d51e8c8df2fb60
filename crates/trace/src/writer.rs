//! The segmented writer.
//!
//! Each table is written as a sequence of segments. A segment is written to
//! `part-NNNNN.parquet.inprogress`; closing it writes the footer, fsyncs,
//! lists it in `meta.json` (rows, length, CRC-32) and only then renames it
//! to `part-NNNNN.parquet`. So every `*.parquet` file a reader (or a DuckDB
//! glob) sees is complete, `meta.json` says which files make up the trace,
//! and a killed or out-of-space recorder never damages a closed segment.
//!
//! All tables close their segments together at a *checkpoint*, every
//! second by default, and the first time soon after the first events: a
//! killed recorder loses at most the events since the last one, even in
//! its first second. Stacks, frames and maps close before events, so a listed
//! events segment never refers to a stack that is not listed too. One
//! segment a second would make thousands of files in an hour, so every
//! `merge_segments` closed segments of a table are merged into one
//! (`part-AAAAA-BBBBB.parquet`) by copying their column chunks as they are,
//! without decoding them (docs/format.md, "Segments and their lifecycle").
//! The writer holds the trace's lock ([`TraceLock`]) from before it writes
//! anything until it is dropped (docs/format.md, "The lock").

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::builder::{
    BooleanBufferBuilder, BooleanBuilder, ListBuilder, StringBuilder, StructBuilder, UInt32Builder,
    UInt64Builder,
};
use arrow_array::types::{ArrowPrimitiveType, Int8Type, UInt32Type, UInt64Type};
use arrow_array::{
    ArrayRef, BinaryArray, DictionaryArray, Int8Array, PrimitiveArray, RecordBatch, StringArray,
    UInt32Array, UInt64Array,
};
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::{KeyValue, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::{
    DeltaBinaryPackedEncoderOptions, EnabledStatistics, WriterProperties, WriterPropertiesBuilder,
};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;

use crate::directory::lock_output;
use crate::error::{Error, Result};
use crate::events::encode::EventsFile;
use crate::fsio::{create_private, SegmentSink};
use crate::lock::TraceLock;
use crate::meta::{Meta, ScanInfo, SegmentEntry};

pub use crate::directory::remove_trace;
use crate::schema::{
    inlined_fields, Event, EventKind, FrameRecord, MapRecord, ScanRecord, StackRecord, Table,
    TABLE_KEY,
};

/// Tuning of the writer. The defaults are what `memleak record` uses.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Close an events segment after this many rows.
    pub segment_rows: usize,
    /// Close the segments (a checkpoint) after this much time, so a killed
    /// recorder loses at most this much.
    pub segment_duration: Duration,
    /// Make the first checkpoint this soon after the first event, rather
    /// than `segment_duration` after the trace was created: a recorder
    /// killed within its first second then keeps what it recorded too.
    pub first_checkpoint: Duration,
    /// Merge a table's closed segments into one once this many have
    /// closed since the last merge, or they hold `segment_rows` rows
    /// together, and at the end; a full segment is never copied (0 or 1:
    /// never merge).
    pub merge_segments: usize,
    /// Rows per Parquet row group (the unit of parallel replay).
    pub row_group_rows: usize,
    /// zstd level, for every table (default 1: on events, level 3 costs
    /// about 12 % more CPU per event and is no smaller).
    pub zstd_level: i32,
    /// Replace an existing trace at the path.
    pub force: bool,
    /// Changes the Parquet settings of the `events` table after the
    /// writer's own are applied. `None` in normal use; benchmarks (the
    /// `write_speed` example) use it to compare settings through the real
    /// write path.
    pub events_tuning: Option<fn(WriterPropertiesBuilder) -> WriterPropertiesBuilder>,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            segment_rows: 16 << 20,
            segment_duration: Duration::from_secs(1),
            first_checkpoint: Duration::from_millis(100),
            merge_segments: 64,
            row_group_rows: 256 << 10,
            zstd_level: 1,
            force: false,
            events_tuning: None,
        }
    }
}

/// Buffers rows of one table and turns them into Arrow batches.
trait Rows {
    fn len(&self) -> usize;
    fn take_batch(&mut self) -> RecordBatch;
    /// Gets back the batch's memory once the Parquet writer is done with
    /// it, so the next batch reuses warm pages instead of faulting in
    /// fresh ones.
    fn recycle(&mut self, _batch: RecordBatch) {}
}

/// An open segment file.
enum SegmentFile {
    /// Every table but `events`.
    Arrow(Box<ArrowWriter<SegmentSink>>),
    /// `events`, whose `kind` column is encoded by memleak.
    Events(Box<EventsFile>),
}

impl SegmentFile {
    fn create(
        table: Table,
        file: SegmentSink,
        props: WriterProperties,
    ) -> parquet::errors::Result<Self> {
        Ok(match table {
            Table::Events => SegmentFile::Events(Box::new(EventsFile::try_new(file, props)?)),
            _ => SegmentFile::Arrow(Box::new(ArrowWriter::try_new(
                file,
                table.schema(),
                Some(props),
            )?)),
        })
    }

    fn write(&mut self, batch: &RecordBatch) -> parquet::errors::Result<()> {
        match self {
            SegmentFile::Arrow(w) => w.write(batch),
            SegmentFile::Events(w) => w.write(batch),
        }
    }

    /// Writes the footer and returns the file.
    fn into_inner(self) -> parquet::errors::Result<SegmentSink> {
        match self {
            SegmentFile::Arrow(w) => w.into_inner(),
            SegmentFile::Events(w) => w.into_inner(),
        }
    }
}

/// One table's sequence of segments.
struct TableSegments<R: Rows> {
    table: Table,
    dir: PathBuf,
    rows: R,
    props: WriterProperties,
    open: Option<(SegmentFile, PathBuf)>,
    next_index: u32,
    batch_rows: usize,
    rows_in_segment: usize,
    /// Index and rows of the closed segments not merged yet, in order:
    /// the last entries the manifest lists for this table.
    unmerged: Vec<(u32, u64)>,
}

/// A segment whose footer is on disk, not yet renamed into place.
struct Closed {
    tmp: PathBuf,
    path: PathBuf,
    entry: SegmentEntry,
}

impl<R: Rows> TableSegments<R> {
    fn new(root: &Path, table: Table, rows: R, props: WriterProperties, batch_rows: usize) -> Self {
        TableSegments {
            table,
            dir: root.join(table.name()),
            rows,
            props,
            open: None,
            next_index: 0,
            batch_rows,
            rows_in_segment: 0,
            unmerged: Vec::new(),
        }
    }

    fn final_path(&self, index: u32) -> PathBuf {
        self.dir.join(segment_name(index))
    }

    /// Moves buffered rows into the open segment, opening one if needed.
    fn drain(&mut self) -> Result<()> {
        if self.rows.len() == 0 {
            return Ok(());
        }
        if self.open.is_none() {
            if !self.dir.exists() {
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&self.dir)
                    .map_err(|e| Error::io(&self.dir, e))?;
            }
            let path = in_progress(&self.final_path(self.next_index));
            let file = create_private(&path).map_err(|e| Error::io(&path, e))?;
            let writer =
                SegmentFile::create(self.table, SegmentSink::new(file), self.props.clone())
                    .map_err(|e| Error::parquet_write(&path, e))?;
            self.open = Some((writer, path));
            self.rows_in_segment = 0;
        }
        let batch = self.rows.take_batch();
        self.rows_in_segment += batch.num_rows();
        let (writer, path) = self.open.as_mut().expect("opened above");
        writer
            .write(&batch)
            .map_err(|e| Error::parquet_write(path, e))?;
        self.rows.recycle(batch);
        Ok(())
    }

    fn maybe_drain(&mut self) -> Result<()> {
        if self.rows.len() >= self.batch_rows {
            self.drain()?;
        }
        Ok(())
    }

    /// Closes the open segment: footer, fsync. The caller lists it in
    /// `meta.json`, then renames it into place.
    fn close_segment(&mut self) -> Result<Option<Closed>> {
        self.drain()?;
        let Some((writer, tmp)) = self.open.take() else {
            return Ok(None);
        };
        let sink = writer
            .into_inner()
            .map_err(|e| Error::parquet_write(&tmp, e))?;
        let (bytes, crc32) = sink.sync().map_err(|e| Error::io(&tmp, e))?;
        let index = self.next_index;
        let path = self.final_path(index);
        let entry = SegmentEntry {
            file: segment_name(index),
            rows: self.rows_in_segment as u64,
            bytes,
            crc32,
        };
        self.next_index += 1;
        self.rows_in_segment = 0;
        self.unmerged.push((index, entry.rows));
        Ok(Some(Closed { tmp, path, entry }))
    }
}

/// `part-NNNNN.parquet`.
fn segment_name(index: u32) -> String {
    format!("part-{index:05}.parquet")
}

/// The name a segment has while it is written.
fn in_progress(path: &Path) -> PathBuf {
    let mut name = path.file_name().expect("a segment file").to_os_string();
    name.push(".inprogress");
    path.with_file_name(name)
}

/// Writes a trace directory.
pub struct TraceWriter {
    root: PathBuf,
    opts: WriterOptions,
    meta: Meta,
    events: TableSegments<EventRows>,
    stacks: TableSegments<StackRows>,
    frames: TableSegments<FrameRows>,
    maps: TableSegments<MapRows>,
    scan: TableSegments<ScanRows>,
    segment_started: Instant,
    /// When [`tick`](Self::tick) first saw events, until a checkpoint has
    /// listed some.
    first_events_seen: Option<Instant>,
    events_written: u64,
    /// Held from before anything is written until the writer is dropped.
    lock: TraceLock,
    /// Events pushed since the counters in `meta` were last brought up to
    /// date, by kind code: a map update per event would cost more than
    /// encoding it.
    kind_counts: Box<[u64; 256]>,
    /// Buffered events at which `push_event` hands a batch over: a full
    /// batch, or fewer when the segment fills first.
    events_drain_at: usize,
}

impl TraceWriter {
    /// Creates the trace directory, locks it ([`TraceLock`]) and writes an
    /// initial `meta.json` with `complete: false`. Refuses an existing path
    /// unless `opts.force`, and even then replaces only an empty directory
    /// or a memleak trace ([`remove_trace`]) that no other recorder holds
    /// ([`Error::Locked`]). What it wrote is removed again if it fails.
    pub fn create(root: impl AsRef<Path>, mut meta: Meta, opts: WriterOptions) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let (lock, made) = lock_output(&root, opts.force)?;
        meta.complete = false;
        meta.segments = Some(Default::default());
        meta.checkpoint_ns = meta.start_ns;
        if let Err(e) = meta.store(&root) {
            lock.remove_file();
            if made {
                let _ = fs::remove_dir(&root);
            }
            return Err(e);
        }
        let batch = 64 * 1024;
        let mut writer = TraceWriter {
            events: TableSegments::new(
                &root,
                Table::Events,
                EventRows::new(batch),
                events_props(&opts),
                batch,
            ),
            stacks: TableSegments::new(
                &root,
                Table::Stacks,
                StackRows::default(),
                plain_props(Table::Stacks, &opts),
                8192,
            ),
            frames: TableSegments::new(
                &root,
                Table::Frames,
                FrameRows::default(),
                plain_props(Table::Frames, &opts),
                8192,
            ),
            maps: TableSegments::new(
                &root,
                Table::Maps,
                MapRows::default(),
                plain_props(Table::Maps, &opts),
                8192,
            ),
            scan: TableSegments::new(
                &root,
                Table::Scan,
                ScanRows::default(),
                plain_props(Table::Scan, &opts),
                8192,
            ),
            root,
            opts,
            meta,
            segment_started: Instant::now(),
            first_events_seen: None,
            events_written: 0,
            lock,
            kind_counts: Box::new([0; 256]),
            events_drain_at: 1,
        };
        writer.update_drain_at();
        Ok(writer)
    }

    /// The trace directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The trace's lock. A clone keeps the trace locked after the writer
    /// is gone, until it is dropped too: to remove a trace that recorded
    /// nothing without another recorder taking it meanwhile.
    pub fn lock(&self) -> TraceLock {
        self.lock.clone()
    }

    /// The metadata that [`finish`](Self::finish) will write; counters may
    /// be updated through it.
    pub fn meta_mut(&mut self) -> &mut Meta {
        self.sync_counters();
        &mut self.meta
    }

    /// Adds the per-kind counts gathered by `push_event` to the metadata.
    fn sync_counters(&mut self) {
        for (code, n) in self.kind_counts.iter_mut().enumerate() {
            if *n == 0 {
                continue;
            }
            let kind = EventKind::from_code(code as u8).expect("counted kinds are valid");
            *self
                .meta
                .counters
                .events
                .entry(kind.name().to_string())
                .or_insert(0) += std::mem::take(n);
        }
    }

    /// Appends an event.
    #[inline]
    pub fn push_event(&mut self, ev: &Event) -> Result<()> {
        self.events.rows.push(ev);
        self.kind_counts[ev.kind as u8 as usize] += 1;
        self.events_written += 1;
        if self.events.rows.len() >= self.events_drain_at {
            self.drain_events()?;
        }
        Ok(())
    }

    /// Whether the next [`push_event`](Self::push_event) fills the events
    /// segment and so makes a checkpoint. A caller that holds rows of
    /// other tables back (the recorder keeps stacks until their frames are
    /// symbolized) writes them first: a listed events segment must never
    /// refer to a stack that no listed segment holds.
    #[inline]
    pub fn next_event_checkpoints(&self) -> bool {
        let pending = self.events.rows.len() + 1;
        pending >= self.events_drain_at
            && self.events.rows_in_segment + pending >= self.opts.segment_rows
    }

    /// Hands a full batch of events to the Parquet writer; rotates when the
    /// segment is full.
    #[cold]
    fn drain_events(&mut self) -> Result<()> {
        self.events.drain()?;
        if self.events.rows_in_segment >= self.opts.segment_rows {
            self.rotate()?;
        }
        self.update_drain_at();
        Ok(())
    }

    fn update_drain_at(&mut self) {
        let room = self
            .opts
            .segment_rows
            .saturating_sub(self.events.rows_in_segment);
        self.events_drain_at = self.events.batch_rows.min(room).max(1);
    }

    /// Appends a stack.
    pub fn push_stack(&mut self, s: &StackRecord) -> Result<()> {
        self.stacks.rows.push(s);
        self.stacks.maybe_drain()
    }

    /// Appends a symbolized frame.
    pub fn push_frame(&mut self, f: &FrameRecord) -> Result<()> {
        self.frames.rows.push(f);
        self.frames.maybe_drain()
    }

    /// Appends a memory-map line.
    pub fn push_map(&mut self, m: &MapRecord) -> Result<()> {
        self.maps.rows.push(m);
        self.maps.maybe_drain()
    }

    /// Adds a reachability scan: its entry in `meta.json` `scans` and its
    /// rows in the `scan` table, both written at the next checkpoint
    /// ([`rotate`](Self::rotate)) or at [`finish`](Self::finish), together.
    /// `info.blocks` is set to the number of rows; every row must carry
    /// the scan's `pid` and `ts_ns` (readers match them). A failed scan
    /// has an `error` and usually no rows. Several scans may be added.
    pub fn write_scan(&mut self, mut info: ScanInfo, rows: &[ScanRecord]) -> Result<()> {
        debug_assert!(
            rows.iter()
                .all(|r| r.pid == info.pid && r.ts_ns == info.ts_ns),
            "scan rows of another scan"
        );
        info.blocks = rows.len() as u64;
        for r in rows {
            self.scan.rows.push(r);
            self.scan.maybe_drain()?;
        }
        self.meta.scans.push(info);
        Ok(())
    }

    /// Rows written to `events` so far.
    pub fn events_written(&self) -> u64 {
        self.events_written
    }

    /// Makes a checkpoint if the segment duration has passed, or, before
    /// any events segment was listed, `first_checkpoint` after this was
    /// first called with events pushed. Call it from the recorder's timer
    /// (every few milliseconds).
    pub fn tick(&mut self) -> Result<()> {
        let mut due = self.segment_started.elapsed() >= self.opts.segment_duration;
        if self.events.next_index == 0 && self.events_written > 0 {
            let seen = *self.first_events_seen.get_or_insert_with(Instant::now);
            due |= seen.elapsed() >= self.opts.first_checkpoint;
        }
        if due {
            self.rotate()?;
        }
        Ok(())
    }

    /// A checkpoint: closes every open segment, lists them in `meta.json`
    /// with the counters so far, renames them into place, and merges a
    /// table's segments once `merge_segments` of them have closed.
    pub fn rotate(&mut self) -> Result<()> {
        self.checkpoint()?;
        self.merge(false)
    }

    fn checkpoint(&mut self) -> Result<()> {
        self.sync_counters();
        // Stacks, frames and maps first: a listed events segment must never
        // refer to a stack that is not in a listed stacks segment.
        let closed = [
            (Table::Stacks, self.stacks.close_segment()?),
            (Table::Frames, self.frames.close_segment()?),
            (Table::Maps, self.maps.close_segment()?),
            (Table::Scan, self.scan.close_segment()?),
            (Table::Events, self.events.close_segment()?),
        ];
        self.update_drain_at();
        self.segment_started = Instant::now();
        let manifest = self.meta.segments.get_or_insert_with(Default::default);
        for (table, c) in &closed {
            if let Some(c) = c {
                manifest
                    .entry(table.name().to_string())
                    .or_default()
                    .push(c.entry.clone());
            }
        }
        self.meta.checkpoint_ns = crate::meta::clock_ns(libc::CLOCK_MONOTONIC);
        // Listed first, renamed second: a crash in between leaves a listed
        // `.inprogress` file that readers recognize by its length and CRC.
        self.meta.store(&self.root)?;
        for c in closed.into_iter().filter_map(|(_, c)| c) {
            fs::rename(&c.tmp, &c.path).map_err(|e| Error::io(&c.path, e))?;
        }
        Ok(())
    }

    /// Merges a table's unmerged segments when `merge_segments` of them
    /// have closed, when they hold `segment_rows` rows together, or (`all`)
    /// at the end. A segment closed because it was full (half of
    /// `segment_rows` or more) is large enough as it is: it is never copied,
    /// and the smaller ones before it are merged without it.
    fn merge(&mut self, all: bool) -> Result<()> {
        let (n, full) = (self.opts.merge_segments, self.opts.segment_rows as u64);
        if n < 2 {
            return Ok(());
        }
        let root = self.root.clone();
        let manifest = self.meta.segments.get_or_insert_with(Default::default);
        let mut changed = Vec::new();
        for (table, unmerged) in [
            (Table::Stacks, &mut self.stacks.unmerged),
            (Table::Frames, &mut self.frames.unmerged),
            (Table::Maps, &mut self.maps.unmerged),
            (Table::Scan, &mut self.scan.unmerged),
            (Table::Events, &mut self.events.unmerged),
        ] {
            let large_last = unmerged.last().is_some_and(|&(_, rows)| rows >= full / 2);
            let rows: u64 = unmerged.iter().map(|&(_, r)| r).sum();
            if !(all || large_last || unmerged.len() >= n || rows >= full) {
                continue;
            }
            let small = &unmerged[..unmerged.len() - usize::from(large_last)];
            if small.len() >= 2 {
                let entries = manifest.entry(table.name().to_string()).or_default();
                let first = entries.len() - unmerged.len();
                let dir = root.join(table.name());
                let (a, b) = (small[0].0, small[small.len() - 1].0);
                let name = format!("part-{a:05}-{b:05}.parquet");
                let path = dir.join(&name);
                let parts = &entries[first..first + small.len()];
                let entry = merge_segments(&dir, parts, &in_progress(&path), name)?;
                let parts: Vec<SegmentEntry> = entries
                    .splice(first..first + small.len(), [entry])
                    .collect();
                changed.push((dir, parts, path));
            }
            unmerged.clear();
        }
        if changed.is_empty() {
            return Ok(());
        }
        // The merged segments replace their parts in `meta.json` first;
        // the parts go before the merged file takes its name, so a glob
        // never sees a row twice. A crash in between leaves a listed
        // `.inprogress` file, which readers recognize.
        self.meta.store(&self.root)?;
        for (dir, parts, path) in changed {
            for part in parts {
                let p = dir.join(&part.file);
                fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
            }
            fs::rename(in_progress(&path), &path).map_err(|e| Error::io(&path, e))?;
        }
        Ok(())
    }

    /// Closes everything, merges what is left to merge, and writes the
    /// final `meta.json` with `complete: true`.
    pub fn finish(mut self) -> Result<Meta> {
        self.checkpoint()?;
        self.merge(true)?;
        if self.meta.end_ns == 0 {
            self.meta.end_ns = crate::meta::clock_ns(libc::CLOCK_MONOTONIC);
        }
        self.meta.complete = true;
        self.meta.store(&self.root)?;
        // Complete: nothing left for a lock file to say. The lock itself
        // is held until the writer (and every clone of it) is dropped.
        self.lock.remove_file();
        Ok(self.meta)
    }
}

/// Writes the segments `parts` of `dir` as one file at `tmp`, copying
/// their column chunks as they are (no decoding, no encoding), and
/// returns its entry under `name`.
fn merge_segments(
    dir: &Path,
    parts: &[SegmentEntry],
    tmp: &Path,
    name: String,
) -> Result<SegmentEntry> {
    let mut sources: Vec<(PathBuf, Bytes, ParquetMetaData)> = Vec::with_capacity(parts.len());
    for part in parts {
        let path = dir.join(&part.file);
        let bytes = Bytes::from(fs::read(&path).map_err(|e| Error::io(&path, e))?);
        let md = ParquetMetaDataReader::new()
            .parse_and_finish(&bytes)
            .map_err(|e| Error::Corrupt {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        sources.push((path, bytes, md));
    }
    let first = &sources[0].2;
    let file_md = first.file_metadata();
    let props = WriterProperties::builder()
        .set_key_value_metadata(file_md.key_value_metadata().cloned())
        .set_created_by(file_md.created_by().unwrap_or("memleak").to_string())
        .build();
    let file = create_private(tmp).map_err(|e| Error::io(tmp, e))?;
    let werr = |e| Error::parquet_write(tmp, e);
    let mut w = SerializedFileWriter::new(
        SegmentSink::new(file),
        file_md.schema_descr().root_schema_ptr(),
        Arc::new(props),
    )
    .map_err(werr)?;
    let mut rows = 0u64;
    for (_, bytes, md) in &sources {
        for rg in md.row_groups() {
            let mut out = w.next_row_group().map_err(werr)?;
            for col in rg.columns() {
                let close = ColumnCloseResult {
                    bytes_written: col.compressed_size() as u64,
                    rows_written: rg.num_rows() as u64,
                    metadata: col.clone(),
                    bloom_filter: None,
                    column_index: None,
                    offset_index: None,
                };
                out.append_column(bytes, close).map_err(werr)?;
            }
            out.close().map_err(werr)?;
            rows += rg.num_rows() as u64;
        }
    }
    let sink = w.into_inner().map_err(werr)?;
    let (bytes, crc32) = sink.sync().map_err(|e| Error::io(tmp, e))?;
    Ok(SegmentEntry {
        file: name,
        rows,
        bytes,
        crc32,
    })
}

fn base_props(
    table: Table,
    opts: &WriterOptions,
) -> parquet::file::properties::WriterPropertiesBuilder {
    let level = ZstdLevel::try_new(opts.zstd_level).unwrap_or_default();
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(level))
        .set_max_row_group_row_count(Some(opts.row_group_rows))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_key_value_metadata(Some(vec![
            KeyValue::new(TABLE_KEY.to_string(), table.name().to_string()),
            KeyValue::new(
                "memleak.format_version".to_string(),
                format!(
                    "{}.{}",
                    crate::schema::FORMAT_MAJOR,
                    crate::schema::FORMAT_MINOR
                ),
            ),
        ]))
}

/// Settings chosen by measurement, for CPU per event first and bytes per
/// event second (docs/format.md, "Encodings"; rerun
/// `cargo run --release -p memleak-trace --example write_speed` and
/// `--example bytes_per_event -- --compare`):
///
/// - `ts_ns` is monotonic: DELTA_BINARY_PACKED leaves only the jitter of
///   each delta, and 32-value miniblocks keep an occasional long gap from
///   widening many neighbours. zstd then takes what bit-packing cannot:
///   the recorder stamps up to 16 events of a CPU with one clock reading,
///   so most deltas are 0 and a miniblock's width is set by the one that
///   is not (1.9 bytes/event packed, 0.14 compressed, on the overhead
///   benchmark's trace).
/// - `pid` and `tid` change only between bursts: DELTA_BINARY_PACKED stores
///   runs as zero-width miniblocks, as small as dictionary indices and
///   cheaper to compute than a hash lookup per value.
/// - `size` uses BYTE_STREAM_SPLIT: the low bytes of sizes are skewed but
///   not byte-aligned once bit-packed, and zstd entropy-codes the split
///   byte streams better than it does dictionary indices.
/// - `kind`, `addr`, `stack_id` repeat heavily and are dictionary-encoded;
///   the all-null `old_*` columns cost only their run-length-encoded levels.
/// - zstd level 1 (`WriterOptions::zstd_level`): level 3 costs about 12 %
///   more CPU and is no smaller on 64Ki-row pages.
/// - pages of 64Ki rows (one per batch): zstd's input and tables stay in
///   cache, and a page still gives it enough context. One page per row
///   group (256Ki rows) costs 20 % more CPU for 0.1 % fewer bytes.
/// - statistics only for `ts_ns` (chunk min/max, to skip row groups by
///   time); min/max of every value of every column costs CPU (the string
///   `kind` most) and nothing reads them.
fn events_props(opts: &WriterOptions) -> WriterProperties {
    let ts = ColumnPath::from("ts_ns");
    let size = ColumnPath::from("size");
    let miniblocks = DeltaBinaryPackedEncoderOptions::try_new(128, 4)
        .expect("128-value blocks of four 32-value miniblocks");
    let mut b = base_props(Table::Events, opts)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_column_statistics_enabled(ts.clone(), EnabledStatistics::Chunk)
        .set_column_dictionary_enabled(ts.clone(), false)
        .set_column_encoding(ts.clone(), Encoding::DELTA_BINARY_PACKED)
        .set_column_delta_binary_packed_encoder_options(ts.clone(), miniblocks)
        .set_column_dictionary_enabled(size.clone(), false)
        .set_column_encoding(size, Encoding::BYTE_STREAM_SPLIT);
    for col in ["pid", "tid"] {
        b = b
            .set_column_dictionary_enabled(ColumnPath::from(col), false)
            .set_column_encoding(ColumnPath::from(col), Encoding::DELTA_BINARY_PACKED);
    }
    b = b
        .set_data_page_row_count_limit(EVENTS_PAGE_ROWS)
        .set_data_page_size_limit(8 << 20)
        .set_dictionary_page_size_limit(8 << 20);
    match opts.events_tuning {
        Some(tune) => tune(b).build(),
        None => b.build(),
    }
}

/// Rows per data page of the events table.
const EVENTS_PAGE_ROWS: usize = 64 << 10;

fn plain_props(table: Table, opts: &WriterOptions) -> WriterProperties {
    base_props(table, opts).build()
}

/// A nullable u64 column, kept sparse while rows arrive: only the
/// present values, with their row numbers. `old_addr` and `old_size` are
/// null in almost every row, so pushing costs one branch, and the dense
/// values and validity bitmap are built once per batch.
struct OptU64 {
    present: Vec<(u32, u64)>,
    /// The dense values of the last batch, recycled.
    values: Vec<u64>,
}

impl OptU64 {
    fn new() -> Self {
        OptU64 {
            present: Vec::new(),
            values: Vec::new(),
        }
    }

    #[inline]
    fn push(&mut self, row: usize, v: Option<u64>) {
        if let Some(v) = v {
            self.present.push((row as u32, v));
        }
    }

    fn take(&mut self, rows: usize) -> UInt64Array {
        let mut values = std::mem::take(&mut self.values);
        values.clear();
        values.resize(rows, 0);
        let nulls = if self.present.len() == rows {
            for (i, &(_, v)) in self.present.iter().enumerate() {
                values[i] = v;
            }
            None
        } else {
            let mut valid = BooleanBufferBuilder::new(rows);
            valid.append_n(rows, false);
            for &(row, v) in &self.present {
                values[row as usize] = v;
                valid.set_bit(row as usize, true);
            }
            Some(valid.finish().into())
        };
        self.present.clear();
        UInt64Array::new(values.into(), nulls)
    }
}

/// The events being buffered, one vector per column. Each batch's vectors
/// become the Arrow arrays without a copy, and the next batch starts with
/// vectors of full capacity, so pushing never reallocates.
struct EventRows {
    capacity: usize,
    ts: Vec<u64>,
    pid: Vec<u32>,
    tid: Vec<u32>,
    kind: Vec<i8>,
    addr: Vec<u64>,
    size: Vec<u64>,
    old_addr: OptU64,
    old_size: OptU64,
    stack_id: OptU64,
}

impl EventRows {
    fn new(capacity: usize) -> Self {
        EventRows {
            capacity,
            ts: Vec::with_capacity(capacity),
            pid: Vec::with_capacity(capacity),
            tid: Vec::with_capacity(capacity),
            kind: Vec::with_capacity(capacity),
            addr: Vec::with_capacity(capacity),
            size: Vec::with_capacity(capacity),
            old_addr: OptU64::new(),
            old_size: OptU64::new(),
            stack_id: OptU64::new(),
        }
    }

    #[inline]
    fn push(&mut self, e: &Event) {
        let row = self.ts.len();
        self.old_addr.push(row, e.old_addr);
        self.old_size.push(row, e.old_size);
        self.stack_id.push(row, e.stack_id);
        self.ts.push(e.ts_ns);
        self.pid.push(e.pid);
        self.tid.push(e.tid);
        self.kind.push(KIND_KEYS[e.kind as u8 as usize]);
        self.addr.push(e.addr);
        self.size.push(e.size);
    }
}

/// Index of each kind (by code) in the dictionary written with every
/// batch, which lists the kinds in the order of [`EventKind::ALL`].
const KIND_KEYS: [i8; 256] = {
    let mut keys = [-1i8; 256];
    let mut i = 0;
    while i < EventKind::ALL.len() {
        keys[EventKind::ALL[i] as u8 as usize] = i as i8;
        i += 1;
    }
    keys
};

fn kind_dictionary() -> Arc<StringArray> {
    Arc::new(StringArray::from_iter_values(
        EventKind::ALL.iter().map(|k| k.name()),
    ))
}

impl Rows for EventRows {
    fn len(&self) -> usize {
        self.ts.len()
    }

    fn take_batch(&mut self) -> RecordBatch {
        use std::mem::take;
        let rows = self.ts.len();
        let kinds = DictionaryArray::<Int8Type>::try_new(
            Int8Array::from(take(&mut self.kind)),
            kind_dictionary(),
        )
        .expect("kind keys are in range");
        let cols: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(take(&mut self.ts))),
            Arc::new(UInt32Array::from(take(&mut self.pid))),
            Arc::new(UInt32Array::from(take(&mut self.tid))),
            Arc::new(kinds),
            Arc::new(UInt64Array::from(take(&mut self.addr))),
            Arc::new(UInt64Array::from(take(&mut self.size))),
            Arc::new(self.old_addr.take(rows)),
            Arc::new(self.old_size.take(rows)),
            Arc::new(self.stack_id.take(rows)),
        ];
        RecordBatch::try_new(Table::Events.schema(), cols).expect("events batch matches schema")
    }

    fn recycle(&mut self, batch: RecordBatch) {
        let (_, cols, _) = batch.into_parts();
        fn prim<T: ArrowPrimitiveType>(col: &ArrayRef) -> Option<PrimitiveArray<T>> {
            col.as_any().downcast_ref::<PrimitiveArray<T>>().cloned()
        }
        let kind = cols[3]
            .as_any()
            .downcast_ref::<DictionaryArray<Int8Type>>()
            .map(|d| d.keys().clone());
        let u64s = |i: usize| prim::<UInt64Type>(&cols[i]);
        let u32s = |i: usize| prim::<UInt32Type>(&cols[i]);
        let (ts, pid, tid, addr, size) = (u64s(0), u32s(1), u32s(2), u64s(4), u64s(5));
        let (old_addr, old_size, stack_id) = (u64s(6), u64s(7), u64s(8));
        // Our clones are the last references once the batch is gone.
        drop(cols);
        let cap = self.capacity;
        reuse(&mut self.ts, ts, cap);
        reuse(&mut self.pid, pid, cap);
        reuse(&mut self.tid, tid, cap);
        reuse(&mut self.kind, kind, cap);
        reuse(&mut self.addr, addr, cap);
        reuse(&mut self.size, size, cap);
        reuse(&mut self.old_addr.values, old_addr, cap);
        reuse(&mut self.old_size.values, old_size, cap);
        reuse(&mut self.stack_id.values, stack_id, cap);
    }
}

/// Makes `v` (empty after `take_batch`) the vector behind `array` if
/// nothing else holds it, or else a new vector of `capacity`.
fn reuse<T: ArrowPrimitiveType>(
    v: &mut Vec<T::Native>,
    array: Option<PrimitiveArray<T>>,
    capacity: usize,
) {
    if !v.is_empty() {
        return;
    }
    let reclaimed = array.and_then(|a| a.into_parts().1.into_inner().into_vec().ok());
    match reclaimed {
        Some(mut old) if old.capacity() >= capacity => {
            old.clear();
            *v = old;
        }
        _ => v.reserve(capacity),
    }
}

struct StackRows {
    stack_id: UInt64Builder,
    pid: UInt32Builder,
    kernel: BooleanBuilder,
    truncated: BooleanBuilder,
    frames: ListBuilder<UInt64Builder>,
    n: usize,
}

impl Default for StackRows {
    fn default() -> Self {
        let item = Arc::new(arrow_schema::Field::new(
            "item",
            arrow_schema::DataType::UInt64,
            false,
        ));
        StackRows {
            stack_id: UInt64Builder::new(),
            pid: UInt32Builder::new(),
            kernel: BooleanBuilder::new(),
            truncated: BooleanBuilder::new(),
            frames: ListBuilder::new(UInt64Builder::new()).with_field(item),
            n: 0,
        }
    }
}

impl StackRows {
    fn push(&mut self, s: &StackRecord) {
        self.stack_id.append_value(s.stack_id);
        self.pid.append_value(s.pid);
        self.kernel.append_value(s.kernel);
        self.truncated.append_value(s.truncated);
        self.frames.values().append_slice(&s.frames);
        self.frames.append(true);
        self.n += 1;
    }
}

impl Rows for StackRows {
    fn len(&self) -> usize {
        self.n
    }
    fn take_batch(&mut self) -> RecordBatch {
        self.n = 0;
        let cols: Vec<ArrayRef> = vec![
            Arc::new(self.stack_id.finish()),
            Arc::new(self.pid.finish()),
            Arc::new(self.kernel.finish()),
            Arc::new(self.truncated.finish()),
            Arc::new(self.frames.finish()),
        ];
        RecordBatch::try_new(Table::Stacks.schema(), cols).expect("stacks batch matches schema")
    }
}

struct FrameRows {
    pid: UInt32Builder,
    addr: UInt64Builder,
    build_id: StringBuilder,
    path: StringBuilder,
    file_offset: UInt64Builder,
    function: StringBuilder,
    func_offset: UInt64Builder,
    file: StringBuilder,
    line: UInt32Builder,
    column: UInt32Builder,
    inlined: ListBuilder<StructBuilder>,
    n: usize,
}

impl Default for FrameRows {
    fn default() -> Self {
        let fields = inlined_fields();
        let item = Arc::new(arrow_schema::Field::new(
            "item",
            arrow_schema::DataType::Struct(fields.clone()),
            false,
        ));
        FrameRows {
            pid: UInt32Builder::new(),
            addr: UInt64Builder::new(),
            build_id: StringBuilder::new(),
            path: StringBuilder::new(),
            file_offset: UInt64Builder::new(),
            function: StringBuilder::new(),
            func_offset: UInt64Builder::new(),
            file: StringBuilder::new(),
            line: UInt32Builder::new(),
            column: UInt32Builder::new(),
            inlined: ListBuilder::new(StructBuilder::from_fields(fields, 0)).with_field(item),
            n: 0,
        }
    }
}

impl FrameRows {
    fn push(&mut self, f: &FrameRecord) {
        self.pid.append_value(f.pid);
        self.addr.append_value(f.addr);
        self.build_id.append_option(f.build_id.as_deref());
        self.path.append_option(f.path.as_deref());
        self.file_offset.append_option(f.file_offset);
        self.function.append_option(f.function.as_deref());
        self.func_offset.append_option(f.func_offset);
        self.file.append_option(f.file.as_deref());
        self.line.append_option(f.line);
        self.column.append_option(f.column);
        let s = self.inlined.values();
        for i in &f.inlined {
            s.field_builder::<StringBuilder>(0)
                .expect("function")
                .append_value(&i.function);
            s.field_builder::<StringBuilder>(1)
                .expect("file")
                .append_option(i.file.as_deref());
            s.field_builder::<UInt32Builder>(2)
                .expect("line")
                .append_option(i.line);
            s.field_builder::<UInt32Builder>(3)
                .expect("column")
                .append_option(i.column);
            s.append(true);
        }
        self.inlined.append(true);
        self.n += 1;
    }
}

impl Rows for FrameRows {
    fn len(&self) -> usize {
        self.n
    }
    fn take_batch(&mut self) -> RecordBatch {
        self.n = 0;
        let cols: Vec<ArrayRef> = vec![
            Arc::new(self.pid.finish()),
            Arc::new(self.addr.finish()),
            Arc::new(self.build_id.finish()),
            Arc::new(self.path.finish()),
            Arc::new(self.file_offset.finish()),
            Arc::new(self.function.finish()),
            Arc::new(self.func_offset.finish()),
            Arc::new(self.file.finish()),
            Arc::new(self.line.finish()),
            Arc::new(self.column.finish()),
            Arc::new(self.inlined.finish()),
        ];
        RecordBatch::try_new(Table::Frames.schema(), cols).expect("frames batch matches schema")
    }
}

#[derive(Default)]
struct MapRows {
    rows: Vec<MapRecord>,
}

impl MapRows {
    fn push(&mut self, m: &MapRecord) {
        self.rows.push(m.clone());
    }
}

impl Rows for MapRows {
    fn len(&self) -> usize {
        self.rows.len()
    }
    fn take_batch(&mut self) -> RecordBatch {
        let rows = std::mem::take(&mut self.rows);
        let u64col = |f: fn(&MapRecord) -> u64| -> ArrayRef {
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(f)))
        };
        let cols: Vec<ArrayRef> = vec![
            u64col(|m| m.ts_ns),
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(|m| m.pid))),
            u64col(|m| m.start),
            u64col(|m| m.end),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|m| m.perms.as_str()),
            )),
            u64col(|m| m.offset),
            u64col(|m| m.inode),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|m| m.path.as_deref()),
            )),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|m| m.build_id.as_deref()),
            )),
        ];
        RecordBatch::try_new(Table::Maps.schema(), cols).expect("maps batch matches schema")
    }
}

#[derive(Default)]
struct ScanRows {
    rows: Vec<ScanRecord>,
}

impl ScanRows {
    fn push(&mut self, r: &ScanRecord) {
        self.rows.push(r.clone());
    }
}

impl Rows for ScanRows {
    fn len(&self) -> usize {
        self.rows.len()
    }
    fn take_batch(&mut self) -> RecordBatch {
        let rows = std::mem::take(&mut self.rows);
        let u64col = |f: fn(&ScanRecord) -> u64| -> ArrayRef {
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(f)))
        };
        let cols: Vec<ArrayRef> = vec![
            u64col(|r| r.ts_ns),
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.pid))),
            u64col(|r| r.addr),
            u64col(|r| r.size),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.verdict.name()),
            )),
            Arc::new(BinaryArray::from_iter(
                rows.iter().map(|r| r.contents.as_deref()),
            )),
        ];
        RecordBatch::try_new(Table::Scan.schema(), cols).expect("scan batch matches schema")
    }
}
