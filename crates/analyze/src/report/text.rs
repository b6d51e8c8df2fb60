//! The text report: top stacks, each as a bcc-style header and one line
//! per frame, their age histograms, and a summary at the end.

use std::fmt::Write as _;

use crate::behaviour::{per_second, percent};
use crate::fleet::types::{Fleet, StackOrigin};
use crate::growth::Growth;
use crate::histogram::SizeBucket;
use crate::model::{Frame, LeakSummary, Report, SortKey, StackReport, Summary, SuppressedTotals};
use crate::time::{format_bytes, format_duration};
use crate::verdicts::{hex_preview, verdict_name, VERDICTS_AND_UNSCANNED};

/// Stacks whose lost blocks' contents the text report shows.
const CONTENTS_STACKS: usize = 5;
/// Bytes of a block's contents the text report shows.
const CONTENTS_BYTES: usize = 32;

/// Renders the text report.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let top = report.top_stacks();
    let s = &report.summary;
    if let Some(inc) = &s.incomplete {
        // First, where nobody can miss it: what follows is a partial view.
        let _ = writeln!(out, "WARNING: {inc}.\n");
    }
    if let Some(w) = s.losses().warning() {
        // As near the top: the figures below may be wrong.
        let _ = writeln!(out, "WARNING: {w}.\n");
    }
    if let Some(n) = s.sampling_note() {
        let _ = writeln!(out, "ESTIMATES: {n}.\n");
    }
    if let Some(leak) = &s.leak {
        // With a scan, the verdicts lead, as memcheck's LEAK SUMMARY does.
        render_leak_summary(&mut out, leak, s);
        out.push('\n');
    }
    if top.is_empty() {
        out.push_str("No outstanding allocations");
        if !s.filters.is_empty() {
            out.push_str(" matching the filters");
        }
        if s.incomplete.is_some() {
            out.push_str(" in the part of the recording that was saved");
        }
        out.push_str(".\n\n");
    } else if s.sort == SortKey::Temporary {
        let _ = writeln!(
            out,
            "Top {} stacks with temporary or outstanding allocations, {}:\n",
            top.len(),
            s.order()
        );
    } else if s.sort == SortKey::Growth {
        let shown = report.stacks.iter().filter(|st| st.shown(s.sort)).count();
        let _ = writeln!(
            out,
            "Top {} of {} stacks with outstanding allocations or freed late, {}:\n",
            top.len(),
            shown,
            s.order()
        );
    } else {
        let _ = writeln!(
            out,
            "Top {} of {} stacks with outstanding allocations, {}:\n",
            top.len(),
            s.outstanding_stacks,
            s.order()
        );
    }
    let fleet = report.fleet.as_deref();
    for (i, st) in top.iter().enumerate() {
        render_stack(&mut out, st, i < CONTENTS_STACKS, s.rate_interval_ns);
        if let (Some(f), Some(o)) = (fleet, &st.origin) {
            render_origin(&mut out, f, o);
        }
        out.push('\n');
    }
    render_summary(&mut out, s);
    if let Some(f) = fleet {
        render_fleet(&mut out, f, report.top);
    }
    out
}

/// Groups of a stack the text report names.
const STACK_GROUPS: usize = 5;

/// Where a merged stack is held: `by host (3 of 200): h017 4096 bytes in
/// 10; …`.
fn render_origin(out: &mut String, fleet: &Fleet, o: &StackOrigin) {
    let by = fleet.group_by.name();
    let parts: Vec<String> = o
        .groups
        .iter()
        .take(STACK_GROUPS)
        .map(|g| format!("{} {} in {}", g.group, bytes_phrase(g.bytes), g.count))
        .collect();
    let more = match o.groups.len().saturating_sub(STACK_GROUPS) {
        0 => String::new(),
        n => format!("; and {n} more"),
    };
    let _ = writeln!(
        out,
        "    by {by} ({} of {}): {}{more}",
        o.groups.len(),
        fleet.groups.len(),
        parts.join("; ")
    );
    let _ = writeln!(
        out,
        "    frames as in host {}, trace {} ({})",
        o.host,
        o.trace,
        plural(o.traces, "trace holds it", "traces hold it")
    );
}

