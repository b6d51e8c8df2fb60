//! A page-level decoder for the event columns replay reads.
//!
//! The Arrow reader decodes every column into Arrow arrays: nullable
//! columns go through definition levels in `i16`, a values buffer that is
//! zeroed, filled densely and then spread to the rows (`pad_nulls`), and
//! the analyzer then copied them again to turn nulls into zeros. This
//! module reads the pages itself (Parquet's page reader still parses the
//! page headers and decompresses) and decodes the few encodings a trace
//! uses straight into the vectors replay reads, nulls written as 0:
//!
//! * PLAIN, and dictionary pages in PLAIN;
//! * RLE_DICTIONARY / PLAIN_DICTIONARY indices (RLE/bit-packed hybrid);
//! * DELTA_BINARY_PACKED;
//! * BYTE_STREAM_SPLIT;
//! * definition levels in RLE (v1 pages) or v2 pages, maximum level 1.
//!
//! Anything else (another encoding or physical type, repeated columns, a
//! malformed page) makes [`read_column`] return `None`, and the caller
//! takes the Arrow path, which reports real errors properly.
//!
//! [`read_column`] decodes a whole column chunk; a [`Cursor`] decodes one
//! a page at a time, so that a caller can take the columns of a row group
//! together while each page's values are still in the cache.

use std::sync::Arc;

use bytes::{Buf, Bytes};
use parquet::basic::{Compression, Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};
use parquet::errors::ParquetError;
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;

/// A byte range of a file held in memory, addressed by file offsets.
pub struct Chunk {
    /// File offset of `data[0]`.
    pub base: u64,
    /// The bytes.
    pub data: Bytes,
}

