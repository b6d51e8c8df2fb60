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
//! [`EventsFile::write_pages`]), so readers (DuckDB, pyarrow, the
//! analyzer) see the same columns as before. Settings only Parquet's
//! writers implement (version 2 pages, page statistics, bloom filters,
//! chunk statistics beyond `ts_ns`'s, other encodings; the `write_speed`
//! example and the analyzer's decoder tests ask for some) send a column
//! through them instead.
//!
//! The `write_speed` example compares this path with the Arrow writer's
//! (docs/benchmarks.md, the writer cost).

use arrow_array::types::Int8Type;
use arrow_array::{Array, DictionaryArray, RecordBatch, StringArray, UInt32Array, UInt64Array};
use arrow_schema::{DataType, Field};
use bytes::Bytes;
use parquet::arrow::arrow_writer::{compute_leaves, ArrowColumnWriter, ArrowRowGroupWriterFactory};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::statistics::Statistics;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;

use crate::fsio::SegmentSink;
use crate::schema::{EventKind, Table};

/// A column encoded here, with its values of the row group being filled.
enum Custom {
    /// `kind`: the Arrow dictionary keys (indexes of [`EventKind::ALL`]).
    Kind(Vec<i8>),
    /// An integer column written DELTA_BINARY_PACKED (`ts_ns`, `pid`,
    /// `tid`): the values as the physical type's bits, and whether the
    /// chunk gets min/max statistics.
    Delta {
        values: Vec<i64>,
        int32: bool,
        stats: bool,
    },
    /// A u64 column written BYTE_STREAM_SPLIT (`size`).
    Split(Vec<u64>),
    /// A u64 column written RLE_DICTIONARY (`addr`, and the nullable
    /// `old_addr`, `old_size`, `stack_id`): the values present, and for a
    /// nullable column each row's definition level (1 present, 0 null).
    Dict {
        values: Vec<u64>,
        levels: Option<Vec<u8>>,
    },
}

impl Custom {
    /// How `field` is encoded here, if it is: `kind` always; the integer
    /// columns as `props` say, when that is DELTA_BINARY_PACKED,
    /// BYTE_STREAM_SPLIT or a dictionary (the `write_speed` example can
    /// ask for other settings, which Parquet's writers then follow).
    fn for_field(field: &Field, props: &WriterProperties) -> Option<Custom> {
        let path = ColumnPath::from(field.name().as_str());
        // What only Parquet's writers do: version 2 pages, statistics in
        // pages (in chunks: `ts_ns`'s min/max only), bloom filters, and
        // dictionaries that could outgrow their page limit.
        let stats = props.statistics_enabled(&path);
        if props.writer_version() != WriterVersion::PARQUET_1_0
            || stats == EnabledStatistics::Page
            || props.bloom_filter_properties(&path).is_some()
            || props.dictionary_page_size_limit()
                < props
                    .max_row_group_row_count()
                    .unwrap_or(usize::MAX)
                    .saturating_mul(8)
        {
            return None;
        }
        let chunk_stats = stats == EnabledStatistics::Chunk;
        if field.name() == "kind" {
            return (!chunk_stats).then(|| Custom::Kind(Vec::new()));
        }
        let int32 = match field.data_type() {
            DataType::UInt32 => true,
            DataType::UInt64 => false,
            _ => return None,
        };
        let nullable = field.is_nullable();
        match (props.dictionary_enabled(&path), props.encoding(&path)) {
            (true, _) if !int32 && !chunk_stats => Some(Custom::Dict {
                values: Vec::new(),
                levels: nullable.then(Vec::new),
            }),
            (false, Some(Encoding::DELTA_BINARY_PACKED)) if !nullable => Some(Custom::Delta {
                values: Vec::new(),
                int32,
                stats: chunk_stats,
            }),
            (false, Some(Encoding::BYTE_STREAM_SPLIT)) if !nullable && !int32 && !chunk_stats => {
                Some(Custom::Split(Vec::new()))
            }
            _ => None,
        }
    }

