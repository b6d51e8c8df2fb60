//! One page decoded: what a column's values become ([`Values`]), whether
//! its shape is one this decoder reads, a data page split into its
//! definition levels and values ([`DataPage`]), and the values decoded
//! by encoding, nulls written as 0.

use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::file::metadata::ColumnChunkMetaData;

use super::source::RawPage;
use crate::events::codec::delta::delta;
use crate::events::codec::dict::lookup;
use crate::events::codec::hybrid::hybrid;
use crate::events::codec::plain::{plain, plain_strings};
use crate::events::codec::split::byte_stream_split;

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
    pub(super) levels: Vec<u8>,
    pub(super) idx: Vec<u32>,
    pub(super) vals: Vec<u64>,
    pub(super) dict: Vec<u64>,
    /// A decompressed page.
    pub(super) page: Vec<u8>,
    /// The thread's zstd decompression context.
    pub(super) zstd: Option<zstd::bulk::Decompressor<'static>>,
    /// Value and dictionary buffers of the [`Cursor`](super::Cursor)s of
    /// row groups streamed before, for the next ones.
    pub cursors: CursorBuffers,
}

/// Buffers of spent [`Cursor`](super::Cursor)s, by value type. A fresh
/// cursor's page of values (64 Ki rows) was zeroed and faulted in anew for
/// every row group.
#[derive(Default)]
pub struct CursorBuffers {
    u64s: Vec<Vec<u64>>,
    u32s: Vec<Vec<u32>>,
    u8s: Vec<Vec<u8>>,
    dicts: Vec<Vec<u64>>,
}

/// The value types a [`Cursor`](super::Cursor) decodes into, and where
/// [`CursorBuffers`] keeps their buffers.
pub trait Spare: Sized {
    /// The spare buffers of this type.
    fn spare(b: &mut CursorBuffers) -> &mut Vec<Vec<Self>>;
}

impl Spare for u64 {
    fn spare(b: &mut CursorBuffers) -> &mut Vec<Vec<Self>> {
        &mut b.u64s
    }
}

impl Spare for u32 {
    fn spare(b: &mut CursorBuffers) -> &mut Vec<Vec<Self>> {
        &mut b.u32s
    }
}

impl Spare for u8 {
    fn spare(b: &mut CursorBuffers) -> &mut Vec<Vec<Self>> {
        &mut b.u8s
    }
}

impl CursorBuffers {
    /// A spare dictionary buffer.
    pub(super) fn dict(&mut self) -> Vec<u64> {
        self.dicts.pop().unwrap_or_default()
    }

    /// Keeps a spent cursor's buffers.
    pub(super) fn keep<T: Spare>(&mut self, vals: Vec<T>, dict: Vec<u64>) {
        T::spare(self).push(vals);
        self.dicts.push(dict);
    }
}

/// The first `n` elements of `v`, grown if needed but not cleared: every
/// user overwrites them, so recycled buffers are not zeroed again.
pub(super) fn sized<T: Copy + Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// Whether the column is nullable, and its physical type; `None` if it
/// is not a flat column of a type `kind` reads.
pub(super) fn column_shape(
    meta: &ColumnChunkMetaData,
    kind: Values,
) -> Option<(bool, PhysicalType)> {
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

/// A data page, split into its parts.
pub(super) struct DataPage<'a> {
    /// Rows (values and nulls).
    pub(super) n: usize,
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
    pub(super) fn of(
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
    pub(super) fn decode<T: Copy>(
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
            let idx = sized(&mut scratch.idx, out.len());
            lookup(values, dict, idx, out, conv)
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
