//! The table of outstanding blocks of one process in one partition.
//!
//! Replay is bound by memory latency: each event looks up a block in a
//! table far larger than the caches. A general-purpose hash map cannot say
//! where a key will be probed before probing it, so this is a small
//! open-addressing table (linear probing, backward-shift deletion, no
//! tombstones) whose home slot of an address is known in advance: replay
//! prefetches the slots of the events a few rows ahead, and the misses of
//! consecutive events overlap instead of queueing.

use crate::hash::mix;
use crate::replay::Block;

/// One slot: 32 bytes, two per cache line. Address 0 marks an empty slot
/// (no block lives at address 0; replay never inserts it).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
struct Slot {
    addr: u64,
    size: u64,
    ts: u64,
    stack: u64,
}

/// Outstanding blocks by address.
#[derive(Debug, Clone)]
pub struct BlockTable {
    slots: Box<[Slot]>,
    /// `64 - log2(slots.len())`: the home slot is the top bits of the hash.
    shift: u32,
    len: usize,
}

const MIN_SLOTS: usize = 256;

impl Default for BlockTable {
    fn default() -> Self {
        Self::with_slots(MIN_SLOTS)
    }
}

impl BlockTable {
    fn with_slots(n: usize) -> Self {
        debug_assert!(n.is_power_of_two());
        BlockTable {
            slots: vec![Slot::default(); n].into_boxed_slice(),
            shift: 64 - n.trailing_zeros(),
            len: 0,
        }
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline(always)]
    fn home(&self, addr: u64) -> usize {
        (mix(addr) >> self.shift) as usize
    }

    /// Hints the CPU to fetch the home slot of `addr`.
    #[inline(always)]
    pub fn prefetch(&self, addr: u64) {
        self.prefetch_hash(mix(addr));
    }

    /// Hints the CPU to fetch the home slot of the address whose
    /// [`mix`] is `h`.
    #[inline(always)]
    pub fn prefetch_hash(&self, h: u64) {
        let i = (h >> self.shift) as usize;
        prefetch(self.slots.as_ptr().wrapping_add(i) as *const u8);
    }

    /// Inserts or replaces the block at `addr` (non-zero); returns the
    /// replaced block.
    #[inline]
    pub fn insert(&mut self, addr: u64, b: Block) -> Option<Block> {
        debug_assert!(addr != 0);
        // Grow at quarter load. Probing and backward-shift deletion branch
        // on whether each next slot is free, and those branches mispredict
        // about as often as a slot is taken: at half load replay spent a
        // third more CPU per event (docs/benchmarks.md). Slots are 32
        // bytes; 4 to 8 per block.
        if (self.len + 1) * 4 > self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(addr);
        loop {
            let s = &mut self.slots[i];
            if s.addr == addr {
                let old = Block {
                    size: s.size,
                    ts: s.ts,
                    stack: s.stack,
                };
                *s = Slot {
                    addr,
                    size: b.size,
                    ts: b.ts,
                    stack: b.stack,
                };
                return Some(old);
            }
            if s.addr == 0 {
                *s = Slot {
                    addr,
                    size: b.size,
                    ts: b.ts,
                    stack: b.stack,
                };
                self.len += 1;
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes and returns the block at `addr`.
    #[inline]
    pub fn remove(&mut self, addr: u64) -> Option<Block> {
        if addr == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(addr);
        loop {
            let s = self.slots[i];
            if s.addr == addr {
                break;
            }
            if s.addr == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
        let removed = self.slots[i];
        // Backward-shift deletion: pull later entries of the probe run into
        // the hole when their home is not between the hole and them.
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s.addr == 0 {
                break;
            }
            let home = self.home(s.addr);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = Slot::default();
        self.len -= 1;
        Some(Block {
            size: removed.size,
            ts: removed.ts,
            stack: removed.stack,
        })
    }

    /// The block at `addr`.
    pub fn get(&self, addr: u64) -> Option<Block> {
        if addr == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(addr);
        loop {
            let s = self.slots[i];
            if s.addr == addr {
                return Some(Block {
                    size: s.size,
                    ts: s.ts,
                    stack: s.stack,
                });
            }
            if s.addr == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    #[cold]
    fn grow(&mut self) {
        let old = std::mem::replace(self, Self::with_slots(self.slots.len() * 2));
        for s in old.slots.iter().filter(|s| s.addr != 0) {
            let mask = self.slots.len() - 1;
            let mut i = self.home(s.addr);
            while self.slots[i].addr != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = *s;
        }
        self.len = old.len;
    }

    /// Every block, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        self.slots.iter().filter(|s| s.addr != 0).map(|s| {
            (
                s.addr,
                Block {
                    size: s.size,
                    ts: s.ts,
                    stack: s.stack,
                },
            )
        })
    }

    /// Total bytes of the blocks.
    pub fn bytes(&self) -> u64 {
        self.slots.iter().map(|s| s.size).sum()
    }
}

/// Prefetches the cache line at `p` into all cache levels; a no-op where
/// no stable intrinsic exists.
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint; it never faults, even on a bad address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn blk(n: u64) -> Block {
        Block {
            size: n,
            ts: n * 10,
            stack: n % 7,
        }
    }

    #[test]
    fn matches_a_hash_map_under_churn() {
        let mut t = BlockTable::default();
        let mut m: HashMap<u64, Block> = HashMap::new();
        let mut x = 0x1234_5678_9abc_def1u64;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct addresses, so runs collide, wrap and shift back.
            let addr = 0x1000 + (x % 5000) * 16;
            if x.is_multiple_of(3) {
                assert_eq!(t.remove(addr), m.remove(&addr), "step {step}");
            } else {
                assert_eq!(
                    t.insert(addr, blk(step)),
                    m.insert(addr, blk(step)),
                    "step {step}"
                );
            }
            assert_eq!(t.len(), m.len());
        }
        for (&a, b) in &m {
            assert_eq!(t.get(a), Some(*b));
        }
        assert_eq!(t.iter().count(), m.len());
        assert_eq!(t.bytes(), m.values().map(|b| b.size).sum::<u64>());
        assert_eq!(t.remove(0), None);
    }
}
