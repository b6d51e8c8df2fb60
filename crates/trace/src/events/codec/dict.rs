//! RLE_DICTIONARY: a dictionary page of the column chunk's distinct
//! values (PLAIN), then data pages of their indices, each a byte of bit
//! width and the indices in the RLE/bit-packed hybrid.

use super::hybrid::{bit_packed_run, hybrid};

/// A dictionary of u64 values for one column chunk: entries in order of
/// first appearance. The table's slots carry the generation of the chunk
/// that filled them, so starting a chunk clears nothing.
#[derive(Default)]
pub(crate) struct U64Dict {
    /// (value, entry, generation).
    slots: Vec<(u64, u32, u32)>,
    pub(crate) entries: Vec<u64>,
    generation: u32,
    shift: u32,
}

impl U64Dict {
    /// Starts a chunk of up to `rows` values.
    pub(crate) fn start(&mut self, rows: usize) {
        let want = (rows.max(8) * 2).next_power_of_two();
        if self.slots.len() < want || self.generation == u32::MAX {
            self.slots = vec![(0, 0, 0); want];
            self.shift = 64 - want.trailing_zeros();
            self.generation = 0;
        }
        self.generation += 1;
        self.entries.clear();
    }

    /// The entry of `v`, added if new.
    #[inline]
    pub(crate) fn index(&mut self, v: u64) -> u32 {
        let mask = self.slots.len() - 1;
        let mut i = (v.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize;
        loop {
            let slot = &mut self.slots[i];
            if slot.2 != self.generation {
                let entry = self.entries.len() as u32;
                *slot = (v, entry, self.generation);
                self.entries.push(v);
                return entry;
            }
            if slot.0 == v {
                return slot.1;
            }
            i = (i + 1) & mask;
        }
    }
}

/// Appends the body of a data page of dictionary indices: their bit
/// width, then one bit-packed run (none in a page of nulls only).
pub(crate) fn put_indices(out: &mut Vec<u8>, width: u8, indices: &[u64]) {
    out.push(width);
    if !indices.is_empty() {
        bit_packed_run(out, indices, width);
    }
}

/// Decodes `out.len()` values of an RLE_DICTIONARY (or PLAIN_DICTIONARY)
/// page body: each index looked up in `dict`, through `conv`. `idx` is
/// scratch space for `out.len()` indices. `None` for an index past the
/// dictionary.
#[inline(always)]
pub(crate) fn lookup<T: Copy>(
    values: &[u8],
    dict: &[u64],
    idx: &mut [u32],
    out: &mut [T],
    conv: impl Fn(u64) -> T,
) -> Option<()> {
    let (&width, rest) = match values.split_first() {
        Some(x) => x,
        None if out.is_empty() => return Some(()),
        None => return None,
    };
    hybrid(rest, width as u32, idx, |v| v as u32)?;
    let max = idx.iter().fold(0, |m, &i| m.max(i));
    if !out.is_empty() && max as usize >= dict.len() {
        return None;
    }
    for (o, &i) in out.iter_mut().zip(idx.iter()) {
        *o = conv(dict[i as usize]);
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::codec::hybrid::bit_width;

    #[test]
    fn dictionary_entries_in_order_of_first_appearance() {
        let mut d = U64Dict::default();
        for round in 0..3 {
            d.start(100);
            let got: Vec<u32> = [7, 9, 7, u64::MAX, 0, 9, round]
                .iter()
                .map(|&v| d.index(v))
                .collect();
            assert_eq!(&got[..6], &[0, 1, 0, 2, 3, 1], "round {round}");
            // 0 is there already; 1 and 2 are new in their round.
            assert_eq!(got[6], if round == 0 { 3 } else { 4 }, "round {round}");
        }
        // Many values: every one gets its own entry, and again the same.
        d.start(100_000);
        for v in 0..100_000u64 {
            assert_eq!(d.index(v * 4096), v as u32);
        }
        for v in 0..100_000u64 {
            assert_eq!(d.index(v * 4096), v as u32);
        }
    }

    #[test]
    fn indices_round_trip() {
        let values: Vec<u64> = (0..5000u64).map(|i| (i * i) % 613 * 4096).collect();
        let mut d = U64Dict::default();
        d.start(values.len());
        let indices: Vec<u64> = values.iter().map(|&v| d.index(v) as u64).collect();
        let width = bit_width(d.entries.len());
        let mut page = Vec::new();
        put_indices(&mut page, width, &indices);
        let mut idx = vec![0u32; values.len()];
        let mut got = vec![0u64; values.len()];
        lookup(&page, &d.entries, &mut idx, &mut got, |v| v).unwrap();
        assert_eq!(got, values);
        // The last entry is used: without it, an index is past the end.
        let short = &d.entries[..d.entries.len() - 1];
        assert!(lookup(&page, short, &mut idx, &mut got, |v| v).is_none());
    }
}