    fn append(&mut self, col: &dyn Array) -> Result<()> {
        let wrong = || ParquetError::General(format!("unexpected {:?} column", col.data_type()));
        let u64s = || col.as_any().downcast_ref::<UInt64Array>().ok_or_else(wrong);
        let required = !matches!(
            self,
            Custom::Dict {
                levels: Some(_),
                ..
            }
        );
        if required && col.null_count() > 0 {
            return Err(ParquetError::General("nulls in a required column".into()));
        }
        match self {
            Custom::Kind(keys) => {
                let dict = col
                    .as_any()
                    .downcast_ref::<DictionaryArray<Int8Type>>()
                    .ok_or_else(wrong)?;
                let names = dict.values().as_any().downcast_ref::<StringArray>();
                let same = names.is_some_and(|n| {
                    n.len() == EventKind::ALL.len()
                        && n.iter()
                            .zip(EventKind::ALL)
                            .all(|(a, k)| a == Some(k.name()))
                });
                if !same {
                    return Err(ParquetError::General(
                        "kind dictionary is not the kinds".into(),
                    ));
                }
                keys.extend_from_slice(dict.keys().values());
            }
            Custom::Delta {
                values,
                int32: true,
                ..
            } => {
                let a = col
                    .as_any()
                    .downcast_ref::<UInt32Array>()
                    .ok_or_else(wrong)?;
                values.extend(a.values().iter().map(|&v| v as i32 as i64));
            }
            Custom::Delta { values, .. } => {
                values.extend(u64s()?.values().iter().map(|&v| v as i64));
            }
            Custom::Split(values)
            | Custom::Dict {
                values,
                levels: None,
            } => {
                values.extend_from_slice(u64s()?.values());
            }
            Custom::Dict {
                values,
                levels: Some(levels),
            } => {
                let a = u64s()?;
                match a.nulls() {
                    None => {
                        values.extend_from_slice(a.values());
                        levels.resize(levels.len() + a.len(), 1);
                    }
                    Some(nulls) => {
                        for (&v, present) in a.values().iter().zip(nulls.iter()) {
                            if present {
                                values.push(v);
                            }
                            levels.push(present as u8);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Rows buffered.
    fn len(&self) -> usize {
        match self {
            Custom::Kind(keys) => keys.len(),
            Custom::Delta { values, .. } => values.len(),
            Custom::Split(values) => values.len(),
            Custom::Dict {
                levels: Some(levels),
                ..
            } => levels.len(),
            Custom::Dict { values, .. } => values.len(),
        }
    }

    fn clear(&mut self) {
        match self {
            Custom::Kind(keys) => keys.clear(),
            Custom::Delta { values, .. } => values.clear(),
            Custom::Split(values) => values.clear(),
            Custom::Dict { values, levels } => {
                values.clear();
                if let Some(levels) = levels {
                    levels.clear();
                }
            }
        }
    }
}

/// A dictionary of u64 values for one column chunk: entries in order of
/// first appearance. The table's slots carry the generation of the chunk
/// that filled them, so starting a chunk clears nothing.
#[derive(Default)]
struct U64Dict {
    /// (value, entry, generation).
    slots: Vec<(u64, u32, u32)>,
    entries: Vec<u64>,
    generation: u32,
    shift: u32,
}

impl U64Dict {
    /// Starts a chunk of up to `rows` values.
    fn start(&mut self, rows: usize) {
        let want = (rows.max(8) * 2).next_power_of_two();
        if self.slots.len() < want || self.generation == u32::MAX {
            self.slots = vec![(0, 0, 0); want];
            self.shift = 64 - want.trailing_zeros();
            self.generation = 0;
        }
        self.generation += 1;
        self.entries.clear();
    }

    /// The entry of `v`, added if new.
    #[inline]
    fn index(&mut self, v: u64) -> u32 {
        let mask = self.slots.len() - 1;
        let mut i = (v.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize;
        loop {
            let slot = &mut self.slots[i];
            if slot.2 != self.generation {
                let entry = self.entries.len() as u32;
                *slot = (v, entry, self.generation);
                self.entries.push(v);
                return entry;
            }
            if slot.0 == v {
                return slot.1;
            }
            i = (i + 1) & mask;
        }
    }
}

/// An open `events` segment.
pub(crate) struct EventsFile {
    file: SerializedFileWriter<SegmentSink>,
    factory: ArrowRowGroupWriterFactory,
    /// By column: the columns encoded here.
    custom: Vec<Option<Custom>>,
    row_group_rows: usize,
    page_rows: usize,
    compression: Compression,
    zstd: zstd::bulk::Compressor<'static>,
    /// Parquet's writers of the columns not encoded here, by column, for
    /// the row group being filled (none while every column is encoded
    /// here), and its rows.
    arrow: Vec<Option<ArrowColumnWriter>>,
    rows: usize,
    row_groups: usize,
    dict: U64Dict,
    /// Pages before compression, and dictionary indices: reused.
    pages: ChunkPages,
    index_buf: Vec<u64>,
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
        let level = match compression {
            Compression::ZSTD(l) => l.compression_level(),
            Compression::UNCOMPRESSED => 0,
            other => {
                return Err(ParquetError::NYI(format!(
                    "events written with {other:?}; only zstd or none"
                )))
            }
        };
        let zstd =
            zstd::bulk::Compressor::new(level).map_err(|e| ParquetError::External(Box::new(e)))?;
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
            page_rows,
            compression,
            zstd,
            arrow: Vec::new(),
            rows: 0,
            row_groups: 0,
            dict: U64Dict::default(),
            pages: ChunkPages::default(),
            index_buf: Vec::new(),
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
                    let chunk = self.custom_chunk(i, &custom);
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

    /// Encodes column `col` of the row group as a column chunk.
    fn custom_chunk(&mut self, col: usize, custom: &Custom) -> Result<(Bytes, ColumnCloseResult)> {
        let descr = self.file.schema_descr().column(col);
        let mut stats = None;
        let encodings;
        // Buffers reused from chunk to chunk.
        let mut out = std::mem::take(&mut self.pages);
        let mut indices = std::mem::take(&mut self.index_buf);
        indices.clear();
        match custom {
            Custom::Kind(keys) => {
                encodings = vec![Encoding::PLAIN, Encoding::RLE, Encoding::RLE_DICTIONARY];
                // Dictionary entries in order of first appearance.
                let mut entry = [u8::MAX; 256];
                let mut names: Vec<&str> = Vec::new();
                for &k in keys {
                    let slot = &mut entry[k as u8 as usize];
                    if *slot == u8::MAX {
                        let kind = EventKind::ALL.get(k as usize).ok_or_else(|| {
                            ParquetError::General(format!("kind key {k} out of range"))
                        })?;
                        *slot = names.len() as u8;
                        names.push(kind.name());
                    }
                    indices.push(*slot as u64);
                }
                let mut dict = out.buf();
                for name in &names {
                    dict.extend_from_slice(&(name.len() as u32).to_le_bytes());
                    dict.extend_from_slice(name.as_bytes());
                }
                out.dictionary(dict, names.len());
                let width = bit_width(names.len());
                for part in indices.chunks(self.page_rows) {
                    let mut raw = out.buf();
                    raw.push(width);
                    bit_packed_run(&mut raw, part, width);
                    out.data(raw, part.len(), Encoding::RLE_DICTIONARY);
                }
            }
            Custom::Delta {
                values,
                int32,
                stats: want_stats,
            } => {
                encodings = vec![Encoding::RLE, Encoding::DELTA_BINARY_PACKED];
                for part in values.chunks(self.page_rows) {
                    let mut raw = out.buf();
                    delta_page(&mut raw, part, *int32);
                    out.data(raw, part.len(), Encoding::DELTA_BINARY_PACKED);
                }
                if *want_stats {
                    stats = Some(min_max(values, *int32));
                }
            }
            Custom::Split(values) => {
                encodings = vec![Encoding::RLE, Encoding::BYTE_STREAM_SPLIT];
                for part in values.chunks(self.page_rows) {
                    let mut raw = out.buf();
                    byte_stream_split(&mut raw, part);
                    out.data(raw, part.len(), Encoding::BYTE_STREAM_SPLIT);
                }
            }
            Custom::Dict { values, levels } => {
                encodings = if values.is_empty() {
                    // No value in the chunk, so no dictionary.
                    vec![Encoding::PLAIN, Encoding::RLE]
                } else {
                    vec![Encoding::PLAIN, Encoding::RLE, Encoding::RLE_DICTIONARY]
                };
                let mut dict = std::mem::take(&mut self.dict);
                dict.start(values.len());
                indices.extend(values.iter().map(|&v| dict.index(v) as u64));
                let width = bit_width(dict.entries.len());
                if !dict.entries.is_empty() {
                    let mut raw = out.buf();
                    raw.extend(dict.entries.iter().flat_map(|v| v.to_le_bytes()));
                    out.dictionary(raw, dict.entries.len());
                }
                self.dict = dict;
                // Pages of `page_rows` rows, and the values present in each.
                let mut next = 0;
                for first in (0..custom.len()).step_by(self.page_rows) {
                    let rows = self.page_rows.min(custom.len() - first);
                    let mut raw = out.buf();
                    let present = match levels {
                        Some(levels) => {
                            let page_levels = &levels[first..first + rows];
                            def_levels(&mut raw, page_levels);
                            page_levels.iter().filter(|&&l| l == 1).count()
                        }
                        None => rows,
                    };
                    let page_indices = &indices[next..next + present];
                    next += present;
                    let encoding = if indices.is_empty() {
                        // No value in the chunk, so no dictionary.
                        Encoding::PLAIN
                    } else {
                        raw.push(width);
                        if !page_indices.is_empty() {
                            bit_packed_run(&mut raw, page_indices, width);
                        }
                        Encoding::RLE_DICTIONARY
                    };
                    out.data(raw, rows, encoding);
                }
            }
        }
        self.index_buf = indices;
        let written = self.write_pages(&mut out);
        out.recycle();
        self.pages = out;
        let (bytes, chunk, codec) = written?;
        let rows = custom.len();
        let mut metadata = ColumnChunkMetaData::builder(descr)
            .set_compression(codec)
            .set_encodings(encodings)
            .set_num_values(rows as i64)
            .set_total_compressed_size(chunk.compressed as i64)
            .set_total_uncompressed_size(chunk.uncompressed as i64)
            .set_dictionary_page_offset(chunk.dictionary_offset.map(|o| o as i64))
            .set_data_page_offset(chunk.data_offset.unwrap_or(0) as i64);
        if let Some(stats) = stats {
            metadata = metadata.set_statistics(stats);
        }
        let close = ColumnCloseResult {
            bytes_written: bytes.len() as u64,
            rows_written: rows as u64,
            metadata: metadata.build()?,
            bloom_filter: None,
            column_index: None,
            offset_index: None,
        };
        Ok((bytes, close))
    }

    /// Compresses a chunk's pages and writes them with their headers.
    /// zstd is kept only where it saves at least 1/32 of the chunk's
    /// bytes: below that (`ts_ns` with nanosecond jitter, which zstd
    /// makes larger) readers would pay for decompression for nothing, and
    /// Parquet lets every column chunk have its own codec.
    fn write_pages(&mut self, out: &mut ChunkPages) -> Result<(Bytes, ChunkSizes, Compression)> {
        let mut codec = self.compression;
        let mut packed = Vec::with_capacity(out.pages.len());
        if codec != Compression::UNCOMPRESSED {
            let (mut raw_bytes, mut packed_bytes) = (0, 0);
            for page in &out.pages {
                let z = self
                    .zstd
                    .compress(&page.raw)
                    .map_err(|e| ParquetError::External(Box::new(e)))?;
                raw_bytes += page.raw.len();
                packed_bytes += z.len();
                packed.push(Bytes::from(z));
            }
            if packed_bytes > raw_bytes - raw_bytes / 32 {
                codec = Compression::UNCOMPRESSED;
                packed.clear();
            }
        }
        let mut sink = Vec::new();
        let mut chunk = ChunkSizes::default();
        for (i, page) in out.pages.iter().enumerate() {
            let data: &[u8] = match packed.get(i) {
                Some(z) => z,
                None => &page.raw,
            };
            let offset = sink.len();
            page_header(&mut sink, page, data)?;
            let header = sink.len() - offset;
            sink.extend_from_slice(data);
            chunk.add(
                offset as u64,
                header + data.len(),
                header + page.raw.len(),
                !page.dictionary,
            );
        }
        Ok((Bytes::from(sink), chunk, codec))
    }

    /// Writes the last row group and the footer, and returns the file.
    pub(crate) fn into_inner(mut self) -> Result<SegmentSink> {
        self.flush_row_group()?;
        self.file.into_inner()
    }
}

/// A page of a column chunk, before compression.
struct RawPage {
    raw: Vec<u8>,
    values: usize,
    encoding: Encoding,
    dictionary: bool,
}

/// The pages of the column chunk being encoded, and spare buffers.
#[derive(Default)]
struct ChunkPages {
    pages: Vec<RawPage>,
    spare: Vec<Vec<u8>>,
}

impl ChunkPages {
    /// An empty buffer for a page.
    fn buf(&mut self) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        b
    }

    fn dictionary(&mut self, raw: Vec<u8>, entries: usize) {
        self.pages.push(RawPage {
            raw,
            values: entries,
            encoding: Encoding::PLAIN,
            dictionary: true,
        });
    }

    fn data(&mut self, raw: Vec<u8>, values: usize, encoding: Encoding) {
        self.pages.push(RawPage {
            raw,
            values,
            encoding,
            dictionary: false,
        });
    }

    /// Keeps the pages' buffers for the next chunk.
    fn recycle(&mut self) {
        self.spare.extend(self.pages.drain(..).map(|p| p.raw));
    }
}

/// Sizes and offsets of a column chunk being written.
#[derive(Default)]
struct ChunkSizes {
    compressed: usize,
    uncompressed: usize,
    dictionary_offset: Option<u64>,
    data_offset: Option<u64>,
}

impl ChunkSizes {
    /// Counts a page written at `offset`, with its header.
    fn add(&mut self, offset: u64, compressed: usize, uncompressed: usize, data: bool) {
        self.compressed += compressed;
        self.uncompressed += uncompressed;
        let first = if data {
            &mut self.data_offset
        } else {
            &mut self.dictionary_offset
        };
        first.get_or_insert(offset);
    }
}

/// Chunk statistics of an unsigned column: min and max (as Parquet keeps
/// unsigned values, in the signed physical type), no nulls.
fn min_max(values: &[i64], int32: bool) -> Statistics {
    if int32 {
        let it = values.iter().map(|&v| v as u32);
        let (min, max) = (it.clone().min(), it.max());
        Statistics::int32(
            min.map(|v| v as i32),
            max.map(|v| v as i32),
            None,
            Some(0),
            false,
        )
    } else {
        let it = values.iter().map(|&v| v as u64);
        let (min, max) = (it.clone().min(), it.max());
        Statistics::int64(
            min.map(|v| v as i64),
            max.map(|v| v as i64),
            None,
            Some(0),
            false,
        )
    }
}

/// Values per block and miniblocks per block of DELTA_BINARY_PACKED pages
/// (those of the Parquet writer's settings: 32-value miniblocks keep an
/// occasional long gap between times from widening many neighbours).
const DELTA_BLOCK: usize = 128;
const DELTA_MINIBLOCKS: usize = 4;
const DELTA_MINIBLOCK: usize = DELTA_BLOCK / DELTA_MINIBLOCKS;

/// A DELTA_BINARY_PACKED page body of `values` (the physical type's bits;
/// `int32`: 32-bit arithmetic, which wraps as readers do).
fn delta_page(out: &mut Vec<u8>, values: &[i64], int32: bool) {
    put_uvarint(out, DELTA_BLOCK as u64);
    put_uvarint(out, DELTA_MINIBLOCKS as u64);
    put_uvarint(out, values.len() as u64);
    put_zigzag(out, values.first().copied().unwrap_or(0));
    let delta = |a: i64, b: i64| {
        if int32 {
            (a as i32).wrapping_sub(b as i32) as i64
        } else {
            a.wrapping_sub(b)
        }
    };
    let offset = |d: i64, min: i64| {
        if int32 {
            (d as i32).wrapping_sub(min as i32) as u32 as u64
        } else {
            d.wrapping_sub(min) as u64
        }
    };
    let mut deltas = [0i64; DELTA_BLOCK];
    let mut packed = [0u64; DELTA_MINIBLOCK];
    for start in (1..values.len()).step_by(DELTA_BLOCK) {
        let block = &values[start - 1..(start + DELTA_BLOCK).min(values.len())];
        let n = block.len() - 1;
        for (j, d) in deltas[..n].iter_mut().enumerate() {
            *d = delta(block[j + 1], block[j]);
        }
        let min = deltas[..n].iter().copied().min().unwrap_or(0);
        put_zigzag(out, min);
        let widths_at = out.len();
        out.extend_from_slice(&[0; DELTA_MINIBLOCKS]);
        for (m, mini) in deltas[..n].chunks(DELTA_MINIBLOCK).enumerate() {
            let mut bits = 0u64;
            for (p, &d) in packed.iter_mut().zip(mini) {
                *p = offset(d, min);
                bits |= *p;
            }
            packed[mini.len()..].fill(0);
            let width = 64 - bits.leading_zeros();
            out[widths_at + m] = width as u8;
            pack(out, &packed, width);
        }
    }
}

/// Appends a miniblock: `values` packed `width` bits each, least
/// significant first (4 * `width` bytes).
fn pack(out: &mut Vec<u8>, values: &[u64; DELTA_MINIBLOCK], width: u32) {
    if width == 0 {
        return;
    }
    let start = out.len();
    out.resize(start + DELTA_MINIBLOCK / 8 * width as usize, 0);
    pack_bits(&mut out[start..], values, width);
}

/// Packs `values` into `dst`, `width` (1 to 64) bits each, least
/// significant first; `dst` holds whole bytes for a multiple of eight
/// values, the missing ones taken as 0.
fn pack_bits(dst: &mut [u8], values: &[u64], width: u32) {
    let (mut acc, mut bits, mut pos) = (0u64, 0u32, 0usize);
    for &v in values {
        acc |= v << bits;
        bits += width;
        if bits >= 64 {
            dst[pos..pos + 8].copy_from_slice(&acc.to_le_bytes());
            pos += 8;
            bits -= 64;
            // The bits of `v` that did not fit (none if it ended exactly
            // at the word's end).
            acc = if bits == 0 { 0 } else { v >> (width - bits) };
        }
    }
    let n = (bits as usize).div_ceil(8).min(dst.len() - pos);
    dst[pos..pos + n].copy_from_slice(&acc.to_le_bytes()[..n]);
}

/// Writes the Thrift (compact protocol) `PageHeader` of a version 1 data
/// page or a dictionary page whose bytes on disk are `data`, with the
/// CRC-32 of `data` that Parquet's format defines: Parquet's own page
/// writer leaves it out, and it is what lets a reader tell a flipped bit
/// in a page from a different value.
fn page_header(out: &mut Vec<u8>, page: &RawPage, data: &[u8]) -> Result<()> {
    const I32: u8 = 5;
    const STRUCT: u8 = 12;
    const BOOL_FALSE: u8 = 2;
    let size = |n: usize| {
        i32::try_from(n).map_err(|_| ParquetError::General(format!("page of {n} bytes")))
    };
    let field = |out: &mut Vec<u8>, delta: u8, ty: u8| out.push(delta << 4 | ty);
    let int = |out: &mut Vec<u8>, v: i64| put_zigzag(out, v);
    field(out, 1, I32);
    int(out, if page.dictionary { 2 } else { 0 }); // DICTIONARY_PAGE, DATA_PAGE
    field(out, 1, I32);
    int(out, size(page.raw.len())? as i64);
    field(out, 1, I32);
    int(out, size(data.len())? as i64);
    field(out, 1, I32);
    int(out, crc32fast::hash(data) as i32 as i64);
    let values = size(page.values)? as i64;
    let encoding = encoding_code(page.encoding)?;
    if page.dictionary {
        field(out, 3, STRUCT); // field 7: dictionary_page_header
        field(out, 1, I32);
        int(out, values);
        field(out, 1, I32);
        int(out, encoding);
        field(out, 1, BOOL_FALSE); // is_sorted
    } else {
        field(out, 1, STRUCT); // field 5: data_page_header
        field(out, 1, I32);
        int(out, values);
        field(out, 1, I32);
        int(out, encoding);
        let rle = encoding_code(Encoding::RLE)?;
        field(out, 1, I32); // definition levels
        int(out, rle);
        field(out, 1, I32); // repetition levels
        int(out, rle);
    }
    out.push(0); // end of the inner struct
    out.push(0); // end of PageHeader
    Ok(())
}

/// The Thrift code of an encoding this module writes.
fn encoding_code(e: Encoding) -> Result<i64> {
    Ok(match e {
        Encoding::PLAIN => 0,
        Encoding::RLE => 3,
        Encoding::DELTA_BINARY_PACKED => 5,
        Encoding::RLE_DICTIONARY => 8,
        Encoding::BYTE_STREAM_SPLIT => 9,
        other => return Err(ParquetError::NYI(format!("page header for {other}"))),
    })
}

fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_zigzag(out: &mut Vec<u8>, v: i64) {
    put_uvarint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Bits per dictionary index for `entries` entries (at least 1).
fn bit_width(entries: usize) -> u8 {
    let max = entries.saturating_sub(1) as u32;
    (32 - max.leading_zeros()).max(1) as u8
}

/// Appends one bit-packed run of the RLE/bit-packed hybrid encoding:
/// groups of eight values, `width` bits each, least significant first, the
/// last group padded with 0.
fn bit_packed_run(out: &mut Vec<u8>, values: &[u64], width: u8) {
    let groups = values.len().div_ceil(8);
    put_uvarint(out, ((groups as u64) << 1) | 1);
    let start = out.len();
    out.resize(start + groups * width as usize, 0);
    pack_bits(&mut out[start..], values, width as u32);
}

/// Appends the definition levels of a version 1 page of an optional
/// column (0 null, 1 present): their length, then the RLE/bit-packed
/// hybrid, with RLE runs for 8 or more equal levels (as Parquet's encoder
/// does) and bit-packed groups of eight for the rest.
fn def_levels(out: &mut Vec<u8>, levels: &[u8]) {
    let len_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let n = levels.len();
    let mut packed_from = None;
    let mut p = 0;
    while p < n {
        let v = levels[p];
        let run_end = p + levels[p..].iter().take_while(|&&l| l == v).count();
        if run_end - p < 8 {
            packed_from.get_or_insert(p);
            p = run_end;
            continue;
        }
        if let Some(start) = packed_from.take() {
            // A bit-packed run holds whole groups: complete the last one
            // from this run.
            let end = start + (p - start).div_ceil(8) * 8;
            bit_packed_levels(out, &levels[start..end]);
            p = end;
            if run_end - p < 8 {
                packed_from = Some(p);
                p = run_end;
                continue;
            }
        }
        put_uvarint(out, ((run_end - p) as u64) << 1);
        out.push(v);
        p = run_end;
    }
    if let Some(start) = packed_from {
        bit_packed_levels(out, &levels[start..]);
    }
    let len = (out.len() - len_at - 4) as u32;
    out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
}

/// One bit-packed run of 1-bit levels (the last group padded with 0).
fn bit_packed_levels(out: &mut Vec<u8>, levels: &[u8]) {
    put_uvarint(out, ((levels.len().div_ceil(8) as u64) << 1) | 1);
    for group in levels.chunks(8) {
        let byte = group
            .iter()
            .enumerate()
            .fold(0u8, |b, (j, &l)| b | (l & 1) << j);
        out.push(byte);
    }
}

/// A BYTE_STREAM_SPLIT page body: byte k of every value, for k = 0..8.
fn byte_stream_split(out: &mut Vec<u8>, values: &[u64]) {
    let n = values.len();
    let start = out.len();
    out.resize(start + n * 8, 0);
    let out = &mut out[start..];
    for (i, v) in values.iter().enumerate() {
        for (k, b) in v.to_le_bytes().into_iter().enumerate() {
            out[k * n + i] = b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_widths() {
        assert_eq!(bit_width(1), 1);
        assert_eq!(bit_width(2), 1);
        assert_eq!(bit_width(3), 2);
        assert_eq!(bit_width(4), 2);
        assert_eq!(bit_width(5), 3);
        assert_eq!(bit_width(28), 5);
    }

    #[test]
    fn page_packs_groups_of_eight() {
        // 9 values of width 2: two groups, the second padded.
        let mut page = vec![2];
        bit_packed_run(&mut page, &[0, 1, 2, 3, 3, 2, 1, 0, 2], 2);
        assert_eq!(page[1], (2 << 1) | 1, "bit-packed run of 2 groups");
        // 0,1,2,3 -> 0b11_10_01_00; 3,2,1,0 -> 0b00_01_10_11.
        assert_eq!(&page[2..4], &[0b1110_0100, 0b0001_1011]);
        assert_eq!(&page[4..6], &[0b0000_0010, 0]);
        assert_eq!(page.len(), 6);
    }

    #[test]
    fn miniblocks_pack_every_width() {
        for width in 1..=64u32 {
            let mask = if width == 64 {
                u64::MAX
            } else {
                (1 << width) - 1
            };
            let mut values = [0u64; DELTA_MINIBLOCK];
            for (i, v) in values.iter_mut().enumerate() {
                *v = (0x9e37_79b9_7f4a_7c15u64.rotate_left(i as u32 * 7) ^ i as u64) & mask;
            }
            let mut out = vec![0xaa];
            pack(&mut out, &values, width);
            assert_eq!(out.len(), 1 + 4 * width as usize, "width {width}");
            // Read the bits back one by one.
            let bit = |n: usize| (out[1 + n / 8] >> (n % 8)) & 1;
            for (i, &v) in values.iter().enumerate() {
                let got = (0..width as usize).fold(0u64, |acc, b| {
                    acc | (bit(i * width as usize + b) as u64) << b
                });
                assert_eq!(got, v, "width {width}, value {i}");
            }
        }
    }

    #[test]
    fn levels_are_rle_and_bit_packed_runs() {
        let mut out = Vec::new();
        def_levels(&mut out, &[0; 1000]);
        // Length 3: varint(1000 << 1) is 2 bytes, then the value.
        assert_eq!(out, [3, 0, 0, 0, 0xd0, 0x0f, 0]);
        let mut out = Vec::new();
        def_levels(&mut out, &[1, 0, 1, 1, 0, 0, 0, 1, 1]);
        assert_eq!(out, [3, 0, 0, 0, (2 << 1) | 1, 0b1000_1101, 1]);
        // Mixed: 3 bit-packed, completed to 8 from a run of 20 zeros
        // whose other 15 are an RLE run, then 2 ones bit-packed.
        let mut levels = vec![1, 0, 1];
        levels.extend([0; 20]);
        levels.extend([1, 1]);
        let mut out = Vec::new();
        def_levels(&mut out, &levels);
        assert_eq!(out, [6, 0, 0, 0, 3, 0b101, 15 << 1, 0, 3, 0b11]);
    }

    #[test]
    fn byte_streams_split() {
        let mut out = vec![];
        byte_stream_split(&mut out, &[0x0807_0605_0403_0201, 0x1817_1615_1413_1211]);
        assert_eq!(
            out,
            [1, 0x11, 2, 0x12, 3, 0x13, 4, 0x14, 5, 0x15, 6, 0x16, 7, 0x17, 8, 0x18]
        );
    }

    #[test]
    fn dictionary_entries_in_order_of_first_appearance() {
        let mut d = U64Dict::default();
        for round in 0..3 {
            d.start(100);
            let got: Vec<u32> = [7, 9, 7, u64::MAX, 0, 9, round]
                .iter()
                .map(|&v| d.index(v))
                .collect();
            assert_eq!(&got[..6], &[0, 1, 0, 2, 3, 1], "round {round}");
            // 0 is there already; 1 and 2 are new in their round.
            assert_eq!(got[6], if round == 0 { 3 } else { 4 }, "round {round}");
        }
        // Many values: every one gets its own entry, and again the same.
        d.start(100_000);
        for v in 0..100_000u64 {
            assert_eq!(d.index(v * 4096), v as u32);
        }
        for v in 0..100_000u64 {
            assert_eq!(d.index(v * 4096), v as u32);
        }
    }

    #[test]
    fn long_run_header_is_a_varint() {
        let mut page = vec![1];
        bit_packed_run(&mut page, &[1u64; 8 * 200], 1);
        // 200 groups: (200 << 1) | 1 = 401 = 0b1_1001_0001.
        assert_eq!(&page[1..3], &[0x91, 0x03]);
        assert_eq!(page.len(), 3 + 200);
        assert!(page[3..].iter().all(|&b| b == 0xff));
    }
}
