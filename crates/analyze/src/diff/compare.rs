//! The comparison of two reports: stacks matched across traces by their
//! symbolized frames ([`stack_key`]), merged per key, and how each
//! changed ([`Diff`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use crate::model::{Frame, Report, StackReport};
use memleak_trace::FrameRow;

/// How stacks are matched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MatchOptions {
    /// Match frames by function and file only: an edit that moves code
    /// (a fix) shifts the lines of everything below it.
    pub ignore_lines: bool,
}

/// What one trace holds under one stack key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Side {
    /// Outstanding bytes.
    pub bytes: u64,
    /// Outstanding allocations.
    pub count: u64,
    /// Stacks of the trace merged under the key.
    pub stacks: u64,
    /// Their processes, ascending (kernel stacks have none).
    pub pids: Vec<u32>,
}

/// One stack key and what both traces hold under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffStack {
    /// The normalized identity of the stack ([`stack_key`]).
    pub key: String,
    /// A kernel stack.
    pub kernel: bool,
    /// The stack may miss outer frames.
    pub truncated: bool,
    /// Frames, innermost first, as recorded in NEW (in BASE when NEW has
    /// nothing outstanding under the key).
    pub frames: Vec<Frame>,
    /// BASE's outstanding allocations.
    pub base: Side,
    /// NEW's outstanding allocations.
    pub new: Side,
}

/// How a stack changed from BASE to NEW.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// More bytes (or, with equal bytes, more allocations) in NEW.
    Grown,
    /// Fewer bytes (or, with equal bytes, fewer allocations) in NEW.
    Shrunk,
    /// The same bytes and allocations.
    Unchanged,
}

impl Change {
    /// Name as the JSON writes it.
    pub fn name(self) -> &'static str {
        match self {
            Change::Grown => "grown",
            Change::Shrunk => "shrunk",
            Change::Unchanged => "unchanged",
        }
    }
}

impl DiffStack {
    /// NEW's bytes minus BASE's.
    pub fn delta_bytes(&self) -> i64 {
        signed(self.new.bytes) - signed(self.base.bytes)
    }

    /// NEW's allocations minus BASE's.
    pub fn delta_count(&self) -> i64 {
        signed(self.new.count) - signed(self.base.count)
    }

    /// Grown, shrunk or unchanged.
    pub fn change(&self) -> Change {
        match (self.delta_bytes(), self.delta_count()) {
            (b, _) if b > 0 => Change::Grown,
            (b, _) if b < 0 => Change::Shrunk,
            (_, c) if c > 0 => Change::Grown,
            (_, c) if c < 0 => Change::Shrunk,
            _ => Change::Unchanged,
        }
    }
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Totals of one side of the diff.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SideSummary {
    /// The trace directory.
    pub trace: String,
    /// Events read.
    pub events: u64,
    /// From the recording's start to the evaluation time (ns).
    pub duration_ns: u64,
    /// Outstanding bytes matching every filter.
    pub outstanding_bytes: u64,
    /// Outstanding allocations matching every filter.
    pub outstanding_allocations: u64,
    /// Stacks of the trace with outstanding allocations.
    pub outstanding_stacks: u64,
    /// Distinct stack keys among them.
    pub keys: u64,
    /// Whether the recording finished cleanly.
    pub complete: bool,
    /// Events the recorder lost, by reason, from meta.json.
    pub lost_by_reason: BTreeMap<String, u64>,
    /// A sampled recording's sampling: its figures are estimates.
    pub sampling: Option<memleak_trace::Sampling>,
}

impl SideSummary {
    /// The trace's lost events sorted by what they mean: those missing
    /// from it make its outstanding figures uncertain.
    pub fn losses(&self) -> memleak_trace::Losses {
        memleak_trace::Losses::of(&self.lost_by_reason)
    }

    fn of(r: &Report, keys: u64) -> SideSummary {
        let s = &r.summary;
        SideSummary {
            trace: s.trace.clone(),
            events: s.events,
            duration_ns: s.duration_ns(),
            outstanding_bytes: s.outstanding_bytes,
            outstanding_allocations: s.outstanding_allocations,
            outstanding_stacks: s.outstanding_stacks,
            keys,
            complete: s.complete,
            lost_by_reason: s.lost_by_reason.clone(),
            sampling: s.sampling,
        }
    }
}

/// Totals of the diff.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiffSummary {
    /// BASE's totals.
    pub base: SideSummary,
    /// NEW's totals.
    pub new: SideSummary,
    /// Keys with more outstanding in NEW.
    pub grown: u64,
    /// Keys with less outstanding in NEW.
    pub shrunk: u64,
    /// Keys with the same bytes and allocations in both.
    pub unchanged: u64,
    /// Keys with outstanding allocations in BASE only (fixed, or gone).
    pub only_in_base: u64,
    /// Keys with outstanding allocations in NEW only (new leaks).
    pub only_in_new: u64,
    /// Frames matched without their lines.
    pub ignore_lines: bool,
    /// The filters in force on both sides, as `name=value`.
    pub filters: Vec<String>,
}

