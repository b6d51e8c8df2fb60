//! The validating, streaming reader.
//!
//! [`Trace::open`] checks `meta.json` and every segment footer up front, so
//! a bad trace fails before any work starts, with one line naming the file.
//! Events are then streamed one row group at a time, with only the columns
//! asked for.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int8Type, UInt32Type, UInt64Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;

use crate::checksum::{self, Deferred};
use crate::error::{Error, Result};
use crate::frame_columns::FrameColumns;
use crate::guarded;
use crate::meta::Meta;
use crate::schema::{
    column_since, EventKind, FrameRecord, MapRecord, ScanRecord, ScanVerdict, StackRecord, Table,
    TABLE_KEY,
};
use crate::stack_columns::StackColumns;

/// A set of `events` columns to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventColumns(u16);

impl EventColumns {
    /// `ts_ns`.
    pub const TS: Self = Self(1);
    /// `pid`.
    pub const PID: Self = Self(2);
    /// `tid`.
    pub const TID: Self = Self(4);
    /// `kind`.
    pub const KIND: Self = Self(8);
    /// `addr`.
    pub const ADDR: Self = Self(16);
    /// `size`.
    pub const SIZE: Self = Self(32);
    /// `old_addr`.
    pub const OLD_ADDR: Self = Self(64);
    /// `stack_id`.
    pub const STACK_ID: Self = Self(128);
    /// `old_size`.
    pub const OLD_SIZE: Self = Self(256);
    /// Every column.
    pub const ALL: Self = Self(511);
    /// What replay needs: every column (`tid` for temporary allocations).
    pub const REPLAY: Self = Self(511);

    const NAMES: [&'static str; 9] = [
        "ts_ns", "pid", "tid", "kind", "addr", "size", "old_addr", "stack_id", "old_size",
    ];

    /// Whether `other` is included.
    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    fn names(self) -> impl Iterator<Item = &'static str> {
        (0..9)
            .filter(move |i| self.0 & (1 << i) != 0)
            .map(|i| Self::NAMES[i])
    }
}

impl std::ops::BitOr for EventColumns {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// Decoded events, one vector per column. Columns that were not requested
/// are empty. Nulls are stored as 0 (no valid block lives at address 0, and
/// stack ids start at 1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventBatch {
    /// `ts_ns`.
    pub ts_ns: Vec<u64>,
    /// `pid`.
    pub pid: Vec<u32>,
    /// `tid`.
    pub tid: Vec<u32>,
    /// `kind`.
    pub kind: Vec<EventKind>,
    /// `addr`.
    pub addr: Vec<u64>,
    /// `size`.
    pub size: Vec<u64>,
    /// `old_addr`, 0 for null.
    pub old_addr: Vec<u64>,
    /// `stack_id`, 0 for null.
    pub stack_id: Vec<u64>,
    /// `old_size`, 0 for null.
    pub old_size: Vec<u64>,
    rows: usize,
}

impl EventBatch {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Row `i` as an [`crate::schema::Event`] (requires every column).
    pub fn event(&self, i: usize) -> crate::schema::Event {
        crate::schema::Event {
            ts_ns: self.ts_ns[i],
            pid: self.pid[i],
            tid: self.tid[i],
            kind: self.kind[i],
            addr: self.addr[i],
            size: self.size[i],
            old_addr: Some(self.old_addr[i]).filter(|&a| a != 0),
            old_size: Some(self.old_size[i]).filter(|&a| a != 0),
            stack_id: Some(self.stack_id[i]).filter(|&a| a != 0),
        }
    }
}

/// One row group of one events segment: the unit of parallel decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowGroupUnit {
    /// Index into the trace's events segments.
    pub segment: usize,
    /// Row group within the segment.
    pub row_group: usize,
    /// Rows in it.
    pub rows: u64,
}

/// Size of one table, as [`Trace::table_stats`] reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Readable segments (skipped ones are not counted).
    pub segments: u64,
    /// Rows over all segments.
    pub rows: u64,
    /// Parquet row groups over all segments.
    pub row_groups: u64,
    /// Bytes on disk over all segments.
    pub bytes: u64,
}

/// One segment file and its footer, loaded and checked by [`Trace::open`].
pub(crate) struct Segment {
    pub(crate) path: PathBuf,
    pub(crate) meta: ArrowReaderMetadata,
    /// The checksum, when it is checked as the segment is read (events
    /// segments of [`Trace::open_deferred`]).
    pub(crate) deferred: Option<Deferred>,
}

