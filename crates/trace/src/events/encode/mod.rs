//! An `events` segment file, its columns encoded here.
//!
//! Parquet's Arrow writer is generic, and its cost showed in the recorder,
//! which writes every event. For `kind` it hashes and compares every
//! row's string to find its dictionary entry again, although the keys of
//! our Arrow dictionary already say which entry it is (about twice the
//! cost of the same keys as an Int8 column: the `kind_cost` example).
//! Around every column it runs level and mini-batch
//! machinery that a flat table of integers does not need. So the columns
//! are encoded here, into the encodings the Arrow writer produced, and
//! spliced into the file through Parquet's file writer:
//!
//! - `kind`: a PLAIN dictionary page of the kinds in the order they first
//!   appear, then RLE_DICTIONARY data pages (bit-packed runs);
//! - `ts_ns`, `pid`, `tid`: DELTA_BINARY_PACKED in the layout of Parquet's
//!   encoder (128-value blocks of four miniblocks), `ts_ns` with its chunk
//!   min/max;
//! - `size`: BYTE_STREAM_SPLIT;
//! - `addr`, `old_addr`, `old_size`, `stack_id`: a PLAIN dictionary page
//!   of the chunk's values, then RLE_DICTIONARY data pages, the nullable
//!   ones with RLE/bit-packed definition levels (a chunk with no value has
//!   no dictionary and PLAIN pages of levels only).
//!
//! Pages are version 1, of the properties' row count (64Ki rows),
//! compressed like the rest of the file where that pays (see
//! [`ChunkEncoder::write_pages`](chunk::ChunkEncoder::write_pages)), so
//! readers (DuckDB, pyarrow, the analyzer) see the same columns as
//! before. Settings only Parquet's writers implement (version 2 pages,
//! page statistics, bloom filters, chunk statistics beyond `ts_ns`'s,
//! other encodings; the `write_speed` example and the analyzer's decoder
//! tests ask for some) send a column through them instead.
//!
//! The `write_speed` example compares this path with the Arrow writer's
//! (docs/benchmarks.md, the writer cost).
//!
//! `columns` buffers the values of the columns encoded here, `chunk`
//! turns them into column chunks; the encodings themselves are in
//! `events::codec`, beside their decoders.

mod chunk;
mod columns;

use arrow_array::RecordBatch;
use parquet::arrow::arrow_writer::{compute_leaves, ArrowColumnWriter, ArrowRowGroupWriterFactory};
use parquet::arrow::ArrowWriter;
use parquet::errors::Result;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;

use crate::fsio::SegmentSink;
use crate::schema::Table;
use chunk::ChunkEncoder;
use columns::Custom;

/// An open `events` segment.
pub(crate) struct EventsFile {
    file: SerializedFileWriter<SegmentSink>,
    factory: ArrowRowGroupWriterFactory,
    /// By column: the columns encoded here.
    custom: Vec<Option<Custom>>,
    row_group_rows: usize,
    /// Parquet's writers of the columns not encoded here, by column, for
    /// the row group being filled (none while every column is encoded
    /// here), and its rows.
    arrow: Vec<Option<ArrowColumnWriter>>,
    rows: usize,
    row_groups: usize,
    /// Encodes the chunks of the columns encoded here.
    encoder: ChunkEncoder,
}

impl EventsFile {
    /// Pages hold `props`' row count limit (and no more than its byte
    /// limit of 8-byte values), as those of the other columns.
    pub(crate) fn try_new(file: SegmentSink, props: WriterProperties) -> Result<Self> {
        let page_rows = props
            .data_page_row_count_limit()
            .min(props.data_page_size_limit() / 8)
            .max(8);
        let row_group_rows = props.max_row_group_row_count().unwrap_or(1 << 20).max(1);
        let compression = props.compression(&ColumnPath::from("kind"));
        let encoder = ChunkEncoder::new(page_rows, compression)?;
        let schema = Table::Events.schema();
        let custom: Vec<Option<Custom>> = schema
            .fields()
            .iter()
            .map(|f| {
                let compressed_alike = props.compression(&ColumnPath::from(f.name().as_str()));
                Custom::for_field(f, &props).filter(|_| compressed_alike == compression)
            })
            .collect();
        let writer = ArrowWriter::try_new(file, schema, Some(props))?;
        let (file, factory) = writer.into_serialized_writer()?;
        Ok(EventsFile {
            file,
            factory,
            custom,
            row_group_rows,
            arrow: Vec::new(),
            rows: 0,
            row_groups: 0,
            encoder,
        })
    }

    /// Appends a batch of the events schema, closing row groups as they fill.
    pub(crate) fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let mut offset = 0;
        while offset < batch.num_rows() {
            if self.rows == 0 && self.custom.iter().any(Option::is_none) {
                // A new row group: writers for the columns Parquet encodes.
                let writers = self.factory.create_column_writers(self.row_groups)?;
                self.arrow = writers
                    .into_iter()
                    .zip(&self.custom)
                    .map(|(w, c)| c.is_none().then_some(w))
                    .collect();
            }
            let room = self.row_group_rows - self.rows;
            let n = room.min(batch.num_rows() - offset);
            self.write_rows(&batch.slice(offset, n))?;
            self.rows += n;
            offset += n;
            if self.rows >= self.row_group_rows {
                self.flush_row_group()?;
            }
        }
        Ok(())
    }

    fn write_rows(&mut self, batch: &RecordBatch) -> Result<()> {
        let schema = batch.schema();
        for (i, (field, col)) in schema.fields().iter().zip(batch.columns()).enumerate() {
            if let Some(custom) = &mut self.custom[i] {
                custom.append(col.as_ref())?;
                continue;
            }
            let writer = self.arrow[i].as_mut().expect("a writer where no encoder");
            for leaf in compute_leaves(field, col)? {
                writer.write(&leaf)?;
            }
        }
        Ok(())
    }

    /// Writes the row group being filled, if any.
    fn flush_row_group(&mut self) -> Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        let mut arrow = std::mem::take(&mut self.arrow);
        let mut chunks = Vec::with_capacity(self.custom.len());
        for i in 0..self.custom.len() {
            let chunk = match self.custom[i].take() {
                Some(mut custom) => {
                    debug_assert_eq!(custom.len(), self.rows);
                    let descr = self.file.schema_descr().column(i);
                    let chunk = self.encoder.encode(descr, &custom);
                    custom.clear();
                    self.custom[i] = Some(custom);
                    Some(chunk?)
                }
                None => None,
            };
            chunks.push(chunk);
        }
        let mut rg = self.file.next_row_group()?;
        for (i, chunk) in chunks.into_iter().enumerate() {
            match chunk {
                Some((bytes, close)) => rg.append_column(&bytes, close)?,
                None => {
                    let w = arrow[i].take().expect("a writer where no encoder");
                    w.close()?.append_to_row_group(&mut rg)?;
                }
            }
        }
        rg.close()?;
        self.rows = 0;
        self.row_groups += 1;
        Ok(())
    }

    /// Writes the last row group and the footer, and returns the file.
    pub(crate) fn into_inner(mut self) -> Result<SegmentSink> {
        self.flush_row_group()?;
        self.file.into_inner()
    }
}