impl Chunk {
    fn range(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
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

/// What a column's values become.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// INT64 or INT32 (zero-extended) integers.
    Int,
    /// BYTE_ARRAY strings, through a dictionary: each row gets the code
    /// `code_of` gives its string.
    Codes,
}

/// Scratch space reused across columns and pages.
#[derive(Default)]
pub struct Scratch {
    levels: Vec<u8>,
    idx: Vec<u32>,
    vals: Vec<u64>,
    dict: Vec<u64>,
    /// A decompressed page.
    page: Vec<u8>,
    /// The thread's zstd decompression context.
    zstd: Option<zstd::bulk::Decompressor<'static>>,
}

/// The first `n` elements of `v`, grown if needed but not cleared: every
/// user overwrites them, so recycled buffers are not zeroed again.
fn sized<T: Copy + Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// Decodes a whole column chunk of `rows` rows into `out`, nulls as 0,
/// each value through `conv` (which must be exact for the column's
/// values: callers pick the output type by the column's physical type).
/// For [`Values::Codes`], `code_of` maps a dictionary string to the value
/// stored. `out` is resized to `rows` and overwritten; a recycled vector
/// of that length is not written twice. `None` when the chunk uses
/// anything this module does not decode.
#[allow(clippy::too_many_arguments)]
pub fn read_column<T: Copy + Default>(
    chunk: &Arc<Chunk>,
    meta: &ColumnChunkMetaData,
    rows: usize,
    kind: Values,
    code_of: &dyn Fn(&[u8]) -> u64,
    conv: impl Fn(u64) -> T + Copy,
    scratch: &mut Scratch,
    out: &mut Vec<T>,
) -> Option<()> {
    let (nullable, ty) = column_shape(meta, kind)?;
    out.resize(rows, T::default());
    let mut dict = std::mem::take(&mut scratch.dict);
    let zstd = match meta.compression() {
        Compression::UNCOMPRESSED => Some(false),
        Compression::ZSTD(_) => Some(true),
        _ => None,
    };
    let r = match zstd {
        Some(zstd) => {
            let (start, len) = meta.byte_range();
            let data = chunk.range(start, usize::try_from(len).ok()?).ok()?;
            let mut buf = std::mem::take(&mut scratch.page);
            let mut dctx = scratch.zstd.take();
            if zstd && dctx.is_none() {
                dctx = Some(zstd::bulk::Decompressor::new().ok()?);
            }
            let mut src = OwnPages {
                data: &data,
                dctx: dctx.as_mut().filter(|_| zstd),
                buf: &mut buf,
            };
            let r = read_pages(
                &mut src, nullable, ty, kind, code_of, conv, scratch, &mut dict, out,
            );
            scratch.page = buf;
            scratch.zstd = dctx;
            r
        }
        None => {
            let pages = SerializedPageReader::new(chunk.clone(), meta, rows, None).ok()?;
            let mut src = ParquetPages { pages, cur: None };
            read_pages(
                &mut src, nullable, ty, kind, code_of, conv, scratch, &mut dict, out,
            )
        }
    };
    scratch.dict = dict;
    r?;
    Some(())
}

/// Whether the column is nullable, and its physical type; `None` if it
/// is not a flat column of a type `kind` reads.
fn column_shape(meta: &ColumnChunkMetaData, kind: Values) -> Option<(bool, PhysicalType)> {
    let descr = meta.column_descr();
    if descr.max_rep_level() != 0 || descr.max_def_level() > 1 {
        return None;
    }
    let ty = meta.column_type();
    match (kind, ty) {
        (Values::Int, PhysicalType::INT64 | PhysicalType::INT32) => {}
        (Values::Codes, PhysicalType::BYTE_ARRAY) => {}
        _ => return None,
    }
    Some((descr.max_def_level() == 1, ty))
}

/// A page as [`read_pages`] decodes it.
enum RawPage<'a> {
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

/// Where [`read_pages`] gets pages from. `Some(None)` at the end of the
/// chunk, `None` on anything unexpected.
trait PageSource {
    fn next_page(&mut self) -> Option<Option<RawPage<'_>>>;
}

/// Pages through Parquet's own page reader: for codecs other than zstd.
struct ParquetPages {
    pages: SerializedPageReader<Chunk>,
    cur: Option<Page>,
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
struct OwnPages<'a> {
    /// The rest of the column chunk.
    data: &'a [u8],
    /// The decompressor, for a zstd chunk.
    dctx: Option<&'a mut zstd::bulk::Decompressor<'static>>,
    buf: &'a mut Vec<u8>,
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

const PAGE_DATA: i32 = 0;
const PAGE_INDEX: i32 = 1;
const PAGE_DICTIONARY: i32 = 2;
const PAGE_DATA_V2: i32 = 3;

/// The fields of a Parquet `PageHeader` this module reads.
#[derive(Default)]
struct PageHeader {
    page_type: i32,
    uncompressed: i32,
    compressed: i32,
    num_values: i32,
    encoding: i32,
    /// v1 data pages.
    def_level_encoding: i32,
    /// v2 data pages.
    def_levels_len: i32,
    rep_levels_len: i32,
    v2_compressed: bool,
    /// CRC-32 of the page's bytes as stored, when the writer gave one.
    crc: Option<u32>,
}

impl PageHeader {
    fn read(c: &mut Compact<'_>) -> Option<PageHeader> {
        let mut h = PageHeader {
            page_type: -1,
            compressed: -1,
            // An RLE code, for v2 pages, which have none.
            def_level_encoding: 3,
            v2_compressed: true,
            ..PageHeader::default()
        };
        let mut id = 0i16;
        while let Some((f, ty)) = c.field(&mut id)? {
            match (f, ty) {
                (1, I32) => h.page_type = c.int()?,
                (2, I32) => h.uncompressed = c.int()?,
                (3, I32) => h.compressed = c.int()?,
                (4, I32) => h.crc = Some(c.int()? as u32),
                (5 | 7 | 8, STRUCT) => {
                    let mut sub = 0i16;
                    while let Some((g, ty)) = c.field(&mut sub)? {
                        match (f, g, ty) {
                            (_, 1, I32) => h.num_values = c.int()?,
                            (5 | 7, 2, I32) | (8, 4, I32) => h.encoding = c.int()?,
                            (5, 3, I32) => h.def_level_encoding = c.int()?,
                            (8, 5, I32) => h.def_levels_len = c.int()?,
                            (8, 6, I32) => h.rep_levels_len = c.int()?,
                            (8, 7, TRUE) => h.v2_compressed = true,
                            (8, 7, FALSE) => h.v2_compressed = false,
                            _ => c.skip(ty, 0)?,
                        }
                    }
                }
                _ => c.skip(ty, 0)?,
            }
        }
        (h.page_type >= 0 && h.compressed >= 0).then_some(h)
    }
}

/// Parquet's `Encoding` of its Thrift code.
fn encoding_of(code: i32) -> Option<Encoding> {
    Some(match code {
        0 => Encoding::PLAIN,
        2 => Encoding::PLAIN_DICTIONARY,
        3 => Encoding::RLE,
        5 => Encoding::DELTA_BINARY_PACKED,
        6 => Encoding::DELTA_LENGTH_BYTE_ARRAY,
        7 => Encoding::DELTA_BYTE_ARRAY,
        8 => Encoding::RLE_DICTIONARY,
        9 => Encoding::BYTE_STREAM_SPLIT,
        _ => return None,
    })
}

// Thrift compact protocol field types.
const TRUE: u8 = 1;
const FALSE: u8 = 2;
const I32: u8 = 5;
const STRUCT: u8 = 12;

/// A reader of the Thrift compact protocol, enough for page headers.
struct Compact<'a> {
    data: &'a [u8],
    at: usize,
}

impl Compact<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.data.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut rest = self.data.get(self.at..)?;
        let before = rest.len();
        let v = uleb(&mut rest)?;
        self.at += before - rest.len();
        Some(v)
    }

    fn int(&mut self) -> Option<i32> {
        i32::try_from(zigzag(self.varint()?)).ok()
    }

    /// The next field's id and type; `None` at the end of the struct.
    fn field(&mut self, last: &mut i16) -> Option<Option<(i16, u8)>> {
        let b = self.byte()?;
        if b == 0 {
            return Some(None);
        }
        let delta = (b >> 4) as i16;
        let id = if delta != 0 {
            last.checked_add(delta)?
        } else {
            i16::try_from(zigzag(self.varint()?)).ok()?
        };
        *last = id;
        Some(Some((id, b & 0x0f)))
    }

    /// Skips a value of type `ty`.
    fn skip(&mut self, ty: u8, depth: u32) -> Option<()> {
        if depth > 32 {
            return None;
        }
        match ty {
            TRUE | FALSE => {}
            3 => {
                self.byte()?;
            }
            4..=6 => {
                self.varint()?;
            }
            7 => self.advance(8)?,
            8 => {
                let n = usize::try_from(self.varint()?).ok()?;
                self.advance(n)?;
            }
            9 | 10 => {
                let b = self.byte()?;
                let mut n = (b >> 4) as u64;
                if n == 15 {
                    n = self.varint()?;
                }
                for _ in 0..n {
                    self.skip_element(b & 0x0f, depth)?;
                }
            }
            11 => {
                let n = self.varint()?;
                if n > 0 {
                    let kv = self.byte()?;
                    for _ in 0..n {
                        self.skip_element(kv >> 4, depth)?;
                        self.skip_element(kv & 0x0f, depth)?;
                    }
                }
            }
            STRUCT => {
                let mut id = 0i16;
                while let Some((_, t)) = self.field(&mut id)? {
                    self.skip(t, depth + 1)?;
                }
            }
            _ => return None,
        }
        Some(())
    }

    /// Skips an element of a list, set or map: booleans take a byte there.
    fn skip_element(&mut self, ty: u8, depth: u32) -> Option<()> {
        match ty {
            TRUE | FALSE => self.byte().map(|_| ()),
            _ => self.skip(ty, depth + 1),
        }
    }

    fn advance(&mut self, n: usize) -> Option<()> {
        let end = self.at.checked_add(n)?;
        (end <= self.data.len()).then(|| self.at = end)
    }
}