impl DiffSummary {
    /// NEW's outstanding bytes minus BASE's.
    pub fn delta_bytes(&self) -> i64 {
        signed(self.new.outstanding_bytes) - signed(self.base.outstanding_bytes)
    }

    /// NEW's outstanding allocations minus BASE's.
    pub fn delta_allocations(&self) -> i64 {
        signed(self.new.outstanding_allocations) - signed(self.base.outstanding_allocations)
    }

    /// Whether either trace misses events, so the figures of that side,
    /// and the changes, are uncertain.
    pub fn uncertain(&self) -> bool {
        self.base.losses().uncertain() || self.new.losses().uncertain()
    }
}

/// The diff of two analyses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// Totals.
    pub summary: DiffSummary,
    /// Every key with outstanding allocations on either side: grown ones
    /// first (most bytes gained first), then shrunk ones (most bytes lost
    /// first), then unchanged ones (most bytes first); ties by key.
    pub stacks: Vec<DiffStack>,
    /// How many stacks of each change text and JSON show (0: all).
    pub top: usize,
}

impl Diff {
    /// The stacks of one kind of change, in report order, at most `top`.
    pub fn shown(&self, change: Change) -> impl Iterator<Item = &DiffStack> {
        let n = if self.top == 0 { usize::MAX } else { self.top };
        self.stacks
            .iter()
            .filter(move |s| s.change() == change)
            .take(n)
    }

    /// How many stacks changed that way.
    pub fn count(&self, change: Change) -> u64 {
        self.stacks.iter().filter(|s| s.change() == change).count() as u64
    }
}

/// One trace's outstanding allocations by stack key: all [`diff`] needs
/// of a [`Report`]. The command keys the first trace's report and drops it
/// before replaying the second, so the two replays' tables are never held
/// at once.
#[derive(Debug, Clone, Default)]
pub struct Keyed {
    summary: SideSummary,
    filters: Vec<String>,
    opts: MatchOptions,
    stacks: HashMap<String, KeyedStack>,
}

#[derive(Debug, Clone)]
struct KeyedStack {
    kernel: bool,
    truncated: bool,
    frames: Vec<Frame>,
    side: Side,
}

impl Keyed {
    /// Keys the stacks of `report` with outstanding allocations.
    pub fn new(report: &Report, opts: MatchOptions) -> Keyed {
        let mut stacks: HashMap<String, KeyedStack> = HashMap::new();
        for s in report.stacks.iter().filter(|s| s.count > 0) {
            let e = stacks
                .entry(stack_key(s, opts))
                .or_insert_with(|| KeyedStack {
                    kernel: s.kernel,
                    truncated: s.truncated,
                    frames: s.frames.clone(),
                    side: Side::default(),
                });
            e.side.bytes += s.bytes;
            e.side.count += s.count;
            e.side.stacks += 1;
            if let Some(p) = s.pid {
                if let Err(i) = e.side.pids.binary_search(&p) {
                    e.side.pids.insert(i, p);
                }
            }
        }
        Keyed {
            summary: SideSummary::of(report, stacks.len() as u64),
            filters: report.summary.filters.clone(),
            opts,
            stacks,
        }
    }
}

/// Compares the outstanding allocations of `base` and `new`, stack key by
/// stack key. Stacks with nothing outstanding on either side are left out.
pub fn diff(base: &Report, new: &Report, opts: MatchOptions, top: usize) -> Diff {
    diff_keyed(Keyed::new(base, opts), Keyed::new(new, opts), top)
}

