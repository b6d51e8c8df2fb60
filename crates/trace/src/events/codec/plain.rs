//! PLAIN: integers little-endian at their physical width, strings each
//! after its u32 length. memleak writes it for dictionary pages (of u64
//! values, and of the kinds' names); the decoder reads INT32, INT64 and
//! BYTE_ARRAY pages and dictionaries.

use parquet::basic::Type as PhysicalType;

/// Appends `values` as a PLAIN INT64 page body.
pub(crate) fn put_plain(out: &mut Vec<u8>, values: &[u64]) {
    out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
}

/// Appends `strings` as a PLAIN BYTE_ARRAY page body.
pub(crate) fn put_plain_strings(out: &mut Vec<u8>, strings: &[&str]) {
    for s in strings {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
}

pub(crate) fn plain<T: Copy>(
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

pub(crate) fn plain_strings<T>(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_round_trip() {
        let vals = [0u64, 1, 0x1234_5678_9abc_def0, u64::MAX];
        let mut out = Vec::new();
        put_plain(&mut out, &vals);
        assert_eq!(out.len(), 32);
        let mut got = [0u64; 4];
        plain(&out, PhysicalType::INT64, &mut got, |v| v).unwrap();
        assert_eq!(got, vals);
        // Too short for the values asked for.
        assert!(plain(&out[..31], PhysicalType::INT64, &mut got, |v| v).is_none());
    }

    #[test]
    fn strings_round_trip() {
        let names = ["malloc", "", "free", "aligned_alloc"];
        let mut out = Vec::new();
        put_plain_strings(&mut out, &names);
        let code = |s: &[u8]| names.iter().position(|n| n.as_bytes() == s).unwrap() as u64;
        let mut got = [9u64; 4];
        plain_strings(&out, &code, &mut got, |v| v).unwrap();
        assert_eq!(got, [0, 1, 2, 3]);
        assert!(plain_strings(&out[..out.len() - 1], &code, &mut got, |v| v).is_none());
    }
}
