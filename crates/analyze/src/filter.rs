//! Which events and allocations a report considers.
//!
//! Filters act in two places. `--pid` and `--kind` select events before
//! replay: user and kernel state, and the state of different processes,
//! never interact, so dropping the rest early is both exact and faster.
//! Size and time-window filters select allocations, not events: a free
//! must still find its block even when the block is filtered out of the
//! report, or it would be miscounted as a free of an unknown address.

use memleak_trace::schema::KindClass;
use memleak_trace::EventKind;

/// User-space events, kernel events, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KindScope {
    /// Both.
    #[default]
    All,
    /// Allocator calls of processes (malloc, new, mmap, …).
    User,
    /// Kernel allocators (kmalloc, kmem_cache, pages, per-CPU).
    Kernel,
    /// Heap allocator calls of processes (malloc, new, …: what valgrind
    /// counts), without their memory mappings.
    Heap,
    /// Memory mappings of processes (mmap, munmap, mremap).
    Mmap,
}

impl KindScope {
    /// Whether events of `kind` are in scope.
    pub fn includes(self, kind: EventKind) -> bool {
        match self {
            KindScope::All => true,
            KindScope::User => !kind.is_kernel(),
            KindScope::Kernel => kind.is_kernel(),
            // Process events (exec, exit, fork) belong to both.
            KindScope::Heap => !kind.is_kernel() && !is_mapping(kind),
            KindScope::Mmap => {
                !kind.is_kernel() && (is_mapping(kind) || kind.class() == KindClass::Process)
            }
        }
    }
}

fn is_mapping(kind: EventKind) -> bool {
    matches!(
        kind.class(),
        KindClass::MapRange | KindClass::UnmapRange | KindClass::RemapRange
    )
}

/// Report filters, with times relative to the start of the trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only these processes (empty: all). Kernel events have no process
    /// and are dropped when this is set.
    pub pids: Vec<u32>,
    /// User, kernel or both.
    pub kind: KindScope,
    /// Only allocations of at least this many bytes.
    pub min_size: Option<u64>,
    /// Only allocations of at most this many bytes.
    pub max_size: Option<u64>,
    /// Only allocations made at or after this time (ns since trace start).
    pub from_ns: Option<u64>,
    /// Only allocations made before this time (ns since trace start).
    pub to_ns: Option<u64>,
    /// Only outstanding allocations at least this old (bcc's `-o`).
    pub older_than_ns: Option<u64>,
}

/// A [`Filter`] with absolute timestamps, as replay applies it.
#[derive(Debug, Clone, Default)]
pub struct ResolvedFilter {
    pids: Vec<u32>,
    kind: KindScope,
    min_size: u64,
    max_size: u64,
    from_ts: u64,
    to_ts: u64,
    older_than_ns: u64,
}

impl Filter {
    /// Turns relative times into trace timestamps.
    pub fn resolve(&self, start_ts: u64) -> ResolvedFilter {
        let mut pids = self.pids.clone();
        pids.sort_unstable();
        pids.dedup();
        ResolvedFilter {
            pids,
            kind: self.kind,
            min_size: self.min_size.unwrap_or(0),
            max_size: self.max_size.unwrap_or(u64::MAX),
            from_ts: self.from_ns.map_or(0, |f| start_ts.saturating_add(f)),
            to_ts: self.to_ns.map_or(u64::MAX, |t| start_ts.saturating_add(t)),
            older_than_ns: self.older_than_ns.unwrap_or(0),
        }
    }

    /// True when nothing is filtered.
    pub fn is_empty(&self) -> bool {
        *self == Filter::default()
    }
}

impl ResolvedFilter {
    /// Whether events of `kind` by `pid` take part in replay.
    #[inline]
    pub fn event_selected(&self, pid: u32, kind: EventKind) -> bool {
        if !self.kind.includes(kind) {
            return false;
        }
        if self.pids.is_empty() {
            return true;
        }
        !kind.is_kernel() && self.pids.binary_search(&pid).is_ok()
    }

    /// Whether events of `kind` take part, whatever their process: kernel
    /// events have no process, so a pid filter drops them.
    #[inline]
    pub fn kind_selected(&self, kind: EventKind) -> bool {
        self.kind.includes(kind) && (self.pids.is_empty() || !kind.is_kernel())
    }

    /// Whether events of process `pid` take part.
    #[inline]
    pub fn pid_selected(&self, pid: u32) -> bool {
        self.pids.is_empty() || self.pids.binary_search(&pid).is_ok()
    }

    /// Whether any process filter is set.
    pub fn has_pids(&self) -> bool {
        !self.pids.is_empty()
    }

    /// Whether an allocation of `size` bytes made at `ts` counts.
    #[inline]
    pub fn alloc_selected(&self, size: u64, ts: u64) -> bool {
        size >= self.min_size && size <= self.max_size && ts >= self.from_ts && ts < self.to_ts
    }

    /// Whether [`ResolvedFilter::alloc_selected`] is true for every size
    /// and every time from `first` to `last`.
    pub fn selects_every_allocation(&self, first: u64, last: u64) -> bool {
        self.min_size == 0
            && self.max_size == u64::MAX
            && self.from_ts <= first
            && last < self.to_ts
    }

    /// The allocations that count at evaluation time `at`, as bounds on
    /// their size and time: `(min_size, max_size, from_ts, to_ts)`, sizes
    /// inclusive, `to_ts` exclusive (`--older-than` moves it earlier).
    pub(crate) fn allocation_bounds(&self, at: u64) -> (u64, u64, u64, u64) {
        let old_enough = match self.older_than_ns {
            0 => u64::MAX,
            o => at.saturating_sub(o).saturating_add(1),
        };
        (
            self.min_size,
            self.max_size,
            self.from_ts,
            self.to_ts.min(old_enough),
        )
    }

    /// Whether an allocation of `size` bytes made at `ts` and still
    /// outstanding at `at` counts.
    #[inline]
    pub fn outstanding_selected(&self, size: u64, ts: u64, at: u64) -> bool {
        self.alloc_selected(size, ts) && at.saturating_sub(ts) >= self.older_than_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_select_as_documented() {
        let f = Filter {
            pids: vec![7, 3],
            kind: KindScope::User,
            min_size: Some(10),
            max_size: Some(100),
            from_ns: Some(1_000),
            to_ns: Some(2_000),
            older_than_ns: Some(500),
        }
        .resolve(10_000);
        assert!(f.event_selected(3, EventKind::Malloc));
        assert!(!f.event_selected(4, EventKind::Malloc));
        assert!(!f.event_selected(3, EventKind::Kmalloc));
        assert!(f.alloc_selected(10, 11_000));
        assert!(!f.alloc_selected(9, 11_000));
        assert!(!f.alloc_selected(101, 11_000));
        assert!(!f.alloc_selected(50, 10_999));
        assert!(!f.alloc_selected(50, 12_000));
        assert!(f.outstanding_selected(50, 11_000, 11_500));
        assert!(!f.outstanding_selected(50, 11_000, 11_499));
        let all = Filter::default().resolve(0);
        assert!(all.event_selected(1, EventKind::Kfree));
        assert!(Filter::default().is_empty());
    }
}
