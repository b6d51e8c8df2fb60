//! The allocations of a replay, in all and by stack ([`Allocated`]),
//! counted by the decode workers rather than by replay: their number,
//! bytes and sizes, and the temporary ones (`temporary.rs`).

use crate::hash::{int_map, IntMap};
use crate::histogram::{size_bucket, SizeCount, SizeHistogram};

/// Allocations and their bytes, in all and by stack (those the filter
/// selects), counted while decoding.
pub(super) struct Allocated {
    pub(super) allocations: u64,
    pub(super) bytes: u64,
    pub(super) totals: StackTotals,
    /// The sizes of the allocations the filter selects.
    pub(super) sizes: SizeHistogram,
    /// Temporary allocations (see `temporary.rs`) the filter selects.
    pub(super) temporary: u64,
}

impl Allocated {
    pub(super) fn new(max_stack: u64) -> Self {
        Allocated {
            allocations: 0,
            bytes: 0,
            totals: StackTotals::new(max_stack),
            sizes: SizeHistogram::default(),
            temporary: 0,
        }
    }

    /// Counts `n` temporary allocations of `stack`.
    #[inline]
    pub(super) fn add_temporary(&mut self, stack: u64, n: u64) {
        self.temporary += n;
        self.totals.entry(stack).t.temporary += n;
    }

    /// The sizes of each stack's allocations, smallest first.
    pub(super) fn sizes_by_stack(&self) -> IntMap<u64, Vec<SizeCount>> {
        let mut out: IntMap<u64, Vec<SizeCount>> = int_map();
        self.totals.for_each_size(|stack, b, count| {
            out.entry(stack).or_default().push(SizeCount::new(b, count));
        });
        for v in out.values_mut() {
            v.sort_unstable_by_key(|b| b.low);
            // A bucket counted both in an entry and in the map.
            v.dedup_by(|b, a| {
                let same = a.low == b.low;
                if same {
                    a.count += b.count;
                }
                same
            });
        }
        out
    }

    pub(super) fn merge(&mut self, o: &Allocated) {
        self.allocations += o.allocations;
        self.bytes += o.bytes;
        self.sizes.merge(&o.sizes);
        self.temporary += o.temporary;
        o.totals
            .for_each(|stack, t| self.totals.add_totals(stack, t));
        o.totals
            .for_each_size(|stack, b, n| self.totals.spill(stack, b, n));
    }
}

/// Size buckets counted in a stack's [`Entry`]: sizes under 512 KiB.
const ENTRY_BUCKETS: usize = 20;

/// A stack's totals and the sizes of its allocations, in one cache line
/// (one miss per allocation counted, where a separate table of sizes
/// doubled the misses). A size counter that fills up is added to
/// [`StackTotals::sizes`] and starts again, as are sizes of 512 KiB and
/// more.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Entry {
    t: AllocatedTotals,
    sizes: [u16; ENTRY_BUCKETS],
}

/// Allocation totals by stack: a flat array when stack ids are dense (the
/// recorder numbers them from 1), a map for the rest.
pub(super) struct StackTotals {
    dense: Vec<Entry>,
    sparse: IntMap<u64, Entry>,
    /// Allocations by (stack, size bucket) that the entries do not hold.
    sizes: IntMap<(u64, u8), u64>,
}

/// Stack ids below this are counted in a flat array.
const DENSE_STACKS: u64 = 1 << 20;

impl StackTotals {
    fn new(max_stack: u64) -> Self {
        let dense_len = if max_stack < DENSE_STACKS {
            max_stack as usize + 1
        } else {
            0
        };
        StackTotals {
            dense: vec![Entry::default(); dense_len],
            sparse: int_map(),
            sizes: int_map(),
        }
    }

    /// The entry of `stack`, created if new.
    #[inline(always)]
    fn entry(&mut self, stack: u64) -> &mut Entry {
        if stack as usize >= self.dense.len() {
            self.grow(stack);
        }
        match self.dense.get_mut(stack as usize) {
            Some(t) => t,
            None => self.sparse.entry(stack).or_default(),
        }
    }

    #[cold]
    fn add(&mut self, stack: u64, bytes: u64) {
        let mut sizes = std::mem::take(&mut self.sizes);
        let e = self.entry(stack);
        e.t.allocations += 1;
        e.t.bytes += bytes;
        count_size(e, &mut sizes, stack, bytes);
        self.sizes = sizes;
    }