/// An opened, validated trace.
pub struct Trace {
    root: PathBuf,
    meta: Meta,
    segments: BTreeMap<&'static str, Vec<Segment>>,
    warnings: Vec<String>,
    /// Segments being written when the recording stopped, and their sizes.
    unfinished: Vec<(PathBuf, u64)>,
}

/// What a trace whose recorder did not finish is known to miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Incomplete {
    /// Time from the start of the recording to its last checkpoint: every
    /// event before it is in the trace, every event after it is missing.
    pub since_start_ns: u64,
    /// Segments that were being written (their rows are not readable).
    pub unfinished_segments: usize,
    /// Their bytes.
    pub unfinished_bytes: u64,
    /// Whether meta.json lists the segments (format 1.1): without it the
    /// last checkpoint is not known.
    pub listed: bool,
}

impl std::fmt::Display for Incomplete {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "incomplete trace: the recording did not finish (recorder killed, crashed or still running)"
        )?;
        if self.listed {
            write!(
                f,
                "; events after its last checkpoint, {:.3} s into the recording, are missing",
                self.since_start_ns as f64 / 1e9
            )?;
        } else {
            write!(f, "; events after the last closed segment are missing")?;
        }
        if self.unfinished_segments > 0 {
            write!(
                f,
                " ({} unfinished segment{}, {} bytes, skipped)",
                self.unfinished_segments,
                if self.unfinished_segments == 1 {
                    ""
                } else {
                    "s"
                },
                self.unfinished_bytes
            )?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace")
            .field("root", &self.root)
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

const PARQUET_MAGIC: &[u8; 4] = b"PAR1";

impl Trace {
    /// Opens and validates a trace directory: every listed segment's
    /// checksum is checked before this returns.
    pub fn open(path: impl AsRef<Path>) -> Result<Trace> {
        Trace::open_with(path.as_ref(), false)
    }

    /// Like [`Trace::open`], but the checksums of the events segments are
    /// checked as they are read ([`crate::checksum`]): by the event
    /// [`Decoder`](crate::events::Decoder) as it decodes them, and then by
    /// [`Trace::verify_events`], which the caller must call before it
    /// trusts what it decoded; any other read of the events checks the
    /// whole segment first. For a caller that decodes every event once
    /// (replay), this reads each file once instead of twice.
    pub fn open_deferred(path: impl AsRef<Path>) -> Result<Trace> {
        Trace::open_with(path.as_ref(), true)
    }

    /// Checks the events segments whose checksum [`Trace::open_deferred`]
    /// left to check: a mismatch is [`Error::Corrupt`]. Cheap when done
    /// (and for a trace opened by [`Trace::open`]).
    pub fn verify_events(&self) -> Result<()> {
        for seg in self.event_segments() {
            if let Some(d) = &seg.deferred {
                d.verify()?;
            }
        }
        Ok(())
    }

    fn open_with(path: &Path, defer_events: bool) -> Result<Trace> {
        let root = path.to_path_buf();
        let md = fs::metadata(&root).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::Missing(root.clone()),
            _ => Error::io(&root, e),
        })?;
        if !md.is_dir() {
            let mut magic = [0u8; 4];
            let is_parquet = File::open(&root)
                .and_then(|mut f| f.read_exact(&mut magic))
                .is_ok()
                && &magic == PARQUET_MAGIC;
            return Err(if is_parquet {
                Error::Foreign {
                    path: root,
                    reason: "a single Parquet file; a memleak trace is a directory with meta.json"
                        .into(),
                }
            } else {
                Error::NotATrace {
                    path: root,
                    reason: "not a directory".into(),
                }
            });
        }
        let meta = Meta::load(&root)?;
        let mut trace = Trace {
            root,
            meta,
            segments: BTreeMap::new(),
            warnings: Vec::new(),
            unfinished: Vec::new(),
        };
        for table in Table::ALL {
            let segs = trace.open_table(table, defer_events && table == Table::Events)?;
            trace.segments.insert(table.name(), segs);
        }
        if let Some(inc) = trace.incomplete() {
            let w = format!("{}: {}", trace.root.display(), inc);
            trace.warnings.push(w);
        }
        Ok(trace)
    }

    fn open_table(&mut self, table: Table, defer: bool) -> Result<Vec<Segment>> {
        let dir = self.root.join(table.name());
        let listing = match fs::read_dir(&dir) {
            Ok(entries) => entries
                .map(|e| e.map(|e| e.path()))
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| Error::io(&dir, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(Error::io(&dir, e)),
        };
        let Some(manifest) = &self.meta.segments else {
            return self.open_unlisted(table, listing);
        };
        let listed = manifest.get(table.name()).cloned().unwrap_or_default();
        let mut segs = Vec::with_capacity(listed.len());
        let mut used = std::collections::HashSet::new();
        for entry in &listed {
            let path = dir.join(&entry.file);
            let path = if path.exists() {
                path
            } else {
                // Listed, then the recorder stopped before renaming it
                // (checkpoints list a segment first): the finished file
                // still has its temporary name, and must match the entry.
                let tmp = dir.join(format!("{}.inprogress", entry.file));
                if !tmp.exists() {
                    return Err(Error::corrupt(&path, "listed in meta.json but missing"));
                }
                self.warnings.push(format!(
                    "{}: the recorder stopped before renaming this listed segment; reading it",
                    tmp.display()
                ));
                tmp
            };
            let deferred = if defer {
                checksum::open_checking_length(&path, entry)?;
                Some(Deferred::new(path.clone(), entry.clone()))
            } else {
                checksum::verify_listed(&path, entry)?;
                None
            };
            let opened = load_footer(&path)
                .map_err(|reason| Error::corrupt(&path, reason))
                .and_then(|meta| {
                    let rows = meta.metadata().file_metadata().num_rows();
                    if u64::try_from(rows).ok() != Some(entry.rows) {
                        return Err(Error::corrupt(
                            &path,
                            format!("{rows} rows, meta.json lists {}", entry.rows),
                        ));
                    }
                    check_schema(table, &path, &meta)?;
                    Ok(meta)
                });
            let meta = match (opened, &deferred) {
                (Ok(meta), _) => meta,
                // A damaged file is a checksum mismatch, as when it is
                // checked first.
                (Err(e), Some(d)) => return Err(d.verify().err().unwrap_or(e)),
                (Err(e), None) => return Err(e),
            };
            used.insert(path.clone());
            segs.push(Segment {
                path,
                meta,
                deferred,
            });
        }
        let mut unlisted: Vec<PathBuf> = listing
            .into_iter()
            .filter(|p| !used.contains(p))
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                name.ends_with(".parquet") || name.ends_with(".parquet.inprogress")
            })
            .collect();
        unlisted.sort();
        for path in unlisted {
            let bytes = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            if path.extension().is_some_and(|x| x == "inprogress") {
                self.unfinished.push((path.clone(), bytes));
                self.warnings.push(format!(
                    "{}: skipping unfinished segment ({bytes} bytes written after the last checkpoint)",
                    path.display()
                ));
            } else {
                self.warnings.push(format!(
                    "{}: not listed in meta.json (left over from an interrupted merge?); ignored",
                    path.display()
                ));
            }
        }
        Ok(segs)
    }

    /// A format 1.0 trace, whose meta.json lists no segments: every
    /// `*.parquet` file of the table, in name order; the last one may be
    /// truncated (skipped with a warning).
    fn open_unlisted(&mut self, table: Table, listing: Vec<PathBuf>) -> Result<Vec<Segment>> {
        let mut paths = Vec::new();
        for path in listing {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(".parquet") {
                paths.push(path);
            } else if name.ends_with(".parquet.inprogress") {
                let bytes = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                self.unfinished.push((path.clone(), bytes));
                self.warnings
                    .push(format!("{}: skipping unfinished segment", path.display()));
            }
        }
        paths.sort();
        let mut segs = Vec::with_capacity(paths.len());
        let last = paths.len().saturating_sub(1);
        for (i, path) in paths.into_iter().enumerate() {
            let meta = match load_footer(&path) {
                Ok(m) => m,
                Err(reason) if i == last => {
                    self.warnings.push(format!(
                        "{}: skipping truncated last segment ({reason})",
                        path.display()
                    ));
                    continue;
                }
                Err(reason) => return Err(Error::corrupt(&path, reason)),
            };
            check_schema(table, &path, &meta)?;
            segs.push(Segment {
                path,
                meta,
                deferred: None,
            });
        }
        Ok(segs)
    }

    /// What is known to be missing from a trace whose recorder did not
    /// finish; `None` for a complete trace.
    pub fn incomplete(&self) -> Option<Incomplete> {
        if self.meta.complete {
            return None;
        }
        let checkpoint_ns = self.meta.checkpoint_ns.max(self.meta.start_ns);
        Some(Incomplete {
            since_start_ns: checkpoint_ns.saturating_sub(self.meta.start_ns),
            unfinished_segments: self.unfinished.len(),
            unfinished_bytes: self.unfinished.iter().map(|(_, b)| b).sum(),
            listed: self.meta.segments.is_some(),
        })
    }

    /// The trace directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Contents of `meta.json`.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Non-fatal problems found while opening (skipped segments, unfinished
    /// recording). The CLI prints them as warnings.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Number of events rows in readable segments.
    pub fn event_count(&self) -> u64 {
        self.segments["events"]
            .iter()
            .map(|s| s.meta.metadata().file_metadata().num_rows() as u64)
            .sum()
    }

    /// Segment, row and byte counts of one table's readable segments.
    pub fn table_stats(&self, table: Table) -> TableStats {
        let mut st = TableStats::default();
        for seg in &self.segments[table.name()] {
            let md = seg.meta.metadata();
            st.segments += 1;
            st.rows += md.file_metadata().num_rows() as u64;
            st.row_groups += md.num_row_groups() as u64;
            st.bytes += fs::metadata(&seg.path).map(|m| m.len()).unwrap_or(0);
        }
        st
    }

    /// The events segments, as [`RowGroupUnit::segment`] numbers them.
    pub(crate) fn event_segments(&self) -> &[Segment] {
        &self.segments[Table::Events.name()]
    }

    /// Every events row group, in time order.
    pub fn event_units(&self) -> Vec<RowGroupUnit> {
        let mut units = Vec::new();
        for (segment, seg) in self.segments["events"].iter().enumerate() {
            for (row_group, rg) in seg.meta.metadata().row_groups().iter().enumerate() {
                units.push(RowGroupUnit {
                    segment,
                    row_group,
                    rows: rg.num_rows() as u64,
                });
            }
        }
        units
    }

    /// The first and last timestamps of a row group (`None` if it has no
    /// rows): from the footer's min/max of `ts_ns`, which the writer keeps
    /// for this, else decoded. The footer is not read again, and none of
    /// the events file: for a trace opened with [`Trace::open_deferred`],
    /// decoding would check the whole segment first.
    pub fn unit_ts_range(&self, unit: &RowGroupUnit) -> Result<Option<(u64, u64)>> {
        if unit.rows == 0 {
            return Ok(None);
        }
        let seg = &self.segments["events"][unit.segment];
        let md = seg.meta.metadata();
        let schema = md.file_metadata().schema_descr();
        let stats = (0..schema.num_columns())
            .find(|&i| schema.column(i).path().string() == "ts_ns")
            .and_then(|i| md.row_group(unit.row_group).column(i).statistics());
        if let Some(parquet::file::statistics::Statistics::Int64(v)) = stats {
            if let (Some(&lo), Some(&hi)) = (v.min_opt(), v.max_opt()) {
                // Unsigned values stored as INT64: below 2^63 the signed
                // and unsigned orders agree, whichever the writer used.
                if 0 <= lo && lo <= hi {
                    return Ok(Some((lo as u64, hi as u64)));
                }
            }
        }
        let ts = self.read_unit(unit, EventColumns::TS)?.ts_ns;
        Ok(ts.iter().min().copied().zip(ts.iter().max().copied()))
    }

    /// Decodes one row group of events.
    pub fn read_unit(&self, unit: &RowGroupUnit, cols: EventColumns) -> Result<EventBatch> {
        let seg = &self.segments["events"][unit.segment];
        let reader = batch_reader(seg, cols.names(), Some(unit.row_group), unit.rows as usize)?;
        let mut out = EventBatch::default();
        for batch in reader {
            let batch = batch?;
            append_events(&mut out, &batch, &seg.path)?;
        }
        Ok(out)
    }

    /// Streams all events in time order, one row group at a time.
    pub fn events(
        &self,
        cols: EventColumns,
    ) -> Result<impl Iterator<Item = Result<EventBatch>> + '_> {
        Ok(self
            .event_units()
            .into_iter()
            .map(move |u| self.read_unit(&u, cols)))
    }

    /// Reads the whole `stacks` table.
    pub fn stacks(&self) -> Result<Vec<StackRecord>> {
        Ok(self
            .stack_columns()?
            .iter()
            .map(|s| s.to_record())
            .collect())
    }

    /// Reads the whole `stacks` table, column by column.
    pub fn stack_columns(&self) -> Result<StackColumns> {
        let mut out = StackColumns::default();
        self.for_each_batch(Table::Stacks, |b, _| {
            let id = b.column(0).as_primitive::<UInt64Type>();
            let pid = b.column(1).as_primitive::<UInt32Type>();
            let kernel = b.column(2).as_boolean();
            let truncated = b.column(3).as_boolean();
            let frames = b.column(4).as_list::<i32>();
            // Each list by its offsets into the child column, not a slice
            // of it per row (an array made and dropped per stack).
            let (offsets, addrs) = (
                frames.value_offsets(),
                frames.values().as_primitive::<UInt64Type>().values(),
            );
            let n = b.num_rows();
            out.reserve(n, (offsets[n] - offsets[0]) as usize);
            for i in 0..n {
                let (from, to) = (offsets[i] as usize, offsets[i + 1] as usize);
                out.push(
                    id.value(i),
                    pid.value(i),
                    kernel.value(i),
                    truncated.value(i),
                    &addrs[from..to],
                );
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Reads the whole `frames` table.
    pub fn frames(&self) -> Result<Vec<FrameRecord>> {
        Ok(self
            .frame_columns()?
            .rows()
            .map(|r| r.to_record())
            .collect())
    }

    /// Reads the whole `frames` table, column by column: what
    /// [`Trace::frames`] reads, without a record per row.
    pub fn frame_columns(&self) -> Result<FrameColumns> {
        let schema = Table::Frames.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let mut out = FrameColumns::default();
        for seg in &self.segments[Table::Frames.name()] {
            // The strings as their dictionaries and each row's index into
            // them: a row's string is not copied, and the fleet's keys are
            // made once per dictionary entry.
            let seg = dictionary_strings(seg, FrameColumns::DICTIONARY)?;
            // A row group is one batch, with one dictionary per column.
            for batch in batch_reader(&seg, names.iter().copied(), None, 1 << 20)? {
                let batch = batch?;
                let cols: Vec<ArrayRef> = names
                    .iter()
                    .map(|n| batch.column_by_name(n).cloned().expect("projected column"))
                    .collect();
                out.push(&cols).map_err(|reason| Error::Foreign {
                    path: seg.path.clone(),
                    reason,
                })?;
            }
        }
        Ok(out)
    }

    /// Reads the whole `maps` table.
    pub fn maps(&self) -> Result<Vec<MapRecord>> {
        let mut out = Vec::new();
        self.for_each_batch(Table::Maps, |b, _| {
            let u64c = |i: usize| b.column(i).as_primitive::<UInt64Type>();
            let s = |i: usize| b.column(i).as_string::<i32>();
            let pid = b.column(1).as_primitive::<UInt32Type>();
            for i in 0..b.num_rows() {
                out.push(MapRecord {
                    ts_ns: u64c(0).value(i),
                    pid: pid.value(i),
                    start: u64c(2).value(i),
                    end: u64c(3).value(i),
                    perms: s(4).value(i).to_string(),
                    offset: u64c(5).value(i),
                    inode: u64c(6).value(i),
                    path: opt_str(s(7), i),
                    build_id: opt_str(s(8), i),
                });
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Reads the whole `scan` table (empty for a trace without one, such
    /// as every trace before format 1.3), checked against `meta.json`:
    /// every row belongs to a scan `scans` lists (same `pid` and `ts_ns`)
    /// and every scan has the number of rows it lists as `blocks`, so a
    /// table and a `meta.json` that do not belong together are an error,
    /// not verdicts for the wrong blocks.
    pub fn scans(&self) -> Result<Vec<ScanRecord>> {
        let mut out = Vec::new();
        let mut per_scan: BTreeMap<(u32, u64), u64> = BTreeMap::new();
        for s in &self.meta.scans {
            per_scan.insert((s.pid, s.ts_ns), 0);
        }
        self.for_each_batch(Table::Scan, |b, path| {
            let u64c = |i: usize| b.column(i).as_primitive::<UInt64Type>();
            let pid = b.column(1).as_primitive::<UInt32Type>();
            let verdict = b.column(4).as_string::<i32>();
            let contents = b.column(5).as_binary::<i32>();
            for i in 0..b.num_rows() {
                let (ts_ns, pid) = (u64c(0).value(i), pid.value(i));
                let name = verdict.value(i);
                let verdict = ScanVerdict::from_name(name).ok_or_else(|| {
                    Error::corrupt(path, format!("unknown scan verdict {name:?}"))
                })?;
                match per_scan.get_mut(&(pid, ts_ns)) {
                    Some(n) => *n += 1,
                    None => {
                        return Err(Error::corrupt(
                            path,
                            format!(
                            "scan rows of pid {pid} at {ts_ns} ns, a scan meta.json does not list"
                        ),
                        ))
                    }
                }
                out.push(ScanRecord {
                    ts_ns,
                    pid,
                    addr: u64c(2).value(i),
                    size: u64c(3).value(i),
                    verdict,
                    contents: contents.is_valid(i).then(|| contents.value(i).to_vec()),
                });
            }
            Ok(())
        })?;
        for s in &self.meta.scans {
            let found = per_scan[&(s.pid, s.ts_ns)];
            if found != s.blocks {
                return Err(Error::corrupt(
                    &self.root.join(Table::Scan.name()),
                    format!(
                        "{found} rows for the scan of pid {} at {} ns, meta.json lists {} blocks",
                        s.pid, s.ts_ns, s.blocks
                    ),
                ));
            }
        }
        Ok(out)
    }

    /// Decodes every batch of a table with the known columns only, in
    /// schema order, so callers can index columns by position.
    fn for_each_batch(
        &self,
        table: Table,
        mut f: impl FnMut(&RecordBatch, &Path) -> Result<()>,
    ) -> Result<()> {
        let schema = table.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        for seg in &self.segments[table.name()] {
            for batch in batch_reader(seg, names.iter().copied(), None, 8192)? {
                let batch = batch?;
                // Reorder to schema order: a newer minor may add columns anywhere.
                let cols = names
                    .iter()
                    .map(|n| batch.column_by_name(n).cloned().expect("projected column"))
                    .collect::<Vec<_>>();
                let batch =
                    RecordBatch::try_new(schema.clone(), cols).map_err(|e| Error::Foreign {
                        path: seg.path.clone(),
                        reason: e.to_string(),
                    })?;
                f(&batch, &seg.path)?;
            }
        }
        Ok(())
    }
}

fn opt_str(a: &arrow_array::StringArray, i: usize) -> Option<String> {
    a.is_valid(i).then(|| a.value(i).to_string())
}

/// Types a reader accepts for a column: the written type, or for `kind`
/// plain strings too (what other tools write when they rewrite a trace).
fn compatible(found: &DataType, expected: &DataType) -> bool {
    if found == expected {
        return true;
    }
    match (found, expected) {
        (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View, DataType::Dictionary(_, v)) => {
            **v == DataType::Utf8
        }
        (DataType::Dictionary(_, v), DataType::Dictionary(_, w)) => v == w,
        (DataType::List(a), DataType::List(b)) => compatible(a.data_type(), b.data_type()),
        _ => false,
    }
}

/// Checks a segment's table tag and columns against the schema.
fn check_schema(table: Table, path: &Path, meta: &ArrowReaderMetadata) -> Result<()> {
    let kv = meta.metadata().file_metadata().key_value_metadata();
    let tag = kv
        .and_then(|kv| kv.iter().find(|k| k.key == TABLE_KEY))
        .and_then(|k| k.value.clone());
    let foreign = |reason: String| Error::Foreign {
        path: path.to_path_buf(),
        reason,
    };
    if tag.as_deref() != Some(table.name()) {
        return Err(foreign(match tag {
            Some(t) => format!("a memleak {t} segment in the {} directory", table.name()),
            None => "not written by memleak".to_string(),
        }));
    }
    let schema = meta.schema();
    for field in table.schema().fields() {
        match schema.field_with_name(field.name()) {
            Ok(found) if compatible(found.data_type(), field.data_type()) => {}
            Ok(found) => {
                return Err(foreign(format!(
                    "column {} has type {}, expected {}",
                    field.name(),
                    found.data_type(),
                    field.data_type()
                )))
            }
            // A column added after the version that wrote the segment.
            Err(_) if written_by(kv).is_some_and(|v| v < column_since(table, field.name())) => {}
            Err(_) => return Err(foreign(format!("missing column {}", field.name()))),
        }
    }
    Ok(())
}

/// The format version a segment says wrote it (`memleak.format_version`).
fn written_by(kv: Option<&Vec<parquet::file::metadata::KeyValue>>) -> Option<(u32, u32)> {
    let v = kv?
        .iter()
        .find(|k| k.key == "memleak.format_version")?
        .value
        .as_deref()?;
    let (a, b) = v.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn load_footer(path: &Path) -> std::result::Result<ArrowReaderMetadata, String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let meta = guarded::decode(|| ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()))?
        .map_err(|e| e.to_string())?;
    check_layout(meta.metadata(), len)?;
    Ok(meta)
}

/// Checks that every column chunk a footer describes lies inside the
/// file: Parquet's reader trusts the offsets, and panics or allocates
/// what a damaged footer says (found by `cargo fuzz run trace_reader`).
fn check_layout(md: &parquet::file::metadata::ParquetMetaData, len: u64) -> Result<(), String> {
    for (i, rg) in md.row_groups().iter().enumerate() {
        if rg.num_rows() < 0 {
            return Err(format!("row group {i} has {} rows", rg.num_rows()));
        }
        for col in rg.columns() {
            let start = col
                .dictionary_page_offset()
                .unwrap_or_else(|| col.data_page_offset());
            let size = col.compressed_size();
            let end = u64::try_from(start)
                .ok()
                .zip(u64::try_from(size).ok())
                .and_then(|(s, n)| s.checked_add(n));
            if end.is_none_or(|end| end > len) || col.data_page_offset() < start {
                return Err(format!(
                    "column {} of row group {i} lies outside the file ({size} bytes at {start}, file of {len})",
                    col.column_path()
                ));
            }
        }
    }
    Ok(())
}

/// `seg` with its footer read so that the top-level string columns of
/// `names` decode as dictionaries (`Int32` keys), as the writer encodes
/// them.
fn dictionary_strings(seg: &Segment, names: &[&str]) -> Result<Segment> {
    let fields: Vec<arrow_schema::FieldRef> = seg
        .meta
        .schema()
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Utf8 if names.contains(&f.name().as_str()) => {
                Arc::new(f.as_ref().clone().with_data_type(DataType::Dictionary(
                    Box::new(DataType::Int32),
                    Box::new(DataType::Utf8),
                )))
            }
            _ => f.clone(),
        })
        .collect();
    let hint = Arc::new(arrow_schema::Schema::new_with_metadata(
        fields,
        seg.meta.schema().metadata().clone(),
    ));
    guarded::decode(|| {
        ArrowReaderMetadata::try_new(
            seg.meta.metadata().clone(),
            ArrowReaderOptions::new().with_schema(hint),
        )
    })
    .and_then(|r| r.map_err(|e| e.to_string()))
    .map(|meta| Segment {
        path: seg.path.clone(),
        meta,
        // The frames table's: checked whole when the trace was opened.
        deferred: None,
    })
    .map_err(|e| Error::corrupt(&seg.path, e))
}

fn batch_reader<'a>(
    seg: &Segment,
    names: impl IntoIterator<Item = &'a str>,
    row_group: Option<usize>,
    batch_size: usize,
) -> Result<Batches> {
    // What the Parquet reader reads is not checksummed as it goes.
    if let Some(d) = &seg.deferred {
        d.verify()?;
    }
    let file = File::open(&seg.path).map_err(|e| Error::io(&seg.path, e))?;
    let mask = ProjectionMask::columns(seg.meta.parquet_schema(), names);
    let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, seg.meta.clone())
        .with_projection(mask)
        .with_batch_size(batch_size.max(1));
    if let Some(rg) = row_group {
        builder = builder.with_row_groups(vec![rg]);
    }
    let inner = guarded::decode(|| builder.build())
        .and_then(|r| r.map_err(|e| e.to_string()))
        .map_err(|e| Error::corrupt(&seg.path, e))?;
    Ok(Batches {
        inner: Some(inner),
        path: seg.path.clone(),
    })
}

/// The batches of one segment, decoded under [`guarded::decode`]: a
/// damaged page is an error naming the file, never a panic. Nothing
/// follows the first error.
struct Batches {
    inner: Option<ParquetRecordBatchReader>,
    path: PathBuf,
}

impl Iterator for Batches {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Result<RecordBatch>> {
        let inner = self.inner.as_mut()?;
        let r = match guarded::decode(|| inner.next()) {
            Ok(None) => None,
            Ok(Some(Ok(b))) => return Some(Ok(b)),
            Ok(Some(Err(e))) => Some(Err(Error::corrupt(&self.path, e))),
            Err(e) => Some(Err(Error::corrupt(&self.path, e))),
        };
        self.inner = None;
        r
    }
}

fn kinds_of(col: &dyn Array, path: &Path) -> Result<Vec<Option<EventKind>>> {
    if let Some(dict) = col.as_dictionary_opt::<Int8Type>() {
        let values = dict
            .values()
            .as_string_opt::<i32>()
            .ok_or_else(|| Error::corrupt(path, "kind dictionary is not strings"))?;
        let map: Vec<Option<EventKind>> = (0..values.len())
            .map(|i| EventKind::from_name(values.value(i)))
            .collect();
        Ok(dict
            .keys()
            .values()
            .iter()
            .map(|&k| map.get(k as usize).copied().flatten())
            .collect())
    } else if let Some(s) = col.as_string_opt::<i32>() {
        Ok((0..s.len())
            .map(|i| EventKind::from_name(s.value(i)))
            .collect())
    } else {
        Err(Error::Foreign {
            path: path.to_path_buf(),
            reason: format!("kind column has type {}", col.data_type()),
        })
    }
}

fn append_events(out: &mut EventBatch, b: &RecordBatch, path: &Path) -> Result<()> {
    let n = b.num_rows();
    let kinds = match b.column_by_name("kind") {
        Some(c) => Some(kinds_of(c.as_ref(), path)?),
        None => None,
    };
    // Rows of kinds this version does not know are skipped, as the format
    // promises; they can only come from a newer minor version.
    let keep: Option<Vec<bool>> = kinds
        .as_ref()
        .filter(|k| k.iter().any(|k| k.is_none()))
        .map(|k| k.iter().map(|k| k.is_some()).collect());
    let kept = |i: usize| keep.as_ref().is_none_or(|k| k[i]);
    let all_kept = keep.is_none();
    fn u64col(
        out: &mut Vec<u64>,
        b: &RecordBatch,
        name: &str,
        all_kept: bool,
        kept: &dyn Fn(usize) -> bool,
    ) {
        if let Some(c) = b.column_by_name(name) {
            let a = c.as_primitive::<UInt64Type>();
            let start = out.len();
            if all_kept {
                // Fast path: copy the values, then zero the nulls.
                out.extend_from_slice(a.values());
                if let Some(nulls) = a.nulls().filter(|n| n.null_count() > 0) {
                    for i in (0..a.len()).filter(|&i| nulls.is_null(i)) {
                        out[start + i] = 0;
                    }
                }
            } else {
                out.extend((0..a.len()).filter(|&i| kept(i)).map(|i| {
                    if a.is_valid(i) {
                        a.value(i)
                    } else {
                        0
                    }
                }));
            }
        }
    }
    u64col(&mut out.ts_ns, b, "ts_ns", all_kept, &kept);
    u64col(&mut out.addr, b, "addr", all_kept, &kept);
    u64col(&mut out.size, b, "size", all_kept, &kept);
    u64col(&mut out.old_addr, b, "old_addr", all_kept, &kept);
    u64col(&mut out.stack_id, b, "stack_id", all_kept, &kept);
    u64col(&mut out.old_size, b, "old_size", all_kept, &kept);
    for (name, dst) in [("pid", &mut out.pid), ("tid", &mut out.tid)] {
        if let Some(c) = b.column_by_name(name) {
            let a = c.as_primitive::<UInt32Type>();
            if all_kept {
                dst.extend_from_slice(a.values());
            } else {
                dst.extend((0..a.len()).filter(|&i| kept(i)).map(|i| a.value(i)));
            }
        }
    }
    if let Some(k) = kinds {
        out.kind.extend(k.into_iter().flatten());
    }
    out.rows += match &keep {
        Some(k) => k.iter().filter(|&&x| x).count(),
        None => n,
    };
    Ok(())
}
