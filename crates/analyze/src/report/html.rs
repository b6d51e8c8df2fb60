//! The HTML report: one self-contained page (no network, no fonts or
//! scripts from elsewhere) with the summary, a timeline chart of
//! outstanding bytes, the flamegraphs and the top-stacks table.
//!
//! The page is written here, server side, as far as it can be: the summary
//! and the table are plain HTML, readable without scripts. A small script
//! (`html/report.js`) draws the timeline from the data embedded as JSON,
//! switches the flamegraphs and sorts the table; the style is
//! `html/report.css`. Both are plain files included at build time.
//!
//! The flamegraphs are inferno's interactive SVGs ([`crate::svg`]), one per
//! weight. Each carries its own script with global names and element ids
//! (`frames`, `details`, …), so several cannot share the page's document:
//! each is embedded in base64 and shown in its own iframe, from a blob URL
//! made on first view. The snippet `html/flamegraph-embed.js` is added to
//! each SVG to report to the page what it drew and its height.
//!
//! Everything that comes from the trace (function names, paths, C++
//! templates full of `<` and `&`) is escaped where it is written.

use std::fmt::Write as _;
use std::io::{self, Write};

use base64::Engine as _;
use serde::Serialize;

use crate::model::{Frame, LeakSummary, Report, StackReport, Summary};
use crate::report::folded::Weight;
use crate::time::{format_bytes, format_duration};
use crate::verdicts::{verdict_name, verdict_rank, VERDICTS_AND_UNSCANNED};

mod colours;

const CSS: &str = include_str!("html/report.css");
const JS: &str = include_str!("html/report.js");
const FLAMEGRAPH_EMBED_JS: &str = include_str!("html/flamegraph-embed.js");

/// The flamegraph views, in the order of the page's toggle.
const FLAMEGRAPHS: [Weight; 3] = [Weight::Bytes, Weight::Count, Weight::AllocatedBytes];

/// Stacks drawn in the timeline beside the total: the first of the table.
const TIMELINE_STACKS: usize = 10;

/// Processes whose peak the summary lists.
const PROCESS_PEAKS: usize = 5;

/// Writes the HTML report of `report` to `w`.
///
/// The flamegraphs are of every stack; the table shows the report's top
/// stacks (`--top`), like the text and JSON reports.
pub fn write(report: &Report, w: &mut dyn Write) -> io::Result<()> {
    // The three flamegraphs are the slow part on a big report: draw them
    // in parallel, and the rest of the page meanwhile.
    let (svgs, page) = rayon::join(
        || -> io::Result<Vec<String>> {
            use rayon::prelude::*;
            FLAMEGRAPHS[..]
                .par_iter()
                .map(|&weight| {
                    crate::report::svg::render(report, weight)
                        .map(|svg| embed_svg(&colours::annotate(&svg, report, weight)))
                })
                .collect()
        },
        || {
            let mut head = String::new();
            let mut body = String::new();
            page_head(&mut head, report);
            page_body(&mut body, report);
            (head, body)
        },
    );
    let svgs = svgs?;
    let (head, body) = page;
    w.write_all(head.as_bytes())?;
    w.write_all(body.as_bytes())?;
    for (weight, svg) in FLAMEGRAPHS.iter().zip(&svgs) {
        write!(
            w,
            "<script type=\"application/base64\" id=\"flamegraph-{}\">",
            weight.name()
        )?;
        w.write_all(svg.as_bytes())?;
        w.write_all(b"</script>\n")?;
    }
    write!(w, "<script>\n{JS}</script>\n</body>\n</html>\n")?;
    Ok(())
}

/// Renders the HTML report into a string.
pub fn render(report: &Report) -> io::Result<String> {
    let mut out = Vec::new();
    write(report, &mut out)?;
    Ok(String::from_utf8(out).expect("the page is written from strings"))
}

/// The SVG with the embedding snippet added, in base64: base64 holds no
/// `<` or `&`, so it sits in a `<script>` element as it is.
fn embed_svg(svg: &[u8]) -> String {
    let snippet =
        format!("<script type=\"text/ecmascript\"><![CDATA[\n{FLAMEGRAPH_EMBED_JS}]]></script>\n");
    let end = svg
        .windows(6)
        .rposition(|w| w == b"</svg>")
        .unwrap_or(svg.len());
    let mut doc = Vec::with_capacity(svg.len() + snippet.len());
    doc.extend_from_slice(&svg[..end]);
    doc.extend_from_slice(snippet.as_bytes());
    doc.extend_from_slice(&svg[end..]);
    base64::engine::general_purpose::STANDARD.encode(doc)
}

/// Escapes text for HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