/// The page loop of [`read_column`]; `dict` is scratch space for the
/// dictionary.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn read_pages<T: Copy + Default>(
    pages: &mut impl PageSource,
    nullable: bool,
    ty: PhysicalType,
    kind: Values,
    code_of: &dyn Fn(&[u8]) -> u64,
    conv: impl Fn(u64) -> T + Copy,
    scratch: &mut Scratch,
    dict_buf: &mut Vec<u64>,
    out: &mut [T],
) -> Option<()> {
    let rows = out.len();
    let mut at = 0usize;
    let mut has_dict = false;
    while let Some(page) = pages.next_page()? {
        let Some(data) = DataPage::of(page, nullable, kind, ty, code_of, dict_buf, &mut has_dict)?
        else {
            continue;
        };
        let dst = out.get_mut(at..at.checked_add(data.n)?)?;
        at += data.n;
        let dict = has_dict.then_some(&dict_buf[..]);
        data.decode(nullable, kind, ty, dict, code_of, scratch, dst, conv)?;
    }
    (at == rows).then_some(())
}

/// A data page, split into its parts.
struct DataPage<'a> {
    /// Rows (values and nulls).
    n: usize,
    encoding: Encoding,
    /// Definition levels (RLE), empty if the column is required.
    levels: &'a [u8],
    values: &'a [u8],
}

impl<'a> DataPage<'a> {
    /// The data page `page` is, or `None` inside for a dictionary page,
    /// which is decoded into `dict` (`has_dict` set). `None` on anything
    /// unexpected.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn of(
        page: RawPage<'a>,
        nullable: bool,
        kind: Values,
        ty: PhysicalType,
        code_of: &dyn Fn(&[u8]) -> u64,
        dict: &mut Vec<u64>,
        has_dict: &mut bool,
    ) -> Option<Option<DataPage<'a>>> {
        let (n, encoding, levels, values) = match page {
            RawPage::Dictionary {
                buf,
                num_values,
                encoding,
            } => {
                if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
                    return None;
                }
                let d = sized(dict, num_values);
                match kind {
                    Values::Int => plain(buf, ty, d, |v| v)?,
                    Values::Codes => plain_strings(buf, code_of, d, |v| v)?,
                }
                dict.truncate(num_values);
                *has_dict = true;
                return Some(None);
            }
            RawPage::Data {
                body,
                num_values,
                encoding,
                def_level_encoding,
                v2_levels,
            } => match v2_levels {
                Some(levels) => (num_values, encoding, levels, body),
                None if nullable => {
                    if def_level_encoding != Encoding::RLE {
                        return None;
                    }
                    let len = u32::from_le_bytes(body.get(..4)?.try_into().ok()?) as usize;
                    let end = 4usize.checked_add(len)?;
                    (num_values, encoding, body.get(4..end)?, &body[end..])
                }
                None => (num_values, encoding, &body[..0], body),
            },
        };
        Some(Some(DataPage {
            n,
            encoding,
            levels,
            values,
        }))
    }

    /// Decodes the page's `n` rows into `dst`, nulls as 0.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn decode<T: Copy>(
        &self,
        nullable: bool,
        kind: Values,
        ty: PhysicalType,
        dict: Option<&[u64]>,
        code_of: &dyn Fn(&[u8]) -> u64,
        scratch: &mut Scratch,
        dst: &mut [T],
        conv: impl Fn(u64) -> T + Copy,
    ) -> Option<()> {
        let n = self.n;
        debug_assert_eq!(dst.len(), n);
        // Which rows of the page have a value.
        let present = if nullable {
            let lv = sized(&mut scratch.levels, n);
            hybrid(self.levels, 1, lv, |v| v as u8)?;
            // Width 1: every level is 0 or 1.
            lv.iter().map(|&l| l as usize).sum::<usize>()
        } else {
            n
        };
        let (encoding, values) = (self.encoding, self.values);
        if present < n {
            // Decode the present values into scratch, then spread them.
            let mut vals = std::mem::take(&mut scratch.vals);
            let v = sized(&mut vals, present);
            let ok = decode_values(encoding, kind, ty, values, dict, code_of, scratch, v, |v| v);
            let ok = ok.map(|()| spread(&scratch.levels[..n], v, dst, conv));
            scratch.vals = vals;
            ok
        } else {
            decode_values(
                encoding, kind, ty, values, dict, code_of, scratch, dst, conv,
            )
        }
    }
}

