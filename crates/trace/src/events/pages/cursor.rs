//! A column chunk decoded a page at a time ([`Cursor`]).

use bytes::Bytes;
use parquet::basic::{Compression, Type as PhysicalType};
use parquet::file::metadata::ColumnChunkMetaData;

use super::page::{column_shape, sized, CursorBuffers, DataPage, Scratch, Spare, Values};
use super::source::{Chunk, OwnPages, PageSource};

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
    /// [`read_column`](super::read_column) would not decode or for a codec other than zstd.
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

    /// Takes its buffers from `spare` (what [`Cursor::give_back`] left
    /// there), so that they need not be grown and zeroed again.
    pub fn reuse(&mut self, spare: &mut CursorBuffers)
    where
        T: Spare,
    {
        if let Some(v) = T::spare(spare).pop() {
            // Kept at its length (values are written over, not pushed),
            // all of it consumed.
            self.vals = v;
            self.pos = self.vals.len();
        }
        self.dict = spare.dict();
    }

    /// Leaves its buffers in `spare`, for [`Cursor::reuse`].
    pub fn give_back(self, spare: &mut CursorBuffers)
    where
        T: Spare,
    {
        spare.keep(self.vals, self.dict);
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
    /// first), each value through `conv` as in [`read_column`](super::read_column), dropping
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
