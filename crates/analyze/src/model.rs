//! The report's types: what an analysis finds ([`Report`]: the
//! [`Summary`] and the outstanding allocations by stack, [`StackReport`])
//! and how its stacks are ordered ([`SortKey`]). The analysis
//! (`analysis.rs`) builds them; the output formats (`report/`) and the
//! diff (`diff/`) read them.

use std::collections::BTreeMap;

use memleak_trace::{InlinedFrame, ScanInfo};
use serde::Serialize;

use crate::fleet::types::{Fleet, StackOrigin};
use crate::growth::{Growth, Timeline};
use crate::histogram::{AgeHistogram, SizeCount, SizeHistogram};
use crate::replay::Anomalies;
pub use crate::verdicts::ClassTotals;
use crate::verdicts::{BlockContents, VerdictTotals};

/// Order of the stacks in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    /// Most outstanding bytes first.
    #[default]
    Bytes,
    /// Most outstanding allocations first.
    Count,
    /// Oldest outstanding allocation first.
    Age,
    /// By growth verdict: growing stacks first, steepest slope first, then
    /// plateaus and unknown by outstanding bytes, then transient stacks
    /// (listed even with nothing outstanding) by their highest sample.
    Growth,
    /// Most temporary allocations first; the stacks shown are those with
    /// temporary allocations, outstanding or not.
    Temporary,
    /// By the scan's worst verdict of each stack (definitely lost first,
    /// unscanned last), then by that verdict's bytes: the grouping of
    /// [`AnalyzeOptions::group_by_verdict`](crate::AnalyzeOptions) with
    /// bytes within each group. Without a scan, as [`SortKey::Bytes`].
    Verdict,
}

impl SortKey {
    /// Name as given on the command line.
    pub fn name(self) -> &'static str {
        match self {
            SortKey::Bytes => "bytes",
            SortKey::Count => "count",
            SortKey::Age => "age",
            SortKey::Growth => "growth",
            SortKey::Temporary => "temporary",
            SortKey::Verdict => "verdict",
        }
    }
}

/// A frame of an inlined chain, innermost first.
pub type Inlined = InlinedFrame;

/// One frame of a stack, symbolized as the recorder left it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frame {
    /// Raw return address.
    pub addr: u64,
    /// Function containing the address (the outermost, non-inlined one).
    pub function: Option<String>,
    /// Offset of the address from the function's start.
    pub offset: Option<u64>,
    /// Source file.
    pub file: Option<String>,
    /// Source line (of the call).
    pub line: Option<u32>,
    /// Source column.
    pub column: Option<u32>,
    /// Object file (executable, library or kernel module).
    pub path: Option<String>,
    /// Offset of the address in the object file.
    pub file_offset: Option<u64>,
    /// Build id of the object file, lowercase hex.
    pub build_id: Option<String>,
    /// Functions inlined at this address, innermost first.
    pub inlined: Vec<Inlined>,
}

/// Outstanding allocations of one stack.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StackReport {
    /// Stack id in the trace (0: the events had no stack).
    pub stack_id: u64,
    /// Process the stack belongs to (`None` for kernel stacks or unknown).
    pub pid: Option<u32>,
    /// A kernel stack.
    pub kernel: bool,
    /// The stack may miss outer frames.
    pub truncated: bool,
    /// Whether the stack id was found in the stacks table.
    pub known: bool,
    /// Outstanding bytes.
    pub bytes: u64,
    /// Outstanding allocations.
    pub count: u64,
    /// Of `bytes`, those of memory mappings (`mmap`) rather than heap
    /// blocks.
    pub mapped_bytes: u64,
    /// Of `count`, the mappings.
    pub mapped_count: u64,
    /// Timestamp of the oldest outstanding allocation.
    pub oldest_ts: Option<u64>,
    /// Age of the oldest outstanding allocation at the evaluation time.
    pub oldest_age_ns: u64,
    /// Bytes allocated by the stack during the trace, freed or not.
    pub allocated_bytes: u64,
    /// Allocations made by the stack during the trace, freed or not.
    pub allocations: u64,
    /// Of `allocations`, the temporary ones (see [`behaviour`](crate::behaviour)).
    pub temporary: u64,
    /// Sizes of `allocations`, non-empty log2 buckets, smallest first.
    pub allocation_sizes: Vec<SizeCount>,
    /// Ages of the outstanding allocations.
    pub age_histogram: AgeHistogram,
    /// Frames, innermost first.
    pub frames: Vec<Frame>,
    /// How the stack's outstanding bytes evolved (`None`: not computed).
    pub growth: Option<Growth>,
    /// `bytes` and `count` by scan verdict, when a scan applies to the
    /// report.
    pub verdicts: Option<VerdictTotals>,
    /// The first bytes of a few lost blocks (worst verdict, then lowest
    /// address first), when the recording kept them.
    pub contents: Vec<BlockContents>,
    /// In a report of several traces: which traces hold the stack, and
    /// which one its id, pid and addresses are from.
    pub origin: Option<Box<StackOrigin>>,
}