/// Decodes a column chunk one data page at a time, for callers that
/// consume the columns of a row group together in row order: a page's
/// values are used while they are still in the cache, instead of a whole
/// column chunk being written out and read back. Uncompressed and zstd
/// chunks only ([`Cursor::new`] says `None` to anything else).
pub struct Cursor<T> {
    /// The column chunk's bytes.
    data: Bytes,
    /// Offset in `data` of the next page header.
    at: usize,
    zstd: bool,
    nullable: bool,
    ty: PhysicalType,
    kind: Values,
    dict: Vec<u64>,
    has_dict: bool,
    /// The current page's values; `vals[pos..]` are not consumed yet.
    vals: Vec<T>,
    pos: usize,
    /// Rows of the chunk in pages not decoded yet.
    rows_left: usize,
}

impl<T: Copy + Default> Cursor<T> {
    /// A cursor over the `rows` rows of the column chunk `meta` in
    /// `chunk`, its values read as `kind`; `None` for what
    /// [`read_column`] would not decode or for a codec other than zstd.
    pub fn new(
        chunk: &Chunk,
        meta: &ColumnChunkMetaData,
        rows: usize,
        kind: Values,
    ) -> Option<Self> {
        let (nullable, ty) = column_shape(meta, kind)?;
        let zstd = match meta.compression() {
            Compression::UNCOMPRESSED => false,
            Compression::ZSTD(_) => true,
            _ => return None,
        };
        let (start, len) = meta.byte_range();
        Some(Cursor {
            data: chunk.range(start, usize::try_from(len).ok()?).ok()?,
            at: 0,
            zstd,
            nullable,
            ty,
            kind,
            dict: Vec::new(),
            has_dict: false,
            vals: Vec::new(),
            pos: 0,
            rows_left: rows,
        })
    }

    /// The decoded values not consumed yet.
    #[inline(always)]
    pub fn values(&self) -> &[T] {
        &self.vals[self.pos..]
    }

    /// Marks the first `n` of [`Cursor::values`] consumed.
    #[inline(always)]
    pub fn consume(&mut self, n: usize) {
        debug_assert!(self.pos + n <= self.vals.len());
        self.pos += n;
    }

    /// Decodes the next data page (after a dictionary page, if one comes
    /// first), each value through `conv` as in [`read_column`], dropping
    /// what is left of the current page. `None` on anything unexpected,
    /// including a page past the chunk's rows or the end of the chunk
    /// before them.
    pub fn next_page(
        &mut self,
        code_of: &dyn Fn(&[u8]) -> u64,
        conv: impl Fn(u64) -> T + Copy,
        scratch: &mut Scratch,
    ) -> Option<()> {
        let mut buf = std::mem::take(&mut scratch.page);
        let mut dctx = scratch.zstd.take();
        let r = self.decode_next(code_of, conv, scratch, &mut buf, &mut dctx);
        scratch.page = buf;
        scratch.zstd = dctx;
        r
    }

