//! An `events` segment file, with the `kind` column encoded here.
//!
//! Parquet's Arrow writer encodes a dictionary-encoded string column by
//! hashing and comparing every row's string to find its dictionary entry
//! again, although the keys of our Arrow dictionary already say which
//! entry it is: 11.6 ns a row for `kind` alone, where the same keys as an
//! Int8 column cost 5.7 (the `kind_cost` example). So the other columns go
//! through Parquet's column writers and `kind` is encoded from the keys
//! directly, in the encoding the Arrow writer produced: a PLAIN dictionary
//! page of the kinds in the order they first appear, then RLE_DICTIONARY
//! data pages (bit-packed runs), each compressed like the rest of the file. Readers (DuckDB, pyarrow,
//! the analyzer) see the same column as before.

use std::fs::File;

use arrow_array::types::Int8Type;
use arrow_array::{Array, RecordBatch};
use bytes::Bytes;
use parquet::arrow::arrow_writer::{compute_leaves, ArrowColumnWriter, ArrowRowGroupWriterFactory};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

use crate::schema::{EventKind, Table};

/// Index of `kind` among the events table's columns (all are leaves).
fn kind_column() -> usize {
    Table::Events
        .schema()
        .index_of("kind")
        .expect("events have a kind")
}

/// An open `events` segment.
pub(crate) struct EventsFile {
    file: SerializedFileWriter<File>,
    factory: ArrowRowGroupWriterFactory,
    kind_col: usize,
    kind_descr: ColumnDescPtr,
    row_group_rows: usize,
    page_rows: usize,
    compression: Compression,
    zstd: zstd::bulk::Compressor<'static>,
    /// The row group being filled: Parquet's writers for every column but
    /// `kind` (whose slot holds an unused one), and the kind keys.
    writers: Option<Vec<ArrowColumnWriter>>,
    keys: Vec<i8>,
    row_groups: usize,
}

impl EventsFile {
    /// `page_rows`: rows per data page of `kind`, as for the other columns.
    pub(crate) fn try_new(file: File, props: WriterProperties, page_rows: usize) -> Result<Self> {
        let row_group_rows = props.max_row_group_row_count().unwrap_or(1 << 20).max(1);
        let compression = props.compression(&parquet::schema::types::ColumnPath::from("kind"));
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
        let writer = ArrowWriter::try_new(file, Table::Events.schema(), Some(props))?;
        let (file, factory) = writer.into_serialized_writer()?;
        let kind_col = kind_column();
        let kind_descr = file.schema_descr().column(kind_col);
        Ok(EventsFile {
            file,
            factory,
            kind_col,
            kind_descr,
            row_group_rows,
            page_rows: page_rows.max(8),
            compression,
            zstd,
            writers: None,
            keys: Vec::new(),
            row_groups: 0,
        })
    }