    /// [`StackTotals::add`] if `yes`, without a branch on it when the
    /// stack is in the flat array and the size in one of its counters.
    /// (Whether a row allocates is as good as random: a branch on it
    /// mispredicted about every other row.)
    #[inline(always)]
    pub(super) fn add_if(&mut self, stack: u64, bytes: u64, yes: bool) {
        match self.dense.get_mut(stack as usize) {
            Some(e) => {
                e.t.allocations += yes as u64;
                e.t.bytes += bytes & 0u64.wrapping_sub(yes as u64);
                match e.sizes.get_mut(size_bucket(bytes)) {
                    Some(c) if *c < u16::MAX - 1 => *c += yes as u16,
                    _ if yes => count_size(e, &mut self.sizes, stack, bytes),
                    _ => {}
                }
            }
            None if yes => self.add(stack, bytes),
            None => {}
        }
    }

    /// Adds `extra` allocations and `bytes` to `stack`'s, all of `size`
    /// bytes each: what a sampled allocation stands for beyond itself.
    pub(super) fn add_scaled(&mut self, stack: u64, size: u64, extra: u64, bytes: u64) {
        let e = &mut self.entry(stack).t;
        e.allocations += extra;
        e.bytes += bytes;
        self.spill(stack, size_bucket(size), extra);
    }

    /// Hints the CPU to fetch the entry of `stack`, if it is in the flat
    /// array.
    #[inline(always)]
    pub(super) fn prefetch(&self, stack: u64) {
        if let Some(e) = self.dense.get(stack as usize) {
            crate::table::prefetch(e as *const Entry as *const u8);
        }
    }

    fn add_totals(&mut self, stack: u64, t: &AllocatedTotals) {
        let e = &mut self.entry(stack).t;
        e.allocations += t.allocations;
        e.bytes += t.bytes;
        e.temporary += t.temporary;
    }

    #[cold]
    fn spill(&mut self, stack: u64, bucket: usize, n: u64) {
        *self.sizes.entry((stack, bucket as u8)).or_default() += n;
    }

    /// Ids the stacks table did not announce: keep small ones dense.
    #[cold]
    fn grow(&mut self, stack: u64) {
        if stack < DENSE_STACKS {
            let len = (stack as usize + 1)
                .next_power_of_two()
                .min(DENSE_STACKS as usize);
            self.dense.resize(len, Entry::default());
        }
    }

    fn entries(&self) -> impl Iterator<Item = (u64, &Entry)> {
        let dense = self.dense.iter().enumerate().map(|(i, e)| (i as u64, e));
        dense.chain(self.sparse.iter().map(|(&s, e)| (s, e)))
    }

    pub(super) fn for_each(&self, mut f: impl FnMut(u64, &AllocatedTotals)) {
        for (s, e) in self.entries() {
            if e.t.allocations > 0 || e.t.temporary > 0 {
                f(s, &e.t);
            }
        }
    }

    /// Calls `f(stack, bucket, count)` for every non-zero count of
    /// allocations by size; a (stack, bucket) may come twice.
    fn for_each_size(&self, mut f: impl FnMut(u64, usize, u64)) {
        for (s, e) in self.entries() {
            for (b, &n) in e.sizes.iter().enumerate() {
                if n > 0 {
                    f(s, b, n as u64);
                }
            }
        }
        for (&(s, b), &n) in &self.sizes {
            f(s, b as usize, n);
        }
    }
}

/// Counts an allocation of `bytes` in `e`, the entry of `stack`, or in
/// `sizes`.
#[inline(always)]
fn count_size(e: &mut Entry, sizes: &mut IntMap<(u64, u8), u64>, stack: u64, bytes: u64) {
    let b = size_bucket(bytes);
    match e.sizes.get_mut(b) {
        Some(c) if *c < u16::MAX - 1 => *c += 1,
        Some(c) => {
            *sizes.entry((stack, b as u8)).or_default() += *c as u64 + 1;
            *c = 0;
        }
        None => *sizes.entry((stack, b as u8)).or_default() += 1,
    }
}

/// Allocations made by one stack, freed or not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocatedTotals {
    /// Number of allocations.
    pub allocations: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Of the allocations, the temporary ones (`replay/temporary.rs`).
    pub temporary: u64,
}