    fn decode_next(
        &mut self,
        code_of: &dyn Fn(&[u8]) -> u64,
        conv: impl Fn(u64) -> T + Copy,
        scratch: &mut Scratch,
        buf: &mut Vec<u8>,
        dctx: &mut Option<zstd::bulk::Decompressor<'static>>,
    ) -> Option<()> {
        if self.zstd && dctx.is_none() {
            *dctx = Some(zstd::bulk::Decompressor::new().ok()?);
        }
        let (nullable, kind, ty) = (self.nullable, self.kind, self.ty);
        loop {
            let mut src = OwnPages {
                data: self.data.get(self.at..)?,
                dctx: dctx.as_mut().filter(|_| self.zstd),
                buf,
            };
            let page = src.next_page()??;
            let data = DataPage::of(
                page,
                nullable,
                kind,
                ty,
                code_of,
                &mut self.dict,
                &mut self.has_dict,
            )?;
            let Some(data) = data else {
                self.at = self.data.len() - src.data.len();
                continue;
            };
            if data.n > self.rows_left {
                return None;
            }
            let dst = sized(&mut self.vals, data.n);
            let dict = self.has_dict.then_some(&self.dict[..]);
            data.decode(nullable, kind, ty, dict, code_of, scratch, dst, conv)?;
            self.vals.truncate(data.n);
            self.pos = 0;
            self.rows_left -= data.n;
            self.at = self.data.len() - src.data.len();
            return Some(());
        }
    }
}

/// Decodes `out.len()` present values of one page.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn decode_values<T: Copy>(
    encoding: Encoding,
    kind: Values,
    ty: PhysicalType,
    values: &[u8],
    dict: Option<&[u64]>,
    code_of: &dyn Fn(&[u8]) -> u64,
    scratch: &mut Scratch,
    out: &mut [T],
    conv: impl Fn(u64) -> T + Copy,
) -> Option<()> {
    match encoding {
        Encoding::PLAIN if kind == Values::Int => plain(values, ty, out, conv),
        Encoding::PLAIN => plain_strings(values, code_of, out, conv),
        Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY => {
            let dict = dict?;
            let (&width, rest) = match values.split_first() {
                Some(x) => x,
                None if out.is_empty() => return Some(()),
                None => return None,
            };
            let idx = sized(&mut scratch.idx, out.len());
            hybrid(rest, width as u32, idx, |v| v as u32)?;
            let max = idx.iter().fold(0, |m, &i| m.max(i));
            if !out.is_empty() && max as usize >= dict.len() {
                return None;
            }
            for (o, &i) in out.iter_mut().zip(idx.iter()) {
                *o = conv(dict[i as usize]);
            }
            Some(())
        }
        Encoding::DELTA_BINARY_PACKED if kind == Values::Int => delta(values, ty, out, conv),
        Encoding::BYTE_STREAM_SPLIT if kind == Values::Int => {
            byte_stream_split(values, ty, out, conv)
        }
        _ => None,
    }
}

/// Writes one value per level: the next present value, or 0.
fn spread<T: Copy>(levels: &[u8], vals: &[u64], out: &mut [T], conv: impl Fn(u64) -> T) {
    if vals.is_empty() {
        out.fill(conv(0));
        return;
    }
    let mut k = 0usize;
    let last = vals.len() - 1;
    for (o, &l) in out.iter_mut().zip(levels) {
        // Branch-free: read the next value (clamped), keep it if present.
        *o = conv(vals[k.min(last)] & 0u64.wrapping_sub(l as u64));
        k += l as usize;
    }
}

fn plain<T: Copy>(
    data: &[u8],
    ty: PhysicalType,
    out: &mut [T],
    conv: impl Fn(u64) -> T,
) -> Option<()> {
    let n = out.len();
    match ty {
        PhysicalType::INT64 => {
            let b = data.get(..n.checked_mul(8)?)?;
            for (o, c) in out.iter_mut().zip(b.chunks_exact(8)) {
                *o = conv(u64::from_le_bytes(c.try_into().unwrap()));
            }
        }
        PhysicalType::INT32 => {
            let b = data.get(..n.checked_mul(4)?)?;
            for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                *o = conv(u32::from_le_bytes(c.try_into().unwrap()) as u64);
            }
        }
        _ => return None,
    }
    Some(())
}

fn plain_strings<T>(
    mut data: &[u8],
    code_of: &dyn Fn(&[u8]) -> u64,
    out: &mut [T],
    conv: impl Fn(u64) -> T,
) -> Option<()> {
    for o in out.iter_mut() {
        let len = u32::from_le_bytes(data.get(..4)?.try_into().ok()?) as usize;
        let s = data.get(4..4usize.checked_add(len)?)?;
        *o = conv(code_of(s));
        data = &data[4 + len..];
    }
    Some(())
}

fn byte_stream_split<T: Copy>(
    data: &[u8],
    ty: PhysicalType,
    out: &mut [T],
    conv: impl Fn(u64) -> T + Copy,
) -> Option<()> {
    let n = out.len();
    match ty {
        PhysicalType::INT64 => join_streams::<8, T>(data.get(..n.checked_mul(8)?)?, out, conv),
        PhysicalType::INT32 => join_streams::<4, T>(data.get(..n.checked_mul(4)?)?, out, conv),
        _ => return None,
    }
    Some(())
}