impl StackReport {
    /// Whether text and JSON list the stack when sorted by `key`: it has
    /// allocations outstanding, or, sorted by growth, its verdict is
    /// transient (held memory for a while, then freed it).
    pub fn shown(&self, key: SortKey) -> bool {
        self.count > 0
            || (key == SortKey::Temporary && self.temporary > 0)
            || (key == SortKey::Growth
                && self
                    .growth
                    .as_ref()
                    .is_some_and(|g| g.verdict == crate::growth::Verdict::Transient))
    }
}

/// What the scans say about the outstanding allocations: memcheck's
/// LEAK SUMMARY.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeakSummary {
    /// The scans whose verdicts apply: per process, the last successful
    /// one at or before the evaluation time.
    pub scans: Vec<ScanInfo>,
    /// Outstanding bytes and allocations by verdict, every verdict (not
    /// only those `--verdict` selects), without suppressed blocks.
    pub totals: VerdictTotals,
}

/// Blocks one suppression (by name) left out of the report.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct SuppressedTotals {
    /// The suppression's name.
    pub name: String,
    /// Bytes.
    pub bytes: u64,
    /// Allocations.
    pub allocations: u64,
}

/// [`Summary::outstanding_by_class`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OutstandingByClass {
    /// Heap blocks of processes: malloc, new and the rest.
    pub heap: ClassTotals,
    /// Memory mappings of processes (`mmap`).
    pub mapped: ClassTotals,
    /// Kernel allocations.
    pub kernel: ClassTotals,
}

/// Totals of the whole analysis.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    /// The trace directory.
    pub trace: String,
    /// How allocator calls were captured (meta.json `capture`: `bpf` or
    /// `preload`); `None` for traces that do not say.
    pub capture: Option<String>,
    /// `record --sample`'s sampling (meta.json `sampling`): the heap's
    /// bytes and blocks are estimates, each recorded block scaled by the
    /// inverse of its chance of being recorded. `None`: every call was
    /// recorded.
    pub sampling: Option<memleak_trace::Sampling>,
    /// Timestamp the relative times count from: recording start.
    pub start_ts: u64,
    /// Timestamp at which the state is evaluated and ages measured: the
    /// end of the recording, or `--at`.
    pub eval_ts: u64,
    /// Whether `eval_ts` comes from `--at`.
    pub at_given: bool,
    /// With `--at peak`: the peak the state is evaluated at.
    pub at_peak: Option<AtPeak>,
    /// Events read, by kind name (before filters).
    pub events_by_kind: BTreeMap<String, u64>,
    /// Events read.
    pub events: u64,
    /// Allocations replayed (within filters on pid and kind).
    pub allocations: u64,
    /// Frees that released a tracked block.
    pub frees: u64,
    /// Bytes allocated.
    pub allocated_bytes: u64,
    /// Bytes freed.
    pub freed_bytes: u64,
    /// Outstanding bytes matching every filter.
    pub outstanding_bytes: u64,
    /// Outstanding allocations matching every filter.
    pub outstanding_allocations: u64,
    /// Stacks with outstanding allocations matching every filter.
    pub outstanding_stacks: u64,
    /// The outstanding bytes and allocations split by what holds them:
    /// heap blocks of processes (what valgrind counts), their memory
    /// mappings, and the kernel's.
    pub outstanding_by_class: OutstandingByClass,
    /// Highest outstanding bytes of the processes alive at the time and
    /// of the kernel (within filters on pid and kind): a process's blocks
    /// stop counting when it exits, though they stay outstanding.
    pub peak_bytes: u64,
    /// When, in ns since `start_ts`.
    pub peak_ns: u64,
    /// The peak of each process, most bytes first (ties by pid): the
    /// selected processes only, when `--pid` is given.
    pub process_peaks: Vec<PidPeak>,
    /// Anomalies found while replaying.
    pub anomalies: Anomalies,
    /// Events the recorder lost, by reason, from meta.json.
    pub lost_by_reason: BTreeMap<String, u64>,
    /// User stacks the recorder cut before data the frame-pointer walk
    /// read as return addresses (`cut_stacks` of meta.json; `None` when
    /// the trace does not say).
    pub cut_stacks: Option<u64>,
    /// Ages of every outstanding allocation matching the filters.
    pub age_histogram: AgeHistogram,
    /// Temporary allocations among those the filters select.
    pub temporary_allocations: u64,
    /// The threshold of temporary allocations, ns.
    pub temporary_threshold_ns: u64,
    /// Sizes of the allocations the filters select.
    pub allocation_sizes: SizeHistogram,
    /// Sizes of the outstanding allocations matching every filter.
    pub outstanding_sizes: SizeHistogram,
    /// The span, ns, allocation rates are measured over
    /// ([`behaviour::rate_interval`](crate::behaviour::rate_interval)).
    pub rate_interval_ns: u64,
    /// Whether the recording finished cleanly.
    pub complete: bool,
    /// For a recording that did not: what is known to be missing.
    pub incomplete: Option<memleak_trace::Incomplete>,
    /// The filters in force, as `name=value`.
    pub filters: Vec<String>,
    /// Verdicts of the trace's scans, when one applies to the report.
    pub leak: Option<LeakSummary>,
    /// Why the trace's scans do not apply (e.g. `--at` before them).
    pub scan_note: Option<String>,
    /// What suppressions left out, by name, most bytes first (names with
    /// nothing suppressed are not listed).
    pub suppressed: Vec<SuppressedTotals>,
    /// Sort order of the stacks.
    pub sort: SortKey,
    /// Whether the stacks are grouped by their worst verdict before
    /// `sort` orders each group (`--group-by verdict`, or `--sort
    /// verdict`; only when a scan applies).
    pub group_by_verdict: bool,
}

