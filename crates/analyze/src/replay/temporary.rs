//! Temporary allocations: heap blocks freed soon after they were
//! allocated, by the thread that allocated them, before that thread
//! allocated anything else.
//!
//! The rule (docs/analyzer.md, "Temporary allocations"): a heap
//! allocation is temporary when
//! * the thread that made it frees it,
//! * no more than the threshold (`--temporary-threshold`, 1 ms by
//!   default) after it was made,
//! * and that thread made no other heap allocation in between.
//!
//! A realloc is the free of its old block then an allocation of its new
//! one, by the calling thread, as replay models it: `malloc` then an
//! immediate `realloc` makes the malloc'd block temporary, and the
//! realloc'd block may be temporary itself.
//!
//! The rule depends on each thread's order of events, not on the
//! outstanding blocks, so it is decided in the decode workers
//! ([`TempScan`]), which see a row group's rows in time order, and not in
//! the partitions, which see one hash range of addresses each. Each
//! thread's *last* allocation is the only one of its that can still turn
//! out temporary, so a row group is scanned with one entry per thread
//! (its last allocation and whether it is still live) and a table from
//! an address of a process to the thread whose last allocation is live
//! there ([`Owners`]): a free looks its address up there, an allocation
//! replaces its thread's entry. Both are sized by the threads, whatever
//! the length of the trace.
//!
//! A free can only match an allocation of an earlier row group if it
//! comes within the threshold of the row group's start: the scan keeps
//! those frees ([`RowGroupTemps::early`]) and each thread's last
//! allocation ([`RowGroupTemps::last`]), and [`Carry`], run on the row
//! groups in order, matches the early frees of a row group with the last
//! allocations of the row groups before it.

use super::allocated::Allocated;
use crate::hash::{mix, IntMap};

/// A thread's last heap allocation.
#[derive(Clone, Copy, Debug)]
pub(super) struct Last {
    tid: u32,
    /// Its process: an address is a block of one process only.
    pid: u32,
    /// Where [`Owners`] keeps its address: the home entry, or [`SPILLED`].
    home: u32,
    /// Whether the filter selects the allocation: only those count.
    counted: bool,
    /// Not freed yet (nor replaced by an allocation at the same address).
    live: bool,
    addr: u64,
    ts: u64,
    stack: u64,
}

/// A free of a row group that may free an allocation of an earlier row
/// group: it came within the threshold of the row group's first row.
#[derive(Clone, Copy, Debug)]
pub(super) struct EarlyFree {
    tid: u32,
    pid: u32,
    /// Whether its thread had allocated nothing earlier in the row group:
    /// only then can it free the thread's last allocation.
    own: bool,
    addr: u64,
    ts: u64,
}

/// What the scan of a row group leaves for [`Carry`].
#[derive(Default)]
pub(super) struct RowGroupTemps {
    /// Each thread's last allocation in the row group.
    pub(super) last: Vec<Last>,
    /// Frees in the first threshold of the row group that did not free an
    /// allocation of the row group.
    pub(super) early: Vec<EarlyFree>,
}

/// The scan of one row group's heap allocations and frees, in time order.
pub(super) struct TempScan {
    threshold: u64,
    /// Frees up to this time may free an earlier row group's allocation
    /// (`None` before the first row).
    window_end: Option<u64>,
    out: RowGroupTemps,
    /// The entry of each thread in `out.last`, by tid + 1.
    slot_of: SmallMap,
    /// Direct-mapped cache of `slot_of`, by tid: (tid, slot + 1), 0 for
    /// none. Threads interleave, so a single last-used entry missed more
    /// often than not, and each miss was a lookup in `slot_of`.
    tid_cache: [(u32, u32); TID_CACHE],
    /// Which thread's last allocation lives at an address: see
    /// [`Owners`].
    owners: Owners,
}

impl TempScan {
    pub(super) fn new(threshold: u64, mut out: RowGroupTemps) -> Self {
        out.last.clear();
        out.early.clear();
        TempScan {
            threshold,
            window_end: None,
            out,
            slot_of: SmallMap::default(),
            tid_cache: [(0, 0); TID_CACHE],
            owners: Owners::default(),
        }
    }