/// Value `i` is byte `i` of each of the `W` streams, least significant
/// first. One pass, reading all streams side by side, 16 values at a time.
#[inline(always)]
fn join_streams<const W: usize, T: Copy>(data: &[u8], dst: &mut [T], conv: impl Fn(u64) -> T) {
    let n = dst.len();
    let streams: [&[u8]; W] = std::array::from_fn(|k| &data[k * n..(k + 1) * n]);
    const CHUNK: usize = 16;
    let full = n / CHUNK * CHUNK;
    for base in (0..full).step_by(CHUNK) {
        let v = join_16(&streams, base);
        for (d, &x) in dst[base..base + CHUNK].iter_mut().zip(&v) {
            *d = conv(x);
        }
    }
    for (i, d) in dst.iter_mut().enumerate().skip(full) {
        let mut v = 0u64;
        for (k, stream) in streams.iter().enumerate() {
            v |= (stream[i] as u64) << (8 * k);
        }
        *d = conv(v);
    }
}

/// Values `base..base + 16` of [`join_streams`].
#[inline(always)]
fn join_16<const W: usize>(streams: &[&[u8]; W], base: usize) -> [u64; 16] {
    #[cfg(target_arch = "x86_64")]
    if let Ok(eight) = <&[&[u8]; 8]>::try_from(&streams[..]) {
        return transpose_8x16(eight, base);
    }
    let mut v = [0u64; 16];
    for (k, stream) in streams.iter().enumerate() {
        let s: &[u8; 16] = stream[base..base + 16].try_into().unwrap();
        for j in 0..16 {
            v[j] |= (s[j] as u64) << (8 * k);
        }
    }
    v
}

/// Values `base..base + 16` of eight byte streams: byte `k` of value `j`
/// is `streams[k][base + j]`. A transposition of a 8 x 16 byte matrix
/// in three rounds of SSE2 interleaves (bytes to 16-bit pairs, pairs to
/// 32-bit halves, halves to values), where joining byte by byte took a
/// shift and an or for each of the 8 bytes of every value.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn transpose_8x16(streams: &[&[u8]; 8], base: usize) -> [u64; 16] {
    use std::arch::x86_64::*;
    let rows: [&[u8; 16]; 8] =
        std::array::from_fn(|k| streams[k][base..base + 16].try_into().unwrap());
    let mut out = [0u64; 16];
    // SAFETY: SSE2 is part of x86_64; every load reads the 16 bytes of a
    // checked `&[u8; 16]`, every store writes 16 bytes inside `out`.
    unsafe {
        let b: [__m128i; 8] = std::array::from_fn(|k| _mm_loadu_si128(rows[k].as_ptr().cast()));
        // Bytes k and k + 1 of values 0..8 (lo) and 8..16 (hi), in 16 bits.
        let a0 = _mm_unpacklo_epi8(b[0], b[1]);
        let a1 = _mm_unpackhi_epi8(b[0], b[1]);
        let a2 = _mm_unpacklo_epi8(b[2], b[3]);
        let a3 = _mm_unpackhi_epi8(b[2], b[3]);
        let a4 = _mm_unpacklo_epi8(b[4], b[5]);
        let a5 = _mm_unpackhi_epi8(b[4], b[5]);
        let a6 = _mm_unpacklo_epi8(b[6], b[7]);
        let a7 = _mm_unpackhi_epi8(b[6], b[7]);
        // Bytes 0..4 (c) and 4..8 (d) of values 0..4, 4..8, 8..12, 12..16.
        let c = [
            _mm_unpacklo_epi16(a0, a2),
            _mm_unpackhi_epi16(a0, a2),
            _mm_unpacklo_epi16(a1, a3),
            _mm_unpackhi_epi16(a1, a3),
        ];
        let d = [
            _mm_unpacklo_epi16(a4, a6),
            _mm_unpackhi_epi16(a4, a6),
            _mm_unpacklo_epi16(a5, a7),
            _mm_unpackhi_epi16(a5, a7),
        ];
        let p = out.as_mut_ptr() as *mut __m128i;
        for q in 0..4 {
            _mm_storeu_si128(p.add(2 * q), _mm_unpacklo_epi32(c[q], d[q]));
            _mm_storeu_si128(p.add(2 * q + 1), _mm_unpackhi_epi32(c[q], d[q]));
        }
    }
    out
}

/// Reads an unsigned LEB128 integer.
fn uleb(data: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let (&b, rest) = data.split_first()?;
        *data = rest;
        if shift >= 64 {
            return None;
        }
        v |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
        shift += 7;
    }
}

