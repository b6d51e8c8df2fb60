//! The JSON report. Its schema is documented in `docs/json.md` and is a
//! contract: scripts and end-to-end tests consume it. Fields may be added
//! within a `version`; none are removed or renamed.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::behaviour::per_second;
use crate::fleet::types::{GroupTotals, TraceTotals};
use crate::growth::{Growth, Timeline};
use crate::histogram::{Bucket, SizeBucket, SizeCount};
use crate::model::{AtPeak, Frame, Report, StackReport, Summary};
use crate::replay::Anomalies;

/// Version of the JSON schema.
pub const JSON_VERSION: u32 = 1;

#[derive(Serialize)]
struct Doc<'a> {
    version: u32,
    summary: SummaryJson<'a>,
    timeline: Option<&'a Timeline>,
    /// Only in a report of several traces: what the breakdown groups by.
    #[serde(skip_serializing_if = "Option::is_none")]
    group_by: Option<&'static str>,
    /// Only in a report of several traces: outstanding by group.
    #[serde(skip_serializing_if = "Option::is_none")]
    groups: Option<&'a [GroupTotals]>,
    /// Only in a report of several traces: each trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    traces: Option<Vec<TraceJson<'a>>>,
    stacks: Vec<StackJson<'a>>,
}

/// One trace of a multi-trace report.
#[derive(Serialize)]
struct TraceJson<'a> {
    path: &'a str,
    host: &'a str,
    trace: &'a str,
    command: &'a str,
    complete: bool,
    uncertain: bool,
    lost_events: LostJson<'a>,
    events: u64,
    duration_ns: u64,
    outstanding_bytes: u64,
    outstanding_allocations: u64,
    outstanding_stacks: u64,
    peak_outstanding_bytes: u64,
    scans: u64,
}

fn trace_json(t: &TraceTotals) -> TraceJson<'_> {
    TraceJson {
        path: &t.path,
        host: &t.host,
        trace: &t.trace,
        command: &t.command,
        complete: t.complete,
        uncertain: t.losses().uncertain(),
        lost_events: LostJson::of(&t.lost_by_reason),
        events: t.events,
        duration_ns: t.duration_ns,
        outstanding_bytes: t.bytes,
        outstanding_allocations: t.count,
        outstanding_stacks: t.stacks,
        peak_outstanding_bytes: t.peak_bytes,
        scans: t.scans,
    }
}

/// `lost_events` of a summary (the diff's sides have one too).
#[derive(Serialize)]
pub(crate) struct LostJson<'a> {
    total: u64,
    by_reason: &'a BTreeMap<String, u64>,
    /// Events and calls missing from the trace (the reasons that make the
    /// figures uncertain).
    missing: u64,
    /// Events kept without their stack.
    stackless: u64,
    /// The warning `analyze` prints, when `missing` is not 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    warning: Option<String>,
}

impl<'a> LostJson<'a> {
    pub(crate) fn of(by_reason: &'a BTreeMap<String, u64>) -> LostJson<'a> {
        let losses = memleak_trace::Losses::of(by_reason);
        LostJson {
            total: by_reason.values().sum(),
            by_reason,
            missing: losses.missing_total(),
            stackless: losses.stackless,
            warning: losses.warning(),
        }
    }
}

/// What a trace whose recording did not finish is known to miss.
#[derive(Serialize)]
struct IncompleteJson {
    /// Events after this time (ns since the start) are missing; null when
    /// the trace (format 1.0) does not say when its last checkpoint was.
    missing_after_ns: Option<u64>,
    unfinished_segments: usize,
    unfinished_bytes: u64,
}

#[derive(Serialize)]
struct SummaryJson<'a> {
    trace: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    capture: Option<&'a str>,
    /// The heap's bytes and counts are estimates from a sampled
    /// recording (`sampling` says how).
    estimated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    sampling: Option<memleak_trace::Sampling>,
    complete: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    incomplete: Option<IncompleteJson>,
    /// Events are missing (`lost_events.missing`): every outstanding
    /// figure may be wrong.
    uncertain: bool,
    start_ns: u64,
    eval_ns: u64,
    at_given: bool,
    at_peak: Option<AtPeak>,
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
    outstanding_by_class: crate::model::OutstandingByClass,
    peak_outstanding_bytes: u64,
    peak_ns: u64,
    process_peaks: Vec<ProcessPeakJson>,
    anomalies: Anomalies,
    lost_events: LostJson<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cut_stacks: Option<u64>,
    age_histogram: Vec<Bucket>,
    #[serde(flatten)]
    behaviour: SummaryBehaviourJson,
    filters: &'a [String],
    sort: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    group_by: Option<&'static str>,
    stacks_shown: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    leak_summary: Option<LeakJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scan_note: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    suppressed: &'a [crate::model::SuppressedTotals],
}

