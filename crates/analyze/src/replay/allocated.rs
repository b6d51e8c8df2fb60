//! The allocations of a replay, in all and by stack ([`Allocated`]),
//! counted by the decode workers rather than by replay.

use super::AllocatedTotals;
use crate::hash::{int_map, IntMap};

/// Allocations and their bytes, in all and by stack (those the filter
/// selects), counted while decoding.
pub(super) struct Allocated {
    pub(super) allocations: u64,
    pub(super) bytes: u64,
    pub(super) totals: StackTotals,
}

impl Allocated {
    pub(super) fn new(max_stack: u64) -> Self {
        Allocated {
            allocations: 0,
            bytes: 0,
            totals: StackTotals::new(max_stack),
        }
    }

    pub(super) fn merge(&mut self, o: &Allocated) {
        self.allocations += o.allocations;
        self.bytes += o.bytes;
        o.totals
            .for_each(|stack, t| self.totals.add_totals(stack, t));
    }
}

/// Allocation totals by stack: a flat array when stack ids are dense (the
/// recorder numbers them from 1), a map for the rest.
pub(super) struct StackTotals {
    dense: Vec<AllocatedTotals>,
    sparse: IntMap<u64, AllocatedTotals>,
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
            dense: vec![AllocatedTotals::default(); dense_len],
            sparse: int_map(),
        }
    }

    /// The totals of `stack`, created if new.
    #[inline(always)]
    fn entry(&mut self, stack: u64) -> &mut AllocatedTotals {
        if stack as usize >= self.dense.len() {
            self.grow(stack);
        }
        match self.dense.get_mut(stack as usize) {
            Some(t) => t,
            None => self.sparse.entry(stack).or_default(),
        }
    }

    #[inline(always)]
    fn add(&mut self, stack: u64, bytes: u64) {
        let t = self.entry(stack);
        t.allocations += 1;
        t.bytes += bytes;
    }

    /// [`StackTotals::add`] if `yes`, without a branch on it when the
    /// stack is in the flat array.
    #[inline(always)]
    pub(super) fn add_if(&mut self, stack: u64, bytes: u64, yes: bool) {
        match self.dense.get_mut(stack as usize) {
            Some(t) => {
                t.allocations += yes as u64;
                t.bytes += bytes & 0u64.wrapping_sub(yes as u64);
            }
            None if yes => self.add(stack, bytes),
            None => {}
        }
    }

    fn add_totals(&mut self, stack: u64, t: &AllocatedTotals) {
        let e = self.entry(stack);
        e.allocations += t.allocations;
        e.bytes += t.bytes;
    }

    /// Ids the stacks table did not announce: keep small ones dense.
    #[cold]
    fn grow(&mut self, stack: u64) {
        if stack < DENSE_STACKS {
            let len = (stack as usize + 1)
                .next_power_of_two()
                .min(DENSE_STACKS as usize);
            self.dense.resize(len, AllocatedTotals::default());
        }
    }

    pub(super) fn for_each(&self, mut f: impl FnMut(u64, &AllocatedTotals)) {
        for (i, t) in self.dense.iter().enumerate() {
            if t.allocations > 0 {
                f(i as u64, t);
            }
        }
        for (&s, t) in &self.sparse {
            f(s, t);
        }
    }
}
