//! DWARF-based unwinding for code without frame pointers (issue 18).
//!
//! Distribution binaries and `-O2` builds keep no frame pointers, so a
//! frame-pointer walk stops after one frame. Instead, at record time each
//! executable object's `.eh_frame` (or `.debug_frame`) is reduced to a
//! compact, sorted table of 8-byte [`Row`]s that the probe can search and
//! apply with a few loads per frame.
//!
//! - [`row`]: the row layout shared with BPF, and its lookup.
//! - [`build`]: rows from an ELF file's CFI, with gimli.
//! - [`cache`]: tables by build id, so a shared library is read once.
//! - [`reference`]: the unwinder the probe implements, in user space.
//! - [`tables`]: the probe's row array and per-process mapping tables.

pub mod build;
pub mod cache;
pub mod reference;
pub mod row;
pub mod tables;

pub use build::{build, BuildError, BuildStats, Table, Unsupported};
pub use cache::{UnwindCache, UnwindObject};
pub use reference::{unwind, End, Frame, Memory, Mode, ObjectMap, Regs, Truncation, Unwound};
pub use row::{Kind, Row};
pub use tables::{MapEntry, ProcTable, TablesStats, UnwindSink, UnwindTables, WalkMode};
