//! `memleak diff BASE NEW`: the outstanding allocations of two analyses,
//! stack by stack, and how they changed ("did my fix work?").
//!
//! `compare.rs` matches the stacks across traces; each of the diff's
//! formats is a file of its own implementing [`Render`](crate::Render):
//! [`text`], [`json`], [`folded`] and [`svg`] (differential flamegraphs). The two
//! [`Report`]s come from the ordinary analysis, with the same options, so
//! every filter means what it means for `analyze`.
//!
//! Two traces rarely share addresses, stack ids or pids: the program may
//! be rebuilt, run on another host, or just loaded elsewhere. A stack is
//! therefore identified by its symbolized frames only (see [`stack_key`]),
//! and the stacks of one trace with the same key (several processes of
//! one program, or stacks that differ only in what the key ignores) are
//! merged before the two sides are compared.

mod compare;
pub mod folded;
pub mod json;
pub mod svg;
pub mod text;

pub(crate) use compare::{basename, push_row_key, SEP};
pub use compare::{
    diff, diff_keyed, frame_key, moved_lines_hint, normalize_function, stack_key, Change, Diff,
    DiffStack, DiffSummary, Keyed, MatchOptions, Side, SideSummary,
};
pub use folded::{render_folded, DiffWeight};
pub use json::render_json;
pub use svg::render_svg;
pub use text::render_text;
