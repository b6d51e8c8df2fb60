//! The memleak trace format: what a recording looks like on disk, and the
//! only code that reads or writes it.
//!
//! A trace is a directory laid out like a Hive/Spark dataset, so that
//! DuckDB, pyarrow and Spark read it without help:
//!
//! ```text
//! trace.parquet/
//!   meta.json                 format version, host, clocks, command, counters
//!   events/part-00000.parquet one row per allocator event
//!   stacks/part-00000.parquet stack_id -> raw frame addresses
//!   frames/part-00000.parquet (pid, addr) -> normalized + symbolized frame
//!   maps/part-00000.parquet   /proc/PID/maps snapshots
//!   scan/part-00000.parquet   reachability verdicts of outstanding blocks
//! ```
//!
//! This crate owns the schema ([`schema`]), the metadata file ([`meta`])
//! and what its loss counters mean ([`losses`]),
//! the segmented writer ([`writer`]), the validating, streaming reader
//! ([`reader`]) and the `events` table's own encoder and fast decoder
//! ([`events`]), which hands replay decoded row groups. How files are
//! created and replaced ([`fsio`]) is shared with the CLI's reports, and
//! [`discover`] finds the traces of a dataset directory. It
//! has no BPF or symbolizer dependency, so a laptop without clang can open
//! any trace.
//!
//! ```no_run
//! use memleak_trace::{Trace, EventColumns};
//! let trace = Trace::open("trace.parquet")?;
//! let mut n = 0;
//! for batch in trace.events(EventColumns::ALL)? {
//!     n += batch?.len();
//! }
//! println!("{n} events, {} lost", trace.meta().counters.lost_total());
//! # Ok::<(), memleak_trace::Error>(())
//! ```
#![deny(missing_docs)]

mod checksum;
mod directory;
pub mod discover;
pub mod error;
pub mod events;
pub mod frame_columns;
pub mod fsio;
mod guarded;
pub mod lock;
pub mod losses;
pub mod meta;
pub mod reader;
pub mod schema;
pub mod stack_columns;
pub mod writer;

pub use discover::{find_traces, is_trace, FoundTrace};
pub use error::{describe_io, Error, Result};
pub use frame_columns::{DictColumn, FrameBatchRef, FrameColumns, FrameRow, InlinedRow};
pub use lock::TraceLock;
pub use losses::{describe_loss, loss_effect, LossEffect, Losses};
pub use meta::{
    Counters, KernelRecursion, Manifest, Meta, Sampling, ScanInfo, SegmentEntry, UnwindInfo,
};
pub use reader::{EventBatch, EventColumns, Incomplete, TableStats, Trace};
pub use schema::{
    Event, EventKind, FrameRecord, InlinedFrame, MapRecord, ScanRecord, ScanVerdict, StackRecord,
    Table,
};
pub use stack_columns::{StackColumns, StackRef};
pub use writer::{TraceWriter, WriterOptions};
