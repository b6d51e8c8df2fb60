//! The columns of event rows as replay reads them ([`Columns`], owned,
//! and [`Slices`], borrowed), shared by the decoder and by the writer's
//! tap (`TraceWriter::tap_events`), which hands them the rows it writes.

/// Kind code of rows whose kind this version does not know.
pub const UNKNOWN_KIND: u8 = 255;

/// The columns of one row group that replay reads. Nulls are 0.
#[derive(Default)]
pub struct Columns {
    pub(crate) rows: usize,
    pub(crate) ts: Vec<u64>,
    pub(crate) pid: Vec<u32>,
    pub(crate) tid: Vec<u32>,
    pub(crate) kind: Vec<u8>,
    pub(crate) addr: Vec<u64>,
    pub(crate) size: Vec<u64>,
    pub(crate) old_addr: Vec<u64>,
    pub(crate) stack_id: Vec<u64>,
    pub(crate) old_size: Vec<u64>,
}

/// Borrowed slices of [`Columns`].
#[derive(Clone, Copy)]
pub struct Slices<'a> {
    /// `ts_ns`.
    pub ts: &'a [u64],
    /// `pid`.
    pub pid: &'a [u32],
    /// `tid`.
    pub tid: &'a [u32],
    /// `kind` as [`EventKind`](crate::schema::EventKind) codes ([`UNKNOWN_KIND`] if unknown).
    pub kind: &'a [u8],
    /// `addr`.
    pub addr: &'a [u64],
    /// `size`.
    pub size: &'a [u64],
    /// `old_addr`.
    pub old_addr: &'a [u64],
    /// `stack_id`.
    pub stack_id: &'a [u64],
    /// `old_size`, which only mremap rows have: rows of other kinds may
    /// hold anything (the page decoder skips the column in row groups
    /// without mremap).
    pub old_size: &'a [u64],
}

impl<'a> Slices<'a> {
    /// Rows `start..end`.
    #[inline]
    pub fn range(&self, start: usize, end: usize) -> Slices<'a> {
        Slices {
            ts: &self.ts[start..end],
            pid: &self.pid[start..end],
            tid: &self.tid[start..end],
            kind: &self.kind[start..end],
            addr: &self.addr[start..end],
            size: &self.size[start..end],
            old_addr: &self.old_addr[start..end],
            stack_id: &self.stack_id[start..end],
            old_size: self.old_size.get(start..end).unwrap_or(&[]),
        }
    }
}

impl Columns {
    /// Number of rows.
    #[inline]
    pub fn len(&self) -> usize {
        self.rows
    }

    /// True when there are no rows.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The first `n` rows as slices.
    #[inline]
    pub fn slices(&self, n: usize) -> Slices<'_> {
        Slices {
            ts: &self.ts[..n],
            pid: &self.pid[..n],
            tid: &self.tid[..n],
            kind: &self.kind[..n],
            addr: &self.addr[..n],
            size: &self.size[..n],
            old_addr: &self.old_addr[..n],
            stack_id: &self.stack_id[..n],
            old_size: &self.old_size[..n],
        }
    }
}