    /// The row group's result.
    pub(super) fn finish(self) -> RowGroupTemps {
        self.out
    }

    #[inline(always)]
    fn window_end(&mut self, ts: u64) -> u64 {
        *self
            .window_end
            .get_or_insert(ts.saturating_add(self.threshold))
    }

    /// A free by thread `tid` of process `pid` of the block at `addr`;
    /// counts a temporary allocation in `acc`.
    #[inline(always)]
    pub(super) fn free(&mut self, (pid, tid): (u32, u32), addr: u64, ts: u64, acc: &mut Allocated) {
        let window_end = self.window_end(ts);
        match self.owners.find(pid, addr, &self.out.last) {
            Some(slot) => {
                // The block of some thread's last allocation.
                let l = &mut self.out.last[slot as usize];
                self.owners.kill(l);
                if l.tid == tid && l.counted && ts.saturating_sub(l.ts) <= self.threshold {
                    acc.add_temporary(l.stack, 1);
                }
            }
            None if ts <= window_end => self.early_free((pid, tid), addr, ts),
            None => {}
        }
    }

    #[cold]
    fn early_free(&mut self, (pid, tid): (u32, u32), addr: u64, ts: u64) {
        let own = self.slot_of.get((tid as u64 + 1, 0)).is_none();
        self.out.early.push(EarlyFree {
            tid,
            pid,
            own,
            addr,
            ts,
        });
    }

    /// An allocation by thread `tid` of process `pid` of the block at
    /// `addr`, which the filter selects if `counted`.
    #[inline(always)]
    pub(super) fn alloc(
        &mut self,
        (pid, tid): (u32, u32),
        addr: u64,
        ts: u64,
        stack: u64,
        counted: bool,
    ) {
        self.window_end(ts);
        let slot = self.slot(tid);
        if let Some(other) = self.owners.find(pid, addr, &self.out.last) {
            // The address was live in another thread's entry: its free was
            // missed, and that block is gone.
            self.owners.kill(&mut self.out.last[other as usize]);
        }
        // No longer the thread's last allocation.
        self.owners.kill(&mut self.out.last[slot as usize]);
        let home = self.owners.insert(pid, addr, slot, &self.out.last);
        self.out.last[slot as usize] = Last {
            tid,
            pid,
            home,
            counted,
            live: true,
            addr,
            ts,
            stack,
        };
    }

    /// Hints the CPU to fetch the home entry of `addr` of process `pid`.
    #[inline(always)]
    pub(super) fn prefetch(&self, pid: u32, addr: u64) {
        let h = self.owners.home_of(pid, addr);
        crate::table::prefetch(self.owners.home.as_ptr().wrapping_add(h) as *const u8);
    }

    #[inline(always)]
    fn slot(&mut self, tid: u32) -> u32 {
        let (t, s) = self.tid_cache[tid as usize % TID_CACHE];
        if t == tid && s != 0 {
            return s - 1;
        }
        self.slot_slow(tid)
    }

    #[cold]
    fn slot_slow(&mut self, tid: u32) -> u32 {
        let n = self.out.last.len() as u32;
        let slot = self.slot_of.get((tid as u64 + 1, 0)).unwrap_or(n);
        if slot == n {
            self.slot_of.insert((tid as u64 + 1, 0), n);
            self.out.last.push(Last {
                tid,
                pid: 0,
                home: 0,
                counted: false,
                live: false,
                addr: 0,
                ts: 0,
                stack: 0,
            });
            self.owners.reserve(&mut self.out.last);
        }
        self.tid_cache[tid as usize % TID_CACHE] = (tid, slot + 1);
        slot
    }
}

