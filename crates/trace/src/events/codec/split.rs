//! BYTE_STREAM_SPLIT: byte k of every value, then byte k + 1 of every
//! value, so that zstd sees the skewed low bytes of sizes together.

use parquet::basic::Type as PhysicalType;

/// A BYTE_STREAM_SPLIT page body: byte k of every value, for k = 0..8.
pub(crate) fn split_streams(out: &mut Vec<u8>, values: &[u64]) {
    let n = values.len();
    let start = out.len();
    out.resize(start + n * 8, 0);
    let out = &mut out[start..];
    for (i, v) in values.iter().enumerate() {
        for (k, b) in v.to_le_bytes().into_iter().enumerate() {
            out[k * n + i] = b;
        }
    }
}

pub(crate) fn byte_stream_split<T: Copy>(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_streams_split() {
        let mut out = vec![];
        split_streams(&mut out, &[0x0807_0605_0403_0201, 0x1817_1615_1413_1211]);
        assert_eq!(
            out,
            [1, 0x11, 2, 0x12, 3, 0x13, 4, 0x14, 5, 0x15, 6, 0x16, 7, 0x17, 8, 0x18]
        );
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
    fn split_streams_join() {
        for n in [0usize, 1, 15, 16, 17, 1000] {
            let vals: Vec<u64> = (0..n as u64).map(|i| i * i * 4099 + (i << 40)).collect();
            let mut out = Vec::new();
            split_streams(&mut out, &vals);
            let mut got = vec![0u64; n];
            byte_stream_split(&out, PhysicalType::INT64, &mut got, |v| v).unwrap();
            assert_eq!(got, vals, "{n} values");
        }
    }
}
