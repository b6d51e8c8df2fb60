//! Following the peaks of the live total and of each process's share of
//! it (see [the replay module](super) for what counts).

use super::partition::Partition;
use super::process::{raise, ProcessIndex, NO_PID, NO_PROCESS};
use super::types::ProcessPeak;

/// A process's share of the live total and its peak, as the sequential
/// pass over several partitions' changes follows them.
#[derive(Clone, Copy, Default)]
pub(super) struct Share {
    pub(super) held: i64,
    pub(super) peak: i64,
    pub(super) peak_ts: u64,
    pub(super) peak_row: Option<u64>,
}

/// The live total as replay follows it, its peak and when it was reached,
/// and with several partitions each process's share of it.
#[derive(Default)]
pub(super) struct LiveTotal {
    pub(super) outstanding: i64,
    pub(super) peak: i64,
    pub(super) peak_ts: u64,
    /// With several partitions, the row that reached the peak (counted
    /// over the whole trace).
    pub(super) peak_row: Option<u64>,
    /// With several partitions: the change of each row of a row group,
    /// the process (its index in the [`ProcessIndex`]) each row's change
    /// belongs to, and each process's share of the live total.
    totals: Vec<i64>,
    whose: Vec<u32>,
    shares: Vec<Share>,
}

impl LiveTotal {
    /// Takes the totals a single partition followed as it replayed.
    pub(super) fn follow(&mut self, p: &Partition) {
        (self.outstanding, self.peak, self.peak_ts) = (p.outstanding, p.peak, p.peak_ts);
    }

    /// Sums the changes several partitions made in a row group whose
    /// rows were made at `ts` per row, then walks the rows in time order
    /// for the peaks. The changes of a row all belong to one process (or
    /// the kernel). The row group's first row is row `base` of the trace.
    pub(super) fn sum(
        &mut self,
        partitions: &mut [Partition],
        ts: &[u64],
        processes: usize,
        base: u64,
    ) {
        let n = ts.len();
        let LiveTotal {
            outstanding,
            peak,
            peak_ts,
            peak_row,
            totals,
            whose,
            shares,
        } = self;
        totals.clear();
        totals.resize(n, 0);
        whose.resize(n, NO_PROCESS);
        // Every process a change names was numbered before the partitions
        // replayed this row group.
        shares.resize(processes + 1, Share::default());
        let shares = &mut shares[..];
        for p in partitions {
            for (i, k, v) in p.deltas.drain(..) {
                totals[i as usize] += v;
                whose[i as usize] = k;
            }
        }
        // A row without changes adds 0 to some process's share (its entry
        // may be left from an earlier row group): no test needed. The
        // kernel's changes go to share 0, which no process has.
        for (i, &x) in totals.iter().enumerate() {
            *outstanding += x;
            if *outstanding > *peak {
                raise(peak, peak_ts, *outstanding, ts[i]);
                *peak_row = Some(base + i as u64);
            }
            let e = &mut shares[whose[i] as usize];
            e.held += x;
            if e.held > e.peak {
                raise(&mut e.peak, &mut e.peak_ts, e.held, ts[i]);
                e.peak_row = Some(base + i as u64);
            }
        }
    }

    /// The peak of each process's share of the live total, by pid, for
    /// the processes that held any.
    pub(super) fn process_peaks(
        &self,
        partitions: &[Partition],
        processes: &ProcessIndex,
    ) -> Vec<ProcessPeak> {
        let peaks: Vec<(u32, i64, u64, Option<u64>)> = match partitions {
            // One partition followed each process's peak as it replayed.
            [p] => p.pids[2..]
                .iter()
                .map(|st| (st.pid, st.peak, st.peak_ts, None))
                .collect(),
            _ => {
                let pids = processes.pids();
                self.shares
                    .iter()
                    .enumerate()
                    .skip(1)
                    .map(|(k, e)| (pids[k - 1], e.peak, e.peak_ts, e.peak_row))
                    .collect()
            }
        };
        let mut peaks: Vec<ProcessPeak> = peaks
            .into_iter()
            .filter(|&(pid, peak, _, _)| pid < NO_PID && peak > 0)
            .map(|(pid, peak, ts, row)| ProcessPeak {
                pid,
                bytes: peak as u64,
                ts,
                row,
            })
            .collect();
        peaks.sort_unstable_by_key(|p| p.pid);
        peaks
    }
}
