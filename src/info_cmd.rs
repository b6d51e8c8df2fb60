//! `memleak info`: what a trace holds, without replaying it.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use memleak_trace::{Table, Trace};
use serde::Serialize;

use crate::exit_status::{self, Exit};

/// Arguments of `memleak info`.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  memleak info trace.parquet  # metadata, counters, lost events, tables
  memleak info trace.parquet --json | jq .lost
  memleak info trace.parquet --json | jq '.tables.events.rows'")]
pub struct InfoArgs {
    /// Trace directory written by `memleak record`.
    pub trace: PathBuf,
    /// Print one JSON object instead of text, for scripts.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: InfoArgs) -> anyhow::Result<ExitCode> {
    let trace = Trace::open(&args.trace)?;
    for w in trace.warnings() {
        say!("memleak: warning: {w}");
    }
    let report = report(&trace);
    crate::output::to_stdout(|out| {
        if args.json {
            serde_json::to_writer_pretty(&mut *out, &report)?;
            writeln!(out)
        } else {
            print_text(&report, out)
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Everything `info` shows: `--json` prints it as it is, the text form is
/// rendered from it.
///
/// The fields are in alphabetical order because that is the order of the
/// JSON object `info --json` has always printed (it was built as a
/// `serde_json::Value`, whose objects sort their keys): scripts that diff
/// the output see no change. Keep new fields in order too.
#[derive(Serialize)]
struct Report<'a> {
    /// How allocator calls were captured (`bpf` for traces from before
    /// the agent, which do not say).
    capture: &'a str,
    command: &'a [String],
    complete: bool,
    /// User stacks the recorder cut before data (`null`: not recorded).
    cut_stacks: Option<u64>,
    duration_s: Option<f64>,
    end_ns: u64,
    end_utc: Option<String>,
    events: &'a BTreeMap<String, u64>,
    events_bytes_per_event: Option<f64>,
    events_total: u64,
    /// The traced command's status as a shell reports it (128 + the
    /// signal if one killed it).
    exit_code: Option<i32>,
    /// Whether the signal that killed it dumped core.
    exit_core_dumped: bool,
    /// The signal that killed it (`null`: it exited, or the trace is
    /// older than format 1.4, which did not record signals).
    exit_signal: Option<i32>,
    /// Its name (`SIGKILL`).
    exit_signal_name: Option<String>,
    failed_allocations: Option<u64>,
    format: &'a str,
    format_version: &'a str,
    host: &'a str,
    kernel: &'a str,
    lost: &'a BTreeMap<String, u64>,
    lost_total: u64,
    /// `null` when the recorder left no notes.
    notes: Option<&'a [String]>,
    path: &'a Path,
    pids: &'a [u32],
    recorder_cpu_ns: Option<u64>,
    /// `record --sample`: the mean bytes between sample points (`null`:
    /// every call was recorded).
    sample_mean_bytes: Option<u64>,
    /// Reachability scans (`[]` when there was none).
    scans: &'a [memleak_trace::ScanInfo],
    start_ns: u64,
    start_utc: Option<String>,
    /// By table name, so in name order like the rest.
    tables: BTreeMap<&'static str, TableInfo>,
    tool_version: &'a str,
    /// `null` for traces without it (format 1.1 and older, kernel only).
    unwind: Option<&'a memleak_trace::UnwindInfo>,
    warnings: &'a [String],
    /// How the command ended, for the text.
    #[serde(skip)]
    exit: Option<Exit>,
    /// A trace older than 1.4 whose `exit_code` could be 128 + a signal.
    #[serde(skip)]
    signal_unrecorded: bool,
}

/// One table's line of [`Report::tables`] (fields in alphabetical order,
/// see [`Report`]).
#[derive(Serialize)]
struct TableInfo {
    bytes: u64,
    row_groups: u64,
    rows: u64,
    segments: u64,
}

fn report(trace: &Trace) -> Report<'_> {
    let m = trace.meta();
    // Event timestamps are CLOCK_MONOTONIC; the clock pair read at start
    // converts them to wall-clock time.
    let wall = |mono: u64| -> Option<u64> {
        (mono != 0 && m.clock.realtime_ns != 0)
            .then(|| m.clock.realtime_ns as i128 + mono as i128 - m.clock.monotonic_ns as i128)
            .and_then(|ns| u64::try_from(ns).ok())
    };
    let duration_s =
        (m.end_ns > m.start_ns && m.start_ns != 0).then(|| (m.end_ns - m.start_ns) as f64 / 1e9);
    // The scan table exists only in traces with a scan.
    let tables = Table::ALL
        .iter()
        .filter(|&&t| t != Table::Scan || trace.table_stats(t).segments > 0)
        .map(|&t| {
            let st = trace.table_stats(t);
            let info = TableInfo {
                bytes: st.bytes,
                row_groups: st.row_groups,
                rows: st.rows,
                segments: st.segments,
            };
            (t.name(), info)
        })
        .collect();
    let events = trace.table_stats(Table::Events);
    let exit = Exit::from_meta(m);
    let exit_signal = exit.and_then(Exit::signal);
    Report {
        capture: m.capture.as_deref().unwrap_or("bpf"),
        sample_mean_bytes: m.sampling.map(|s| s.mean_bytes),
        command: &m.command,
        complete: m.complete,
        cut_stacks: m.cut_stacks,
        duration_s,
        end_ns: m.end_ns,
        end_utc: wall(m.end_ns).map(utc),
        events: &m.counters.events,
        events_bytes_per_event: (events.rows > 0).then(|| events.bytes as f64 / events.rows as f64),
        events_total: m.counters.events_total(),
        exit_code: m.exit_code,
        exit_core_dumped: m.exit_core_dumped,
        exit_signal,
        exit_signal_name: exit_signal.and_then(exit_status::signal_name),
        failed_allocations: m.failed_allocations,
        format: &m.format,
        format_version: &m.format_version,
        host: &m.host,
        kernel: &m.kernel,
        lost: &m.counters.lost,
        lost_total: m.counters.lost_total(),
        notes: (!m.notes.is_empty()).then_some(&m.notes[..]),
        path: trace.path(),
        pids: &m.pids,
        recorder_cpu_ns: m.recorder_cpu_ns,
        scans: &m.scans,
        start_ns: m.start_ns,
        start_utc: wall(m.start_ns).map(utc),
        tables,
        tool_version: &m.tool_version,
        unwind: m.unwind.as_ref(),
        warnings: trace.warnings(),
        exit,
        signal_unrecorded: m.version().is_some_and(|v| v < (1, 4))
            && m.exit_code.is_some_and(|c| (129..=128 + 64).contains(&c)),
    }
}

fn print_text(r: &Report<'_>, out: &mut dyn Write) -> io::Result<()> {
    let or_unknown = |v: &str| {
        if v.is_empty() {
            "(unknown)".to_string()
        } else {
            v.to_string()
        }
    };
    writeln!(out, "trace:     {}", r.path.display())?;
    writeln!(
        out,
        "format:    {} {} (written by memleak {})",
        r.format,
        r.format_version,
        or_unknown(r.tool_version)
    )?;
    writeln!(
        out,
        "host:      {} (kernel {})",
        or_unknown(r.host),
        or_unknown(r.kernel)
    )?;
    writeln!(
        out,
        "command:   {}",
        if r.command.is_empty() {
            "(unknown)".to_string()
        } else {
            r.command.join(" ")
        }
    )?;
    writeln!(
        out,
        "capture:   {}",
        match r.capture {
            "preload" => "preload (memleak's agent inside the command)",
            "bpf" => "bpf (kernel uprobes)",
            other => other,
        }
    )?;
    if let Some(mean) = r.sample_mean_bytes {
        writeln!(
            out,
            "sampled:   one allocation per {} allocated on average (record --sample): \
             reports give estimates",
            crate::units::format_size(mean)
        )?;
    }
    let pids: Vec<String> = r.pids.iter().map(|p| p.to_string()).collect();
    writeln!(
        out,
        "pids:      {}",
        if pids.is_empty() {
            "(none)".to_string()
        } else {
            pids.join(" ")
        }
    )?;
    let when = |utc: &Option<String>, ns: u64| match utc {
        Some(t) => format!("{t} (monotonic {ns} ns)"),
        None if ns != 0 => format!("monotonic {ns} ns"),
        None => "(unknown)".to_string(),
    };
    writeln!(out, "start:     {}", when(&r.start_utc, r.start_ns))?;
    writeln!(out, "end:       {}", when(&r.end_utc, r.end_ns))?;
    match r.duration_s {
        Some(d) => writeln!(out, "duration:  {d:.3} s")?,
        None => writeln!(out, "duration:  (unknown)")?,
    };
    let complete = if r.complete {
        match r.exit {
            Some(Exit::Code(c)) if r.signal_unrecorded => format!(
                "yes (traced command exited with {c}, or was {}: traces before format 1.4 \
                 do not say which)",
                exit_status::killed_by(c - 128)
            ),
            // "exited with 0", as info has always said.
            Some(Exit::Code(c)) => format!("yes (traced command exited with {c})"),
            Some(e) => format!("yes (traced command {e})"),
            None => "yes".to_string(),
        }
    } else {
        "no (recorder killed or still running)".to_string()
    };
    writeln!(out, "complete:  {complete}")?;

    let mut counts = |key: &str, total: u64, map: &BTreeMap<String, u64>| -> io::Result<()> {
        writeln!(out, "{key:<10} {total}")?;
        let width = map.keys().map(|k| k.len()).max().unwrap_or(0);
        for (k, v) in map {
            writeln!(out, "  {k:<width$}  {v:>12}")?;
        }
        Ok(())
    };
    counts("events", r.events_total, r.events)?;
    counts("lost", r.lost_total, r.lost)?;
    if let Some(u) = r.unwind {
        let truncated: u64 = u.truncated.values().sum();
        let reasons: Vec<String> = u
            .truncated
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(
            out,
            "unwind:    --unwind {}: {} complete, {} ended by frame pointer, {} truncated{}; \
             {} objects' unwind rows ({} rows)",
            u.mode,
            u.complete,
            u.frame_pointer,
            truncated,
            if reasons.is_empty() {
                String::new()
            } else {
                format!(" ({})", reasons.join(", "))
            },
            u.objects,
            u.rows
        )?;
    }
    if let Some(n) = r.failed_allocations {
        writeln!(
            out,
            "failed allocations: {n} (returned NULL; not outstanding)"
        )?;
    }
    if let Some(n) = r.cut_stacks.filter(|&n| n > 0) {
        writeln!(
            out,
            "cut stacks: {n} (ended before data the frame-pointer walk read; marked truncated)"
        )?;
    }
    for note in r.notes.into_iter().flatten() {
        writeln!(out, "note:      {note}")?;
    }

    for s in r.scans {
        let mib = (s.roots_bytes + s.heap_bytes) as f64 / (1 << 20) as f64;
        let per_mib = if mib > 0.0 {
            format!(", {:.3} ms/MiB", s.pause_ns as f64 / 1e6 / mib)
        } else {
            String::new()
        };
        write!(
            out,
            "scan:      pid {} at monotonic {} ns: paused {:.3} ms{per_mib}, {} threads, \
             {} bytes of roots, {} bytes of heap, {} blocks",
            s.pid,
            s.ts_ns,
            s.pause_ns as f64 / 1e6,
            s.threads,
            s.roots_bytes,
            s.heap_bytes,
            s.blocks
        )?;
        match &s.error {
            Some(e) => writeln!(out, "; failed: {e}")?,
            None => writeln!(out)?,
        }
    }
    writeln!(
        out,
        "tables:    {:<8} {:>8} {:>12} {:>10} {:>12}",
        "", "segments", "rows", "row groups", "bytes"
    )?;
    for name in Table::ALL.iter().map(|t| t.name()) {
        let Some(t) = r.tables.get(name) else {
            continue;
        };
        writeln!(
            out,
            "           {name:<8} {:>8} {:>12} {:>10} {:>12}",
            t.segments, t.rows, t.row_groups, t.bytes
        )?;
    }
    if let Some(b) = r.events_bytes_per_event {
        writeln!(out, "size:      {b:.2} bytes/event in the events table")?;
    }
    Ok(())
}

/// Formats nanoseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn utc(ns: u64) -> String {
    let [year, month, day, h, m, s] = crate::units::utc_fields(ns / 1_000_000_000);
    format!(
        "{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{:03}Z",
        ns % 1_000_000_000 / 1_000_000
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            super::utc(951_782_400_123_000_000),
            "2000-02-29T00:00:00.123Z"
        );
        assert_eq!(
            super::utc(1_735_689_599_999_999_999),
            "2024-12-31T23:59:59.999Z"
        );
    }
}
