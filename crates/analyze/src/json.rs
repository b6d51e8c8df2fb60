//! The JSON report. Its schema is documented in `docs/json.md` and is a
//! contract: scripts and end-to-end tests consume it. Fields may be added
//! within a `version`; none are removed or renamed.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::histogram::Bucket;
use crate::replay::Anomalies;
use crate::report::{Frame, Report, StackReport};

/// Version of the JSON schema.
pub const JSON_VERSION: u32 = 1;

#[derive(Serialize)]
struct Doc<'a> {
    version: u32,
    summary: SummaryJson<'a>,
    stacks: Vec<StackJson<'a>>,
}

#[derive(Serialize)]
struct LostJson<'a> {
    total: u64,
    by_reason: &'a BTreeMap<String, u64>,
}

#[derive(Serialize)]
struct SummaryJson<'a> {
    trace: &'a str,
    complete: bool,
    start_ns: u64,
    eval_ns: u64,
    at_given: bool,
    duration_ns: u64,
    events: u64,
    events_by_kind: &'a BTreeMap<String, u64>,
    allocations: u64,
    frees: u64,
    allocated_bytes: u64,
    freed_bytes: u64,
    outstanding_bytes: u64,
    outstanding_allocations: u64,
    outstanding_stacks: u64,
    peak_outstanding_bytes: u64,
    peak_ns: u64,
    anomalies: Anomalies,
    lost_events: LostJson<'a>,
    age_histogram: Vec<Bucket>,
    filters: &'a [String],
    sort: &'static str,
    stacks_shown: usize,
}

#[derive(Serialize)]
struct StackJson<'a> {
    stack_id: u64,
    pid: Option<u32>,
    kernel: bool,
    truncated: bool,
    bytes: u64,
    count: u64,
    oldest_age_ns: u64,
    allocated_bytes: u64,
    allocations: u64,
    age_histogram: Vec<Bucket>,
    frames: Vec<FrameJson<'a>>,
}

#[derive(Serialize)]
struct InlinedJson<'a> {
    function: &'a str,
    file: Option<&'a str>,
    line: Option<u32>,
    column: Option<u32>,
}

#[derive(Serialize)]
struct FrameJson<'a> {
    addr: String,
    function: Option<&'a str>,
    offset: Option<u64>,
    file: Option<&'a str>,
    line: Option<u32>,
    column: Option<u32>,
    path: Option<&'a str>,
    file_offset: Option<u64>,
    inlined: Vec<InlinedJson<'a>>,
}

fn frame(f: &Frame) -> FrameJson<'_> {
    FrameJson {
        // A string: kernel addresses do not fit the 53 bits of a double,
        // which is what jq and JavaScript parse numbers into.
        addr: format!("0x{:x}", f.addr),
        function: f.function.as_deref(),
        offset: f.offset,
        file: f.file.as_deref(),
        line: f.line,
        column: f.column,
        path: f.path.as_deref(),
        file_offset: f.file_offset,
        inlined: f
            .inlined
            .iter()
            .map(|i| InlinedJson {
                function: &i.function,
                file: i.file.as_deref(),
                line: i.line,
                column: i.column,
            })
            .collect(),
    }
}

fn stack(s: &StackReport) -> StackJson<'_> {
    StackJson {
        stack_id: s.stack_id,
        pid: s.pid,
        kernel: s.kernel,
        truncated: s.truncated,
        bytes: s.bytes,
        count: s.count,
        oldest_age_ns: s.oldest_age_ns,
        allocated_bytes: s.allocated_bytes,
        allocations: s.allocations,
        age_histogram: s.age_histogram.buckets(),
        frames: s.frames.iter().map(frame).collect(),
    }
}

/// Renders the JSON report, pretty-printed, with a final newline.
pub fn render(report: &Report) -> String {
    let s = &report.summary;
    let top = report.top_stacks();
    let doc = Doc {
        version: JSON_VERSION,
        summary: SummaryJson {
            trace: &s.trace,
            complete: s.complete,
            start_ns: s.start_ts,
            eval_ns: s.eval_ts,
            at_given: s.at_given,
            duration_ns: s.duration_ns(),
            events: s.events,
            events_by_kind: &s.events_by_kind,
            allocations: s.allocations,
            frees: s.frees,
            allocated_bytes: s.allocated_bytes,
            freed_bytes: s.freed_bytes,
            outstanding_bytes: s.outstanding_bytes,
            outstanding_allocations: s.outstanding_allocations,
            outstanding_stacks: s.outstanding_stacks,
            peak_outstanding_bytes: s.peak_bytes,
            peak_ns: s.peak_ns,
            anomalies: s.anomalies,
            lost_events: LostJson {
                total: s.lost_total(),
                by_reason: &s.lost_by_reason,
            },
            age_histogram: s.age_histogram.buckets(),
            filters: &s.filters,
            sort: s.sort.name(),
            stacks_shown: top.len(),
        },
        stacks: top.iter().map(stack).collect(),
    };
    let mut text = serde_json::to_string_pretty(&doc).expect("report serializes");
    text.push('\n');
    text
}