/// The scans that apply and the totals by verdict.
#[derive(Serialize)]
struct LeakJson<'a> {
    scans: Vec<ScanJson<'a>>,
    definitely: crate::verdicts::ClassTotals,
    indirectly: crate::verdicts::ClassTotals,
    possibly: crate::verdicts::ClassTotals,
    reachable: crate::verdicts::ClassTotals,
    unscanned: crate::verdicts::ClassTotals,
}

#[derive(Serialize)]
struct ScanJson<'a> {
    pid: u32,
    /// ns since the start of the recording.
    at_ns: u64,
    pause_ns: u64,
    threads: u32,
    roots_bytes: u64,
    heap_bytes: u64,
    blocks: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

#[derive(Serialize)]
struct ContentsJson {
    addr: String,
    size: u64,
    verdict: &'static str,
    hex: String,
}

#[derive(Serialize)]
struct ProcessPeakJson {
    pid: u32,
    peak_outstanding_bytes: u64,
    peak_ns: u64,
}

#[derive(Serialize)]
struct StackJson<'a> {
    stack_id: u64,
    pid: Option<u32>,
    kernel: bool,
    truncated: bool,
    bytes: u64,
    count: u64,
    mapped_bytes: u64,
    mapped_count: u64,
    oldest_age_ns: u64,
    allocated_bytes: u64,
    allocations: u64,
    age_histogram: Vec<Bucket>,
    #[serde(flatten)]
    behaviour: StackBehaviourJson,
    growth: Option<&'a Growth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    verdicts: Option<crate::verdicts::VerdictTotals>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    contents: Vec<ContentsJson>,
    /// Only in a report of several traces: the key stacks were matched by.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    /// Only in a report of several traces: the host and trace whose stack
    /// id, pid and addresses these are.
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace: Option<&'a str>,
    /// Only in a report of several traces: how many hold the stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    traces: Option<u64>,
    /// Only in a report of several traces: its outstanding by group.
    #[serde(skip_serializing_if = "Option::is_none")]
    groups: Option<&'a [GroupTotals]>,
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

fn stack(s: &StackReport, interval_ns: u64) -> StackJson<'_> {
    StackJson {
        stack_id: s.stack_id,
        pid: s.pid,
        kernel: s.kernel,
        truncated: s.truncated,
        bytes: s.bytes,
        count: s.count,
        mapped_bytes: s.mapped_bytes,
        mapped_count: s.mapped_count,
        oldest_age_ns: s.oldest_age_ns,
        allocated_bytes: s.allocated_bytes,
        allocations: s.allocations,
        age_histogram: s.age_histogram.buckets(),
        behaviour: stack_json(s, interval_ns),
        growth: s.growth.as_ref(),
        verdicts: s.verdicts,
        contents: s
            .contents
            .iter()
            .map(|c| ContentsJson {
                addr: format!("0x{:x}", c.addr),
                size: c.size,
                verdict: crate::verdicts::verdict_name(c.verdict),
                hex: crate::verdicts::hex_string(&c.bytes),
            })
            .collect(),
        key: s.origin.as_ref().map(|o| o.key.as_str()),
        host: s.origin.as_ref().map(|o| o.host.as_str()),
        trace: s.origin.as_ref().map(|o| o.trace.as_str()),
        traces: s.origin.as_ref().map(|o| o.traces),
        groups: s.origin.as_ref().map(|o| o.groups.as_slice()),
        frames: s.frames.iter().map(frame).collect(),
    }
}

/// Renders the JSON report, pretty-printed, with a final newline: what
/// [`write()`] writes.
pub fn render(report: &Report) -> String {
    let mut out = Vec::new();
    write(report, &mut out).expect("writing to memory");
    String::from_utf8(out).expect("JSON is UTF-8")
}

/// Stacks rendered by one task of [`write`].
const STACKS_PER_TASK: usize = 64;
/// Tasks rendered while the previous ones are written.
const TASKS_PER_BATCH: usize = 8;

