//! A whole column chunk decoded at once ([`read_column`]).

use std::sync::Arc;

use parquet::basic::{Compression, Type as PhysicalType};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::serialized_reader::SerializedPageReader;

use super::page::{column_shape, DataPage, Scratch, Values};
use super::source::{Chunk, OwnPages, PageSource, ParquetPages};

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
