//! Little-endian bit packing, `width` bits a value, least significant
//! first: the body of bit-packed runs and of DELTA_BINARY_PACKED
//! miniblocks.

/// Packs `values` into `dst`, `width` (1 to 64) bits each, least
/// significant first; `dst` holds whole bytes for a multiple of eight
/// values, the missing ones taken as 0.
pub(crate) fn pack_bits(dst: &mut [u8], values: &[u64], width: u32) {
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

/// Unpacks `out.len()` little-endian bit-packed values of `width` bits
/// (at most 64) from the start of `src` into `out`, through `conv`.
/// `src` may go on past the packed values (the rest of the page): values
/// whose 16-byte window ends inside it are then read in place, so only
/// the last values of a page go through a padded copy, not every
/// miniblock.
#[inline(always)]
pub(crate) fn unpack<T: Copy>(
    src: &[u8],
    width: u32,
    out: &mut [T],
    conv: impl Fn(u64) -> T,
) -> Option<()> {
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
    fn packed_values_unpack() {
        for width in 1..=64u32 {
            let mask = if width == 64 {
                u64::MAX
            } else {
                (1 << width) - 1
            };
            for n in [1usize, 7, 8, 9, 77] {
                let vals: Vec<u64> = (0..n as u64)
                    .map(|i| (i + 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) & mask)
                    .collect();
                let mut packed = vec![0u8; (n.div_ceil(8) * 8 * width as usize) / 8];
                pack_bits(&mut packed, &vals, width);
                let mut got = vec![0u64; n];
                unpack(&packed, width, &mut got, |v| v).unwrap();
                assert_eq!(got, vals, "{n} values of width {width}");
            }
        }
    }
}
