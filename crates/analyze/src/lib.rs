//! memleak's offline analysis: replays a recorded trace and reports which
//! call stacks hold memory that was never freed, how much, and how old.
//!
//! This crate owns everything after recording and needs no BPF, root or
//! target binaries: the parallel, partitioned [`replay`] of the events,
//! the [`model`] of the report the analysis builds from it (outstanding
//! allocations by stack with frames resolved, age histograms, anomalies,
//! peak), the [`filter`]s, and the output formats of [`report`], each a
//! [`Render`] of its own file: [`text`], [`json`] (schema in `docs/json.md`),
//! [`folded`] stacks, [`svg`] flamegraphs, [`pprof`] profiles and a
//! self-contained [`html`] page, and the [`diff`] of two traces; the leak
//! [`verdicts`] of a reachability scan joined to the outstanding blocks,
//! and the [`suppress`]ions that leave known runtime holders out; and the
//! [`fleet`] analysis of many traces merged into one report.
//!
//! ```no_run
//! use memleak_analyze::{analyze, AnalyzeOptions, SortKey};
//! let opts = AnalyzeOptions { top: 5, sort: SortKey::Bytes, ..Default::default() };
//! let report = analyze("trace.parquet", &opts)?;
//! for s in report.top_stacks() {
//!     println!("{} bytes in {} allocations from stack {}", s.bytes, s.count, s.stack_id);
//! }
//! print!("{}", memleak_analyze::text::render(&report));
//! # Ok::<(), memleak_trace::Error>(())
//! ```
#![deny(missing_docs)]

mod analysis;
pub mod behaviour;
pub mod diff;
pub mod filter;
pub mod fleet;
mod frame_table;
pub mod growth;
mod hash;
pub mod histogram;
pub mod model;
mod pool;
pub mod progress;
mod ranges;
pub mod render;
pub mod replay;
pub mod report;
pub mod sql;
mod stack_table;
mod stacks;
pub mod suppress;
mod table;
mod time;
pub mod verdicts;

pub use report::{folded, html, json, pprof, svg, text};

pub use analysis::{analyze, analyze_trace, AnalyzeOptions};
pub use filter::{Filter, KindScope};
pub use folded::Weight;
pub use growth::{Growth, Timeline, Verdict};
pub use histogram::AgeHistogram;
pub use model::{
    LeakSummary, OutstandingByClass, PidPeak, Report, SortKey, StackReport, Summary,
    SuppressedTotals,
};
pub use render::Render;
pub use suppress::Suppression;
pub use time::format_bytes;
pub use verdicts::{ClassTotals, VerdictSet, VerdictTotals};
