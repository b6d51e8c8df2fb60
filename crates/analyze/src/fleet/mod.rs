//! The analysis of many traces at once (`memleak analyze A B C…`, or a
//! dataset root): one report with the stacks of every trace merged by
//! their symbolized frames, as [`diff`](crate::diff) matches them, and a
//! breakdown of what each trace (host, command) holds.
//!
//! `run.rs` analyzes the traces a few at a time on the worker pool;
//! `merge.rs` reduces each report to its keyed stacks and merges them,
//! with keys as numbers (`keys.rs`);
//! `types.rs` holds what the merged [`Report`](crate::Report) adds, which
//! the report's formats read.

mod keys;
pub mod merge;
pub mod run;
pub mod types;

pub use merge::{Merger, TracePart};
pub use run::{analyze_traces, label, traced_command, FleetOptions, TraceSource};
pub use types::{Fleet, GroupBy, GroupTotals, StackOrigin, TraceTotals};
