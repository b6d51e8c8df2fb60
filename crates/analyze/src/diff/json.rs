//! The diff as JSON (`docs/json.md`).

use serde::Serialize;

use super::compare::{Change, Diff, DiffStack, Side, SideSummary};

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
    estimated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    sampling: Option<memleak_trace::Sampling>,
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
        estimated: t.sampling.is_some(),
        sampling: t.sampling,
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

/// The diff as JSON: `memleak diff --format json`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl crate::render::Render<Diff> for Json {
    fn file_name(&self) -> &'static str {
        "diff.json"
    }

    fn write(&self, d: &Diff, out: &mut (dyn std::io::Write + Send)) -> std::io::Result<()> {
        out.write_all(render_json(d).as_bytes())
    }
}
