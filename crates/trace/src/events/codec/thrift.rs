//! Parquet's page headers, in the Thrift compact protocol: written for
//! the pages memleak encodes (with their CRC-32), read for the pages it
//! decodes (the fields it uses; the rest is skipped).

use parquet::basic::Encoding;
use parquet::errors::{ParquetError, Result};

use super::varint::{put_zigzag, uleb, zigzag};

/// Parquet's page types: the codes of the Thrift `PageType` enum.
pub(crate) const PAGE_DATA: i32 = 0;
pub(crate) const PAGE_INDEX: i32 = 1;
pub(crate) const PAGE_DICTIONARY: i32 = 2;
pub(crate) const PAGE_DATA_V2: i32 = 3;

/// The fields of a Parquet `PageHeader` this module reads.
#[derive(Default)]
pub(crate) struct PageHeader {
    pub(crate) page_type: i32,
    pub(crate) uncompressed: i32,
    pub(crate) compressed: i32,
    pub(crate) num_values: i32,
    pub(crate) encoding: i32,
    /// v1 data pages.
    pub(crate) def_level_encoding: i32,
    /// v2 data pages.
    pub(crate) def_levels_len: i32,
    pub(crate) rep_levels_len: i32,
    pub(crate) v2_compressed: bool,
    /// CRC-32 of the page's bytes as stored, when the writer gave one.
    pub(crate) crc: Option<u32>,
}

impl PageHeader {
    pub(crate) fn read(c: &mut Compact<'_>) -> Option<PageHeader> {
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
pub(crate) fn encoding_of(code: i32) -> Option<Encoding> {
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
pub(crate) struct Compact<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) at: usize,
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

/// Writes the Thrift (compact protocol) `PageHeader` of a version 1 data
/// page or a dictionary page (`dictionary`) of `values` values in
/// `encoding`, `uncompressed` bytes before compression and `data` on
/// disk, with the
/// CRC-32 of `data` that Parquet's format defines: Parquet's own page
/// writer leaves it out, and it is what lets a reader tell a flipped bit
/// in a page from a different value.
pub(crate) fn page_header(
    out: &mut Vec<u8>,
    dictionary: bool,
    values: usize,
    encoding: Encoding,
    uncompressed: usize,
    data: &[u8],
) -> Result<()> {
    let size = |n: usize| {
        i32::try_from(n).map_err(|_| ParquetError::General(format!("page of {n} bytes")))
    };
    let field = |out: &mut Vec<u8>, delta: u8, ty: u8| out.push(delta << 4 | ty);
    let int = |out: &mut Vec<u8>, v: i64| put_zigzag(out, v);
    field(out, 1, I32);
    int(
        out,
        if dictionary {
            PAGE_DICTIONARY
        } else {
            PAGE_DATA
        }
        .into(),
    );
    field(out, 1, I32);
    int(out, size(uncompressed)? as i64);
    field(out, 1, I32);
    int(out, size(data.len())? as i64);
    field(out, 1, I32);
    int(out, crc32fast::hash(data) as i32 as i64);
    let values = size(values)? as i64;
    let encoding = encoding_code(encoding)?;
    if dictionary {
        field(out, 3, STRUCT); // field 7: dictionary_page_header
        field(out, 1, I32);
        int(out, values);
        field(out, 1, I32);
        int(out, encoding);
        field(out, 1, FALSE); // is_sorted
    } else {
        field(out, 1, STRUCT); // field 5: data_page_header
        field(out, 1, I32);
        int(out, values);
        field(out, 1, I32);
        int(out, encoding);
        let rle = encoding_code(Encoding::RLE)?;
        field(out, 1, I32); // definition levels
        int(out, rle);
        field(out, 1, I32); // repetition levels
        int(out, rle);
    }
    out.push(0); // end of the inner struct
    out.push(0); // end of PageHeader
    Ok(())
}

/// The Thrift code of an encoding this module writes.
fn encoding_code(e: Encoding) -> Result<i64> {
    Ok(match e {
        Encoding::PLAIN => 0,
        Encoding::RLE => 3,
        Encoding::DELTA_BINARY_PACKED => 5,
        Encoding::RLE_DICTIONARY => 8,
        Encoding::BYTE_STREAM_SPLIT => 9,
        other => return Err(ParquetError::NYI(format!("page header for {other}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_headers_round_trip() {
        let data = b"the bytes of a page";
        for (dictionary, encoding) in [
            (true, Encoding::PLAIN),
            (false, Encoding::PLAIN),
            (false, Encoding::RLE_DICTIONARY),
            (false, Encoding::DELTA_BINARY_PACKED),
            (false, Encoding::BYTE_STREAM_SPLIT),
        ] {
            let mut out = Vec::new();
            page_header(&mut out, dictionary, 65536, encoding, 300_000, data).unwrap();
            out.extend_from_slice(b"next");
            let mut c = Compact { data: &out, at: 0 };
            let h = PageHeader::read(&mut c).unwrap();
            assert_eq!(&out[c.at..], b"next", "the header ends where it says");
            let page_type = if dictionary {
                PAGE_DICTIONARY
            } else {
                PAGE_DATA
            };
            assert_eq!(h.page_type, page_type);
            assert_eq!(h.uncompressed, 300_000);
            assert_eq!(h.compressed, data.len() as i32);
            assert_eq!(h.num_values, 65536);
            assert_eq!(encoding_of(h.encoding), Some(encoding));
            assert_eq!(h.crc, Some(crc32fast::hash(data)));
            assert_eq!(encoding_of(h.def_level_encoding), Some(Encoding::RLE));
        }
        let mut out = Vec::new();
        let other = page_header(&mut out, false, 1, Encoding::DELTA_BYTE_ARRAY, 1, data);
        assert!(other.is_err(), "an encoding memleak does not write");
    }
}
