//! A trace's stacks table, indexed by stack id ([`StackTable`]), as the
//! report's stacks, the suppressions and the fleet's stack keys look
//! stacks up.

use memleak_trace::{StackColumns, StackRef};
use rayon::prelude::*;

use crate::hash::{int_map, IntMap};

/// A trace's stacks table, looked up by stack id: the stacks stay as
/// decoded, their frames in one array (no vector per stack to make and
/// free), and the index maps an id to its row (the last row of an id
/// repeated).
#[derive(Default)]
pub(crate) struct StackTable {
    columns: StackColumns,
    index: IntMap<u64, u32>,
}

impl StackTable {
    pub(crate) fn new(columns: StackColumns) -> StackTable {
        let mut index = int_map();
        index.reserve(columns.len());
        for i in 0..columns.len() {
            index.insert(columns.id(i), i as u32);
        }
        StackTable { columns, index }
    }

    /// The stack of id `id`.
    #[inline]
    pub(crate) fn get(&self, id: &u64) -> Option<StackRef<'_>> {
        self.index.get(id).map(|&i| self.columns.get(i as usize))
    }

    /// Every stack once (the last row of an id repeated), in no order,
    /// on the worker pool.
    pub(crate) fn par_rows(&self) -> impl ParallelIterator<Item = StackRef<'_>> {
        self.index
            .par_iter()
            .map(|(_, &i)| self.columns.get(i as usize))
    }
}
