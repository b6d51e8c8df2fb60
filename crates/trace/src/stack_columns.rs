//! The `stacks` table column by column ([`StackColumns`]): every stack's
//! frames in one array, without a [`StackRecord`] and its vector per
//! stack, for a reader that looks stacks up by the thousand (a fleet's
//! analysis reads a stacks table per trace).

use crate::schema::StackRecord;

/// The `stacks` table as decoded, in the order of its files and rows.
#[derive(Default)]
pub struct StackColumns {
    ids: Vec<u64>,
    pids: Vec<u32>,
    kernel: Vec<bool>,
    truncated: Vec<bool>,
    /// Where each stack's frames end in `addrs` (they start where the
    /// stack before's end).
    ends: Vec<usize>,
    addrs: Vec<u64>,
}

/// One stack of [`StackColumns`], borrowed: the fields of a
/// [`StackRecord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackRef<'a> {
    /// Trace-unique id; events refer to it.
    pub stack_id: u64,
    /// Process the stack belongs to (0 for kernel stacks).
    pub pid: u32,
    /// True for a kernel stack.
    pub kernel: bool,
    /// True when the stack may be missing outer frames.
    pub truncated: bool,
    /// Raw instruction addresses, innermost first (see
    /// [`StackRecord::frames`]).
    pub frames: &'a [u64],
}

impl StackColumns {
    /// Appends a stack.
    pub(crate) fn push(
        &mut self,
        id: u64,
        pid: u32,
        kernel: bool,
        truncated: bool,
        frames: &[u64],
    ) {
        self.ids.push(id);
        self.pids.push(pid);
        self.kernel.push(kernel);
        self.truncated.push(truncated);
        self.addrs.extend_from_slice(frames);
        self.ends.push(self.addrs.len());
    }

    /// Makes room for `stacks` more stacks of `frames` frames in all.
    pub(crate) fn reserve(&mut self, stacks: usize, frames: usize) {
        self.ids.reserve(stacks);
        self.pids.reserve(stacks);
        self.kernel.reserve(stacks);
        self.truncated.reserve(stacks);
        self.ends.reserve(stacks);
        self.addrs.reserve(frames);
    }

    /// Stacks in the table.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the table has no stack.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The id of the `i`-th stack (panics past the end).
    pub fn id(&self, i: usize) -> u64 {
        self.ids[i]
    }

    /// The `i`-th stack (panics past the end).
    pub fn get(&self, i: usize) -> StackRef<'_> {
        StackRef {
            stack_id: self.ids[i],
            pid: self.pids[i],
            kernel: self.kernel[i],
            truncated: self.truncated[i],
            frames: &self.addrs[i.checked_sub(1).map_or(0, |j| self.ends[j])..self.ends[i]],
        }
    }

    /// Every stack, in order.
    pub fn iter(&self) -> impl Iterator<Item = StackRef<'_>> {
        (0..self.len()).map(|i| self.get(i))
    }
}

impl StackRef<'_> {
    /// The stack as a record of its own.
    pub fn to_record(&self) -> StackRecord {
        StackRecord {
            stack_id: self.stack_id,
            pid: self.pid,
            kernel: self.kernel,
            truncated: self.truncated,
            frames: self.frames.to_vec(),
        }
    }
}
