//! The diff as folded stacks: one side's, or both as the two columns
//! of a differential flamegraph.

use std::fmt::Write as _;

use super::compare::{frame_key, normalize_function, Diff, DiffStack, MatchOptions, Side, SEP};
use crate::model::Frame;

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

    pub(super) fn unit(self) -> &'static str {
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
pub(super) fn differential(d: &Diff, weight: DiffWeight, swapped: bool) -> String {
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

/// The diff as folded stacks, weighed by its [`DiffWeight`]: `memleak
/// diff --format folded`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Folded(pub DiffWeight);

impl crate::render::Render<Diff> for Folded {
    fn file_name(&self) -> &'static str {
        "diff.folded"
    }

    fn write(&self, d: &Diff, out: &mut (dyn std::io::Write + Send)) -> std::io::Result<()> {
        out.write_all(render_folded(d, self.0).as_bytes())
    }
}
