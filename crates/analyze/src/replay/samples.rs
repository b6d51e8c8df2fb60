//! Outstanding bytes by stack sampled at the end of fixed windows, for
//! the growth verdicts (`crate::growth`): each partition keeps the bytes
//! each stack has outstanding now (among the allocations the filters
//! select), and copies the stacks' nonzero values into their rows when
//! replay passes a window's end. Nothing is kept per event: memory is a
//! counter per stack and a row of samples per stack that held anything
//! at a window's end.

use crate::hash::{int_map, IntMap};
use crate::table::Block;

/// What to sample and when, the same for every partition.
#[derive(Debug, Clone, Default)]
pub struct GrowthPlan {
    /// Timestamp window 0 starts at.
    pub start_ts: u64,
    /// Length of a window, in ns (at least 1).
    pub window_ns: u64,
    /// Number of windows (at least 1). The last one ends with the replay,
    /// whatever its nominal end.
    pub windows: usize,
    /// The processes whose allocations count (empty: all). Ancestors
    /// replayed for what they passed on at fork are left out.
    pub pids: Vec<u32>,
    /// Processes whose copies of their parent's blocks count (selected
    /// without their parent).
    pub inherited_for: Vec<u32>,
    /// Allocations of `min_size..=max_size` bytes made in `from_ts..to_ts`
    /// count.
    pub min_size: u64,
    /// See `min_size`.
    pub max_size: u64,
    /// See `min_size`.
    pub from_ts: u64,
    /// See `min_size` (exclusive).
    pub to_ts: u64,
}

/// Stack ids below this have their counter in a flat array.
const DENSE_STACKS: u64 = 1 << 20;

/// A row of samples, one per window.
pub(crate) type Row = Box<[u64]>;

/// The sampling of one partition.
pub(crate) struct Sampler {
    plan: Option<std::sync::Arc<GrowthPlan>>,
    /// The plan's allocation filter, here to save a load: sizes, then
    /// times.
    sizes: (u64, u64),
    times: (u64, u64),
    /// Replay passed the end of window `taken - 1` when an event after
    /// `next` comes (u64::MAX: no more windows to end before the last).
    next: u64,
    taken: usize,
    now_dense: Vec<i64>,
    now_sparse: IntMap<u64, i64>,
    rows_dense: Vec<Option<Row>>,
    rows_sparse: IntMap<u64, Row>,
    totals: Vec<u64>,
}

impl Sampler {
    pub(crate) fn new(plan: Option<std::sync::Arc<GrowthPlan>>) -> Self {
        let next = match &plan {
            Some(p) if p.windows > 1 => p.start_ts.saturating_add(p.window_ns),
            _ => u64::MAX,
        };
        let windows = plan.as_ref().map_or(0, |p| p.windows);
        let (sizes, times) = match &plan {
            Some(p) => ((p.min_size, p.max_size), (p.from_ts, p.to_ts)),
            None => ((0, 0), (0, 0)),
        };
        Sampler {
            plan,
            sizes,
            times,
            next,
            taken: 0,
            now_dense: Vec::new(),
            now_sparse: int_map(),
            rows_dense: Vec::new(),
            rows_sparse: int_map(),
            totals: vec![0; windows],
        }
    }

    /// Whether allocations of process `pid` (`None`: the kernel's) count,
    /// and whether its inherited copies do.
    pub(crate) fn counts_pid(&self, pid: Option<u32>) -> (bool, bool) {
        let Some(p) = &self.plan else {
            return (false, false);
        };
        match pid {
            None => (p.pids.is_empty(), false),
            Some(pid) => (
                p.pids.is_empty() || p.pids.contains(&pid),
                p.inherited_for.contains(&pid),
            ),
        }
    }

    /// Ends the windows that end before `ts`.
    #[inline(always)]
    pub(crate) fn tick(&mut self, ts: u64) {
        if ts > self.next {
            self.end_windows(ts);
        }
    }

    #[cold]
    #[inline(never)]
    fn end_windows(&mut self, ts: u64) {
        let Some(plan) = self.plan.clone() else {
            return;
        };
        let last = plan.windows - 1;
        while self.taken < last && ts > self.next {
            self.take(self.taken);
            self.taken += 1;
            self.next = if self.taken < last {
                self.next.saturating_add(plan.window_ns)
            } else {
                u64::MAX
            };
        }
    }

    /// Copies the current values into window `w`'s samples.
    fn take(&mut self, w: usize) {
        let windows = self.totals.len();
        let mut total = 0u64;
        for (stack, &v) in self.now_dense.iter().enumerate() {
            if v > 0 {
                let row = self.rows_dense[stack].get_or_insert_with(|| zero_row(windows));
                row[w] = v as u64;
                total += v as u64;
            }
        }
        for (&stack, &v) in &self.now_sparse {
            if v > 0 {
                let row = self
                    .rows_sparse
                    .entry(stack)
                    .or_insert_with(|| zero_row(windows));
                row[w] = v as u64;
                total += v as u64;
            }
        }
        self.totals[w] = total;
    }

    /// Whether `b` counts, in a process that counts (`pid_counts`),
    /// forked at `born_ts`, whose inherited copies count or not.
    #[inline(always)]
    pub(crate) fn selects(
        &self,
        b: &Block,
        (pid_counts, inherited): (bool, bool),
        born_ts: u64,
    ) -> bool {
        // A process counts only when there is a plan.
        pid_counts
            && b.size >= self.sizes.0
            && b.size <= self.sizes.1
            && b.ts >= self.times.0
            && b.ts < self.times.1
            && (b.ts >= born_ts || inherited)
    }

    /// Adds (`sign` 1) or takes off (-1) `b`, of a process with `sampled`
    /// flags forked at `born_ts`, if it counts.
    #[inline(always)]
    pub(crate) fn count(&mut self, b: &Block, sampled: (bool, bool), born_ts: u64, sign: i64) {
        if self.selects(b, sampled, born_ts) {
            self.add(b.stack, sign * b.size as i64);
        }
    }

    /// Adds `d` bytes to what `stack` has outstanding.
    #[inline(always)]
    pub(crate) fn add(&mut self, stack: u64, d: i64) {
        match self.now_dense.get_mut(stack as usize) {
            Some(v) => *v += d,
            None => self.add_slow(stack, d),
        }
    }

    #[cold]
    fn add_slow(&mut self, stack: u64, d: i64) {
        if stack < DENSE_STACKS {
            let len = (stack as usize + 1)
                .next_power_of_two()
                .min(DENSE_STACKS as usize);
            self.now_dense.resize(len, 0);
            self.rows_dense.resize_with(len, || None);
            self.now_dense[stack as usize] += d;
        } else {
            *self.now_sparse.entry(stack).or_insert(0) += d;
        }
    }

    /// Ends the windows not ended yet with the state at the end of
    /// replay; returns the rows by stack and the totals.
    pub(crate) fn finish(mut self) -> (IntMap<u64, Row>, Vec<u64>) {
        for w in self.taken..self.totals.len() {
            self.take(w);
        }
        let mut rows = std::mem::take(&mut self.rows_sparse);
        for (stack, row) in self.rows_dense.into_iter().enumerate() {
            if let Some(row) = row {
                rows.insert(stack as u64, row);
            }
        }
        (rows, self.totals)
    }
}

fn zero_row(windows: usize) -> Row {
    vec![0u64; windows].into_boxed_slice()
}
