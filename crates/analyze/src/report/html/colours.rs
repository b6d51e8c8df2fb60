//! Colours of the page's flamegraphs by leak verdict and by growth.
//!
//! inferno colours a frame by its function's name. The page can colour
//! the same flamegraph by what the memory under each frame is: each
//! frame's `<rect>` gets `data-verdict` and `data-growth`, the worst class
//! of the memory under it (definitely lost before reachable, growing
//! before plateau), so that a red trail leads from the root to every
//! definitely lost block however small beside a cache, and a style sheet
//! in the SVG fills the rects by them when the page asks (a class on the
//! root element). inferno lays
//! the folded lines out in their sorted order, one sample per unit of
//! weight, and writes each frame's first sample and width (`fg:x`,
//! `fg:w`): the frame covers exactly the lines that start in that range.

use crate::growth::Verdict;
use crate::model::{Report, StackReport};
use crate::report::folded::{path, Weight};
use crate::verdicts::{verdict_rank, VERDICTS_AND_UNSCANNED};

/// The verdict classes, worst first; `none`: no scan applies.
pub(super) const VERDICT_CLASSES: [&str; 6] = [
    "definitely",
    "indirectly",
    "possibly",
    "reachable",
    "unscanned",
    "none",
];

/// The growth classes, in `--sort growth`'s order; `none`: not computed.
pub(super) const GROWTH_CLASSES: [&str; 5] = ["growing", "plateau", "unknown", "transient", "none"];

/// Fill of each class, shared by the flamegraph's style and the page's
/// legend: definitely lost and growing in the strongest red.
pub(super) const FILLS: [(&str, &str); 11] = [
    ("definitely", "#d62728"),
    ("indirectly", "#ff7f0e"),
    ("possibly", "#f0c419"),
    ("reachable", "#9ab3d5"),
    ("unscanned", "#cfcfcf"),
    ("none", "#e4e4e4"),
    ("growing", "#d62728"),
    ("plateau", "#f0a030"),
    ("unknown", "#cfcfcf"),
    ("transient", "#7cbf7c"),
    ("none", "#e4e4e4"),
];

/// A folded line's weight split by class.
struct Line {
    weight: u64,
    verdicts: [u64; 6],
    growth: [u64; 5],
}

fn growth_class(st: &StackReport) -> usize {
    match st.growth.as_ref().map(|g| g.verdict) {
        Some(Verdict::Growing) => 0,
        Some(Verdict::Plateau) => 1,
        Some(Verdict::Unknown) => 2,
        Some(Verdict::Transient) => 3,
        None => 4,
    }
}

/// The folded lines of `weight` in inferno's order (sorted as whole
/// lines), each with its first sample and its classes.
fn lines(report: &Report, weight: Weight) -> Vec<(u64, Line)> {
    let mut by_path: std::collections::HashMap<String, Line> = Default::default();
    for st in &report.stacks {
        let w = weight.of(st);
        if w == 0 {
            continue;
        }
        let line = by_path.entry(path(st)).or_insert(Line {
            weight: 0,
            verdicts: [0; 6],
            growth: [0; 5],
        });
        line.weight += w;
        line.growth[growth_class(st)] += w;
        match &st.verdicts {
            // Outstanding weights split by verdict; what was allocated
            // goes to the stack's worst verdict.
            Some(v) if matches!(weight, Weight::Bytes | Weight::Count) => {
                for k in VERDICTS_AND_UNSCANNED {
                    let t = v.get(k);
                    let amount = match weight {
                        Weight::Bytes => t.bytes,
                        _ => t.allocations,
                    };
                    line.verdicts[verdict_rank(k) as usize] += amount;
                }
            }
            Some(v) => match v.worst() {
                Some((k, _)) => line.verdicts[verdict_rank(k) as usize] += w,
                None => line.verdicts[5] += w,
            },
            None => line.verdicts[5] += w,
        }
    }
    let mut sorted: Vec<(String, Line)> = by_path
        .into_iter()
        .map(|(p, l)| (format!("{p} {}", l.weight), l))
        .collect();
    sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut at = 0;
    sorted
        .into_iter()
        .map(|(_, l)| {
            let start = at;
            at += l.weight;
            (start, l)
        })
        .collect()
}

