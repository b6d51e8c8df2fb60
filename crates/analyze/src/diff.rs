//! `memleak diff BASE NEW`: the outstanding allocations of two analyses,
//! stack by stack, and how they changed ("did my fix work?").
//!
//! This module owns the matching of stacks across traces and the diff's
//! renderers (text, JSON, folded and SVG differential flamegraphs). The two
//! [`Report`]s come from the ordinary analysis, with the same options, so
//! every filter means what it means for `analyze`.
//!
//! Two traces rarely share addresses, stack ids or pids: the program may
//! be rebuilt, run on another host, or just loaded elsewhere. A stack is
//! therefore identified by its symbolized frames only (see [`stack_key`]),
//! and the stacks of one trace with the same key (several processes of
//! one program, or stacks that differ only in what the key ignores) are
//! merged before the two sides are compared.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::Serialize;

use crate::model::{Frame, Report, StackReport};
use crate::time::format_bytes;

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
const SEP: &str = " | ";

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
    if s.kernel {
        key.push_str("[kernel]");
        key.push_str(SEP);
    }
    if s.truncated {
        key.push_str("[truncated]");
        key.push_str(SEP);
    }
    if s.frames.is_empty() {
        key.push_str(if s.stack_id == 0 {
            "[no stack]"
        } else {
            "[missing stack]"
        });
    }
    for (i, f) in s.frames.iter().enumerate() {
        if i > 0 {
            key.push_str(SEP);
        }
        key.push_str(&frame_key(f, opts));
    }
    key
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
    match &f.function {
        Some(func) => {
            push_location(&mut k, func, f.file.as_deref(), f.line, opts);
        }
        None => match (&f.path, f.file_offset) {
            (Some(p), Some(o)) => {
                let _ = write!(k, "[{}+0x{o:x}]", basename(p));
            }
            (Some(p), None) => {
                let _ = write!(k, "[{}]", basename(p));
            }
            (None, _) => k.push_str("[unknown]"),
        },
    }
    for inl in &f.inlined {
        k.push_str(" <- ");
        push_location(&mut k, &inl.function, inl.file.as_deref(), inl.line, opts);
    }
    k
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

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
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

/// Renders the text diff: grown stacks, then shrunk ones (at most `top`
/// of each), then the summary.
pub fn render_text(d: &Diff) -> String {
    let mut out = String::new();
    let s = &d.summary;
    for (side, t) in [("BASE", &s.base), ("NEW", &s.new)] {
        if !t.complete {
            let _ = writeln!(
                out,
                "WARNING: the {side} recording is incomplete (recorder killed or still running).\n"
            );
        }
    }
    for (side, t) in [("BASE", &s.base), ("NEW", &s.new)] {
        if let Some(w) = t.losses().warning() {
            let _ = writeln!(out, "WARNING: in the {side} recording, {w}.\n");
        }
    }
    for (change, title, order) in [
        (Change::Grown, "Grown", "most growth first"),
        (Change::Shrunk, "Shrunk", "largest decrease first"),
    ] {
        let total = d.count(change);
        if total == 0 {
            let _ = writeln!(out, "{title}: no stacks.\n");
            continue;
        }
        let shown: Vec<&DiffStack> = d.shown(change).collect();
        let _ = writeln!(
            out,
            "{title}: {} of {} {}, {order}:\n",
            shown.len(),
            total,
            if total == 1 { "stack" } else { "stacks" }
        );
        for st in shown {
            render_stack(&mut out, st);
            out.push('\n');
        }
    }
    let same = d.count(Change::Unchanged);
    if same > 0 {
        let _ = writeln!(
            out,
            "Unchanged: {}, the same bytes and allocations in both (listed by --format json).\n",
            plural(same, "stack")
        );
    }
    render_summary(&mut out, d);
    out
}

fn signed_bytes(v: i64) -> String {
    let mag = v.unsigned_abs();
    let sign = if v < 0 { "-" } else { "+" };
    if mag < 1024 {
        format!("{sign}{mag} bytes")
    } else {
        format!("{sign}{mag} bytes ({sign}{})", format_bytes(mag))
    }
}

fn signed_count(v: i64) -> String {
    let word = if v.unsigned_abs() == 1 {
        "allocation"
    } else {
        "allocations"
    };
    if v < 0 {
        format!("{v} {word}")
    } else {
        format!("+{v} {word}")
    }
}