/// The thread whose last allocation is live at an address, for the
/// scan. At most one thread's is: an allocation at a live address takes
/// the address from its owner. Each address has one home entry, which
/// names a thread and nothing else. It holds for the address while that
/// thread's last allocation is live there, so an entry goes stale by
/// itself when its thread allocates again or the block is freed, and is
/// never cleared: the scan's lookups are a hash, two loads and a compare,
/// without the probing and the removal of a map (a map keyed by address
/// cost about 15 ns a heap row, most of it in branches). An address whose
/// home entry still holds for another address is spilled to `overflow`;
/// with 256 entries a thread that is rare, and `overflow` is only looked
/// at while it holds a live allocation.
struct Owners {
    /// Slot + 1 of a thread in [`RowGroupTemps::last`], 0 for none.
    home: Vec<u32>,
    /// `64 - log2(home.len())`.
    shift: u32,
    /// Addresses spilled, and their thread's slot; the entries that no
    /// longer hold are dropped when it would grow.
    overflow: SmallMap,
    /// Live last allocations in `overflow`.
    spilled: usize,
    /// A bit per [`filter_bit`] of the addresses spilled since `spilled`
    /// was last 0: a lookup whose bit is clear skips `overflow`. A thread
    /// that rarely allocates can keep a spilled allocation live for long,
    /// and every lookup missing its home entry then probed `overflow`
    /// (1.6 % of the analyzer's CPU on the 30 M-event bench trace).
    filter: u64,
}

/// The bit of [`Owners::filter`] for the address whose [`mix`] is `h`:
/// its low bits (the home entry is of the high ones).
#[inline(always)]
fn filter_bit(h: u64) -> u64 {
    1 << (h & 63)
}

/// The hash of `addr` in process `pid`: one address in two processes (a
/// parent and its forked child) is two blocks.
#[inline(always)]
fn key_hash(pid: u32, addr: u64) -> u64 {
    mix(addr ^ (pid as u64).rotate_right(20))
}

/// [`Last::home`] of an allocation whose address is in
/// [`Owners::overflow`].
const SPILLED: u32 = u32::MAX;

/// Entries of [`Owners::home`] per thread.
const OWNERS_PER_THREAD: usize = 256;

impl Default for Owners {
    fn default() -> Self {
        Owners::with_len(1024)
    }
}

impl Owners {
    fn with_len(n: usize) -> Self {
        debug_assert!(n.is_power_of_two());
        Owners {
            home: vec![0; n],
            shift: 64 - n.trailing_zeros(),
            overflow: SmallMap::default(),
            spilled: 0,
            filter: 0,
        }
    }

    #[inline(always)]
    fn home_of(&self, pid: u32, addr: u64) -> usize {
        (key_hash(pid, addr) >> self.shift) as usize
    }

    /// The slot of the thread whose last allocation is live at `addr` of
    /// process `pid`.
    #[inline(always)]
    fn find(&self, pid: u32, addr: u64, last: &[Last]) -> Option<u32> {
        let h = key_hash(pid, addr);
        let e = self.home[(h >> self.shift) as usize];
        if e != 0 {
            let l = &last[e as usize - 1];
            if l.live && l.addr == addr && l.pid == pid {
                return Some(e - 1);
            }
        }
        if self.spilled == 0 || self.filter & filter_bit(h) == 0 {
            return None;
        }
        self.find_spilled(pid, addr, last)
    }

    #[cold]
    fn find_spilled(&self, pid: u32, addr: u64, last: &[Last]) -> Option<u32> {
        let slot = self.overflow.get((addr, pid))?;
        let l = &last[slot as usize];
        (l.live && l.addr == addr && l.pid == pid).then_some(slot)
    }

    /// Makes `l` no longer live.
    #[inline(always)]
    fn kill(&mut self, l: &mut Last) {
        if l.live {
            l.live = false;
            if l.home == SPILLED {
                self.spilled -= 1;
                if self.spilled == 0 {
                    self.filter = 0;
                }
            }
        }
    }

    /// Records the address of the last allocation of `slot`, about to be
    /// live at `addr` (no other thread's is: the caller killed it);
    /// returns where it went, for [`Last::home`].
    #[inline(always)]
    fn insert(&mut self, pid: u32, addr: u64, slot: u32, last: &[Last]) -> u32 {
        let h = self.home_of(pid, addr);
        let e = self.home[h];
        if e != 0 {
            let l = &last[e as usize - 1];
            if l.live && l.home == h as u32 {
                return self.spill(pid, addr, slot, last);
            }
        }
        self.home[h] = slot + 1;
        h as u32
    }

