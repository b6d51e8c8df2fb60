//! DELTA_BINARY_PACKED: a first value, then blocks of deltas, each block
//! its minimum delta and miniblocks bit-packed at their own width. The
//! encoder writes Parquet's own layout (128-value blocks of four
//! miniblocks); the decoder reads any block and miniblock size the format
//! allows.

use parquet::basic::Type as PhysicalType;

use super::bitpack::{pack_bits, unpack};
use super::varint::{put_uvarint, put_zigzag, uleb, zigzag};

/// Values per block and miniblocks per block of DELTA_BINARY_PACKED pages
/// (those of the Parquet writer's settings: 32-value miniblocks keep an
/// occasional long gap between times from widening many neighbours).
const DELTA_BLOCK: usize = 128;
const DELTA_MINIBLOCKS: usize = 4;
const DELTA_MINIBLOCK: usize = DELTA_BLOCK / DELTA_MINIBLOCKS;

/// A DELTA_BINARY_PACKED page body of `values` (the physical type's bits;
/// `int32`: 32-bit arithmetic, which wraps as readers do).
pub(crate) fn delta_page(out: &mut Vec<u8>, values: &[i64], int32: bool) {
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

/// Decodes `out.len()` DELTA_BINARY_PACKED values (the page's count).
pub(crate) fn delta<T: Copy>(
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
    fn pages_round_trip() {
        let times: Vec<i64> = (0..1000i64)
            .map(|i| 1_000_000 + i * 37 + (i % 7) * 1000)
            .collect();
        let wide: Vec<i64> = (0..300i64)
            .map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64)
            .collect();
        for (values, what) in [
            (vec![], "empty"),
            (vec![42], "one value"),
            (vec![5; 129], "a constant"),
            (times, "times"),
            (wide, "64-bit wrapping deltas"),
        ] {
            let mut page = Vec::new();
            delta_page(&mut page, &values, false);
            let mut got = vec![0u64; values.len()];
            delta(&page, PhysicalType::INT64, &mut got, |v| v).unwrap();
            let want: Vec<u64> = values.iter().map(|&v| v as u64).collect();
            assert_eq!(got, want, "{what}");
        }
        // INT32 arithmetic wraps at 32 bits, as readers do.
        let pids: Vec<i64> = [7u32, u32::MAX, 0, 1 << 31, 12, 12, 12]
            .iter()
            .map(|&v| v as i32 as i64)
            .collect();
        let mut page = Vec::new();
        delta_page(&mut page, &pids, true);
        let mut got = vec![0u32; pids.len()];
        delta(&page, PhysicalType::INT32, &mut got, |v| v as u32).unwrap();
        assert_eq!(got, [7, u32::MAX, 0, 1 << 31, 12, 12, 12]);
    }
}
