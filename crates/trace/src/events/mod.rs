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
//! The small tables (`stacks`, `frames`, `maps`) are written and read
//! through Parquet's Arrow writer and reader in [`crate::writer`] and
//! [`crate::reader`]; `Trace::read_unit` is also the reference reader of
//! the events.
pub(crate) mod encode;