/// Writes the JSON report to `out`, pretty-printed, with a final newline.
///
/// The stacks are rendered in parallel, a few dozen to a task, and
/// spliced into the document; a batch of them is written while the next
/// is rendered. With every stack of a large trace the report is tens of
/// megabytes, which one thread took about a fifth as long to render and
/// write as the replay. The result is what `serde_json::to_string_pretty`
/// makes of the whole document (a test checks it).
pub fn write<W: std::io::Write + Send + ?Sized>(
    report: &Report,
    out: &mut W,
) -> std::io::Result<()> {
    use rayon::prelude::*;

    let top = report.top_stacks();
    let interval_ns = report.summary.rate_interval_ns;
    let head = serde_json::to_string_pretty(&doc(report, Vec::new(), top.len()))
        .expect("report serializes");
    if top.is_empty() {
        out.write_all(head.as_bytes())?;
        return out.write_all(b"\n");
    }
    // `head` ends with the empty array and the closing brace.
    let body = head
        .strip_suffix("\"stacks\": []\n}")
        .expect("stacks come last in the document");
    out.write_all(body.as_bytes())?;
    out.write_all(b"\"stacks\": [\n")?;
    let render_batch = |batch: &[StackReport]| -> Vec<Vec<u8>> {
        batch
            .par_chunks(STACKS_PER_TASK)
            .map(|chunk| {
                let mut text = Indented(Vec::with_capacity(chunk.len() * 8192));
                for s in chunk {
                    if !text.0.is_empty() {
                        text.0.extend_from_slice(b",\n");
                    }
                    text.0.extend_from_slice(STACK_INDENT);
                    let mut ser = serde_json::Serializer::pretty(&mut text);
                    stack(s, interval_ns)
                        .serialize(&mut ser)
                        .expect("stack serializes");
                }
                text.0
            })
            .collect()
    };
    let mut first = true;
    let mut write_parts = |parts: Vec<Vec<u8>>| -> std::io::Result<()> {
        for p in parts {
            if !first {
                out.write_all(b",\n")?;
            }
            first = false;
            out.write_all(&p)?;
        }
        Ok(())
    };
    let mut batches = top.chunks(STACKS_PER_TASK * TASKS_PER_BATCH);
    let mut ready = batches.next().map(render_batch);
    while let Some(parts) = ready.take() {
        let next = batches.next();
        let (rendered, written) = rayon::join(|| next.map(render_batch), || write_parts(parts));
        written?;
        ready = rendered;
    }
    out.write_all(b"\n  ]\n}\n")
}

/// Each stack is an element of `stacks`, two levels deep: its lines are
/// indented by four more spaces than `serde_json` indents them alone.
const STACK_INDENT: &[u8] = b"    ";

/// A buffer that indents every line after the first by
/// [`STACK_INDENT`] as `serde_json`'s pretty printer writes to it. That
/// printer writes each line break at the end of a write of its own, and
/// never a raw line break inside a string (it escapes them), so a write
/// that ends in one is a line break of the layout. Done while writing:
/// splitting each rendered stack into lines afterwards and copying them
/// cost about 5 % of an analysis with every stack in the report.
struct Indented(Vec<u8>);

impl std::io::Write for Indented {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        if buf.last() == Some(&b'\n') {
            self.0.extend_from_slice(STACK_INDENT);
        }
        Ok(buf.len())
    }

    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.write(buf).map(|_| ())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn doc<'a>(report: &'a Report, stacks: Vec<StackJson<'a>>, shown: usize) -> Doc<'a> {
    let s = &report.summary;
    Doc {
        version: JSON_VERSION,
        summary: SummaryJson {
            trace: &s.trace,
            capture: s.capture.as_deref(),
            estimated: s.sampling.is_some(),
            sampling: s.sampling,
            complete: s.complete,
            incomplete: s.incomplete.map(|i| IncompleteJson {
                missing_after_ns: i.listed.then_some(i.since_start_ns),
                unfinished_segments: i.unfinished_segments,
                unfinished_bytes: i.unfinished_bytes,
            }),
            uncertain: s.losses().uncertain(),
            start_ns: s.start_ts,
            eval_ns: s.eval_ts,
            at_given: s.at_given,
            at_peak: s.at_peak,
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
            outstanding_by_class: s.outstanding_by_class,
            peak_outstanding_bytes: s.peak_bytes,
            peak_ns: s.peak_ns,
            process_peaks: s
                .process_peaks
                .iter()
                .map(|p| ProcessPeakJson {
                    pid: p.pid,
                    peak_outstanding_bytes: p.peak_bytes,
                    peak_ns: p.peak_ns,
                })
                .collect(),
            anomalies: s.anomalies,
            lost_events: LostJson::of(&s.lost_by_reason),
            cut_stacks: s.cut_stacks,
            age_histogram: s.age_histogram.buckets(),
            behaviour: summary_json(s),
            filters: &s.filters,
            sort: s.sort.name(),
            group_by: s.group_by_verdict.then_some("verdict"),
            stacks_shown: shown,
            leak_summary: s.leak.as_ref().map(|l| LeakJson {
                scans: l
                    .scans
                    .iter()
                    .map(|x| ScanJson {
                        pid: x.pid,
                        at_ns: x.ts_ns.saturating_sub(s.start_ts),
                        pause_ns: x.pause_ns,
                        threads: x.threads,
                        roots_bytes: x.roots_bytes,
                        heap_bytes: x.heap_bytes,
                        blocks: x.blocks,
                        error: x.error.as_deref(),
                    })
                    .collect(),
                definitely: l.totals.definitely,
                indirectly: l.totals.indirectly,
                possibly: l.totals.possibly,
                reachable: l.totals.reachable,
                unscanned: l.totals.unscanned,
            }),
            scan_note: s.scan_note.as_deref(),
            suppressed: &s.suppressed,
        },
        timeline: report.timeline.as_ref(),
        group_by: report.fleet.as_ref().map(|f| f.group_by.name()),
        groups: report.fleet.as_ref().map(|f| f.groups.as_slice()),
        traces: report
            .fleet
            .as_ref()
            .map(|f| f.traces.iter().map(trace_json).collect()),
        stacks,
    }
}

