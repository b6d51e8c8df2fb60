//! A trace's frames table, indexed by pid and address ([`FrameTable`]),
//! as the report's stacks, the suppressions and the fleet's stack keys
//! look frames up.

use memleak_trace::FrameRecord;

use crate::hash::{int_map, IntMap};

/// A trace's frames table, looked up by pid and address. The records stay
/// in the order read, and the index maps a key to its row (the last row of
/// a key repeated): lookups touch a small table, not the records.
#[derive(Default)]
pub(crate) struct FrameTable {
    rows: Vec<FrameRecord>,
    index: IntMap<(u32, u64), u32>,
}

impl FrameTable {
    pub(crate) fn new(rows: Vec<FrameRecord>) -> FrameTable {
        let mut index = int_map();
        index.reserve(rows.len());
        for (i, f) in rows.iter().enumerate() {
            index.insert((f.pid, f.addr), i as u32);
        }
        FrameTable { rows, index }
    }

    /// The frame of `pid` (0 for the kernel's) at `addr`.
    #[inline]
    pub(crate) fn get(&self, key: &(u32, u64)) -> Option<&FrameRecord> {
        self.row(key).map(|i| &self.rows[i])
    }

    /// The row of the frame of `pid` at `addr`.
    #[inline]
    pub(crate) fn row(&self, key: &(u32, u64)) -> Option<usize> {
        self.index.get(key).map(|&i| i as usize)
    }

    /// The records, in the order read.
    pub(crate) fn rows(&self) -> &[FrameRecord] {
        &self.rows
    }
}