fn render_stack(out: &mut String, st: &DiffStack) {
    let mut tags = Vec::new();
    if st.base.count == 0 {
        tags.push("new stack".to_string());
    }
    if st.new.count == 0 {
        tags.push("gone in NEW".to_string());
    }
    if st.kernel {
        tags.push("kernel".to_string());
    }
    let tags = if tags.is_empty() {
        String::new()
    } else {
        format!(" [{}]", tags.join(", "))
    };
    let _ = writeln!(
        out,
        "{}, {}: {} -> {} bytes in {} -> {} allocations{tags}",
        signed_bytes(st.delta_bytes()),
        signed_count(st.delta_count()),
        st.base.bytes,
        st.new.bytes,
        st.base.count,
        st.new.count,
    );
    let mut lines: Vec<(usize, String, String)> = Vec::new();
    for (i, f) in st.frames.iter().enumerate() {
        for inl in &f.inlined {
            lines.push((
                i,
                format!("{} [inlined]", inl.function),
                location(inl.file.as_deref(), inl.line),
            ));
        }
        let name = f.function.clone().unwrap_or_else(|| "??".into());
        let mut loc = location(f.file.as_deref(), f.line);
        if f.function.is_none() || loc.is_empty() {
            let obj = crate::text::object_loc(f);
            loc = if loc.is_empty() {
                obj
            } else {
                format!("{loc} {obj}")
            };
        }
        lines.push((i, name, loc));
    }
    let width = lines
        .iter()
        .map(|l| l.1.chars().count())
        .max()
        .unwrap_or(0)
        .min(60);
    for (i, name, loc) in &lines {
        let head = format!("    #{i:<3} {name:<width$}");
        if loc.is_empty() {
            let _ = writeln!(out, "{}", head.trim_end());
        } else {
            let _ = writeln!(out, "{head}  {loc}");
        }
    }
    if st.frames.is_empty() {
        let _ = writeln!(out, "    {}", st.key);
    } else if st.truncated {
        out.push_str("    [truncated: outer frames missing]\n");
    }
}

fn location(file: Option<&str>, line: Option<u32>) -> String {
    match (file, line) {
        (Some(f), Some(l)) => format!("{f}:{l}"),
        (Some(f), None) => f.to_string(),
        _ => String::new(),
    }
}

fn plural(n: u64, one: &str) -> String {
    format!("{n} {one}{}", if n == 1 { "" } else { "s" })
}

fn render_summary(out: &mut String, d: &Diff) {
    let s = &d.summary;
    out.push_str("Summary\n");
    let mut row = |k: &str, v: String| {
        let _ = writeln!(out, "  {k:<18}{v}");
    };
    row("base", s.base.trace.clone());
    row("new", s.new.trace.clone());
    for (name, t) in [("base outstanding", &s.base), ("new outstanding", &s.new)] {
        row(
            name,
            format!(
                "{} bytes in {}, {} ({} distinct)",
                t.outstanding_bytes,
                plural(t.outstanding_allocations, "allocation"),
                plural(t.outstanding_stacks, "stack"),
                t.keys
            ),
        );
    }
    row(
        "change",
        format!(
            "{}, {}",
            signed_bytes(s.delta_bytes()),
            signed_count(s.delta_allocations())
        ),
    );
    row(
        "stacks",
        format!(
            "{} grown, {} shrunk, {} unchanged; {} only in base, {} only in new",
            s.grown, s.shrunk, s.unchanged, s.only_in_base, s.only_in_new
        ),
    );
    row(
        "matched by",
        if s.ignore_lines {
            "function and source file (lines ignored)".into()
        } else {
            "function, source file and line".into()
        },
    );
    if !s.filters.is_empty() {
        row("filters", s.filters.join(", "));
    }
}

// ---------------------------------------------------------------------
// JSON

#[derive(Serialize)]
struct DocJson<'a> {
    version: u32,
    report: &'static str,
    summary: SummaryJson<'a>,
    stacks: Vec<StackJson<'a>>,
}

#[derive(Serialize)]
struct SideSummaryJson<'a> {
    trace: &'a str,
    complete: bool,
    uncertain: bool,
    lost_events: crate::json::LostJson<'a>,
    events: u64,
    duration_ns: u64,
    outstanding_bytes: u64,
    outstanding_allocations: u64,
    outstanding_stacks: u64,
    keys: u64,
}

