//! Following the peaks of the live total and of each process's share of
//! it (see [the replay module](super) for what counts).

/// A new peak: out of line, so the test before it stays a branch (taken
/// rarely once the peak is reached) rather than conditional moves of
/// values the loop keeps in memory.
#[cold]
#[inline(never)]
pub(super) fn raise(peak: &mut i64, peak_ts: &mut u64, value: i64, ts: u64) {
    *peak = value;
    *peak_ts = ts;
}

/// A process's share of the live total and its peak, as the sequential
/// pass over several partitions' changes follows them.
#[derive(Clone, Copy, Default)]
pub(super) struct Share {
    pub(super) held: i64,
    pub(super) peak: i64,
    pub(super) peak_ts: u64,
}
