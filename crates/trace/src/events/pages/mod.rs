//! A page-level decoder for the event columns replay reads.
//!
//! The Arrow reader decodes every column into Arrow arrays: nullable
//! columns go through definition levels in `i16`, a values buffer that is
//! zeroed, filled densely and then spread to the rows (`pad_nulls`), and
//! the analyzer then copied them again to turn nulls into zeros. This
//! module reads the pages itself (Parquet's page reader still parses the
//! page headers and decompresses) and decodes the few encodings a trace
//! uses straight into the vectors replay reads, nulls written as 0:
//!
//! * PLAIN, and dictionary pages in PLAIN;
//! * RLE_DICTIONARY / PLAIN_DICTIONARY indices (RLE/bit-packed hybrid);
//! * DELTA_BINARY_PACKED;
//! * BYTE_STREAM_SPLIT;
//! * definition levels in RLE (v1 pages) or v2 pages, maximum level 1.
//!
//! Anything else (another encoding or physical type, repeated columns, a
//! malformed page) makes [`read_column`] return `None`, and the caller
//! takes the Arrow path, which reports real errors properly.
//!
//! [`read_column`] decodes a whole column chunk; a [`Cursor`] decodes one
//! a page at a time, so that a caller can take the columns of a row group
//! together while each page's values are still in the cache.
//!
//! `source` gives the pages, `page` decodes one, `column` and `cursor`
//! are the two ways through a chunk; the encodings themselves are in
//! `events::codec`, beside their encoders.

mod column;
mod cursor;
mod page;
mod source;

pub use column::read_column;
pub use cursor::Cursor;
pub use page::{Scratch, Values};
pub use source::Chunk;