/// Rounds a rate to a thousandth, which is all a report needs.
fn rounded(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A stack's behaviour fields in the JSON report (docs/json.md).
#[derive(Serialize)]
struct StackBehaviourJson {
    temporary: u64,
    allocations_per_s: f64,
    allocated_bytes_per_s: f64,
    allocation_sizes: Vec<SizeCount>,
}

fn stack_json(s: &StackReport, interval_ns: u64) -> StackBehaviourJson {
    StackBehaviourJson {
        temporary: s.temporary,
        allocations_per_s: rounded(per_second(s.allocations, interval_ns)),
        allocated_bytes_per_s: rounded(per_second(s.allocated_bytes, interval_ns)),
        allocation_sizes: s.allocation_sizes.clone(),
    }
}

/// The summary's behaviour fields in the JSON report (docs/json.md).
#[derive(Serialize)]
struct SummaryBehaviourJson {
    temporary_allocations: u64,
    temporary_threshold_ns: u64,
    rate_interval_ns: u64,
    allocations_per_s: f64,
    allocated_bytes_per_s: f64,
    allocation_sizes: Vec<SizeBucket>,
    outstanding_sizes: Vec<SizeBucket>,
}

fn summary_json(s: &Summary) -> SummaryBehaviourJson {
    SummaryBehaviourJson {
        temporary_allocations: s.temporary_allocations,
        temporary_threshold_ns: s.temporary_threshold_ns,
        rate_interval_ns: s.rate_interval_ns,
        allocations_per_s: rounded(per_second(
            s.allocation_sizes.total_count(),
            s.rate_interval_ns,
        )),
        allocated_bytes_per_s: rounded(per_second(
            s.allocation_sizes.total_bytes(),
            s.rate_interval_ns,
        )),
        allocation_sizes: s.allocation_sizes.buckets(),
        outstanding_sizes: s.outstanding_sizes.buckets(),
    }
}

/// The JSON format: `--format json`, `report.json`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl crate::render::Render<Report> for Json {
    fn file_name(&self) -> &'static str {
        "report.json"
    }

    fn write(&self, report: &Report, out: &mut (dyn std::io::Write + Send)) -> std::io::Result<()> {
        write(report, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SortKey;
    use crate::model::{Frame, StackReport, Summary};

    /// The report rendered in one piece, as `render` did before it
    /// rendered stacks in parallel.
    fn whole(report: &Report) -> String {
        let top = report.top_stacks();
        let d = doc(
            report,
            top.iter()
                .map(|s| stack(s, report.summary.rate_interval_ns))
                .collect(),
            top.len(),
        );
        serde_json::to_string_pretty(&d).unwrap() + "\n"
    }

    #[test]
    fn spliced_stacks_match_one_pretty_document() {
        let frame = |addr: u64, function: Option<&str>| Frame {
            addr,
            function: function.map(str::to_string),
            file: Some("a \"quoted\"\nfile.c".into()),
            line: Some(7),
            ..Default::default()
        };
        let mut stacks = Vec::new();
        // More than one batch of tasks (write renders 512 at a time).
        for id in 1..1200u64 {
            let mut age_histogram = crate::AgeHistogram::default();
            age_histogram.add(id * 1_000_000_000, 1, id);
            stacks.push(StackReport {
                stack_id: id,
                pid: (id % 3 != 0).then_some(id as u32),
                bytes: id * 100,
                // The last ones have nothing outstanding and are not shown.
                count: if id < 1190 { 1 + id % 5 } else { 0 },
                age_histogram,
                allocated_bytes: id * 1000,
                allocations: id,
                frames: (0..id % 4)
                    .map(|f| frame(f + id, (f % 2 == 0).then_some("main")))
                    .collect(),
                ..Default::default()
            });
        }
        for top in [0, 1, 2, 64, 65, 150, 512, 513, 1100] {
            let report = Report {
                summary: Summary {
                    trace: "t".into(),
                    sort: SortKey::Bytes,
                    ..Default::default()
                },
                stacks: stacks.clone(),
                top,
                ..Default::default()
            };
            assert_eq!(render(&report), whole(&report), "top {top}");
        }
        let empty = Report {
            summary: Summary::default(),
            stacks: Vec::new(),
            top: 0,
            ..Default::default()
        };
        assert_eq!(render(&empty), whole(&empty));
    }
}
