//! What the partitions count on the way: frees, freed bytes and the
//! [`Anomalies`] of the recording.

use serde::Serialize;

#[derive(Default, Clone, Copy)]
pub(super) struct Counts {
    pub(super) frees: u64,
    pub(super) freed_bytes: u64,
    pub(super) anomalies: Anomalies,
}

/// Events that do not fit the model of a complete recording.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Anomalies {
    /// Frees of addresses never allocated in the trace: blocks allocated
    /// before the recording started (or whose alloc event was lost).
    pub unknown_frees: u64,
    /// Frees of an address that was already freed and not allocated
    /// since. Detected among recent frees only (a bounded cache).
    pub double_frees: u64,
    /// Allocations at an address that was still live: its free was missed.
    pub missed_frees: u64,
}

impl Anomalies {
    pub(super) fn add(&mut self, o: &Anomalies) {
        self.unknown_frees += o.unknown_frees;
        self.double_frees += o.double_frees;
        self.missed_frees += o.missed_frees;
    }

    /// Sum of all anomalies.
    pub fn total(&self) -> u64 {
        self.unknown_frees + self.double_frees + self.missed_frees
    }
}
