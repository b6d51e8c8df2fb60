//! The column chunks of the columns encoded here: each column's pages in
//! its encoding, compressed where that pays, behind their page headers,
//! and the chunk's metadata for the file's footer.

use bytes::Bytes;
use parquet::basic::{Compression, Encoding};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::statistics::Statistics;
use parquet::schema::types::ColumnDescPtr;

use super::columns::Custom;
use crate::events::codec::delta::delta_page;
use crate::events::codec::dict::{put_indices, U64Dict};
use crate::events::codec::hybrid::{bit_width, def_levels};
use crate::events::codec::plain::{put_plain, put_plain_strings};
use crate::events::codec::split::split_streams;
use crate::events::codec::thrift::page_header;
use crate::schema::EventKind;

/// Encodes column chunks. Its buffers (the pages before compression, the
/// dictionary and its indices) are reused from chunk to chunk.
pub(super) struct ChunkEncoder {
    page_rows: usize,
    compression: Compression,
    zstd: zstd::bulk::Compressor<'static>,
    dict: U64Dict,
    /// Pages before compression, and dictionary indices: reused.
    pages: ChunkPages,
    index_buf: Vec<u64>,
}

impl ChunkEncoder {
    /// Pages of `page_rows` rows, compressed with `compression` (zstd or
    /// none) where that pays.
    pub(super) fn new(page_rows: usize, compression: Compression) -> Result<Self> {
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
        Ok(ChunkEncoder {
            page_rows,
            compression,
            zstd,
            dict: U64Dict::default(),
            pages: ChunkPages::default(),
            index_buf: Vec::new(),
        })
    }

    /// Encodes `custom`, the values of column `descr` in the row group,
    /// as a column chunk.
    pub(super) fn encode(
        &mut self,
        descr: ColumnDescPtr,
        custom: &Custom,
    ) -> Result<(Bytes, ColumnCloseResult)> {
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
                put_plain_strings(&mut dict, &names);
                out.dictionary(dict, names.len());
                let width = bit_width(names.len());
                for part in indices.chunks(self.page_rows) {
                    let mut raw = out.buf();
                    put_indices(&mut raw, width, part);
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
                    split_streams(&mut raw, part);
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
                    put_plain(&mut raw, &dict.entries);
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
                        put_indices(&mut raw, width, page_indices);
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
            page_header(
                &mut sink,
                page.dictionary,
                page.values,
                page.encoding,
                page.raw.len(),
                data,
            )?;
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
