//! Where the decoder's pages come from: a column chunk's bytes in memory
//! ([`Chunk`]), read page by page with our own header parser and zstd
//! context ([`OwnPages`]), or through Parquet's page reader for other
//! codecs ([`ParquetPages`]).

use bytes::{Buf, Bytes};
use parquet::basic::Encoding;
use parquet::column::page::{Page, PageReader};
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;

use crate::events::codec::thrift::{
    encoding_of, Compact, PageHeader, PAGE_DATA, PAGE_DATA_V2, PAGE_DICTIONARY, PAGE_INDEX,
};

/// A byte range of a file held in memory, addressed by file offsets.
pub struct Chunk {
    /// File offset of `data[0]`.
    pub base: u64,
    /// The bytes.
    pub data: Bytes,
}

impl Chunk {
    pub(super) fn range(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let s = start
            .checked_sub(self.base)
            .and_then(|s| usize::try_from(s).ok())
            .filter(|&s| s <= self.data.len());
        match s {
            Some(s) if length <= self.data.len() - s => Ok(self.data.slice(s..s + length)),
            _ => Err(ParquetError::EOF(format!(
                "{length} bytes at {start} outside the chunk read"
            ))),
        }
    }
}

impl Length for Chunk {
    fn len(&self) -> u64 {
        self.base + self.data.len() as u64
    }
}

impl ChunkReader for Chunk {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let rest = (self.len().saturating_sub(start)) as usize;
        Ok(self.range(start, rest)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.range(start, length)
    }
}

/// A page as `column::read_pages` decodes it.
pub(super) enum RawPage<'a> {
    Dictionary {
        buf: &'a [u8],
        num_values: usize,
        encoding: Encoding,
    },
    /// A data page: `body` is all of a v1 page (levels, then values) or
    /// the values of a v2 page, whose definition levels are `v2_levels`.
    Data {
        body: &'a [u8],
        num_values: usize,
        encoding: Encoding,
        def_level_encoding: Encoding,
        v2_levels: Option<&'a [u8]>,
    },
}

/// Where `column::read_pages` gets pages from. `Some(None)` at the end of the
/// chunk, `None` on anything unexpected.
pub(super) trait PageSource {
    fn next_page(&mut self) -> Option<Option<RawPage<'_>>>;
}

/// Pages through Parquet's own page reader: for codecs other than zstd.
pub(super) struct ParquetPages {
    pub(super) pages: SerializedPageReader<Chunk>,
    pub(super) cur: Option<Page>,
}

impl PageSource for ParquetPages {
    fn next_page(&mut self) -> Option<Option<RawPage<'_>>> {
        self.cur = self.pages.get_next_page().ok()?;
        let Some(page) = &self.cur else {
            return Some(None);
        };
        Some(Some(match page {
            Page::DictionaryPage {
                buf,
                num_values,
                encoding,
                ..
            } => RawPage::Dictionary {
                buf,
                num_values: *num_values as usize,
                encoding: *encoding,
            },
            Page::DataPage {
                buf,
                num_values,
                encoding,
                def_level_encoding,
                ..
            } => RawPage::Data {
                body: buf,
                num_values: *num_values as usize,
                encoding: *encoding,
                def_level_encoding: *def_level_encoding,
                v2_levels: None,
            },
            Page::DataPageV2 {
                buf,
                num_values,
                encoding,
                def_levels_byte_len,
                rep_levels_byte_len,
                ..
            } => {
                if *rep_levels_byte_len != 0 {
                    return None;
                }
                let d = *def_levels_byte_len as usize;
                RawPage::Data {
                    body: buf.get(d..)?,
                    num_values: *num_values as usize,
                    encoding: *encoding,
                    def_level_encoding: Encoding::RLE,
                    v2_levels: Some(&buf[..d]),
                }
            }
        }))
    }
}

/// Pages read straight from the column chunk's bytes, uncompressed or
/// zstd: page headers are parsed here (Thrift compact protocol) and pages
/// decompressed with one zstd context per thread into one reused buffer.
/// Parquet's page reader made a zstd compression and decompression
/// context for every column chunk (about 2% of decoding) and a fresh
/// buffer for every page.
pub(super) struct OwnPages<'a> {
    /// The rest of the column chunk.
    pub(super) data: &'a [u8],
    /// The decompressor, for a zstd chunk.
    pub(super) dctx: Option<&'a mut zstd::bulk::Decompressor<'static>>,
    pub(super) buf: &'a mut Vec<u8>,
}

impl PageSource for OwnPages<'_> {
    fn next_page(&mut self) -> Option<Option<RawPage<'_>>> {
        loop {
            if self.data.is_empty() {
                return Some(None);
            }
            let mut c = Compact {
                data: self.data,
                at: 0,
            };
            let h = PageHeader::read(&mut c)?;
            let size = usize::try_from(h.compressed).ok()?;
            let raw = self.data.get(c.at..c.at.checked_add(size)?)?;
            // A page whose CRC does not match is not decoded here: the
            // reference reader, which checks it too, reports the file.
            if !cfg!(fuzzing) && h.crc.is_some_and(|crc| crc != crc32fast::hash(raw)) {
                return None;
            }
            self.data = &self.data[c.at + size..];
            let uncompressed = usize::try_from(h.uncompressed).ok()?;
            // v2 pages keep their levels uncompressed, before the values.
            let (levels, compressed) = match h.page_type {
                PAGE_DATA_V2 => {
                    let (d, r) = (h.def_levels_len, h.rep_levels_len);
                    if r != 0 || d < 0 {
                        return None;
                    }
                    let d = d as usize;
                    (Some(raw.get(..d)?), h.v2_compressed)
                }
                PAGE_DATA | PAGE_DICTIONARY => (None, true),
                PAGE_INDEX => continue,
                _ => return None,
            };
            let skip = levels.map_or(0, |l| l.len());
            let src = &raw[skip..];
            let body: &[u8] = match &mut self.dctx {
                Some(dctx) if compressed => {
                    let n = uncompressed.checked_sub(skip)?;
                    self.buf.clear();
                    if n > 0 {
                        self.buf.reserve(n);
                        let got = dctx.decompress_to_buffer(src, &mut *self.buf).ok()?;
                        if got != n {
                            return None;
                        }
                    }
                    &self.buf[..]
                }
                _ => src,
            };
            let num_values = usize::try_from(h.num_values).ok()?;
            let encoding = encoding_of(h.encoding)?;
            return Some(Some(match h.page_type {
                PAGE_DICTIONARY => RawPage::Dictionary {
                    buf: body,
                    num_values,
                    encoding,
                },
                _ => RawPage::Data {
                    body,
                    num_values,
                    encoding,
                    def_level_encoding: encoding_of(h.def_level_encoding)?,
                    v2_levels: levels,
                },
            }));
        }
    }
}
