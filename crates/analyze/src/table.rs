//! The table of outstanding blocks of one process in one partition, and
//! the [`Block`] it holds.
//!
//! Replay is bound by memory latency: each event looks up a block in a
//! table far larger than the caches. A general-purpose hash map cannot say
//! where a key will be probed before probing it, so this is a small
//! open-addressing table (linear probing) whose home slot of an address
//! is known in advance: replay prefetches the slots of the events a few
//! rows ahead, and the misses of consecutive events overlap instead of
//! queueing.
//!
//! A free leaves a tombstone that keeps the address: freeing is one store
//! to a slot already in cache, and allocators hand a freed address out
//! again soon, so the next allocation of it usually finds its own
//! tombstone at its home slot and stops there. (Backward-shift deletion,
//! which this replaced, read the next slot and branched on it at every
//! free.) The first slot holding an address, live or tombstone, along its
//! probe sequence decides whether it is outstanding: insertion puts an
//! address at its first tombstone or before any of them, so a live entry
//! never hides behind a tombstone of the same address. Tombstones are
//! cleared when the table is rebuilt, which happens when live entries and
//! tombstones together fill a quarter of the slots (half, in tables past
//! 16 MiB).

use crate::hash::{int_map, mix, IntMap};

/// An outstanding heap block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Bytes requested.
    pub size: u64,
    /// When it was allocated.
    pub ts: u64,
    /// Stack of the allocation (0: unknown).
    pub stack: u64,
}

/// One slot: 32 bytes, two per cache line. Address 0 marks an empty slot
/// (no block lives at address 0; replay never inserts it); [`TOMB`] in
/// `size` a freed one.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
struct Slot {
    addr: u64,
    size: u64,
    ts: u64,
    stack: u64,
}

/// Set in a slot's `size` once its block is freed. Blocks whose size has
/// this bit (no allocator hands out 8 EiB; only a corrupt trace says so)
/// live in [`BlockTable::huge`] instead.
const TOMB: u64 = 1 << 63;

impl Slot {
    #[inline(always)]
    fn block(&self) -> Block {
        Block {
            size: self.size,
            ts: self.ts,
            stack: self.stack,
        }
    }

    #[inline(always)]
    fn live(&self) -> bool {
        self.addr != 0 && self.size & TOMB == 0
    }
}

/// Outstanding blocks by address.
#[derive(Debug, Clone)]
pub struct BlockTable {
    slots: Box<[Slot]>,
    /// `64 - log2(slots.len())`: the home slot is the top bits of the hash.
    shift: u32,
    /// Live slots.
    len: usize,
    /// Tombstones.
    tombs: usize,
    /// Blocks whose size has the [`TOMB`] bit set.
    huge: IntMap<u64, Block>,
}