/// The breakdown of a multi-trace report: outstanding by group, most
/// first, at most `top` rows (0: all).
fn render_fleet(out: &mut String, fleet: &Fleet, top: usize) {
    let by = fleet.group_by.name();
    let n = if top == 0 {
        fleet.groups.len()
    } else {
        top.min(fleet.groups.len())
    };
    let _ = writeln!(
        out,
        "\nOutstanding by {by} ({}, {}), most bytes first",
        plural(fleet.groups.len() as u64, by, &format!("{by}s")),
        plural(fleet.traces.len() as u64, "trace", "traces"),
    );
    let width = fleet.groups[..n]
        .iter()
        .map(|g| g.group.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(by.len(), 40);
    let _ = writeln!(
        out,
        "  {by:<width$}  {:>7}  {:>14}  {:>11}",
        "traces", "bytes", "allocations"
    );
    for g in &fleet.groups[..n] {
        let _ = writeln!(
            out,
            "  {:<width$}  {:>7}  {:>14}  {:>11}",
            g.group, g.traces, g.bytes, g.count
        );
    }
    if n < fleet.groups.len() {
        let _ = writeln!(
            out,
            "  and {} more (-T 0 shows all; every trace in --format json)",
            fleet.groups.len() - n
        );
    }
}

fn bytes_phrase(b: u64) -> String {
    if b < 1024 {
        format!("{b} bytes")
    } else {
        format!("{b} bytes ({})", format_bytes(b))
    }
}

/// `growing, +1.5 MiB/s (fit 0.98)`: the verdict, the slope of the last
/// third of the samples and how well a line fits them.
fn growth_phrase(g: &Growth) -> String {
    if g.verdict == crate::growth::Verdict::Unknown {
        // No slope: it would read as a trend.
        return g.verdict.describe().to_string();
    }
    let sign = if g.slope_bytes_per_s < 0.0 { "-" } else { "+" };
    let rate = g.slope_bytes_per_s.abs().round() as u64;
    let rate = if rate < 1024 {
        format!("{rate} bytes")
    } else {
        format_bytes(rate)
    };
    format!("{}, {sign}{rate}/s (fit {:.2})", g.verdict.name(), g.fit)
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// memcheck's LEAK SUMMARY, from the scans: bytes and blocks per verdict,
/// and what suppressions hid.
fn render_leak_summary(out: &mut String, leak: &LeakSummary, s: &Summary) {
    for scan in &leak.scans {
        let _ = writeln!(
            out,
            "Scan of pid {} at {}: paused {:.3} ms for {} of roots and {} of heap ({} blocks, {})",
            scan.pid,
            format_duration(scan.ts_ns.saturating_sub(s.start_ts)),
            scan.pause_ns as f64 / 1e6,
            format_bytes(scan.roots_bytes),
            format_bytes(scan.heap_bytes),
            scan.blocks,
            plural(scan.threads as u64, "thread", "threads"),
        );
    }
    out.push_str("LEAK SUMMARY:\n");
    let label = |v| match v {
        Some(memleak_trace::ScanVerdict::DefinitelyLost) => "definitely lost",
        Some(memleak_trace::ScanVerdict::IndirectlyLost) => "indirectly lost",
        Some(memleak_trace::ScanVerdict::PossiblyLost) => "possibly lost",
        Some(memleak_trace::ScanVerdict::Reachable) => "still reachable",
        None => "unscanned",
    };
    for v in VERDICTS_AND_UNSCANNED {
        let t = leak.totals.get(v);
        if v.is_none() && t.allocations == 0 {
            continue;
        }
        let _ = writeln!(
            out,
            "  {:>16}: {} in {}",
            label(v),
            bytes_phrase(t.bytes),
            plural(t.allocations, "block", "blocks")
        );
    }
    for sup in &s.suppressed {
        let _ = writeln!(
            out,
            "  {:>16}: {} in {} ({})",
            "suppressed",
            bytes_phrase(sup.bytes),
            plural(sup.allocations, "block", "blocks"),
            sup.name
        );
    }
    if leak.totals.unscanned.allocations > 0 {
        out.push_str(
            "  (unscanned: outstanding at the report's time but not in the scan: allocated after it, \
             or of a process or kind it did not read)\n",
        );
    }
}

fn render_stack(out: &mut String, st: &StackReport, show_contents: bool, interval_ns: u64) {
    let mut who = if st.stack_id == 0 {
        "an unknown stack".to_string()
    } else {
        format!("stack {}", st.stack_id)
    };
    if st.kernel {
        who.push_str(" (kernel)");
    } else if let Some(pid) = st.pid {
        let _ = write!(who, " (pid {pid})");
    }
    if st.count == 0 {
        // Listed for its growth verdict: it held memory and freed it.
        let held = st
            .growth
            .as_ref()
            .and_then(|g| g.samples.iter().copied().max())
            .unwrap_or(0);
        let _ = writeln!(
            out,
            "nothing outstanding from {who}, which held up to {} and freed it",
            bytes_phrase(held)
        );
    } else {
        let _ = writeln!(
            out,
            "{} in {} from {}, oldest {}",
            bytes_phrase(st.bytes),
            plural(st.count, "allocation", "allocations"),
            who,
            format_duration(st.oldest_age_ns)
        );
    }
    let _ = writeln!(out, "    {}", stack_line(st, interval_ns));
    if let Some(g) = &st.growth {
        let _ = writeln!(out, "    growth: {}", growth_phrase(g));
    }
    if let Some(v) = &st.verdicts {
        let parts: Vec<String> = VERDICTS_AND_UNSCANNED
            .into_iter()
            .filter_map(|k| {
                let t = v.get(k);
                (t.allocations > 0 || t.bytes > 0).then(|| {
                    format!(
                        "{} {} in {}",
                        verdict_name(k),
                        bytes_phrase(t.bytes),
                        t.allocations
                    )
                })
            })
            .collect();
        let _ = writeln!(out, "    verdicts: {}", parts.join("; "));
    }
    let lines = frame_lines(&st.frames);
    let width = lines
        .iter()
        .map(|l| l.1.chars().count())
        .max()
        .unwrap_or(0)
        .min(60);
    for (idx, name, addr, loc) in &lines {
        let head = format!("    #{idx:<3} 0x{addr:016x}  {name:<width$}");
        if loc.is_empty() {
            let _ = writeln!(out, "{}", head.trim_end());
        } else {
            let _ = writeln!(out, "{head}  {loc}");
        }
    }
    if st.frames.is_empty() {
        let what = if st.stack_id == 0 {
            "no stack was captured"
        } else {
            "stack missing from the trace"
        };
        let _ = writeln!(out, "    [{what}]");
    } else if st.truncated {
        out.push_str("    [truncated: outer frames missing]\n");
    }
    if show_contents {
        for c in &st.contents {
            let _ = writeln!(
                out,
                "    contents of {} 0x{:x} ({} bytes): {}",
                verdict_name(c.verdict),
                c.addr,
                c.size,
                hex_preview(&c.bytes, CONTENTS_BYTES)
            );
        }
    }
    out.push_str(&st.age_histogram.render("    "));
}

/// `(index, name, address, location)` per printed line: the inlined chain
/// of a frame (innermost first, marked) above the function containing it.
fn frame_lines(frames: &[Frame]) -> Vec<(usize, String, u64, String)> {
    let mut lines = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        for inl in &f.inlined {
            lines.push((
                i,
                format!("{} [inlined]", inl.function),
                f.addr,
                source_loc(inl.file.as_deref(), inl.line),
            ));
        }
        let name = match (&f.function, f.offset) {
            (Some(func), Some(off)) => format!("{func}+0x{off:x}"),
            (Some(func), None) => func.clone(),
            (None, _) => "??".to_string(),
        };
        let mut loc = source_loc(f.file.as_deref(), f.line);
        if loc.is_empty() || f.function.is_none() {
            // Without a symbol or a line, the object and offset are what
            // lets someone symbolize the frame later.
            let obj = object_loc(f);
            loc = if loc.is_empty() {
                obj
            } else {
                format!("{loc} {obj}")
            };
        }
        lines.push((i, name, f.addr, loc));
    }
    lines
}

fn source_loc(file: Option<&str>, line: Option<u32>) -> String {
    match (file, line) {
        (Some(f), Some(l)) => format!("{f}:{l}"),
        (Some(f), None) => f.to_string(),
        _ => String::new(),
    }
}

/// `path+0xoffset` of a frame, `[unknown]` when the recorder could not say.
pub fn object_loc(f: &Frame) -> String {
    match (&f.path, f.file_offset) {
        (Some(p), Some(o)) => format!("{p}+0x{o:x}"),
        (Some(p), None) => p.clone(),
        (None, _) => "[unknown]".to_string(),
    }
}

/// Processes whose peak the text summary lists.
const PROCESS_PEAKS: usize = 5;

fn render_summary(out: &mut String, s: &Summary) {
    out.push_str("Summary\n");
    let mut row = |k: &str, v: String| {
        let _ = writeln!(out, "  {k:<18}{v}");
    };
    row("trace", s.trace.clone());
    if let Some(capture) = &s.capture {
        row("capture", capture.clone());
    }
    if let Some(sm) = s.sampling {
        row(
            "sampled",
            format!(
                "mean {}: bytes and blocks are estimates",
                format_bytes(sm.mean_bytes)
            ),
        );
    }
    if !s.complete {
        let missing = match &s.incomplete {
            Some(i) if i.listed => format!(
                "; events after {} are missing",
                format_duration(i.since_start_ns)
            ),
            _ => String::new(),
        };
        row(
            "recording",
            format!("incomplete (recorder killed or still running){missing}"),
        );
    }
    let when = if s.at_peak.is_some() {
        "state and ages at the peak, --at peak"
    } else if s.at_given {
        "state and ages at --at"
    } else {
        "ages at end of recording"
    };
    row(
        "duration",
        format!("{} ({when})", format_duration(s.duration_ns())),
    );
    let kinds: Vec<String> = s
        .events_by_kind
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    row(
        "events",
        if kinds.is_empty() {
            "0".into()
        } else {
            format!("{}: {}", s.events, kinds.join(", "))
        },
    );
    row(
        "allocations",
        format!("{}, {}", s.allocations, bytes_phrase(s.allocated_bytes)),
    );
    row(
        "frees",
        format!("{}, {}", s.frees, bytes_phrase(s.freed_bytes)),
    );
    // What the suppressions took out of the outstanding figures, said
    // next to them.
    let hidden: Vec<&SuppressedTotals> =
        s.suppressed.iter().filter(|x| x.allocations > 0).collect();
    let hidden_phrase = (!hidden.is_empty()).then(|| {
        let names: Vec<&str> = hidden.iter().map(|x| x.name.as_str()).collect();
        format!(
            "; {} in {} suppressed ({})",
            bytes_phrase(hidden.iter().map(|x| x.bytes).sum()),
            plural(
                hidden.iter().map(|x| x.allocations).sum(),
                "block",
                "blocks"
            ),
            names.join(", ")
        )
    });
    row(
        "outstanding",
        format!(
            "{}, {}, in {}{}",
            plural(s.outstanding_allocations, "allocation", "allocations"),
            bytes_phrase(s.outstanding_bytes),
            plural(s.outstanding_stacks, "stack", "stacks"),
            hidden_phrase.as_deref().unwrap_or("")
        ),
    );
    // valgrind counts heap blocks only: the split lets a reader compare.
    let c = &s.outstanding_by_class;
    let mut parts = Vec::new();
    for (name, t) in [("heap", c.heap), ("mapped", c.mapped), ("kernel", c.kernel)] {
        if t.allocations > 0 || t.bytes > 0 {
            parts.push(format!(
                "{name} {} in {}",
                bytes_phrase(t.bytes),
                plural(t.allocations, "allocation", "allocations")
            ));
        }
    }
    if !parts.is_empty() {
        row("outstanding in", parts.join("; "));
    }
    // The peak is of the whole trace under the filters: suppressed blocks
    // count in it, and it says so when there are some.
    row(
        "peak outstanding",
        format!(
            "{} at {}{}",
            bytes_phrase(s.peak_bytes),
            format_duration(s.peak_ns),
            if hidden.is_empty() {
                ""
            } else {
                " (suppressed blocks included)"
            }
        ),
    );
    if let Some(p) = &s.at_peak {
        let whose = match p.pid {
            Some(pid) => format!("of pid {pid}"),
            None => "of the live total".to_string(),
        };
        row(
            "peak view",
            format!(
                "the state at the peak {whose}, {} at {}",
                bytes_phrase(p.bytes),
                format_duration(p.ns)
            ),
        );
    }
    // The processes that held the most, a few lines at most.
    for (i, p) in s.process_peaks.iter().take(PROCESS_PEAKS).enumerate() {
        row(
            if i == 0 { "peak by process" } else { "" },
            format!(
                "pid {}: {} at {}",
                p.pid,
                bytes_phrase(p.peak_bytes),
                format_duration(p.peak_ns)
            ),
        );
    }
    if s.process_peaks.len() > PROCESS_PEAKS {
        let more = s.process_peaks.len() - PROCESS_PEAKS;
        let what = if more == 1 { "process" } else { "processes" };
        row("", format!("and {more} more {what} (all in --format json)"));
    }
    let a = &s.anomalies;
    row(
        "anomalies",
        format!(
            "{}: {} (allocated before recording), {}, {} (alloc on a live address)",
            a.total(),
            plural(a.unknown_frees, "unknown free", "unknown frees"),
            plural(a.double_frees, "double free", "double frees"),
            plural(a.missed_frees, "missed free", "missed frees"),
        ),
    );
    let lost: Vec<String> = s
        .lost_by_reason
        .iter()
        .filter(|(_, &v)| v > 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    row(
        "lost events",
        if lost.is_empty() {
            "0".into()
        } else {
            format!("{}: {}", s.lost_total(), lost.join(", "))
        },
    );
    if let Some(n) = s.cut_stacks.filter(|&n| n > 0) {
        row(
            "cut stacks",
            format!(
                "{} cut where the frame-pointer walk read data (code without frame pointers), marked truncated",
                plural(n, "stack", "stacks")
            ),
        );
    }
    if s.leak.is_none() {
        // With a scan, the LEAK SUMMARY at the top lists them.
        for (i, sup) in s.suppressed.iter().enumerate() {
            row(
                if i == 0 { "suppressed" } else { "" },
                format!(
                    "{} in {} ({})",
                    bytes_phrase(sup.bytes),
                    plural(sup.allocations, "allocation", "allocations"),
                    sup.name
                ),
            );
        }
    }
    if let Some(note) = &s.scan_note {
        row("scan", note.clone());
    }
    let (behaviour, sizes) = summary_rows(s);
    for (k, v) in behaviour {
        row(k, v);
    }
    if !s.filters.is_empty() {
        row("filters", s.filters.join(", "));
    }
    if !sizes.is_empty() {
        out.push_str("\nSizes of allocations\n");
        out.push_str(&sizes);
    }
    let hist = s.age_histogram.render("  ");
    if !hist.is_empty() {
        out.push_str("\nAge of outstanding allocations\n");
        out.push_str(&hist);
    }
}

/// Renders non-empty size buckets like bcc's `print_log2_hist`, with a
/// bytes column, each line prefixed by `indent`.
pub fn render_sizes(buckets: &[SizeBucket], indent: &str) -> String {
    let mut out = String::new();
    let max = buckets.iter().map(|b| b.count).max().unwrap_or(1).max(1);
    if buckets.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "{indent}{:>24} : count      bytes       distribution",
        "size (bytes)"
    );
    for b in buckets {
        let stars = ((b.count as u128 * 40).div_ceil(max as u128)) as usize;
        let _ = writeln!(
            out,
            "{indent}{:>10} -> {:<10} : {:<10} {:<11} |{:<40}|",
            b.low,
            b.high,
            b.count,
            b.bytes,
            "*".repeat(stars.max(1))
        );
    }
    out
}

/// A rate for people: `12.5/s`, `3.2 k/s`, `1.1 M/s`.
fn rate(per_s: f64) -> String {
    match per_s {
        r if r >= 1e6 => format!("{:.1} M/s", r / 1e6),
        r if r >= 1e3 => format!("{:.1} k/s", r / 1e3),
        r => format!("{r:.1}/s"),
    }
}

/// The text line of a stack's behaviour: allocations made, their rate,
/// the temporary ones.
pub fn stack_line(s: &StackReport, interval_ns: u64) -> String {
    format!(
        "allocated: {} ({}), {}, {}/s; temporary: {} ({:.1}%)",
        s.allocations,
        format_bytes(s.allocated_bytes),
        rate(per_second(s.allocations, interval_ns)),
        format_bytes(per_second(s.allocated_bytes, interval_ns) as u64),
        s.temporary,
        percent(s.temporary, s.allocations),
    )
}

/// The rows (name, value) of the summary's behaviour, and the size
/// histogram of every allocation.
pub fn summary_rows(s: &Summary) -> (Vec<(&'static str, String)>, String) {
    let rows = vec![
        (
            "temporary",
            format!(
                "{} of {} allocations ({:.1}%): freed within {} by the allocating thread, before it allocated again",
                s.temporary_allocations,
                s.allocation_sizes.total_count(),
                percent(s.temporary_allocations, s.allocation_sizes.total_count()),
                format_duration(s.temporary_threshold_ns)
            ),
        ),
        (
            "allocation rate",
            format!(
                "{}, {}/s over {}",
                rate(per_second(s.allocation_sizes.total_count(), s.rate_interval_ns)),
                format_bytes(per_second(s.allocation_sizes.total_bytes(), s.rate_interval_ns) as u64),
                format_duration(s.rate_interval_ns)
            ),
        ),
    ];
    (rows, render_sizes(&s.allocation_sizes.buckets(), "  "))
}

/// The text format: `--format text`, `report.txt`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Text;

impl crate::render::Render<Report> for Text {
    fn file_name(&self) -> &'static str {
        "report.txt"
    }

    fn write(&self, report: &Report, out: &mut (dyn std::io::Write + Send)) -> std::io::Result<()> {
        out.write_all(render(report).as_bytes())
    }
}
