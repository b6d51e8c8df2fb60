//! Flamegraph SVG, drawn by inferno from the folded stacks.

use inferno::flamegraph::color::{BasicPalette, Palette};
use inferno::flamegraph::{self, Options};

use crate::model::Report;
use crate::report::folded::{lines, Weight};

/// Renders an interactive flamegraph of the report, titled with the trace
/// and the weight. With nothing to draw, a small SVG that says so.
pub fn render(report: &Report, weight: Weight) -> std::io::Result<Vec<u8>> {
    let trace = std::path::Path::new(&report.summary.trace)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| report.summary.trace.clone());
    let title = format!("memleak: {trace}, by {}", weight.describe());
    let lines = lines(report, weight);
    if lines.is_empty() {
        return Ok(empty_svg(&title).into_bytes());
    }
    let mut opts = Options::default();
    opts.title = title;
    // Stacks, as every report counts them, not the distinct frame paths
    // they fold into: the page's "6 stacks" and this title must agree.
    let stacks = report.stacks.iter().filter(|s| weight.of(s) > 0).count();
    let mut subtitle = format!("{stacks} stacks");
    if let Some(s) = report.summary.sampling {
        subtitle.push_str(&format!(
            "; estimates from a sampled recording (mean {})",
            crate::time::format_bytes(s.mean_bytes)
        ));
    }
    if !report.summary.filters.is_empty() {
        subtitle.push_str(&format!("; filters: {}", report.summary.filters.join(", ")));
    }
    opts.subtitle = Some(subtitle);
    opts.count_name = weight.unit().to_string();
    opts.colors = Palette::Basic(BasicPalette::Mem);
    // Same colors for the same function across runs, so two flamegraphs
    // of the same program can be compared by eye.
    opts.hash = true;
    let mut out = Vec::new();
    flamegraph::from_lines(&mut opts, lines.iter().map(|l| l.as_str()), &mut out)?;
    Ok(out)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub(crate) fn empty_svg(title: &str) -> String {
    let t = escape(title);
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
<svg version=\"1.1\" width=\"600\" height=\"80\" xmlns=\"http://www.w3.org/2000/svg\">\n\
<title>{t}</title>\n\
<text x=\"300\" y=\"30\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">{t}</text>\n\
<text x=\"300\" y=\"60\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"12\">nothing to draw: no outstanding allocations match</text>\n\
</svg>\n"
    )
}

/// The flamegraph format, weighed by its [`Weight`]: `--format svg`,
/// `flamegraph.svg`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Svg(pub Weight);

impl crate::render::Render<Report> for Svg {
    fn file_name(&self) -> &'static str {
        "flamegraph.svg"
    }

    fn write(&self, report: &Report, out: &mut (dyn std::io::Write + Send)) -> std::io::Result<()> {
        out.write_all(&render(report, self.0)?)
    }
}