fn trace_name(s: &Summary) -> String {
    std::path::Path::new(&s.trace)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| s.trace.clone())
}

fn page_head(out: &mut String, report: &Report) {
    let title = escape(&format!("memleak: {}", trace_name(&report.summary)));
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
<meta name=\"generator\" content=\"memleak {}\">\n\
<title>{title}</title>\n<style>\n{CSS}</style>\n</head>\n",
        env!("CARGO_PKG_VERSION")
    );
}

fn page_body(out: &mut String, report: &Report) {
    let s = &report.summary;
    let _ = writeln!(
        out,
        "<body>\n<header>\n<h1>memleak report</h1>\n<div class=\"muted mono\">{}</div>\n</header>",
        escape(&s.trace)
    );
    if let Some(w) = s.losses().warning() {
        // At the top of the page, before any figure it puts in doubt.
        let _ = writeln!(
            out,
            "<p class=\"warning banner\" id=\"lost-events\" role=\"alert\">\
<strong>Warning:</strong> {}.</p>",
            escape(&w)
        );
    }
    if let Some(n) = s.sampling_note() {
        let _ = writeln!(
            out,
            "<p class=\"warning banner\" id=\"sampled\">\
<strong>Estimates:</strong> {}.</p>",
            escape(&n)
        );
    }
    if let Some(leak) = &s.leak {
        // First, in the first screen: memcheck's verdicts, as the text
        // report leads with them.
        leak_summary(out, leak, s);
    }
    summary(out, s);
    timeline(out, report);
    flamegraphs(out, report);
    stacks_table(out, report);
    let _ = writeln!(
        out,
        "<footer>Written by memleak {} from the trace above. Self-contained: \
no network needed.</footer>",
        env!("CARGO_PKG_VERSION")
    );
    let data = PageData {
        timeline: report.timeline.as_ref().map(|t| TimelineData {
            start_ns: t.start_ns,
            window_ns: t.window_ns,
            total: &t.total_bytes,
        }),
        series: report
            .top_stacks()
            .iter()
            .enumerate()
            .filter_map(|(i, st)| {
                let g = st.growth.as_ref()?;
                Some(Series {
                    label: format!("#{} {}", i + 1, stack_label(st)),
                    samples: &g.samples,
                })
            })
            .take(TIMELINE_STACKS)
            .collect(),
    };
    let json = serde_json::to_string(&data).expect("plain data serializes");
    // Inside <script>, only `</script` (or `<!--`) could end the element
    // early: no `<` at all, as the JSON escape of it.
    let _ = writeln!(
        out,
        "<script type=\"application/json\" id=\"memleak-data\">{}</script>",
        json.replace('<', "\\u003c")
    );
}

/// The data the page's script draws from.
#[derive(Serialize)]
struct PageData<'a> {
    timeline: Option<TimelineData<'a>>,
    series: Vec<Series<'a>>,
}

#[derive(Serialize)]
struct TimelineData<'a> {
    start_ns: u64,
    window_ns: u64,
    total: &'a [u64],
}

#[derive(Serialize)]
struct Series<'a> {
    label: String,
    samples: &'a [u64],
}

