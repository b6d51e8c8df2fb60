//! A trace's frames table, indexed by pid and address ([`FrameTable`]),
//! as the report's stacks, the suppressions and the fleet's stack keys
//! look frames up.

use memleak_trace::{FrameColumns, FrameRow};

use crate::hash::{int_map, IntMap};

/// A trace's frames table, looked up by pid and address. The rows stay
/// as decoded, column by column (no strings copied), and the index maps a
/// key to its row (the last row of a key repeated): lookups touch a small
/// table, not the rows.
#[derive(Default)]
pub(crate) struct FrameTable {
    columns: FrameColumns,
    index: IntMap<(u32, u64), u32>,
}

impl FrameTable {
    pub(crate) fn new(columns: FrameColumns) -> FrameTable {
        let mut index = int_map();
        index.reserve(columns.len());
        for (i, f) in columns.rows().enumerate() {
            index.insert((f.pid(), f.addr()), i as u32);
        }
        FrameTable { columns, index }
    }

    /// The frame of `pid` (0 for the kernel's) at `addr`.
    #[inline]
    pub(crate) fn get(&self, key: &(u32, u64)) -> Option<FrameRow<'_>> {
        self.row(key).map(|i| self.columns.row(i))
    }

    /// The row of the frame of `pid` at `addr`.
    #[inline]
    pub(crate) fn row(&self, key: &(u32, u64)) -> Option<usize> {
        self.index.get(key).map(|&i| i as usize)
    }

    /// The table's columns.
    pub(crate) fn columns(&self) -> &FrameColumns {
        &self.columns
    }
}