/// [`diff`] of two keyed reports (keyed with the same options).
pub fn diff_keyed(base: Keyed, new: Keyed, top: usize) -> Diff {
    let mut by_key: HashMap<String, DiffStack> = base
        .stacks
        .into_iter()
        .map(|(key, k)| {
            let d = DiffStack {
                key: key.clone(),
                kernel: k.kernel,
                truncated: k.truncated,
                frames: k.frames,
                base: k.side,
                new: Side::default(),
            };
            (key, d)
        })
        .collect();
    for (key, k) in new.stacks {
        let e = by_key.entry(key).or_insert_with_key(|key| DiffStack {
            key: key.clone(),
            kernel: k.kernel,
            truncated: k.truncated,
            frames: Vec::new(),
            base: Side::default(),
            new: Side::default(),
        });
        // NEW's frames win: they name the code as it is now.
        e.frames = k.frames;
        e.new = k.side;
    }
    let mut stacks: Vec<DiffStack> = by_key.into_values().collect();
    sort(&mut stacks);
    let mut summary = DiffSummary {
        base: base.summary,
        new: new.summary,
        ignore_lines: base.opts.ignore_lines,
        filters: base.filters,
        ..Default::default()
    };
    for s in &stacks {
        match s.change() {
            Change::Grown => summary.grown += 1,
            Change::Shrunk => summary.shrunk += 1,
            Change::Unchanged => summary.unchanged += 1,
        }
        summary.only_in_base += (s.new.count == 0) as u64;
        summary.only_in_new += (s.base.count == 0) as u64;
    }
    Diff {
        summary,
        stacks,
        top,
    }
}

/// The hint a diff matched by lines deserves when lines moved: `strict`
/// matched frames with their lines, `loose` the same reports without
/// (`ignore_lines`). When at least half of the stacks only in BASE (and at
/// least one) find their match in NEW once lines are ignored, the code
/// most likely moved between the builds, and every stack it holds reads
/// as gone and new again: the hint says so and names `--ignore-lines`.
pub fn moved_lines_hint(strict: &Diff, loose: &Diff) -> Option<String> {
    let gone = strict.summary.only_in_base;
    let rematched = gone.saturating_sub(loose.summary.only_in_base);
    if strict.summary.ignore_lines || rematched == 0 || rematched * 2 < gone {
        return None;
    }
    Some(format!(
        "{rematched} of the {gone} stacks only in BASE match a stack of NEW when line numbers \
         are ignored: if code moved between the two builds, try --ignore-lines"
    ))
}

fn sort(stacks: &mut [DiffStack]) {
    let rank = |c: Change| match c {
        Change::Grown => 0,
        Change::Shrunk => 1,
        Change::Unchanged => 2,
    };
    stacks.sort_unstable_by(|a, b| {
        let (ca, cb) = (a.change(), b.change());
        rank(ca).cmp(&rank(cb)).then_with(|| {
            let by_size = match ca {
                Change::Grown => {
                    (b.delta_bytes(), b.delta_count()).cmp(&(a.delta_bytes(), a.delta_count()))
                }
                Change::Shrunk => {
                    (a.delta_bytes(), a.delta_count()).cmp(&(b.delta_bytes(), b.delta_count()))
                }
                Change::Unchanged => (b.new.bytes, b.new.count).cmp(&(a.new.bytes, a.new.count)),
            };
            by_size.then_with(|| a.key.cmp(&b.key))
        })
    });
}

/// Separates the frames of a key.
pub(crate) const SEP: &str = " | ";

/// The identity of a stack across traces: its frames, innermost first,
/// each as [`frame_key`] makes it, and whether it is a kernel stack and
/// truncated. Addresses, function offsets, columns, stack ids and pids
/// are not part of it.
///
/// A stack with no frames is `[no stack]` (the event had none) or
/// `[missing stack]` (its id is not in the trace's stacks table), whatever
/// its id: ids mean nothing across traces.
pub fn stack_key(s: &StackReport, opts: MatchOptions) -> String {
    let mut key = String::new();
    push_stack_head(
        &mut key,
        s.kernel,
        s.truncated,
        s.frames.is_empty(),
        s.stack_id,
    );
    for (i, f) in s.frames.iter().enumerate() {
        if i > 0 {
            key.push_str(SEP);
        }
        push_frame_key(&mut key, FrameKeyParts::of(f), inlined_parts(f), opts);
    }
    key
}

/// Appends the [`frame_key`] of a row of a trace's frames table to `k`.
pub(crate) fn push_row_key(k: &mut String, f: FrameRow<'_>, opts: MatchOptions) {
    let parts = FrameKeyParts {
        function: f.function(),
        file: f.file(),
        line: f.line(),
        path: f.path(),
        file_offset: f.file_offset(),
    };
    let inlined = f.inlined().map(|i| (i.function, i.file, i.line));
    push_frame_key(k, parts, inlined, opts);
}

/// What leads a stack's key: whether it is a kernel stack and truncated,
/// and for a stack without frames, why it has none.
fn push_stack_head(key: &mut String, kernel: bool, truncated: bool, empty: bool, id: u64) {
    if kernel {
        key.push_str("[kernel]");
        key.push_str(SEP);
    }
    if truncated {
        key.push_str("[truncated]");
        key.push_str(SEP);
    }
    if empty {
        key.push_str(if id == 0 {
            "[no stack]"
        } else {
            "[missing stack]"
        });
    }
}

