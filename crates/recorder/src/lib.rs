//! memleak's recording pipeline, everything between the ring buffer and the
//! trace that does not need libbpf.
//!
//! - [`event`]: the byte layout of probe records (`bpf/memleak.h`).
//! - [`stacks`]: exact stack deduplication into trace-unique ids.
//! - [`procmaps`]: `/proc/PID/maps` snapshots and address normalization.
//! - [`functions`]: the ELF function symbols a return address lies in.
//! - [`symbolize`]: blazesym symbolization of normalized frames.
//! - [`pipeline`]: [`Recorder`], which ties them to a `TraceWriter`.
//! - [`live`]: what is outstanding now, by stack, for live reports.
//! - [`placement`]: where on an allocator function to put the probe.
//! - [`targets`] and [`providers`]: which functions to probe, and in which
//!   loaded object: the one the process's calls really bind to.
//! - [`agent`]: the shared memory of the in-process agent (`agent/`).
//! - [`unwind`]: unwind tables from `.eh_frame` for the probe, and the
//!   reference unwinder that checks them.
//!
//! Loading and attaching the BPF program lives in the `memleak` binary's
//! `probes` module, the one place that touches libbpf.
//!
//! ```no_run
//! use memleak_recorder::Recorder;
//! use memleak_trace::{Meta, TraceWriter, WriterOptions};
//! let writer = TraceWriter::create("t.parquet", Meta::default(), WriterOptions::default())?;
//! let mut rec = Recorder::new(writer, false);
//! # let record: &[u8] = &[];
//! rec.handle(record)?; // for each ring-buffer record
//! rec.finish()?;
//! # Ok::<(), memleak_trace::Error>(())
//! ```
#![deny(missing_docs)]

pub mod agent;
pub mod elf;
pub mod event;
pub mod functions;
pub mod inject;
pub mod live;
pub mod pipeline;
pub mod placement;
pub mod procmaps;
pub mod providers;
pub mod scan;
pub mod stacks;
pub mod symbolize;
pub mod targets;
pub mod unwind;

#[cfg(test)]
#[path = "../../../tests/common/skip.rs"]
mod skip;

pub use pipeline::{Recorder, Stats, TableUpdate};
