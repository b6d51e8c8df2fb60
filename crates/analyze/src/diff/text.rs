//! The diff as text: the stacks that changed most, then the summary of
//! both sides.

use std::fmt::Write as _;

use super::compare::{Change, Diff, DiffStack};
use crate::time::format_bytes;

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
    for (side, t) in [("BASE", &s.base), ("NEW", &s.new)] {
        if let Some(sm) = t.sampling {
            let _ = writeln!(
                out,
                "ESTIMATES: the {side} recording is sampled (record --sample {}): its bytes \
                 and blocks are estimates.\n",
                format_bytes(sm.mean_bytes)
            );
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

/// The diff as text: `memleak diff --format text`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Text;

impl crate::render::Render<Diff> for Text {
    fn file_name(&self) -> &'static str {
        "diff.txt"
    }

    fn write(&self, d: &Diff, out: &mut (dyn std::io::Write + Send)) -> std::io::Result<()> {
        out.write_all(render_text(d).as_bytes())
    }
}
