//! The diff as a differential flamegraph, drawn by inferno.

use super::compare::Diff;
use super::folded::{differential, DiffWeight};

/// Draws the differential flamegraph with inferno: widths are NEW's
/// (BASE's with `base_widths`, so that what NEW freed shows), colors the
/// change (red grown, blue shrunk) either way.
pub fn render_svg(d: &Diff, weight: DiffWeight, base_widths: bool) -> std::io::Result<Vec<u8>> {
    use inferno::flamegraph::{self, Options};
    let name = |t: &str| {
        std::path::Path::new(t)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| t.to_string())
    };
    let title = format!(
        "memleak diff: {} -> {}, by outstanding {}",
        name(&d.summary.base.trace),
        name(&d.summary.new.trace),
        weight.unit()
    );
    let folded = differential(d, weight, base_widths);
    if folded.is_empty() {
        return Ok(crate::report::svg::empty_svg(&title).into_bytes());
    }
    let mut opts = Options::default();
    opts.title = title;
    let widths = if base_widths { "BASE" } else { "NEW" };
    let mut subtitle = format!("widths: {widths}; red: grown, blue: shrunk (NEW - BASE)");
    if !d.summary.filters.is_empty() {
        subtitle.push_str(&format!("; filters: {}", d.summary.filters.join(", ")));
    }
    opts.subtitle = Some(subtitle);
    opts.count_name = weight.unit().to_string();
    // With the columns swapped, inferno's change is BASE - NEW: negated,
    // red still means grown.
    opts.negate_differentials = base_widths;
    let mut out = Vec::new();
    flamegraph::from_lines(&mut opts, folded.lines(), &mut out)?;
    Ok(out)
}

/// The differential flamegraph: `memleak diff --format svg`, widths of
/// NEW, or of BASE with `base_widths`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Svg {
    /// What the widths measure.
    pub weight: DiffWeight,
    /// Widths of BASE rather than NEW (`--base-widths`).
    pub base_widths: bool,
}

impl crate::render::Render<Diff> for Svg {
    fn file_name(&self) -> &'static str {
        "diff.svg"
    }

    fn write(&self, d: &Diff, out: &mut (dyn std::io::Write + Send)) -> std::io::Result<()> {
        out.write_all(&render_svg(d, self.weight, self.base_widths)?)
    }
}