/// The worst class (the first) with any weight of `amounts`; the last,
/// `none`, when none has.
fn worst(amounts: &[u64]) -> usize {
    amounts
        .iter()
        .position(|&a| a > 0)
        .unwrap_or(amounts.len() - 1)
}

/// `svg` (inferno's, for `weight`) with each frame's classes and the
/// style sheet that fills by them.
pub(super) fn annotate(svg: &[u8], report: &Report, weight: Weight) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(svg) else {
        return svg.to_vec();
    };
    let lines = lines(report, weight);
    let starts: Vec<u64> = lines.iter().map(|(s, _)| *s).collect();
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    let mut rest = text;
    const X: &str = " fg:x=\"";
    while let Some(i) = rest.find(X) {
        let after = &rest[i + X.len()..];
        let parsed = (|| {
            let x_end = after.find('"')?;
            let x: u64 = after[..x_end].parse().ok()?;
            let w_at = after.find(" fg:w=\"")? + 7;
            let w_end = w_at + after[w_at..].find('"')?;
            let w: u64 = after[w_at..w_end].parse().ok()?;
            Some((x, w, w_end + 1))
        })();
        let Some((x, w, end)) = parsed else {
            out.push_str(&rest[..i + X.len()]);
            rest = after;
            continue;
        };
        let from = starts.partition_point(|&s| s < x);
        let to = starts.partition_point(|&s| s < x.saturating_add(w));
        let (mut verdicts, mut growth) = ([0u64; 6], [0u64; 5]);
        for (_, l) in &lines[from..to] {
            for (a, b) in verdicts.iter_mut().zip(l.verdicts) {
                *a += b;
            }
            for (a, b) in growth.iter_mut().zip(l.growth) {
                *a += b;
            }
        }
        out.push_str(&rest[..i + X.len() + end]);
        out.push_str(&format!(
            " data-verdict=\"{}\" data-growth=\"{}\"",
            VERDICT_CLASSES[worst(&verdicts)],
            GROWTH_CLASSES[worst(&growth)]
        ));
        rest = &after[end..];
    }
    out.push_str(rest);
    let style = style_sheet();
    match out.rfind("</svg>") {
        Some(at) => out.insert_str(at, &style),
        None => out.push_str(&style),
    }
    out.into_bytes()
}

/// The rules that fill the frames by class under `.by-verdict` and
/// `.by-growth` on the root element; a searched frame keeps inferno's
/// highlight.
fn style_sheet() -> String {
    let mut css = String::from("<style type=\"text/css\"><![CDATA[\n");
    for (i, (class, fill)) in FILLS.iter().enumerate() {
        let (mode, attr) = if i < VERDICT_CLASSES.len() {
            ("by-verdict", "data-verdict")
        } else {
            ("by-growth", "data-growth")
        };
        css.push_str(&format!(
            ".{mode} rect[{attr}=\"{class}\"]:not([fill=\"rgb(230,0,230)\"]) {{ fill: {fill}; }}\n"
        ));
    }
    css.push_str("]]></style>\n");
    css
}

/// A class's name as the legend says it.
pub(super) fn legend_name(class: &str) -> &str {
    match class {
        "definitely" => "definitely lost",
        "indirectly" => "indirectly lost",
        "possibly" => "possibly lost",
        "reachable" => "still reachable",
        "none" => "no verdict",
        "unknown" => "unknown (too few samples)",
        c => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdicts::verdict_name;

    #[test]
    fn classes_are_the_verdicts_names() {
        for v in VERDICTS_AND_UNSCANNED {
            assert_eq!(VERDICT_CLASSES[verdict_rank(v) as usize], verdict_name(v));
        }
    }
}
