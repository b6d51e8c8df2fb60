//! The output formats of a [`Report`](crate::model::Report), one file
//! each: [`text`], [`json`] (schema in `docs/json.md`), [`folded`] stacks,
//! [`svg`] flamegraphs, [`pprof`] profiles and a self-contained [`html`]
//! page. Each implements [`Render`](crate::render::Render); adding a
//! format is adding a file here.
//!
//! The report's types and the analysis that builds them are re-exported
//! here for the paths callers already use (`report::analyze`,
//! `report::StackReport`).

pub mod folded;
pub mod html;
pub mod json;
pub mod pprof;
pub mod svg;
pub mod text;

pub use folded::Folded;
pub use html::Html;
pub use json::Json;
pub use pprof::Pprof;
pub use svg::Svg;
pub use text::Text;

pub use crate::analysis::{analyze, analyze_trace, AnalyzeOptions};
pub use crate::model::{
    AtPeak, ClassTotals, Frame, Inlined, LeakSummary, OutstandingByClass, PidPeak, Report, SortKey,
    StackReport, Summary, SuppressedTotals,
};
pub use crate::stacks::{sort_stacks, sort_stacks_by_verdict};
