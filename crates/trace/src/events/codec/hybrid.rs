//! The RLE/bit-packed hybrid encoding of Parquet: definition levels and
//! dictionary indices. Runs of one repeated value, or bit-packed groups
//! of eight values.

use super::bitpack::{pack_bits, unpack};
use super::varint::{put_uvarint, uleb};

/// Bits per dictionary index for `entries` entries (at least 1).
pub(crate) fn bit_width(entries: usize) -> u8 {
    let max = entries.saturating_sub(1) as u32;
    (32 - max.leading_zeros()).max(1) as u8
}

/// Appends one bit-packed run of the RLE/bit-packed hybrid encoding:
/// groups of eight values, `width` bits each, least significant first, the
/// last group padded with 0.
pub(crate) fn bit_packed_run(out: &mut Vec<u8>, values: &[u64], width: u8) {
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
pub(crate) fn def_levels(out: &mut Vec<u8>, levels: &[u8]) {
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

/// Decodes `out.len()` values of the RLE/bit-packed hybrid encoding.
pub(crate) fn hybrid<T: Copy>(
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
    fn long_run_header_is_a_varint() {
        let mut page = vec![1];
        bit_packed_run(&mut page, &[1u64; 8 * 200], 1);
        // 200 groups: (200 << 1) | 1 = 401 = 0b1_1001_0001.
        assert_eq!(&page[1..3], &[0x91, 0x03]);
        assert_eq!(page.len(), 3 + 200);
        assert!(page[3..].iter().all(|&b| b == 0xff));
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
    fn hybrid_mixes_runs_and_packed_groups() {
        // RLE run of 5 x 3 (width 2), then one bit-packed group of 8.
        let data = [5 << 1, 3, (1 << 1) | 1, 0b1110_0100, 0b0001_1011];
        let mut out = [0u32; 13];
        hybrid(&data, 2, &mut out, |v| v as u32).unwrap();
        assert_eq!(out, [3, 3, 3, 3, 3, 0, 1, 2, 3, 3, 2, 1, 0]);
    }

    #[test]
    fn levels_round_trip() {
        let patterns: Vec<Vec<u8>> = vec![
            vec![],
            vec![1],
            vec![0; 1000],
            vec![1, 0, 1, 1, 0, 0, 0, 1, 1],
            (0..1000).map(|i| u8::from(i % 3 == 0)).collect(),
            (0..1000)
                .map(|i| u8::from((i / 37) % 2 == 0 || i % 5 == 0))
                .collect(),
        ];
        for levels in patterns {
            let mut out = Vec::new();
            def_levels(&mut out, &levels);
            let len = u32::from_le_bytes(out[..4].try_into().unwrap()) as usize;
            assert_eq!(len, out.len() - 4, "the length prefix");
            let mut got = vec![9u8; levels.len()];
            hybrid(&out[4..], 1, &mut got, |v| v as u8).unwrap();
            assert_eq!(got, levels);
        }
    }

    #[test]
    fn bit_packed_runs_round_trip() {
        for entries in [1usize, 2, 3, 28, 255, 1 << 20] {
            let width = bit_width(entries);
            let values: Vec<u64> = (0..1001u64).map(|i| i * 7919 % entries as u64).collect();
            let mut out = Vec::new();
            bit_packed_run(&mut out, &values, width);
            let mut got = vec![0u32; values.len()];
            hybrid(&out, width as u32, &mut got, |v| v as u32).unwrap();
            assert!(
                got.iter().zip(&values).all(|(&g, &v)| g as u64 == v),
                "{entries} entries"
            );
        }
    }
}