    #[cold]
    fn spill(&mut self, pid: u32, addr: u64, slot: u32, last: &[Last]) -> u32 {
        if (self.overflow.len + 1) * 4 > self.overflow.slots.len() {
            self.overflow.retain(|(a, p), s| {
                let l = &last[s as usize];
                l.live && l.home == SPILLED && l.addr == a && l.pid == p
            });
        }
        self.overflow.insert((addr, pid), slot);
        self.spilled += 1;
        self.filter |= filter_bit(key_hash(pid, addr));
        SPILLED
    }

    /// Makes room for the threads of `last`: more entries, the live ones
    /// moved.
    #[cold]
    fn reserve(&mut self, last: &mut [Last]) {
        let want = (last.len() * OWNERS_PER_THREAD).next_power_of_two();
        if want <= self.home.len() {
            return;
        }
        *self = Owners::with_len(want);
        for slot in 0..last.len() {
            if last[slot].live {
                let (pid, addr) = (last[slot].pid, last[slot].addr);
                last[slot].home = self.insert(pid, addr, slot as u32, last);
            }
        }
    }
}

/// Entries of [`TempScan::tid_cache`] (a power of two).
const TID_CACHE: usize = 64;

/// The last allocations of the threads across row groups, matched in row
/// group order with the early frees of the next ones.
#[derive(Default)]
pub(super) struct Carry {
    /// Live last allocations by process and address.
    by_addr: IntMap<(u32, u64), Last>,
    /// The key of each thread's entry in `by_addr`.
    addr_of: IntMap<u32, (u32, u64)>,
    /// Temporary allocations found here, by stack.
    pub(super) temporary: IntMap<u64, u64>,
}

impl Carry {
    /// Matches `rg`'s early frees with the carried allocations, then
    /// carries `rg`'s last allocations instead of its threads' earlier
    /// ones, and drops the allocations that can no longer be temporary
    /// (older than the threshold at `last_ts`, the row group's end).
    pub(super) fn next(&mut self, rg: &RowGroupTemps, threshold: u64, last_ts: u64) {
        if self.by_addr.is_empty() && rg.last.is_empty() {
            return;
        }
        for f in &rg.early {
            if let Some(l) = self.by_addr.remove(&(f.pid, f.addr)) {
                self.addr_of.remove(&l.tid);
                if l.tid == f.tid && f.own && l.counted && f.ts.saturating_sub(l.ts) <= threshold {
                    *self.temporary.entry(l.stack).or_default() += 1;
                }
            }
        }
        for l in &rg.last {
            if let Some(a) = self.addr_of.remove(&l.tid) {
                self.by_addr.remove(&a);
            }
            if l.live && l.ts.saturating_add(threshold) >= last_ts {
                if let Some(old) = self.by_addr.insert((l.pid, l.addr), *l) {
                    self.addr_of.remove(&old.tid);
                }
                self.addr_of.insert(l.tid, (l.pid, l.addr));
            }
        }
        let expired = |l: &Last| l.ts.saturating_add(threshold) < last_ts;
        if self.by_addr.values().any(expired) {
            self.by_addr.retain(|_, l| !expired(l));
            let by_addr = &self.by_addr;
            self.addr_of.retain(|_, a| by_addr.contains_key(a));
        }
    }
}

/// A small map from keys (a non-zero `u64` and a `u32`) to `u32` values,
/// for the scan's one entry per thread: open addressing with linear
/// probing, kept at most a quarter full. With a few dozen threads it is a
/// few cache lines, and each operation a hash and one or two probes
/// (hashbrown's general machinery cost several times more, at one
/// operation per allocation and free).
struct SmallMap {
    slots: Vec<(Key, u32)>,
    len: usize,
}

/// A [`SmallMap`] key; `.0 == 0` marks an empty slot.
type Key = (u64, u32);

impl Default for SmallMap {
    fn default() -> Self {
        SmallMap {
            slots: vec![((0, 0), 0); 64],
            len: 0,
        }
    }
}

impl SmallMap {
    #[inline(always)]
    fn home(&self, key: Key) -> usize {
        (key_hash(key.1, key.0) >> 32) as usize & (self.slots.len() - 1)
    }