/// The peak an `--at peak` report shows the state at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct AtPeak {
    /// The process whose peak it is; `None`: the live total's.
    pub pid: Option<u32>,
    /// Its bytes.
    pub bytes: u64,
    /// When it was first reached, in ns since `start_ts`.
    pub ns: u64,
}

/// The peak of one process's outstanding bytes while it was alive: the
/// blocks it allocated itself (in its current program image) and had not
/// freed. What it inherited at fork counts for its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PidPeak {
    /// Process id.
    pub pid: u32,
    /// Highest outstanding bytes.
    pub peak_bytes: u64,
    /// When first reached, in ns since `start_ts`.
    pub peak_ns: u64,
}

impl Summary {
    /// The order of the stacks as the reports' headers say it:
    /// `by bytes`, `by verdict (definitely lost first), then by count`.
    pub fn order(&self) -> String {
        let key = match self.sort {
            SortKey::Verdict => SortKey::Bytes,
            k => k,
        };
        if self.group_by_verdict {
            format!("by verdict (definitely lost first), then by {}", key.name())
        } else {
            format!("by {}", key.name())
        }
    }

    /// What a sampled trace's figures are, for every report's header:
    /// `None` when every call was recorded.
    pub fn sampling_note(&self) -> Option<String> {
        self.sampling.map(|s| {
            format!(
                "sampled recording (record --sample {}): heap bytes and blocks are estimates, \
                 each recorded allocation of s bytes scaled by 1/(1-exp(-s/{}))",
                crate::time::format_bytes(s.mean_bytes),
                s.mean_bytes
            )
        })
    }

    /// Time span from start to the evaluation time.
    pub fn duration_ns(&self) -> u64 {
        self.eval_ts.saturating_sub(self.start_ts)
    }

    /// Sum of lost events.
    pub fn lost_total(&self) -> u64 {
        self.lost_by_reason.values().sum()
    }

    /// The lost events sorted by what they mean for the report: those
    /// missing from the trace make the outstanding figures uncertain.
    pub fn losses(&self) -> memleak_trace::Losses {
        memleak_trace::Losses::of(&self.lost_by_reason)
    }
}

/// The analysis of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// Totals.
    pub summary: Summary,
    /// Every stack that allocated (within filters), sorted by the sort key;
    /// stacks with nothing outstanding come last.
    pub stacks: Vec<StackReport>,
    /// How many stacks text and JSON show (0: all).
    pub top: usize,
    /// Outstanding bytes in total over time (`None`: not computed).
    pub timeline: Option<Timeline>,
    /// In a report of several traces: each trace's totals, grouped.
    pub fleet: Option<Box<Fleet>>,
    /// What the analysis built and the report no longer needs.
    pub(crate) spent: Spent,
}

/// What an analysis built on the way to its [`Report`] (the replay's
/// tables of outstanding blocks, the stacks and frames tables), kept by
/// the report and freed with it rather than before it is returned: a
/// caller that exits once the report is written can skip freeing it. The
/// frames table alone is tens of thousands of small strings, whose
/// freeing showed in the bench trace's wall time. Not part of the report's
/// value: every `Spent` equals every other.
#[derive(Clone, Default)]
pub(crate) struct Spent(
    // Held to be dropped with the report, never read.
    #[allow(dead_code)] pub(crate) Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
);

impl std::fmt::Debug for Spent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Spent")
    }
}

impl PartialEq for Spent {
    fn eq(&self, _: &Spent) -> bool {
        true
    }
}

impl Eq for Spent {}

impl Report {
    /// The stacks text and JSON show: those with outstanding allocations,
    /// at most `top` of them.
    pub fn top_stacks(&self) -> &[StackReport] {
        let sort = self.summary.sort;
        let leaking = self.stacks.iter().take_while(|s| s.shown(sort)).count();
        let n = if self.top == 0 {
            leaking
        } else {
            leaking.min(self.top)
        };
        &self.stacks[..n]
    }
}