#[derive(Serialize)]
struct SummaryJson<'a> {
    uncertain: bool,
    base: SideSummaryJson<'a>,
    new: SideSummaryJson<'a>,
    delta_bytes: i64,
    delta_allocations: i64,
    grown: u64,
    shrunk: u64,
    unchanged: u64,
    only_in_base: u64,
    only_in_new: u64,
    match_lines: bool,
    filters: &'a [String],
    stacks_shown: usize,
}

#[derive(Serialize)]
struct SideJson<'a> {
    bytes: u64,
    count: u64,
    stacks: u64,
    pids: &'a [u32],
}

#[derive(Serialize)]
struct StackJson<'a> {
    change: &'static str,
    delta_bytes: i64,
    delta_count: i64,
    base: SideJson<'a>,
    new: SideJson<'a>,
    kernel: bool,
    truncated: bool,
    key: &'a str,
    frames: Vec<FrameJson<'a>>,
}

#[derive(Serialize)]
struct InlinedJson<'a> {
    function: &'a str,
    file: Option<&'a str>,
    line: Option<u32>,
}

#[derive(Serialize)]
struct FrameJson<'a> {
    function: Option<&'a str>,
    file: Option<&'a str>,
    line: Option<u32>,
    path: Option<&'a str>,
    file_offset: Option<u64>,
    inlined: Vec<InlinedJson<'a>>,
}

fn side_summary(t: &SideSummary) -> SideSummaryJson<'_> {
    SideSummaryJson {
        trace: &t.trace,
        complete: t.complete,
        uncertain: t.losses().uncertain(),
        lost_events: crate::json::LostJson::of(&t.lost_by_reason),
        events: t.events,
        duration_ns: t.duration_ns,
        outstanding_bytes: t.outstanding_bytes,
        outstanding_allocations: t.outstanding_allocations,
        outstanding_stacks: t.outstanding_stacks,
        keys: t.keys,
    }
}

fn side(s: &Side) -> SideJson<'_> {
    SideJson {
        bytes: s.bytes,
        count: s.count,
        stacks: s.stacks,
        pids: &s.pids,
    }
}

