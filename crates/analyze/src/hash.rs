//! A tiny, fast hasher for integer keys.
//!
//! Replay does one or two hash-map operations per event, so SipHash (the
//! std default, built to resist hash flooding) would dominate the loop.
//! Addresses are not attacker-chosen here, so a folded 128-bit multiply is
//! enough: it spreads the entropy of the address (whose low 4 bits are
//! usually zero, as allocators align blocks) over all 64 output bits, which
//! matters because the table picks buckets from the low bits and tags from
//! the high ones.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// Mixes one 64-bit value into a well-spread hash.
#[inline(always)]
pub fn mix(x: u64) -> u64 {
    let m = (x as u128).wrapping_mul(K as u128);
    (m as u64) ^ ((m >> 64) as u64)
}

/// Hasher for integer keys; see the module docs.
#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    #[inline(always)]
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // For non-integer keys (strings, the fleet's stack keys): 8 bytes
        // at a time, the last ones padded with zeros.
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    #[inline(always)]
    fn write_u64(&mut self, x: u64) {
        self.0 = mix(self.0 ^ x);
    }

    #[inline(always)]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64);
    }

    #[inline(always)]
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

/// A `HashMap` keyed by integers, hashed with [`IntHasher`].
pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// An empty [`IntMap`].
pub fn int_map<K, V>() -> IntMap<K, V> {
    HashMap::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_addresses_spread_over_low_bits() {
        // 16-byte aligned addresses must still fill every low-bit bucket.
        let mut seen = [false; 64];
        for i in 0..4096u64 {
            seen[(mix(0x5555_0000_0000 + i * 16) & 63) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
