//! `memleak info`: what a trace holds, without replaying it.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use memleak_trace::{Table, Trace};
use serde_json::json;

/// Arguments of `memleak info`.
#[derive(clap::Args)]
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

/// Everything `info` shows, as JSON; the text form is rendered from it.
fn report(trace: &Trace) -> serde_json::Value {
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
    let tables: serde_json::Map<String, serde_json::Value> = Table::ALL
        .iter()
        .map(|&t| {
            let st = trace.table_stats(t);
            let v = json!({
                "segments": st.segments, "rows": st.rows, "row_groups": st.row_groups, "bytes": st.bytes,
            });
            (t.name().to_string(), v)
        })
        .collect();
    let events_rows = trace.table_stats(Table::Events).rows;
    let events_bytes = trace.table_stats(Table::Events).bytes;
    json!({
        "path": trace.path(),
        "format": m.format,
        "format_version": m.format_version,
        "tool_version": m.tool_version,
        "host": m.host,
        "kernel": m.kernel,
        "command": m.command,
        "pids": m.pids,
        "start_ns": m.start_ns,
        "end_ns": m.end_ns,
        "start_utc": wall(m.start_ns).map(utc),
        "end_utc": wall(m.end_ns).map(utc),
        "duration_s": duration_s,
        "complete": m.complete,
        "exit_code": m.exit_code,
        "events": m.counters.events,
        "events_total": m.counters.events_total(),
        "lost": m.counters.lost,
        "lost_total": m.counters.lost_total(),
        "tables": tables,
        "events_bytes_per_event": (events_rows > 0).then(|| events_bytes as f64 / events_rows as f64),
        "warnings": trace.warnings(),
        "notes": (!m.notes.is_empty()).then_some(&m.notes),
        "failed_allocations": m.failed_allocations,
        "recorder_cpu_ns": m.recorder_cpu_ns,
    })
}

fn print_text(r: &serde_json::Value, out: &mut dyn Write) -> io::Result<()> {
    let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
    let or_unknown = |v: String| {
        if v.is_empty() {
            "(unknown)".to_string()
        } else {
            v
        }
    };
    writeln!(out, "trace:     {}", s("path"))?;
    writeln!(
        out,
        "format:    {} {} (written by memleak {})",
        s("format"),
        s("format_version"),
        or_unknown(s("tool_version"))
    )?;
    writeln!(
        out,
        "host:      {} (kernel {})",
        or_unknown(s("host")),
        or_unknown(s("kernel"))
    )?;
    let command: Vec<&str> = r["command"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str())
        .collect();
    writeln!(
        out,
        "command:   {}",
        if command.is_empty() {
            "(unknown)".to_string()
        } else {
            command.join(" ")
        }
    )?;
    let pids: Vec<String> = r["pids"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| p.to_string())
        .collect();
    writeln!(
        out,
        "pids:      {}",
        if pids.is_empty() {
            "(none)".to_string()
        } else {
            pids.join(" ")
        }
    )?;
    let when = |utc: &str, ns: &str| match r[utc].as_str() {
        Some(t) => format!("{t} (monotonic {} ns)", r[ns]),
        None if r[ns].as_u64().unwrap_or(0) != 0 => format!("monotonic {} ns", r[ns]),
        None => "(unknown)".to_string(),
    };
    writeln!(out, "start:     {}", when("start_utc", "start_ns"))?;
    writeln!(out, "end:       {}", when("end_utc", "end_ns"))?;
    match r["duration_s"].as_f64() {
        Some(d) => writeln!(out, "duration:  {d:.3} s")?,
        None => writeln!(out, "duration:  (unknown)")?,
    };
    let complete = if r["complete"].as_bool().unwrap_or(false) {
        match r["exit_code"].as_i64() {
            Some(c) => format!("yes (traced command exited with {c})"),
            None => "yes".to_string(),
        }
    } else {
        "no (recorder killed or still running)".to_string()
    };
    writeln!(out, "complete:  {complete}")?;

    let mut counts = |key: &str, total: &str| -> io::Result<()> {
        writeln!(out, "{key:<10} {}", r[total])?;
        if let Some(map) = r[key].as_object() {
            let width = map.keys().map(|k| k.len()).max().unwrap_or(0);
            for (k, v) in map {
                writeln!(out, "  {k:<width$}  {:>12}", v.as_u64().unwrap_or(0))?;
            }
        }
        Ok(())
    };
    counts("events", "events_total")?;
    counts("lost", "lost_total")?;
    if let Some(n) = r["failed_allocations"].as_u64() {
        writeln!(
            out,
            "failed allocations: {n} (returned NULL; not outstanding)"
        )?;
    }
    for note in r["notes"].as_array().into_iter().flatten() {
        writeln!(out, "note:      {}", note.as_str().unwrap_or_default())?;
    }

    writeln!(
        out,
        "tables:    {:<8} {:>8} {:>12} {:>10} {:>12}",
        "", "segments", "rows", "row groups", "bytes"
    )?;
    if let Some(tables) = r["tables"].as_object() {
        for name in Table::ALL.iter().map(|t| t.name()) {
            let n = |k: &str| tables[name][k].as_u64().unwrap_or(0);
            writeln!(
                out,
                "           {name:<8} {:>8} {:>12} {:>10} {:>12}",
                n("segments"),
                n("rows"),
                n("row_groups"),
                n("bytes")
            )?;
        }
    }
    if let Some(b) = r["events_bytes_per_event"].as_f64() {
        writeln!(out, "size:      {b:.2} bytes/event in the events table")?;
    }
    Ok(())
}

/// Formats nanoseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn utc(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
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