fn stack_json(s: &DiffStack) -> StackJson<'_> {
    StackJson {
        change: s.change().name(),
        delta_bytes: s.delta_bytes(),
        delta_count: s.delta_count(),
        base: side(&s.base),
        new: side(&s.new),
        kernel: s.kernel,
        truncated: s.truncated,
        key: &s.key,
        frames: s
            .frames
            .iter()
            .map(|f| FrameJson {
                function: f.function.as_deref(),
                file: f.file.as_deref(),
                line: f.line,
                path: f.path.as_deref(),
                file_offset: f.file_offset,
                inlined: f
                    .inlined
                    .iter()
                    .map(|i| InlinedJson {
                        function: &i.function,
                        file: i.file.as_deref(),
                        line: i.line,
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Renders the JSON diff (schema in `docs/json.md`), pretty-printed, with
/// a final newline: grown, shrunk and unchanged stacks, at most `top` of
/// each.
pub fn render_json(d: &Diff) -> String {
    let s = &d.summary;
    let stacks: Vec<StackJson> = [Change::Grown, Change::Shrunk, Change::Unchanged]
        .into_iter()
        .flat_map(|c| d.shown(c))
        .map(stack_json)
        .collect();
    let doc = DocJson {
        version: crate::json::JSON_VERSION,
        report: "diff",
        summary: SummaryJson {
            uncertain: s.uncertain(),
            base: side_summary(&s.base),
            new: side_summary(&s.new),
            delta_bytes: s.delta_bytes(),
            delta_allocations: s.delta_allocations(),
            grown: s.grown,
            shrunk: s.shrunk,
            unchanged: s.unchanged,
            only_in_base: s.only_in_base,
            only_in_new: s.only_in_new,
            match_lines: !s.ignore_lines,
            filters: &s.filters,
            stacks_shown: stacks.len(),
        },
        stacks,
    };
    serde_json::to_string_pretty(&doc).expect("diff serializes") + "\n"
}

// ---------------------------------------------------------------------
// Differential flamegraph

/// What the widths of a differential flamegraph measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiffWeight {
    /// Outstanding bytes.
    #[default]
    Bytes,
    /// Outstanding allocations.
    Count,
}

impl DiffWeight {
    fn of(self, s: &Side) -> u64 {
        match self {
            DiffWeight::Bytes => s.bytes,
            DiffWeight::Count => s.count,
        }
    }

    fn unit(self) -> &'static str {
        match self {
            DiffWeight::Bytes => "bytes",
            DiffWeight::Count => "allocations",
        }
    }
}

/// The folded path of a key's frames, outermost first: the normalized
/// function names (so both sides fold alike), inlined ones marked `_[i]`,
/// kernel ones `_[k]`.
fn folded_path(s: &DiffStack) -> String {
    if s.frames.is_empty() {
        return s.key.replace(SEP, ";");
    }
    let suffix = if s.kernel { "_[k]" } else { "" };
    let mut names: Vec<String> = Vec::new();
    if s.truncated {
        names.push("[truncated]".into());
    }
    let clean = |n: &str| n.replace(';', ":").replace(['\n', '\r'], " ");
    for f in s.frames.iter().rev() {
        let name = match &f.function {
            Some(func) => normalize_function(func).to_string(),
            None => frame_key(
                &Frame {
                    inlined: Vec::new(),
                    ..f.clone()
                },
                MatchOptions::default(),
            ),
        };
        names.push(format!("{}{suffix}", clean(&name)));
        for inl in f.inlined.iter().rev() {
            names.push(format!("{}_[i]", clean(normalize_function(&inl.function))));
        }
    }
    names.join(";")
}

fn one_side(d: &Diff, weight: DiffWeight, base: bool) -> String {
    let mut out = String::new();
    for s in &d.stacks {
        let w = weight.of(if base { &s.base } else { &s.new });
        if w > 0 {
            let _ = writeln!(out, "{} {w}", folded_path(s));
        }
    }
    out
}

/// The two-column folded stacks of a differential flamegraph
/// (`path base new`), made by inferno's differential mode from each side's
/// folded stacks; sorted by path.
pub fn render_folded(d: &Diff, weight: DiffWeight) -> String {
    differential(d, weight, false)
}

/// `render_folded`, or with the columns swapped (`path new base`).
fn differential(d: &Diff, weight: DiffWeight, swapped: bool) -> String {
    let (base, new) = (one_side(d, weight, true), one_side(d, weight, false));
    let (first, second) = if swapped { (new, base) } else { (base, new) };
    let mut out = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options::default(),
        first.as_bytes(),
        second.as_bytes(),
        &mut out,
    )
    .expect("writing to memory");
    let text = String::from_utf8(out).expect("folded stacks are UTF-8");
    // inferno writes them in hash order.
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    let mut sorted = lines.join("\n");
    if !sorted.is_empty() {
        sorted.push('\n');
    }
    sorted
}

/// Draws the differential flamegraph with inferno: widths are NEW's
/// (BASE's with `base_widths`, so that what NEW freed shows), colors the
/// change (red grown, blue shrunk) either way.
pub fn render_svg(d: &Diff, weight: DiffWeight, base_widths: bool) -> std::io::Result<Vec<u8>> {
    use inferno::flamegraph::{self, Options};
    let name = |t: &str| {
        std::path::Path::new(t)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| t.to_string())
    };
    let title = format!(
        "memleak diff: {} -> {}, by outstanding {}",
        name(&d.summary.base.trace),
        name(&d.summary.new.trace),
        weight.unit()
    );
    let folded = differential(d, weight, base_widths);
    if folded.is_empty() {
        return Ok(crate::svg::empty_svg(&title).into_bytes());
    }
    let mut opts = Options::default();
    opts.title = title;
    let widths = if base_widths { "BASE" } else { "NEW" };
    let mut subtitle = format!("widths: {widths}; red: grown, blue: shrunk (NEW - BASE)");
    if !d.summary.filters.is_empty() {
        subtitle.push_str(&format!("; filters: {}", d.summary.filters.join(", ")));
    }
    opts.subtitle = Some(subtitle);
    opts.count_name = weight.unit().to_string();
    // With the columns swapped, inferno's change is BASE - NEW: negated,
    // red still means grown.
    opts.negate_differentials = base_widths;
    let mut out = Vec::new();
    flamegraph::from_lines(&mut opts, folded.lines(), &mut out)?;
    Ok(out)
}
