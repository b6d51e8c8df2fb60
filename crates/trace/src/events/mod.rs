//! The `events` table's files: the one table memleak encodes itself.
//!
//! An events segment (`events/part-NNNNN.parquet`) is an ordinary Parquet
//! file that DuckDB or pyarrow read like any other: row groups of 256 Ki
//! rows, version 1 data pages of 64 Ki rows carrying their CRC-32, zstd
//! where it pays, and per column the encoding `docs/format.md` (section
//! "Encodings") chose by measurement. Parquet's generic writer cost the
//! recorder too much per event, so `encode` writes these column chunks
//! itself and splices them into the file through Parquet's file writer
//! (which still writes the footer and schema).
//!
//! Reading them back is where an analysis spends its time, so the same
//! encodings are decoded here too, each beside its encoder in `codec`:
//! `pages` parses the page headers, checks the page CRCs, decompresses
//! and decodes the pages a trace uses (PLAIN, dictionaries, RLE/bit-packed
//! levels and indices, DELTA_BINARY_PACKED, BYTE_STREAM_SPLIT), and
//! [`Decoder`] turns a row group into the [`Columns`] replay reads, or
//! streams it a page of every column at a time as [`Slices`]. Whatever it
//! does not expect (a file another tool rewrote with other encodings or
//! codecs) goes through Parquet's Arrow reader instead, then through
//! [`Trace::read_unit`](crate::Trace::read_unit), the reference reader,
//! which reports damage properly.
//!
//! The small tables (`stacks`, `frames`, `maps`) are written and read
//! through Parquet's Arrow writer and reader alone, in [`crate::writer`]
//! and [`crate::reader`].
//!
//! ```no_run
//! use memleak_trace::{events::Decoder, Trace};
//! let trace = Trace::open("trace.parquet")?;
//! let dec = Decoder::new(&trace);
//! let mut rows = 0;
//! for unit in trace.event_units() {
//!     let cols = dec.read(&unit)?;
//!     rows += cols.len();
//!     dec.recycle(cols);
//! }
//! # Ok::<(), memleak_trace::Error>(())
//! ```

mod codec;
pub(crate) mod columns;
mod decode;
pub(crate) mod encode;
mod pages;

pub use columns::{Columns, Slices, UNKNOWN_KIND};
pub use decode::Decoder;