fn zigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Unpacks `out.len()` little-endian bit-packed values of `width` bits
/// (at most 64) from the start of `src` into `out`, through `conv`.
/// `src` may go on past the packed values (the rest of the page): values
/// whose 16-byte window ends inside it are then read in place, so only
/// the last values of a page go through a padded copy, not every
/// miniblock.
#[inline(always)]
fn unpack<T: Copy>(src: &[u8], width: u32, out: &mut [T], conv: impl Fn(u64) -> T) -> Option<()> {
    let count = out.len();
    if width == 0 {
        out.fill(conv(0));
        return Some(());
    }
    let w = width as usize;
    let bytes = (count * w).div_ceil(8);
    src.get(..bytes)?;
    if width == 1 {
        // Definition levels: eight values a byte, no window to read.
        let mut chunks = out.chunks_exact_mut(8);
        for (o, &b) in (&mut chunks).zip(src) {
            for (j, v) in o.iter_mut().enumerate() {
                *v = conv(((b >> j) & 1) as u64);
            }
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let b = src[count / 8];
            for (j, v) in rest.iter_mut().enumerate() {
                *v = conv(((b >> j) & 1) as u64);
            }
        }
        return Some(());
    }
    let mask = if width == 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    };
    // Values whose 16-byte window lies inside `src` are read in place;
    // the rest from a zero-padded copy of what they need.
    let safe = if src.len() >= 16 {
        ((src.len() - 16) * 8 / w + 1).min(count)
    } else {
        0
    };
    let (head, tail_out) = out.split_at_mut(safe);
    unpack_head(src, w, mask, head, &conv);
    if tail_out.is_empty() {
        return Some(());
    }
    let from = safe * w / 8;
    let tail = &src[from..bytes];
    let mut pad = [0u8; 288];
    if tail.len() + 16 <= pad.len() {
        pad[..tail.len()].copy_from_slice(tail);
        unpack_from(&pad, w, mask, safe * w - from * 8, tail_out, &conv);
    } else {
        let mut big = tail.to_vec();
        big.resize(tail.len() + 16, 0);
        unpack_from(&big, w, mask, safe * w - from * 8, tail_out, &conv);
    }
    Some(())
}

/// [`unpack_from`] from bit 0: for widths 2 to 32 (1 never gets here), eight values at a
/// time with the width a constant, so that every offset and shift in a
/// group of eight is known when compiling (the general loop computes
/// them for each value); the rest through [`unpack_from`].
#[inline(always)]
fn unpack_head<T>(src: &[u8], w: usize, mask: u64, out: &mut [T], conv: &impl Fn(u64) -> T) {
    macro_rules! fixed {
        ($($n:literal)*) => {
            match w {
                $($n => unpack_fixed::<$n, T>(src, out, conv),)*
                _ => 0,
            }
        };
    }
    let done = fixed!(2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);
    unpack_from(src, w, mask, done * w, &mut out[done..], conv);
}

/// Unpacks the values of `out` in whole groups of eight, `W` bits each,
/// from bit 0 of `src`, which extends 16 bytes past the first byte of
/// each value; returns how many it unpacked.
#[inline(always)]
fn unpack_fixed<const W: usize, T>(src: &[u8], out: &mut [T], conv: &impl Fn(u64) -> T) -> usize {
    let mask = (1u64 << W) - 1;
    let mut groups = out.chunks_exact_mut(8);
    let mut base = 0;
    for o in &mut groups {
        // The last value of the group starts at byte 7 * W / 8, and its
        // 16-byte window covers these W + 8 bytes.
        let s = &src[base..base + W + 8];
        for (j, v) in o.iter_mut().enumerate() {
            let bit = j * W;
            let word = u64::from_le_bytes(s[bit / 8..bit / 8 + 8].try_into().unwrap());
            *v = conv((word >> (bit % 8)) & mask);
        }
        base += W;
    }
    out.len() / 8 * 8
}

/// Unpacks `out.len()` values of `w` bits starting at bit `first` of
/// `src`, which extends at least 16 bytes past the last value's first
/// byte.
#[inline(always)]
fn unpack_from<T>(
    src: &[u8],
    w: usize,
    mask: u64,
    first: usize,
    out: &mut [T],
    conv: impl Fn(u64) -> T,
) {
    if w <= 56 {
        for (i, o) in out.iter_mut().enumerate() {
            let bit = first + i * w;
            let word = u64::from_le_bytes(src[bit / 8..bit / 8 + 8].try_into().unwrap());
            *o = conv((word >> (bit % 8)) & mask);
        }
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            let bit = first + i * w;
            let word = u128::from_le_bytes(src[bit / 8..bit / 8 + 16].try_into().unwrap());
            *o = conv((word >> (bit % 8)) as u64 & mask);
        }
    }
}

/// Decodes `out.len()` values of the RLE/bit-packed hybrid encoding.
fn hybrid<T: Copy>(
    mut data: &[u8],
    width: u32,
    out: &mut [T],
    conv: impl Fn(u64) -> T,
) -> Option<()> {
    if width > 32 {
        return None;
    }
    let mut dst = out;
    while !dst.is_empty() {
        let header = uleb(&mut data)?;
        if header & 1 == 0 {
            let count = usize::try_from(header >> 1).ok()?;
            if count == 0 {
                return None;
            }
            let nb = (width as usize).div_ceil(8);
            let vb = data.get(..nb)?;
            let mut v = 0u64;
            for (k, &b) in vb.iter().enumerate() {
                v |= (b as u64) << (8 * k);
            }
            data = &data[nb..];
            let take = count.min(dst.len());
            let (run, rest) = dst.split_at_mut(take);
            run.fill(conv(v));
            dst = rest;
        } else {
            let groups = usize::try_from(header >> 1).ok()?;
            if groups == 0 {
                return None;
            }
            let count = groups.checked_mul(8)?;
            let nb = groups.checked_mul(width as usize)?;
            let take = count.min(dst.len());
            let (run, rest) = dst.split_at_mut(take);
            // The last run may stop short of its declared groups.
            unpack(data, width, run, &conv)?;
            data = &data[nb.min(data.len())..];
            dst = rest;
        }
    }
    Some(())
}

