//! Folded stacks (`outer;…;inner weight`), the input of flamegraph tools.

use std::collections::BTreeMap;

use crate::model::{Frame, Report, StackReport};

/// What a flamegraph's widths measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weight {
    /// Outstanding bytes (the leak view).
    #[default]
    Bytes,
    /// Outstanding allocations.
    Count,
    /// Bytes allocated during the trace, freed or not (the churn view).
    AllocatedBytes,
    /// Allocations made during the trace, freed or not.
    Allocations,
}

impl Weight {
    /// Name as given on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Weight::Bytes => "bytes",
            Weight::Count => "count",
            Weight::AllocatedBytes => "allocated-bytes",
            Weight::Allocations => "allocations",
        }
    }

    /// What the weight measures, for titles.
    pub fn describe(self) -> &'static str {
        match self {
            Weight::Bytes => "outstanding bytes",
            Weight::Count => "outstanding allocations",
            Weight::AllocatedBytes => "allocated bytes",
            Weight::Allocations => "allocations",
        }
    }

    /// Unit of the counts, for the flamegraph's tooltips.
    pub fn unit(self) -> &'static str {
        match self {
            Weight::Bytes | Weight::AllocatedBytes => "bytes",
            Weight::Count | Weight::Allocations => "allocations",
        }
    }

    /// The weight of a stack.
    pub fn of(self, s: &StackReport) -> u64 {
        match self {
            Weight::Bytes => s.bytes,
            Weight::Count => s.count,
            Weight::AllocatedBytes => s.allocated_bytes,
            Weight::Allocations => s.allocations,
        }
    }
}

/// Folded lines, sorted and merged (equal frame paths add up), weight > 0.
/// Every stack counts, not only the top ones: a flamegraph shows the whole.
pub fn lines(report: &Report, weight: Weight) -> Vec<String> {
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for s in &report.stacks {
        let w = weight.of(s);
        if w == 0 {
            continue;
        }
        *merged.entry(path(s)).or_insert(0) += w;
    }
    merged
        .into_iter()
        .map(|(p, w)| format!("{p} {w}"))
        .collect()
}

/// Renders the folded file: one line per distinct stack.
pub fn render(report: &Report, weight: Weight) -> String {
    let mut out = String::new();
    for l in lines(report, weight) {
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// The frames of a stack from outermost to innermost, inlined functions
/// expanded (suffix `_[i]`) and kernel frames marked (`_[k]`), as the
/// flamegraph palettes expect.
pub(crate) fn path(s: &StackReport) -> String {
    if s.frames.is_empty() {
        return if s.stack_id == 0 {
            "[no stack]".into()
        } else {
            format!("[missing stack {}]", s.stack_id)
        };
    }
    let suffix = if s.kernel { "_[k]" } else { "" };
    let mut names: Vec<String> = Vec::new();
    if s.truncated {
        names.push("[truncated]".into());
    }
    for f in s.frames.iter().rev() {
        names.push(format!("{}{suffix}", clean(&frame_name(f))));
        for inl in f.inlined.iter().rev() {
            names.push(format!("{}_[i]", clean(&inl.function)));
        }
    }
    names.join(";")
}

/// Function name, or `[object+0xoffset]` for a frame without a symbol.
fn frame_name(f: &Frame) -> String {
    if let Some(func) = &f.function {
        return func.clone();
    }
    match (&f.path, f.file_offset) {
        (Some(p), Some(o)) => format!("[{}+0x{o:x}]", p.rsplit('/').next().unwrap_or(p)),
        _ => format!("[0x{:x}]", f.addr),
    }
}

/// `;` separates frames and a newline ends the line: neither may appear
/// in a name.
fn clean(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}

/// The folded stacks format, weighed by its [`Weight`]: `--format
/// folded`, `stacks.folded`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Folded(pub Weight);

impl crate::render::Render<Report> for Folded {
    fn file_name(&self) -> &'static str {
        "stacks.folded"
    }

    fn write(&self, report: &Report, out: &mut (dyn std::io::Write + Send)) -> std::io::Result<()> {
        out.write_all(render(report, self.0).as_bytes())
    }
}