const MIN_SLOTS: usize = 256;
/// Slots (32 bytes each) above which a table is kept half full instead
/// of a quarter: 16 MiB.
const BIG: usize = 1 << 19;

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
            tombs: 0,
            huge: int_map(),
        }
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.len + self.huge.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The home slot of the address whose [`mix`] is `h`.
    #[inline(always)]
    fn home(&self, h: u64) -> usize {
        (h >> self.shift) as usize
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

    /// The first slot along `addr`'s probe sequence that holds `addr`
    /// (live or tombstone) or is empty.
    #[inline(always)]
    fn find(&self, addr: u64, h: u64) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = self.home(h);
        loop {
            let a = self.slots[i].addr;
            if a == addr || a == 0 {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// Inserts or replaces the block at `addr` (non-zero); returns the
    /// replaced block. Always inlined: replay passed the block through
    /// memory and got the replaced one back the same way.
    #[inline(always)]
    pub fn insert(&mut self, addr: u64, b: Block) -> Option<Block> {
        self.insert_hashed(addr, mix(addr), b)
    }

    /// [`BlockTable::insert`] with `h` = [`mix`]`(addr)` already known.
    #[inline(always)]
    pub fn insert_hashed(&mut self, addr: u64, h: u64, b: Block) -> Option<Block> {
        debug_assert!(addr != 0 && h == mix(addr));
        if b.size & TOMB != 0 || !self.huge.is_empty() {
            return self.insert_cold(addr, b);
        }
        if (self.len + self.tombs + 1) * self.sparsity() > self.slots.len() {
            self.rebuild();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(h);
        let mut first_tomb = usize::MAX;
        let new = Slot {
            addr,
            size: b.size,
            ts: b.ts,
            stack: b.stack,
        };
        loop {
            let s = &mut self.slots[i];
            if s.addr == addr {
                // Its own slot: replace it (a missed free) or revive it.
                let old = *s;
                *s = new;
                if old.size & TOMB == 0 {
                    return Some(old.block());
                }
                self.tombs -= 1;
                self.len += 1;
                return None;
            }
            if s.addr == 0 {
                if first_tomb != usize::MAX {
                    self.slots[first_tomb] = new;
                    self.tombs -= 1;
                } else {
                    *s = new;
                }
                self.len += 1;
                return None;
            }
            if s.size & TOMB != 0 && first_tomb == usize::MAX {
                first_tomb = i;
            }
            i = (i + 1) & mask;
        }
    }

    /// Insertion when huge blocks are involved.
    #[cold]
    fn insert_cold(&mut self, addr: u64, b: Block) -> Option<Block> {
        if b.size & TOMB != 0 {
            let main = self.remove_main(addr, mix(addr));
            let prev = self.huge.insert(addr, b);
            return main.or(prev);
        }
        match self.huge.remove(&addr) {
            Some(old) => {
                let huge = std::mem::take(&mut self.huge);
                // Not in the main table: it was in `huge`.
                self.insert(addr, b);
                self.huge = huge;
                Some(old)
            }
            None => {
                let huge = std::mem::take(&mut self.huge);
                let r = self.insert(addr, b);
                self.huge = huge;
                r
            }
        }
    }

    /// Removes and returns the block at `addr`.
    #[inline]
    pub fn remove(&mut self, addr: u64) -> Option<Block> {
        self.remove_hashed(addr, mix(addr))
    }

    /// [`BlockTable::remove`] with `h` = [`mix`]`(addr)` already known.
    #[inline(always)]
    pub fn remove_hashed(&mut self, addr: u64, h: u64) -> Option<Block> {
        debug_assert!(h == mix(addr));
        if addr == 0 {
            return None;
        }
        if !self.huge.is_empty() {
            if let Some(b) = self.huge.remove(&addr) {
                return Some(b);
            }
        }
        self.remove_main(addr, h)
    }

    #[inline(always)]
    fn remove_main(&mut self, addr: u64, h: u64) -> Option<Block> {
        let i = self.find(addr, h);
        let s = &mut self.slots[i];
        if !s.live() {
            return None;
        }
        let b = s.block();
        s.size |= TOMB;
        self.len -= 1;
        self.tombs += 1;
        Some(b)
    }

    /// The block at `addr`.
    #[cfg(test)]
    pub fn get(&self, addr: u64) -> Option<Block> {
        if addr == 0 {
            return None;
        }
        if let Some(b) = self.huge.get(&addr) {
            return Some(*b);
        }
        let s = self.slots[self.find(addr, mix(addr))];
        s.live().then(|| s.block())
    }

    /// The table is rebuilt once live slots and tombstones fill one
    /// `sparsity()`-th of it. Probing branches on each slot it passes,
    /// and those branches mispredict about as often as a slot is taken:
    /// at quarter load replay took less CPU than at half load while the
    /// tables of the bench traces fit in the caches' reach. Tables past
    /// 16 MiB miss the caches anyway, and there half load was faster as
    /// well as half the memory.
    #[inline(always)]
    fn sparsity(&self) -> usize {
        if self.slots.len() <= BIG {
            4
        } else {
            2
        }
    }

    /// Rebuilds the table without tombstones: twice as large if the live
    /// blocks alone fill half of what triggers a rebuild, else the same
    /// size.
    #[cold]
    fn rebuild(&mut self) {
        let n = if self.len * 2 * self.sparsity() >= self.slots.len() {
            self.slots.len() * 2
        } else {
            self.slots.len()
        };
        let huge = std::mem::take(&mut self.huge);
        let old = std::mem::replace(self, Self::with_slots(n));
        let mask = self.slots.len() - 1;
        for s in old.slots.iter().filter(|s| s.live()) {
            let mut i = self.home(mix(s.addr));
            while self.slots[i].addr != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = *s;
        }
        self.len = old.len;
        self.huge = huge;
    }

    /// Every block, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        self.piece(0, usize::MAX)
    }

    /// How many pieces of at most `slots` slots [`BlockTable::piece`]
    /// splits the table into.
    pub fn pieces(&self, slots: usize) -> usize {
        self.slots.len().div_ceil(slots.max(1))
    }

    /// The blocks of the `i`-th piece of `slots` slots, in no particular
    /// order; the first piece also has the blocks of huge sizes. The
    /// pieces together are [`BlockTable::iter`].
    pub fn piece(&self, i: usize, slots: usize) -> impl Iterator<Item = (u64, Block)> + '_ {
        let slots = slots.max(1);
        let start = (i * slots).min(self.slots.len());
        let end = (start + slots).min(self.slots.len());
        let huge = (i == 0).then_some(&self.huge);
        self.slots[start..end]
            .iter()
            .filter(|s| s.live())
            .map(|s| (s.addr, s.block()))
            .chain(
                huge.into_iter()
                    .flat_map(|h| h.iter().map(|(&a, &b)| (a, b))),
            )
    }

    /// Total bytes of the blocks.
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.iter().map(|(_, b)| b.size).sum()
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

    #[test]
    fn tombstones_and_huge_sizes_match_a_hash_map() {
        let mut t = BlockTable::default();
        let mut m: HashMap<u64, Block> = HashMap::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for step in 0..300_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Many addresses, some never reused (bump allocation), so the
            // table rebuilds and grows; now and then a block of a size
            // with the top bit set.
            let addr = if x.is_multiple_of(4) {
                0x10_0000 + step * 16
            } else {
                0x1000 + (x % 3000) * 16
            };
            let size = if x.is_multiple_of(97) {
                u64::MAX - step
            } else {
                step
            };
            let b = Block {
                size,
                ts: step,
                stack: x % 5,
            };
            match x % 5 {
                0 | 1 => assert_eq!(t.remove(addr), m.remove(&addr), "step {step}"),
                2 => assert_eq!(t.get(addr), m.get(&addr).copied(), "step {step}"),
                _ => assert_eq!(t.insert(addr, b), m.insert(addr, b), "step {step}"),
            }
            assert_eq!(t.len(), m.len());
        }
        let mut all: Vec<(u64, Block)> = t.iter().collect();
        all.sort_by_key(|e| e.0);
        // The pieces fold_outstanding splits the table into cover it once.
        for size in [1, 100, 256, 1 << 20] {
            let mut pieces: Vec<(u64, Block)> =
                (0..t.pieces(size)).flat_map(|i| t.piece(i, size)).collect();
            pieces.sort_by_key(|e| e.0);
            assert_eq!(pieces, all, "pieces of {size} slots");
        }
        let mut want: Vec<(u64, Block)> = m.into_iter().collect();
        want.sort_by_key(|e| e.0);
        assert_eq!(all, want);
    }
}