/// The identity of a frame across traces:
///
/// - a symbolized frame is its function (gcc's clone suffixes such as
///   `.isra.0`, `.constprop.1`, `.part.2`, `.cold` removed: they come and
///   go with the optimizer), the base name of its source file and its line
///   (unless `ignore_lines`), then each inlined function at the address
///   the same way. The source file's directory is left out: it is where
///   the program was built, a temporary directory for many builds.
/// - a frame without a function is its object's base name and its offset
///   in that object (`[libfoo.so+0x1234]`), which stay the same wherever
///   the object is loaded or installed; without an object, `[unknown]`.
///   The object of a symbolized frame is left out: libraries live in
///   different directories on different hosts.
pub fn frame_key(f: &Frame, opts: MatchOptions) -> String {
    let mut k = String::new();
    push_frame_key(&mut k, FrameKeyParts::of(f), inlined_parts(f), opts);
    k
}

/// The fields of a frame its key is made of but its inlined functions,
/// borrowed from a report's frame or a row of a trace's frames table.
#[derive(Default, Clone, Copy)]
struct FrameKeyParts<'a> {
    function: Option<&'a str>,
    file: Option<&'a str>,
    line: Option<u32>,
    path: Option<&'a str>,
    file_offset: Option<u64>,
}

impl<'a> FrameKeyParts<'a> {
    fn of(f: &'a Frame) -> FrameKeyParts<'a> {
        FrameKeyParts {
            function: f.function.as_deref(),
            file: f.file.as_deref(),
            line: f.line,
            path: f.path.as_deref(),
            file_offset: f.file_offset,
        }
    }
}

/// A function inlined at a frame, as its key has it: function, file, line.
type InlinedPart<'a> = (&'a str, Option<&'a str>, Option<u32>);

fn inlined_parts(f: &Frame) -> impl Iterator<Item = InlinedPart<'_>> {
    f.inlined
        .iter()
        .map(|i| (i.function.as_str(), i.file.as_deref(), i.line))
}

/// Appends the [`frame_key`] of `f` to `k`.
fn push_frame_key<'a>(
    k: &mut String,
    f: FrameKeyParts<'_>,
    inlined: impl Iterator<Item = InlinedPart<'a>>,
    opts: MatchOptions,
) {
    match f.function {
        Some(func) => {
            push_location(k, func, f.file, f.line, opts);
        }
        None => match (f.path, f.file_offset) {
            (Some(p), Some(o)) => {
                let _ = write!(k, "[{}+0x{o:x}]", basename(p));
            }
            (Some(p), None) => {
                let _ = write!(k, "[{}]", basename(p));
            }
            (None, _) => k.push_str("[unknown]"),
        },
    }
    for (function, file, line) in inlined {
        k.push_str(" <- ");
        push_location(k, function, file, line, opts);
    }
}

fn push_location(
    k: &mut String,
    func: &str,
    file: Option<&str>,
    line: Option<u32>,
    opts: MatchOptions,
) {
    k.push_str(normalize_function(func));
    if let Some(file) = file {
        k.push_str(" @ ");
        k.push_str(basename(file));
        if let (Some(l), false) = (line, opts.ignore_lines) {
            let _ = write!(k, ":{l}");
        }
    }
}

pub(crate) fn basename(p: &str) -> &str {
    p.rfind('/').map_or(p, |i| &p[i + 1..])
}

/// Suffixes gcc and clang give the copies of a function they make:
/// `f.isra.0`, `f.constprop.3`, `f.part.1`, `f.cold`, `f.lto_priv.0`,
/// `f.llvm.12345`.
const CLONE_TAGS: &[&str] = &[
    "isra",
    "constprop",
    "part",
    "cold",
    "lto_priv",
    "localalias",
    "llvm",
    "specialized",
];

/// The function a compiler's clone was made from: `f.isra.0` -> `f`.
/// Names with other dotted parts are kept whole.
pub fn normalize_function(name: &str) -> &str {
    let Some(dot) = name.find('.') else {
        return name;
    };
    let (base, rest) = (&name[..dot], &name[dot + 1..]);
    let clone_part = |p: &str| {
        CLONE_TAGS.contains(&p) || (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    if !base.is_empty()
        && rest.split('.').all(clone_part)
        && rest.split('.').any(|p| CLONE_TAGS.contains(&p))
    {
        base
    } else {
        name
    }
}

// ---------------------------------------------------------------------
// Text
