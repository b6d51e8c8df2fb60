//! Unsigned LEB128 varints and zigzag-encoded signed integers: the
//! integers of DELTA_BINARY_PACKED headers, of RLE/bit-packed run headers
//! and of Thrift compact page headers.

pub(crate) fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_zigzag(out: &mut Vec<u8>, v: i64) {
    put_uvarint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Reads an unsigned LEB128 integer.
pub(crate) fn uleb(data: &mut &[u8]) -> Option<u64> {
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

pub(crate) fn zigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip() {
        for v in [
            0,
            1,
            0x7f,
            0x80,
            0x3fff,
            0x4000,
            u32::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_uvarint(&mut out, v);
            let mut data = &out[..];
            assert_eq!(uleb(&mut data), Some(v), "{v:#x}");
            assert!(data.is_empty(), "{v:#x}: all bytes read");
        }
        // Cut short, or longer than 64 bits: refused.
        assert_eq!(uleb(&mut &[0x80u8][..]), None);
        assert_eq!(uleb(&mut &[0xffu8; 11][..]), None);
    }

    #[test]
    fn zigzags_round_trip() {
        for v in [0, 1, -1, 63, -64, 64, i32::MIN as i64, i64::MAX, i64::MIN] {
            let mut out = Vec::new();
            put_zigzag(&mut out, v);
            assert_eq!(uleb(&mut &out[..]).map(zigzag), Some(v), "{v}");
        }
        let mut out = Vec::new();
        put_zigzag(&mut out, -1);
        assert_eq!(out, [1], "-1 is 1 in zigzag");
    }
}
