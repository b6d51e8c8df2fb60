//! The encodings of the `events` table, each in one file with its
//! encoder (used by `events::encode`), its decoder (used by
//! `events::pages`) and a test that one reads back what the other wrote.
//! Integers, levels and indices are little-endian and bit-packed as the
//! Parquet format specifies.

pub(crate) mod bitpack;
pub(crate) mod delta;
pub(crate) mod dict;
pub(crate) mod hybrid;
pub(crate) mod plain;
pub(crate) mod split;
pub(crate) mod thrift;
pub(crate) mod varint;