    #[inline(always)]
    fn find(&self, key: Key) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == key || k.0 == 0 {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    #[inline(always)]
    fn get(&self, key: Key) -> Option<u32> {
        let s = self.slots[self.find(key)];
        (s.0 .0 != 0).then_some(s.1)
    }

    /// Inserts or replaces; returns the value replaced.
    #[inline(always)]
    fn insert(&mut self, key: Key, value: u32) -> Option<u32> {
        debug_assert!(key.0 != 0);
        if (self.len + 1) * 4 > self.slots.len() {
            self.grow();
        }
        let i = self.find(key);
        let old = std::mem::replace(&mut self.slots[i], (key, value));
        if old.0 .0 == 0 {
            self.len += 1;
            None
        } else {
            Some(old.1)
        }
    }

    /// Keeps only the entries for which `keep` holds.
    fn retain(&mut self, keep: impl Fn(Key, u32) -> bool) {
        let n = self.slots.len();
        let old = std::mem::replace(&mut self.slots, vec![((0, 0), 0); n]);
        self.len = 0;
        for (k, v) in old {
            if k.0 != 0 && keep(k, v) {
                self.insert(k, v);
            }
        }
    }

    #[cold]
    fn grow(&mut self) {
        let n = self.slots.len() * 2;
        let old = std::mem::replace(&mut self.slots, vec![((0, 0), 0); n]);
        self.len = 0;
        for (k, v) in old {
            if k.0 != 0 {
                self.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The rule as a map from address to the thread whose last
    /// allocation is live there, removed from at every free and
    /// replaced allocation: what [`Owners`] does without removals.
    #[derive(Default)]
    struct Reference {
        last: HashMap<u32, (u64, u64, bool)>,
        live_at: HashMap<u64, u32>,
        temporary: u64,
    }

    impl Reference {
        fn alloc(&mut self, tid: u32, addr: u64, ts: u64) {
            if let Some((a, _, true)) = self.last.get(&tid).copied() {
                self.live_at.remove(&a);
            }
            if let Some(other) = self.live_at.insert(addr, tid) {
                self.last.get_mut(&other).unwrap().2 = false;
            }
            self.last.insert(tid, (addr, ts, true));
        }

        fn free(&mut self, tid: u32, addr: u64, ts: u64, threshold: u64) {
            if let Some(owner) = self.live_at.remove(&addr) {
                let l = self.last.get_mut(&owner).unwrap();
                l.2 = false;
                if owner == tid && ts - l.1 <= threshold {
                    self.temporary += 1;
                }
            }
        }
    }

    /// Many threads on few addresses, so home entries collide, spill,
    /// go stale and are taken over, and threads keep arriving (the
    /// entries are moved as the table grows): the scan counts the
    /// temporary allocations and leaves the last allocations the
    /// reference does.
    #[test]
    fn owners_match_a_map_of_live_addresses() {
        let threshold = 50;
        let mut scan = TempScan::new(threshold, RowGroupTemps::default());
        let mut reference = Reference::default();
        let mut acc = Allocated::new(0);
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..400_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Threads arrive over the first half; a thread mostly frees
            // its own last block, sometimes another address.
            let threads = 2 + (step / 500).min(400);
            let tid = 1 + (x % threads) as u32;
            let ts = 1000 + step;
            let addr = match reference.last.get(&tid) {
                Some(&(a, _, _)) if (x >> 20).is_multiple_of(3) => a,
                _ => 0x1000 + ((x >> 32) % 3000) * 16,
            };
            if (x >> 40).is_multiple_of(2) {
                scan.alloc((7, tid), addr, ts, 1, true);
                reference.alloc(tid, addr, ts);
            } else {
                scan.free((7, tid), addr, ts, &mut acc);
                reference.free(tid, addr, ts, threshold);
            }
        }
        assert!(scan.owners.home.len() >= 400 * OWNERS_PER_THREAD);
        assert_eq!(acc.temporary, reference.temporary);
        assert!(reference.temporary > 1000, "{}", reference.temporary);
        let out = scan.finish();
        assert_eq!(out.last.len(), reference.last.len());
        for l in &out.last {
            assert_eq!(
                reference.last[&l.tid],
                (l.addr, l.ts, l.live),
                "thread {}",
                l.tid
            );
        }
    }
}