/// Decodes `out.len()` DELTA_BINARY_PACKED values (the page's count).
fn delta<T: Copy>(
    mut data: &[u8],
    ty: PhysicalType,
    out: &mut [T],
    conv: impl Fn(u64) -> T,
) -> Option<()> {
    let n = out.len();
    let block = usize::try_from(uleb(&mut data)?).ok()?;
    let minis = usize::try_from(uleb(&mut data)?).ok()?;
    let total = usize::try_from(uleb(&mut data)?).ok()?;
    let first = zigzag(uleb(&mut data)?);
    if total != n || minis == 0 || block == 0 || block % minis != 0 || block % 128 != 0 {
        return None;
    }
    let per_mini = block / minis;
    if per_mini % 32 != 0 || per_mini > 256 {
        return None;
    }
    // INT32 arithmetic wraps at 32 bits: keep the low half.
    let (max_width, keep) = match ty {
        PhysicalType::INT64 => (64, u64::MAX),
        PhysicalType::INT32 => (32, u32::MAX as u64),
        _ => return None,
    };
    if n == 0 {
        return Some(());
    }
    let mut last = first;
    out[0] = conv(last as u64 & keep);
    let mut at = 1;
    let mut deltas = [0u64; 256];
    while at < n {
        let min_delta = zigzag(uleb(&mut data)?);
        let widths = data.get(..minis)?;
        data = &data[minis..];
        for &w in widths {
            if at == n {
                break;
            }
            if w as u32 > max_width {
                return None;
            }
            let take = per_mini.min(n - at);
            let nb = per_mini * w as usize / 8;
            let d = &mut deltas[..take];
            // The rest of the page, not just this miniblock: unpack then
            // reads in place (see `unpack`). The minimum is added as the
            // deltas are unpacked, leaving one add per value in the
            // running sum.
            unpack(data, w as u32, d, |u| u.wrapping_add(min_delta as u64))?;
            for (o, &u) in out[at..at + take].iter_mut().zip(d.iter()) {
                last = last.wrapping_add(u as i64);
                *o = conv(last as u64 & keep);
            }
            data = &data[nb.min(data.len())..];
            at += take;
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpacks_every_width() {
        for width in 0..=64u32 {
            let vals: Vec<u64> = (0..77u64)
                .map(|i| {
                    let v = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    if width == 64 {
                        v
                    } else {
                        v & ((1u64 << width) - 1)
                    }
                })
                .collect();
            let mut bits = vec![0u8; (vals.len() * width as usize).div_ceil(8)];
            for (i, &v) in vals.iter().enumerate() {
                for b in 0..width as usize {
                    if v >> b & 1 == 1 {
                        let p = i * width as usize + b;
                        bits[p / 8] |= 1 << (p % 8);
                    }
                }
            }
            let mut got = vec![0u64; vals.len()];
            unpack(&bits, width, &mut got, |v| v).unwrap();
            assert_eq!(got, vals, "width {width}");
        }
    }

    #[test]
    fn joins_byte_streams() {
        for n in [0usize, 1, 15, 16, 17, 33, 70] {
            let vals: Vec<u64> = (0..n as u64)
                .map(|i| (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .collect();
            let mut data = vec![0u8; 8 * n];
            for (i, v) in vals.iter().enumerate() {
                for k in 0..8 {
                    data[k * n + i] = v.to_le_bytes()[k];
                }
            }
            let mut got = vec![0u64; n];
            join_streams::<8, u64>(&data, &mut got, |v| v);
            assert_eq!(got, vals, "{n} values of 8 bytes");
            let mut data4 = vec![0u8; 4 * n];
            for (i, v) in vals.iter().enumerate() {
                for k in 0..4 {
                    data4[k * n + i] = v.to_le_bytes()[k];
                }
            }
            let mut got4 = vec![0u32; n];
            join_streams::<4, u32>(&data4, &mut got4, |v| v as u32);
            let want4: Vec<u32> = vals.iter().map(|&v| v as u32).collect();
            assert_eq!(got4, want4, "{n} values of 4 bytes");
        }
    }

    #[test]
    fn hybrid_mixes_runs_and_packed_groups() {
        // RLE run of 5 x 3 (width 2), then one bit-packed group of 8.
        let data = [5 << 1, 3, (1 << 1) | 1, 0b1110_0100, 0b0001_1011];
        let mut out = [0u32; 13];
        hybrid(&data, 2, &mut out, |v| v as u32).unwrap();
        assert_eq!(out, [3, 3, 3, 3, 3, 0, 1, 2, 3, 3, 2, 1, 0]);
    }
}