    /// Appends a batch of the events schema, closing row groups as they fill.
    pub(crate) fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let mut offset = 0;
        while offset < batch.num_rows() {
            if self.writers.is_none() {
                self.writers = Some(self.factory.create_column_writers(self.row_groups)?);
            }
            let room = self.row_group_rows - self.keys.len();
            let n = room.min(batch.num_rows() - offset);
            self.write_rows(&batch.slice(offset, n))?;
            offset += n;
            if self.keys.len() >= self.row_group_rows {
                self.flush_row_group()?;
            }
        }
        Ok(())
    }

    fn write_rows(&mut self, batch: &RecordBatch) -> Result<()> {
        let writers = self.writers.as_mut().expect("row group open");
        let schema = batch.schema();
        for (i, (field, col)) in schema.fields().iter().zip(batch.columns()).enumerate() {
            if i == self.kind_col {
                let dict = col
                    .as_any()
                    .downcast_ref::<arrow_array::DictionaryArray<Int8Type>>()
                    .ok_or_else(|| ParquetError::General("kind is not Int8-keyed".into()))?;
                if dict.null_count() > 0 {
                    return Err(ParquetError::General("kind has nulls".into()));
                }
                if dict.values().len() != EventKind::ALL.len() {
                    return Err(ParquetError::General(
                        "kind dictionary is not the kinds".into(),
                    ));
                }
                self.keys.extend_from_slice(dict.keys().values());
                continue;
            }
            for leaf in compute_leaves(field, col)? {
                writers[i].write(&leaf)?;
            }
        }
        Ok(())
    }

    /// Writes the row group being filled, if any.
    fn flush_row_group(&mut self) -> Result<()> {
        let Some(writers) = self.writers.take() else {
            return Ok(());
        };
        if self.keys.is_empty() {
            return Ok(());
        }
        let mut kind = Some(self.kind_chunk()?);
        let mut rg = self.file.next_row_group()?;
        for (i, w) in writers.into_iter().enumerate() {
            if i == self.kind_col {
                let (bytes, close) = kind.take().expect("one kind column");
                rg.append_column(&bytes, close)?;
            } else {
                w.close()?.append_to_row_group(&mut rg)?;
            }
        }
        rg.close()?;
        self.keys.clear();
        self.row_groups += 1;
        Ok(())
    }

    /// Encodes the row group's kinds as a column chunk.
    fn kind_chunk(&mut self) -> Result<(Bytes, ColumnCloseResult)> {
        // Dictionary entries in order of first appearance.
        let mut entry = [u8::MAX; 256];
        let mut names: Vec<&str> = Vec::new();
        let mut indices = Vec::with_capacity(self.keys.len());
        for &k in &self.keys {
            let slot = &mut entry[k as u8 as usize];
            if *slot == u8::MAX {
                let kind = EventKind::ALL
                    .get(k as usize)
                    .ok_or_else(|| ParquetError::General(format!("kind key {k} out of range")))?;
                *slot = names.len() as u8;
                names.push(kind.name());
            }
            indices.push(*slot);
        }
        let width = bit_width(names.len());

        let mut sink = TrackedWrite::new(Vec::new());
        let mut pages = SerializedPageWriter::new(&mut sink);
        let mut dict = Vec::new();
        for name in &names {
            dict.extend_from_slice(&(name.len() as u32).to_le_bytes());
            dict.extend_from_slice(name.as_bytes());
        }
        let dict_len = dict.len();
        let spec = pages.write_page(CompressedPage::new(
            Page::DictionaryPage {
                buf: self.compress(dict)?,
                num_values: names.len() as u32,
                encoding: Encoding::PLAIN,
                is_sorted: false,
            },
            dict_len,
        ))?;
        let (mut compressed, mut uncompressed) = (spec.compressed_size, spec.uncompressed_size);
        let mut data_offset = None;
        for chunk in indices.chunks(self.page_rows) {
            let raw = rle_dictionary_page(chunk, width);
            let raw_len = raw.len();
            let spec = pages.write_page(CompressedPage::new(
                Page::DataPage {
                    buf: self.compress(raw)?,
                    num_values: chunk.len() as u32,
                    encoding: Encoding::RLE_DICTIONARY,
                    def_level_encoding: Encoding::RLE,
                    rep_level_encoding: Encoding::RLE,
                    statistics: None,
                },
                raw_len,
            ))?;
            data_offset.get_or_insert(spec.offset);
            compressed += spec.compressed_size;
            uncompressed += spec.uncompressed_size;
        }
        pages.close()?;
        let bytes = Bytes::from(sink.into_inner()?);
        let metadata = ColumnChunkMetaData::builder(self.kind_descr.clone())
            .set_compression(self.compression)
            .set_encodings(vec![
                Encoding::PLAIN,
                Encoding::RLE,
                Encoding::RLE_DICTIONARY,
            ])
            .set_num_values(indices.len() as i64)
            .set_total_compressed_size(compressed as i64)
            .set_total_uncompressed_size(uncompressed as i64)
            .set_dictionary_page_offset(Some(0))
            .set_data_page_offset(data_offset.unwrap_or(0) as i64)
            .build()?;
        let close = ColumnCloseResult {
            bytes_written: bytes.len() as u64,
            rows_written: indices.len() as u64,
            metadata,
            bloom_filter: None,
            column_index: None,
            offset_index: None,
        };
        Ok((bytes, close))
    }

    fn compress(&mut self, raw: Vec<u8>) -> Result<Bytes> {
        if self.compression == Compression::UNCOMPRESSED {
            return Ok(Bytes::from(raw));
        }
        let out = self
            .zstd
            .compress(&raw)
            .map_err(|e| ParquetError::External(Box::new(e)))?;
        Ok(Bytes::from(out))
    }

    /// Writes the last row group and the footer, and returns the file.
    pub(crate) fn into_inner(mut self) -> Result<File> {
        self.flush_row_group()?;
        self.file.into_inner()
    }
}

/// Bits per dictionary index for `entries` entries (at least 1).
fn bit_width(entries: usize) -> u8 {
    let max = entries.saturating_sub(1) as u32;
    (32 - max.leading_zeros()).max(1) as u8
}

/// A data page body of dictionary indices: the bit width, then one
/// bit-packed run of the RLE/bit-packed hybrid encoding (groups of eight
/// values, least significant bits first, the last group padded with 0).
fn rle_dictionary_page(indices: &[u8], width: u8) -> Vec<u8> {
    let groups = indices.len().div_ceil(8);
    let mut out = Vec::with_capacity(1 + 10 + groups * width as usize);
    out.push(width);
    let mut header = ((groups as u64) << 1) | 1;
    loop {
        let byte = (header & 0x7f) as u8;
        header >>= 7;
        if header == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    let w = width as u32;
    for group in indices.chunks(8) {
        let mut bits = 0u64;
        for (j, &v) in group.iter().enumerate() {
            bits |= (v as u64) << (j as u32 * w);
        }
        out.extend_from_slice(&bits.to_le_bytes()[..width as usize]);
    }
    out
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
        let page = rle_dictionary_page(&[0, 1, 2, 3, 3, 2, 1, 0, 2], 2);
        assert_eq!(page[0], 2, "bit width");
        assert_eq!(page[1], (2 << 1) | 1, "bit-packed run of 2 groups");
        // 0,1,2,3 -> 0b11_10_01_00; 3,2,1,0 -> 0b00_01_10_11.
        assert_eq!(&page[2..4], &[0b1110_0100, 0b0001_1011]);
        assert_eq!(&page[4..6], &[0b0000_0010, 0]);
        assert_eq!(page.len(), 6);
    }

    #[test]
    fn long_run_header_is_a_varint() {
        let page = rle_dictionary_page(&vec![1u8; 8 * 200], 1);
        // 200 groups: (200 << 1) | 1 = 401 = 0b1_1001_0001.
        assert_eq!(&page[1..3], &[0x91, 0x03]);
        assert_eq!(page.len(), 3 + 200);
        assert!(page[3..].iter().all(|&b| b == 0xff));
    }
}
