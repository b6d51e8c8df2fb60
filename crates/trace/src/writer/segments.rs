//! A table's segments: the file being written, closing it at a
//! checkpoint (footer, fsync, then listed and renamed by the writer), and
//! merging closed segments into one by copying their column chunks
//! (docs/format.md, "Segments and their lifecycle").

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use arrow_array::RecordBatch;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;

use super::rows::Rows;
use crate::error::{Error, Result};
use crate::events::encode::EventsFile;
use crate::fsio::{create_private, SegmentSink};
use crate::meta::SegmentEntry;
use crate::schema::Table;

/// An open segment file.
enum SegmentFile {
    /// Every table but `events`.
    Arrow(Box<ArrowWriter<SegmentSink>>),
    /// `events`, whose columns are encoded by memleak, on a thread of its
    /// own.
    Events(EventsEncoder),
}

impl SegmentFile {
    fn create(
        table: Table,
        file: SegmentSink,
        props: WriterProperties,
    ) -> parquet::errors::Result<Self> {
        Ok(match table {
            Table::Events => {
                SegmentFile::Events(EventsEncoder::spawn(EventsFile::try_new(file, props)?)?)
            }
            _ => SegmentFile::Arrow(Box::new(ArrowWriter::try_new(
                file,
                table.schema(),
                Some(props),
            )?)),
        })
    }

    /// Writes `batch`; returns a batch the writer is done with, for its
    /// memory to be reused, if there is one.
    fn write(&mut self, batch: RecordBatch) -> parquet::errors::Result<Option<RecordBatch>> {
        match self {
            SegmentFile::Arrow(w) => w.write(&batch).map(|()| Some(batch)),
            SegmentFile::Events(w) => w.write(batch),
        }
    }

    /// Writes the footer and returns the file.
    fn into_inner(self) -> parquet::errors::Result<SegmentSink> {
        match self {
            SegmentFile::Arrow(w) => w.into_inner(),
            SegmentFile::Events(w) => w.finish(),
        }
    }
}

/// The events segment's encoder, on a thread of its own: the recorder's
/// thread hands it each batch and goes back to draining events. Encoding
/// was a quarter of that thread's time, which bounded how many events a
/// second it could take from a program (recorders of other tools, such
/// as heaptrack's, write from another process too). One batch waits at
/// most while another is encoded; encoded batches come back for their
/// memory to be reused. An error stops the encoding; the next write, or
/// the segment's close, returns it.
struct EventsEncoder {
    batches: Option<SyncSender<RecordBatch>>,
    spent: Receiver<RecordBatch>,
    thread: Option<JoinHandle<parquet::errors::Result<SegmentSink>>>,
}

impl EventsEncoder {
    fn spawn(file: EventsFile) -> parquet::errors::Result<Self> {
        let (batches, queued) = sync_channel::<RecordBatch>(1);
        let (done, spent) = channel();
        let thread = std::thread::Builder::new()
            .name("memleak-encode".into())
            .spawn(move || {
                let mut file = file;
                for batch in queued {
                    // Returning drops `queued`: the next send fails.
                    file.write(&batch)?;
                    let _ = done.send(batch);
                }
                file.into_inner()
            })
            .map_err(|e| ParquetError::External(Box::new(e)))?;
        Ok(EventsEncoder {
            batches: Some(batches),
            spent,
            thread: Some(thread),
        })
    }

    fn write(&mut self, batch: RecordBatch) -> parquet::errors::Result<Option<RecordBatch>> {
        let sent = self
            .batches
            .as_ref()
            .is_some_and(|tx| tx.send(batch).is_ok());
        if !sent {
            // It failed: its error, now.
            return Err(self
                .join()
                .err()
                .unwrap_or_else(|| ParquetError::General("the events encoder stopped".into())));
        }
        Ok(self.spent.try_recv().ok())
    }

    fn finish(mut self) -> parquet::errors::Result<SegmentSink> {
        self.join()
    }

    /// Ends the thread (once) and returns what it returned.
    fn join(&mut self) -> parquet::errors::Result<SegmentSink> {
        self.batches = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(ParquetError::General("the events encoder panicked".into())),
            None => Err(ParquetError::General("the events encoder stopped".into())),
        }
    }
}

impl Drop for EventsEncoder {
    fn drop(&mut self) {
        // A writer dropped without closing its segment (an error): the
        // thread ends with the channel, and is waited for.
        let _ = self.join();
    }
}

/// One table's sequence of segments.
pub(super) struct TableSegments<R: Rows> {
    table: Table,
    dir: PathBuf,
    pub(super) rows: R,
    props: WriterProperties,
    open: Option<(SegmentFile, PathBuf)>,
    pub(super) next_index: u32,
    pub(super) batch_rows: usize,
    pub(super) rows_in_segment: usize,
    /// Index and rows of the closed segments not merged yet, in order:
    /// the last entries the manifest lists for this table.
    pub(super) unmerged: Vec<(u32, u64)>,
}

/// A segment whose footer is on disk, not yet renamed into place.
pub(super) struct Closed {
    pub(super) tmp: PathBuf,
    pub(super) path: PathBuf,
    pub(super) entry: SegmentEntry,
}

impl<R: Rows> TableSegments<R> {
    pub(super) fn new(
        root: &Path,
        table: Table,
        rows: R,
        props: WriterProperties,
        batch_rows: usize,
    ) -> Self {
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
    pub(super) fn drain(&mut self) -> Result<()> {
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
        let spent = writer
            .write(batch)
            .map_err(|e| Error::parquet_write(path, e))?;
        match spent {
            Some(batch) => self.rows.recycle(batch),
            None => self.rows.reserve(),
        }
        Ok(())
    }

    pub(super) fn maybe_drain(&mut self) -> Result<()> {
        if self.rows.len() >= self.batch_rows {
            self.drain()?;
        }
        Ok(())
    }

    /// Closes the open segment: footer, fsync. The caller lists it in
    /// `meta.json`, then renames it into place.
    pub(super) fn close_segment(&mut self) -> Result<Option<Closed>> {
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
pub(super) fn segment_name(index: u32) -> String {
    format!("part-{index:05}.parquet")
}

/// The name a segment has while it is written.
pub(super) fn in_progress(path: &Path) -> PathBuf {
    let mut name = path.file_name().expect("a segment file").to_os_string();
    name.push(".inprogress");
    path.with_file_name(name)
}

/// Writes the segments `parts` of `dir` as one file at `tmp`, copying
/// their column chunks as they are (no decoding, no encoding), and
/// returns its entry under `name`.
pub(super) fn merge_segments(
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