/// `1234567 bytes (1.18 MiB)`, the exact number first.
fn bytes_phrase(b: u64) -> String {
    if b < 1024 {
        format!("{b} bytes")
    } else {
        format!("{b} bytes ({})", format_bytes(b))
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn card(out: &mut String, value: &str, key: &str) {
    let _ = write!(
        out,
        "<div class=\"card\"><div class=\"v\">{}</div><div class=\"k\">{}</div></div>",
        escape(value),
        escape(key)
    );
}

/// memcheck's LEAK SUMMARY: bytes and blocks per verdict, what
/// suppressions hid, and the scans they come from.
fn leak_summary(out: &mut String, leak: &LeakSummary, s: &Summary) {
    out.push_str("<section id=\"leak-summary\">\n<h2>Leak summary</h2>\n<dl class=\"leak\">\n");
    for v in VERDICTS_AND_UNSCANNED {
        let t = leak.totals.get(v);
        if v.is_none() && t.allocations == 0 {
            continue;
        }
        let name = verdict_name(v);
        let _ = writeln!(
            out,
            "<dt class=\"verdict {name}\">{}</dt><dd>{} in {}</dd>",
            colours::legend_name(name),
            escape(&bytes_phrase(t.bytes)),
            plural(t.allocations, "block", "blocks")
        );
    }
    for sup in &s.suppressed {
        let _ = writeln!(
            out,
            "<dt>suppressed</dt><dd>{} in {} ({})</dd>",
            escape(&bytes_phrase(sup.bytes)),
            plural(sup.allocations, "block", "blocks"),
            escape(&sup.name)
        );
    }
    out.push_str("</dl>\n");
    for scan in &leak.scans {
        let _ = writeln!(
            out,
            "<p class=\"muted\">Scan of pid {} at {}: paused {:.3} ms for {} of roots and {} of \
heap ({} blocks).</p>",
            scan.pid,
            escape(&format_duration(scan.ts_ns.saturating_sub(s.start_ts))),
            scan.pause_ns as f64 / 1e6,
            escape(&format_bytes(scan.roots_bytes)),
            escape(&format_bytes(scan.heap_bytes)),
            scan.blocks
        );
    }
    if leak.totals.unscanned.allocations > 0 {
        out.push_str(
            "<p class=\"muted\">Unscanned: outstanding at the report's time but not in the scan \
(allocated after it, or of a process or kind it did not read).</p>\n",
        );
    }
    out.push_str("</section>\n");
}

fn summary(out: &mut String, s: &Summary) {
    out.push_str("<section id=\"summary\">\n<h2>Summary</h2>\n");
    if let Some(inc) = &s.incomplete {
        let _ = writeln!(
            out,
            "<p class=\"warning\">Warning: {}. What follows is a partial view.</p>",
            escape(&inc.to_string())
        );
    } else if !s.complete {
        out.push_str(
            "<p class=\"warning\">Warning: the recording did not finish cleanly \
(recorder killed or still running).</p>\n",
        );
    }
    out.push_str("<div class=\"cards\">");
    card(out, &format_bytes(s.outstanding_bytes), "outstanding");
    card(
        out,
        &s.outstanding_allocations.to_string(),
        "outstanding allocations",
    );
    card(out, &s.outstanding_stacks.to_string(), "stacks");
    card(out, &format_bytes(s.peak_bytes), "peak outstanding");
    card(out, &format_duration(s.duration_ns()), "recording span");
    card(out, &s.anomalies.total().to_string(), "anomalies");
    out.push_str("</div>\n<dl class=\"summary\">\n");
    let mut row = |k: &str, v: &str| {
        let _ = writeln!(out, "<dt>{}</dt><dd>{}</dd>", escape(k), escape(v));
    };
    let when = if s.at_given {
        "state and ages at --at"
    } else {
        "ages at the end of the recording"
    };
    row(
        "recording span",
        &format!("{} ({when})", format_duration(s.duration_ns())),
    );
    let kinds: Vec<String> = s
        .events_by_kind
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    row(
        "events",
        &if kinds.is_empty() {
            "0".into()
        } else {
            format!("{}: {}", s.events, kinds.join(", "))
        },
    );
    row(
        "allocations",
        &format!("{}, {}", s.allocations, bytes_phrase(s.allocated_bytes)),
    );
    row(
        "frees",
        &format!("{}, {}", s.frees, bytes_phrase(s.freed_bytes)),
    );
    row(
        "outstanding",
        &format!(
            "{}, {}, in {}",
            plural(s.outstanding_allocations, "allocation", "allocations"),
            bytes_phrase(s.outstanding_bytes),
            plural(s.outstanding_stacks, "stack", "stacks")
        ),
    );
    let c = &s.outstanding_by_class;
    let parts: Vec<String> = [("heap", c.heap), ("mapped", c.mapped), ("kernel", c.kernel)]
        .iter()
        .filter(|(_, t)| t.allocations > 0 || t.bytes > 0)
        .map(|(name, t)| {
            format!(
                "{name} {} in {}",
                bytes_phrase(t.bytes),
                plural(t.allocations, "allocation", "allocations")
            )
        })
        .collect();
    if !parts.is_empty() {
        row("outstanding in", &parts.join("; "));
    }
    row(
        "peak outstanding",
        &format!(
            "{} at {}",
            bytes_phrase(s.peak_bytes),
            format_duration(s.peak_ns)
        ),
    );
    for (i, p) in s.process_peaks.iter().take(PROCESS_PEAKS).enumerate() {
        row(
            if i == 0 { "peak by process" } else { "" },
            &format!(
                "pid {}: {} at {}",
                p.pid,
                bytes_phrase(p.peak_bytes),
                format_duration(p.peak_ns)
            ),
        );
    }
    if s.process_peaks.len() > PROCESS_PEAKS {
        row(
            "",
            &format!(
                "and {} more (all in --format json)",
                s.process_peaks.len() - PROCESS_PEAKS
            ),
        );
    }
    let a = &s.anomalies;
    row(
        "anomalies",
        &format!(
            "{}: {} unknown frees (allocated before recording), {} double frees, \
{} missed frees (alloc on a live address)",
            a.total(),
            a.unknown_frees,
            a.double_frees,
            a.missed_frees
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
        &if lost.is_empty() {
            "0".into()
        } else {
            format!("{}: {}", s.lost_total(), lost.join(", "))
        },
    );
    if let Some(n) = s.cut_stacks.filter(|&n| n > 0) {
        row(
            "cut stacks",
            &format!("{n}, cut where the frame-pointer walk read data, marked truncated"),
        );
    }
    row(
        "filters",
        &if s.filters.is_empty() {
            "none".into()
        } else {
            s.filters.join(", ")
        },
    );
    row("order of stacks", &s.order());
    out.push_str("</dl>\n</section>\n");
}

fn timeline(out: &mut String, report: &Report) {
    out.push_str("<section id=\"timeline\">\n<h2>Outstanding bytes over time</h2>\n");
    match &report.timeline {
        Some(t) if !t.total_bytes.is_empty() => {
            let _ = writeln!(
                out,
                "<p class=\"muted\">At the end of each of {} windows of {}: the total \
outstanding bytes matching the filters, and the top stacks of the table.</p>",
                t.total_bytes.len(),
                escape(&format_duration(t.window_ns))
            );
            out.push_str(
                "<div id=\"timeline-chart\"><noscript>The chart needs JavaScript.</noscript></div>\n",
            );
        }
        _ => out.push_str(
            "<div id=\"timeline-chart\"><p class=\"muted\">No timeline in this report.</p></div>\n",
        ),
    }
    out.push_str("</section>\n");
}

fn flamegraphs(out: &mut String, report: &Report) {
    let s = &report.summary;
    // The default colours: by verdict when there are verdicts, so that
    // definitely lost memory is the red of the graph.
    let default = if s.leak.is_some() {
        "verdict"
    } else {
        "function"
    };
    let _ = writeln!(
        out,
        "<section id=\"flamegraph\" data-colour=\"{default}\">\n<h2>Flamegraph</h2>"
    );
    let allocated = report
        .stacks
        .iter()
        .filter(|st| st.allocated_bytes > 0)
        .count();
    let _ = writeln!(
        out,
        "<p class=\"muted\">Every stack of the report: the {} with outstanding allocations by \
outstanding bytes or allocations, the {} that allocated by allocated bytes; outermost frame at \
the bottom. Click a frame to zoom, Ctrl-F to search.</p>",
        plural(s.outstanding_stacks, "stack", "stacks"),
        allocated
    );
    out.push_str("<div class=\"toggle\" role=\"group\" aria-label=\"flamegraph weight\">");
    for w in FLAMEGRAPHS {
        let _ = write!(
            out,
            "<button type=\"button\" data-weight=\"{}\" aria-pressed=\"false\">{}</button>",
            w.name(),
            w.describe()
        );
    }
    out.push_str("</div>\n");
    colour_toggle(out, s.leak.is_some());
    for w in FLAMEGRAPHS {
        let _ = writeln!(
            out,
            "<iframe class=\"flamegraph\" data-weight=\"{0}\" data-source=\"flamegraph-{0}\" \
title=\"flamegraph by {1}\"></iframe>",
            w.name(),
            w.describe()
        );
    }
    out.push_str("</section>\n");
}

/// The buttons that colour the flamegraphs by function (inferno's), by
/// verdict (with a scan) and by growth, and the legend of each.
fn colour_toggle(out: &mut String, verdicts: bool) {
    out.push_str("<div class=\"toggle colour\" role=\"group\" aria-label=\"flamegraph colours\">");
    for (mode, label) in [
        ("function", "colour by function"),
        ("verdict", "by leak verdict"),
        ("growth", "by growth"),
    ] {
        if mode == "verdict" && !verdicts {
            continue;
        }
        let _ = write!(
            out,
            "<button type=\"button\" data-colour=\"{mode}\" aria-pressed=\"false\">{label}</button>"
        );
    }
    out.push_str("</div>\n");
    for (mode, classes) in [
        ("verdict", &colours::VERDICT_CLASSES[..5]),
        ("growth", &colours::GROWTH_CLASSES[..4]),
    ] {
        if mode == "verdict" && !verdicts {
            continue;
        }
        let _ = write!(out, "<div class=\"legend colours\" data-colour=\"{mode}\">");
        for class in classes {
            let fill = colours::FILLS
                .iter()
                .find(|(c, _)| c == class)
                .map_or("#ccc", |f| f.1);
            let _ = write!(
                out,
                "<span><span class=\"swatch box\" style=\"background:{fill}\"></span>{}</span>",
                colours::legend_name(class)
            );
        }
        out.push_str(
            "<span class=\"muted\">(each frame in the colour of the worst beneath it)</span></div>\n",
        );
    }
}

/// The innermost frame of a stack, for labels: function and source line,
/// of the innermost inlined function when there is one (two call sites
/// in one function differ by what was inlined there).
fn stack_label(st: &StackReport) -> String {
    match st.frames.first() {
        Some(f) => {
            let (name, loc) = match f.inlined.first() {
                Some(inl) => (
                    inl.function.clone(),
                    source_loc(inl.file.as_deref(), inl.line),
                ),
                None => (
                    f.function.clone().unwrap_or_else(|| object_loc(f)),
                    source_loc(f.file.as_deref(), f.line),
                ),
            };
            match loc {
                Some(loc) => format!("{name} ({loc})"),
                None => name,
            }
        }
        None if st.stack_id == 0 => "[no stack]".into(),
        None => format!("[missing stack {}]", st.stack_id),
    }
}

fn source_loc(file: Option<&str>, line: Option<u32>) -> Option<String> {
    match (file, line) {
        (Some(f), Some(l)) => Some(format!("{f}:{l}")),
        (Some(f), None) => Some(f.to_string()),
        _ => None,
    }
}

fn object_loc(f: &Frame) -> String {
    match (&f.path, f.file_offset) {
        (Some(p), Some(o)) => format!("{p}+0x{o:x}"),
        (Some(p), None) => p.clone(),
        (None, _) => format!("[0x{:x}]", f.addr),
    }
}

fn stacks_table(out: &mut String, report: &Report) {
    let top = report.top_stacks();
    let s = &report.summary;
    out.push_str("<section id=\"stacks\">\n<h2>Top stacks</h2>\n");
    if top.is_empty() {
        out.push_str("<p>No outstanding allocations");
        if !s.filters.is_empty() {
            out.push_str(" matching the filters");
        }
        out.push_str(".</p>\n</section>\n");
        return;
    }
    let _ = writeln!(
        out,
        "<p class=\"muted\">Top {} of {} stacks with outstanding allocations, {}. \
Click a header to sort, a stack to see its frames.</p>",
        top.len(),
        s.outstanding_stacks,
        escape(&s.order())
    );
    let verdicts = s.leak.is_some();
    out.push_str(
        "<table class=\"stacks\">\n<thead><tr>\
<th data-numeric>#</th><th>stack (innermost frame)</th>",
    );
    if verdicts {
        out.push_str("<th data-numeric title=\"worst verdict first\">verdict</th>");
    }
    out.push_str(
        "<th data-numeric>bytes</th><th data-numeric>count</th>\
<th data-numeric>allocated bytes</th><th data-numeric>oldest</th>\
<th>growth</th><th>age histogram</th></tr></thead>\n<tbody>\n",
    );
    for (i, st) in top.iter().enumerate() {
        stack_row(out, i + 1, st, verdicts);
    }
    out.push_str("</tbody>\n</table>\n</section>\n");
}

fn stack_row(out: &mut String, rank: usize, st: &StackReport, verdicts: bool) {
    let _ = write!(
        out,
        "<tr data-stack=\"{}\"><td class=\"num rank\" data-v=\"{rank}\">{rank}</td><td>",
        st.stack_id
    );
    let mut who = format!("stack {}", st.stack_id);
    if st.kernel {
        who.push_str(", kernel");
    } else if let Some(pid) = st.pid {
        let _ = write!(who, ", pid {pid}");
    }
    let _ = write!(
        out,
        "<details><summary><code>{}</code> <span class=\"muted\">({})</span></summary>",
        escape(&stack_label(st)),
        escape(&who)
    );
    frames_list(out, st);
    out.push_str("</details></td>");
    if verdicts {
        verdict_cell(out, st);
    }
    num_cell(out, st.bytes, Some(format_bytes(st.bytes)));
    num_cell(out, st.count, None);
    num_cell(
        out,
        st.allocated_bytes,
        Some(format_bytes(st.allocated_bytes)),
    );
    let _ = write!(
        out,
        "<td class=\"num\" data-v=\"{}\">{}</td>",
        st.oldest_age_ns,
        escape(&format_duration(st.oldest_age_ns))
    );
    match &st.growth {
        Some(g) => {
            let v = g.verdict.name();
            // An unknown verdict has no trend to give a slope of.
            let detail = match g.verdict {
                crate::growth::Verdict::Unknown => "too few samples".to_string(),
                _ => format!("{}/s, fit {:.2}", signed_bytes(g.slope_bytes_per_s), g.fit),
            };
            let _ = write!(
                out,
                "<td data-v=\"{v}\"><span class=\"verdict {v}\">{v}</span><br>\
<span class=\"muted\">{}</span></td>",
                escape(&detail)
            );
        }
        None => out.push_str("<td data-v=\"\" class=\"muted\">n/a</td>"),
    }
    out.push_str("<td>");
    age_histogram(out, st);
    out.push_str("</td></tr>\n");
}

/// The stack's worst verdict, sortable (definitely lost first), and its
/// bytes and blocks by verdict.
fn verdict_cell(out: &mut String, st: &StackReport) {
    let Some(v) = &st.verdicts else {
        out.push_str("<td data-v=\"9\" class=\"muted\">n/a</td>");
        return;
    };
    let Some((worst, _)) = v.worst() else {
        out.push_str("<td data-v=\"9\" class=\"muted\">none</td>");
        return;
    };
    let name = verdict_name(worst);
    // Sorted descending first by the page: worst verdict, highest value.
    let _ = write!(
        out,
        "<td data-v=\"{}\"><span class=\"verdict {name}\">{}</span>",
        9 - verdict_rank(worst),
        colours::legend_name(name)
    );
    for k in VERDICTS_AND_UNSCANNED {
        let t = v.get(k);
        if t.allocations > 0 || t.bytes > 0 {
            let _ = write!(
                out,
                "<br><span class=\"muted\">{} {} in {}</span>",
                verdict_name(k),
                escape(&format_bytes(t.bytes)),
                t.allocations
            );
        }
    }
    out.push_str("</td>");
}

fn num_cell(out: &mut String, v: u64, human: Option<String>) {
    let _ = write!(out, "<td class=\"num\" data-v=\"{v}\">{v}");
    if let Some(h) = human.filter(|_| v >= 1024) {
        let _ = write!(out, "<span class=\"h\">{}</span>", escape(&h));
    }
    out.push_str("</td>");
}

/// A rate of bytes, signed: `+1.50 KiB`, `-12 B`.
fn signed_bytes(v: f64) -> String {
    let sign = if v < 0.0 { "-" } else { "+" };
    let a = v.abs();
    if a.is_finite() && a < u64::MAX as f64 {
        format!("{sign}{}", format_bytes(a.round() as u64))
    } else {
        format!("{v}")
    }
}

fn frames_list(out: &mut String, st: &StackReport) {
    if st.frames.is_empty() {
        let what = if st.stack_id == 0 {
            "no stack was captured"
        } else {
            "stack missing from the trace"
        };
        let _ = write!(out, "<p class=\"muted\">[{what}]</p>");
        return;
    }
    out.push_str("<ol class=\"frames\" start=\"0\">");
    for f in &st.frames {
        out.push_str("<li>");
        for inl in &f.inlined {
            let _ = write!(
                out,
                "<div class=\"inl\"><code>{}</code> [inlined]",
                escape(&inl.function)
            );
            if let Some(loc) = source_loc(inl.file.as_deref(), inl.line) {
                let _ = write!(out, " <span class=\"mono\">{}</span>", escape(&loc));
            }
            out.push_str("</div>");
        }
        let name = match (&f.function, f.offset) {
            (Some(func), Some(off)) => format!("{func}+0x{off:x}"),
            (Some(func), None) => func.clone(),
            (None, _) => "??".to_string(),
        };
        let _ = write!(out, "<code>{}</code>", escape(&name));
        let loc = source_loc(f.file.as_deref(), f.line);
        if let Some(loc) = &loc {
            let _ = write!(out, " <span class=\"mono\">{}</span>", escape(loc));
        }
        if loc.is_none() || f.function.is_none() {
            let _ = write!(
                out,
                " <span class=\"muted mono\">{}</span>",
                escape(&object_loc(f))
            );
        }
        out.push_str("</li>");
    }
    out.push_str("</ol>");
    if st.truncated {
        out.push_str("<p class=\"muted\">[truncated: outer frames missing]</p>");
    }
}

/// The stack's age histogram as a small bar chart, one bar per log2
/// bucket of age, height by allocations; each bar's tooltip says its range.
fn age_histogram(out: &mut String, st: &StackReport) {
    let buckets = st.age_histogram.buckets();
    if buckets.is_empty() {
        return;
    }
    let max = buckets.iter().map(|b| b.count).max().unwrap_or(1).max(1);
    let (bar, gap, h) = (8u32, 2u32, 28u32);
    let width = buckets.len() as u32 * (bar + gap);
    let first = buckets[0].low_us;
    let last = buckets[buckets.len() - 1].high_us;
    let _ = write!(
        out,
        "<svg class=\"hist\" width=\"{width}\" height=\"{h}\" role=\"img\" \
aria-label=\"ages from {} to {}\">",
        escape(&format_duration(first.saturating_mul(1000))),
        escape(&format_duration(last.saturating_mul(1000)))
    );
    for (i, b) in buckets.iter().enumerate() {
        let bh = if b.count == 0 {
            0
        } else {
            ((b.count as u128 * h as u128).div_ceil(max as u128) as u32).max(1)
        };
        let _ = write!(
            out,
            "<rect x=\"{}\" y=\"{}\" width=\"{bar}\" height=\"{bh}\"><title>{}: {}, {} bytes</title></rect>",
            i as u32 * (bar + gap),
            h - bh,
            escape(&age_range(b.low_us, b.high_us)),
            plural(b.count, "allocation", "allocations"),
            b.bytes
        );
    }
    out.push_str("</svg>");
}

fn age_range(low_us: u64, high_us: u64) -> String {
    if high_us == 0 {
        return "under 1us".into();
    }
    if high_us == u64::MAX {
        return format!("{} and older", format_duration(low_us.saturating_mul(1000)));
    }
    format!(
        "{} to {}",
        format_duration(low_us.saturating_mul(1000)),
        format_duration(high_us.saturating_mul(1000) + 999)
    )
}

/// The HTML page: `--format html`, `report.html`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Html;

impl crate::render::Render<Report> for Html {
    fn file_name(&self) -> &'static str {
        "report.html"
    }

    fn write(&self, report: &Report, out: &mut (dyn Write + Send)) -> io::Result<()> {
        write(report, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::growth::{Growth, Timeline, Verdict};
    use crate::model::{Inlined, Summary};

    /// A report as a C++ program's trace gives one: names and paths full
    /// of `<`, `>` and `&`.
    fn report(with_growth: bool) -> Report {
        let mut hist = crate::AgeHistogram::default();
        hist.add(5_000, 2, 64);
        hist.add(3_000_000_000, 1, 1000);
        let leak = StackReport {
            stack_id: 7,
            pid: Some(42),
            known: true,
            bytes: 123_457,
            count: 3,
            allocated_bytes: 999_999,
            allocations: 9,
            oldest_age_ns: 3_000_000_000,
            age_histogram: hist,
            frames: vec![
                Frame {
                    addr: 0x1000,
                    function: Some("std::vector<int, A&B>::push_back".into()),
                    offset: Some(0x10),
                    file: Some("/usr/include/c++/<vector>".into()),
                    line: Some(12),
                    inlined: vec![Inlined {
                        function: "grow<\"x\">".into(),
                        file: Some("a&b.h".into()),
                        line: Some(3),
                        column: None,
                    }],
                    ..Default::default()
                },
                Frame {
                    addr: 0x2000,
                    function: None,
                    path: Some("/lib/libx.so".into()),
                    file_offset: Some(0x2a),
                    ..Default::default()
                },
            ],
            growth: with_growth.then(|| Growth {
                verdict: Verdict::Growing,
                slope_bytes_per_s: 2048.0,
                fit: 0.97,
                samples: vec![0, 40_000, 80_000, 123_457],
            }),
            ..Default::default()
        };
        let freed = StackReport {
            stack_id: 8,
            allocated_bytes: 10,
            allocations: 1,
            ..Default::default()
        };
        Report {
            summary: Summary {
                trace: "/tmp/<t>&.parquet".into(),
                outstanding_bytes: 123_457,
                outstanding_allocations: 3,
                outstanding_stacks: 1,
                filters: vec!["min_size=<1k>".into()],
                ..Default::default()
            },
            stacks: vec![leak, freed],
            top: 10,
            timeline: with_growth.then(|| Timeline {
                start_ns: 0,
                window_ns: 250_000_000,
                total_bytes: vec![10, 40_010, 80_010, 123_467],
            }),
            ..Default::default()
        }
    }

    /// The `memleak-data` JSON the page's script reads.
    fn page_data(page: &str) -> serde_json::Value {
        let start = page
            .find("<script type=\"application/json\" id=\"memleak-data\">")
            .expect("data element");
        let body = &page[start..];
        let body = &body[body.find('>').unwrap() + 1..body.find("</script>").unwrap()];
        serde_json::from_str(body).expect("valid JSON")
    }

    /// Every SVG embedded for the flamegraphs, decoded.
    fn flamegraphs(page: &str) -> Vec<String> {
        FLAMEGRAPHS
            .iter()
            .map(|w| {
                let tag = format!("id=\"flamegraph-{}\">", w.name());
                let at = page.find(&tag).expect("flamegraph element") + tag.len();
                let end = at + page[at..].find("</script>").unwrap();
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(&page[at..end])
                    .expect("base64");
                String::from_utf8(bytes).unwrap()
            })
            .collect()
    }

    #[test]
    fn escapes_everything_from_the_trace() {
        let page = render(&report(true)).unwrap();
        // Raw text of a <script> element is not parsed as HTML: it only
        // must not contain `<` (checked below).
        let data_at = page.find("<script type=\"application/json\"").unwrap();
        let data_end = data_at + page[data_at..].find("</script>").unwrap();
        assert!(!page[data_at + 8..data_end].contains('<'));
        let html = format!("{}{}", &page[..data_at], &page[data_end..]);
        for raw in [
            "std::vector<int",
            "A&B>",
            "<vector>",
            "grow<\"x\">",
            "a&b.h",
            "<t>&",
            "<1k>",
        ] {
            assert!(!html.contains(raw), "{raw} unescaped");
        }
        assert!(page.contains("std::vector&lt;int, A&amp;B&gt;::push_back+0x10"));
        assert!(page.contains("/usr/include/c++/&lt;vector&gt;:12"));
        assert!(page.contains("grow&lt;&quot;x&quot;&gt;</code> [inlined]"));
        assert!(page.contains("a&amp;b.h:3"));
        assert!(page.contains("/lib/libx.so+0x2a"));
        assert!(page.contains("min_size=&lt;1k&gt;"));
        // The data for the script: no `<` to end its element early, and
        // the label is the innermost frame's, the function inlined there.
        let data = page_data(&page);
        assert_eq!(data["series"][0]["label"], "#1 grow<\"x\"> (a&b.h:3)");
        assert!(page.contains("<summary><code>grow&lt;&quot;x&quot;&gt; (a&amp;b.h:3)</code>"));
    }

    #[test]
    fn renders_with_timeline_and_growth() {
        let page = render(&report(true)).unwrap();
        let data = page_data(&page);
        assert_eq!(data["timeline"]["window_ns"], 250_000_000);
        assert_eq!(
            data["timeline"]["total"],
            serde_json::json!([10, 40_010, 80_010, 123_467])
        );
        assert_eq!(
            data["series"][0]["samples"],
            serde_json::json!([0, 40_000, 80_000, 123_457])
        );
        assert!(page.contains("<span class=\"verdict growing\">growing</span>"));
        assert!(page.contains("+2.00 KiB/s, fit 0.97"));
        assert!(page.contains("4 windows of 250ms"));
        assert!(!page.contains("No timeline in this report"));
        // Only the stack with outstanding allocations is a row.
        assert_eq!(page.matches("<tr data-stack=").count(), 1);
        assert!(page.contains("<td class=\"num\" data-v=\"123457\">123457"));
        // The age histogram: two non-empty buckets with empty ones between.
        assert!(page.contains("2 allocations, 64 bytes"));
        assert!(page.contains("1 allocation, 1000 bytes"));
    }

    #[test]
    fn renders_without_timeline_or_growth() {
        let page = render(&report(false)).unwrap();
        let data = page_data(&page);
        assert!(data["timeline"].is_null());
        assert_eq!(data["series"], serde_json::json!([]));
        assert!(page.contains("No timeline in this report."));
        assert!(page.contains("<td data-v=\"\" class=\"muted\">n/a</td>"));
        assert!(page.contains("<td class=\"num\" data-v=\"123457\">123457"));
    }

    #[test]
    fn embeds_three_flamegraphs_each_with_the_snippet() {
        let page = render(&report(true)).unwrap();
        let svgs = flamegraphs(&page);
        for (svg, w) in svgs.iter().zip(FLAMEGRAPHS) {
            assert!(svg.contains(&format!("by {}", w.describe())), "{w:?}");
            assert!(svg.contains("memleakFlamegraph"));
            assert!(svg.trim_end().ends_with("</svg>"));
            // The frames are in the SVG, escaped by inferno.
            assert!(svg.contains("push_back"));
        }
        // Weights: outstanding bytes, outstanding count, allocated bytes.
        assert!(svgs[0].contains("123,457 bytes"), "{}", &svgs[0][..2000]);
        assert!(svgs[1].contains("3 allocations"));
        assert!(svgs[2].contains("999,999 bytes"));
    }

    #[test]
    fn an_empty_report_is_a_page_too() {
        let page = render(&Report::default()).unwrap();
        assert!(page.contains("No outstanding allocations."));
        assert!(page.contains("No timeline in this report."));
        for svg in flamegraphs(&page) {
            assert!(svg.contains("nothing to draw"));
            assert!(svg.contains("memleakFlamegraph"));
        }
    }
}
