//! What the writer is tuned by ([`WriterOptions`]), and the Parquet
//! settings of each table that follow from it: the `events` table's
//! encodings, chosen by measurement (docs/format.md, "Encodings").

use std::time::Duration;

use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{
    DeltaBinaryPackedEncoderOptions, EnabledStatistics, WriterProperties, WriterPropertiesBuilder,
};
use parquet::schema::types::ColumnPath;

use crate::schema::{Table, TABLE_KEY};

/// Tuning of the writer. The defaults are what `memleak record` uses.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Close an events segment after this many rows.
    pub segment_rows: usize,
    /// Close the segments (a checkpoint) after this much time, so a killed
    /// recorder loses at most this much.
    pub segment_duration: Duration,
    /// Make the first checkpoint this soon after the first event, rather
    /// than `segment_duration` after the trace was created: a recorder
    /// killed within its first second then keeps what it recorded too.
    pub first_checkpoint: Duration,
    /// Merge a table's closed segments into one once this many have
    /// closed since the last merge, or they hold `segment_rows` rows
    /// together, and at the end; a full segment is never copied (0 or 1:
    /// never merge).
    pub merge_segments: usize,
    /// Rows per Parquet row group (the unit of parallel replay).
    pub row_group_rows: usize,
    /// zstd level, for every table (default 1: on events, level 3 costs
    /// about 12 % more CPU per event and is no smaller).
    pub zstd_level: i32,
    /// Replace an existing trace at the path.
    pub force: bool,
    /// Changes the Parquet settings of the `events` table after the
    /// writer's own are applied. `None` in normal use; benchmarks (the
    /// `write_speed` example) use it to compare settings through the real
    /// write path.
    pub events_tuning: Option<fn(WriterPropertiesBuilder) -> WriterPropertiesBuilder>,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            segment_rows: 16 << 20,
            segment_duration: Duration::from_secs(1),
            first_checkpoint: Duration::from_millis(100),
            merge_segments: 64,
            row_group_rows: 256 << 10,
            zstd_level: 1,
            force: false,
            events_tuning: None,
        }
    }
}

fn base_props(
    table: Table,
    opts: &WriterOptions,
) -> parquet::file::properties::WriterPropertiesBuilder {
    let level = ZstdLevel::try_new(opts.zstd_level).unwrap_or_default();
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(level))
        .set_max_row_group_row_count(Some(opts.row_group_rows))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_key_value_metadata(Some(vec![
            KeyValue::new(TABLE_KEY.to_string(), table.name().to_string()),
            KeyValue::new(
                "memleak.format_version".to_string(),
                format!(
                    "{}.{}",
                    crate::schema::FORMAT_MAJOR,
                    crate::schema::FORMAT_MINOR
                ),
            ),
        ]))
}

/// Settings chosen by measurement, for CPU per event first and bytes per
/// event second (docs/format.md, "Encodings"; rerun
/// `cargo run --release -p memleak-trace --example write_speed` and
/// `--example bytes_per_event -- --compare`):
///
/// - `ts_ns` is monotonic: DELTA_BINARY_PACKED leaves only the jitter of
///   each delta, and 32-value miniblocks keep an occasional long gap from
///   widening many neighbours. zstd then takes what bit-packing cannot:
///   the recorder stamps up to 16 events of a CPU with one clock reading,
///   so most deltas are 0 and a miniblock's width is set by the one that
///   is not (1.9 bytes/event packed, 0.14 compressed, on the overhead
///   benchmark's trace).
/// - `pid` and `tid` change only between bursts: DELTA_BINARY_PACKED stores
///   runs as zero-width miniblocks, as small as dictionary indices and
///   cheaper to compute than a hash lookup per value. `seq` counts by one:
///   every miniblock has width 0, a few bytes per 128 rows.
/// - `size` uses BYTE_STREAM_SPLIT: the low bytes of sizes are skewed but
///   not byte-aligned once bit-packed, and zstd entropy-codes the split
///   byte streams better than it does dictionary indices.
/// - `kind`, `addr`, `stack_id` repeat heavily and are dictionary-encoded;
///   the all-null `old_*` columns cost only their run-length-encoded levels.
/// - zstd level 1 (`WriterOptions::zstd_level`): level 3 costs about 12 %
///   more CPU and is no smaller on 64Ki-row pages.
/// - pages of 64Ki rows (one per batch): zstd's input and tables stay in
///   cache, and a page still gives it enough context. One page per row
///   group (256Ki rows) costs 20 % more CPU for 0.1 % fewer bytes.
/// - statistics only for `ts_ns` (chunk min/max, to skip row groups by
///   time); min/max of every value of every column costs CPU (the string
///   `kind` most) and nothing reads them.
pub(super) fn events_props(opts: &WriterOptions) -> WriterProperties {
    let ts = ColumnPath::from("ts_ns");
    let size = ColumnPath::from("size");
    let miniblocks = DeltaBinaryPackedEncoderOptions::try_new(128, 4)
        .expect("128-value blocks of four 32-value miniblocks");
    let mut b = base_props(Table::Events, opts)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_column_statistics_enabled(ts.clone(), EnabledStatistics::Chunk)
        .set_column_dictionary_enabled(ts.clone(), false)
        .set_column_encoding(ts.clone(), Encoding::DELTA_BINARY_PACKED)
        .set_column_delta_binary_packed_encoder_options(ts.clone(), miniblocks)
        .set_column_dictionary_enabled(size.clone(), false)
        .set_column_encoding(size, Encoding::BYTE_STREAM_SPLIT);
    for col in ["pid", "tid", "seq"] {
        b = b
            .set_column_dictionary_enabled(ColumnPath::from(col), false)
            .set_column_encoding(ColumnPath::from(col), Encoding::DELTA_BINARY_PACKED);
    }
    b = b
        .set_data_page_row_count_limit(EVENTS_PAGE_ROWS)
        .set_data_page_size_limit(8 << 20)
        .set_dictionary_page_size_limit(8 << 20);
    match opts.events_tuning {
        Some(tune) => tune(b).build(),
        None => b.build(),
    }
}

/// Rows per data page of the events table.
const EVENTS_PAGE_ROWS: usize = 64 << 10;

pub(super) fn plain_props(table: Table, opts: &WriterOptions) -> WriterProperties {
    base_props(table, opts).build()
}

/// The frames table's: as [`plain_props`], but a frame's address and
/// offset in its object, nearly unique per row, are written plain, not
/// as a dictionary of as many entries as rows that every reader must
/// decode and then index.
pub(super) fn frames_props(opts: &WriterOptions) -> WriterProperties {
    let mut b = base_props(Table::Frames, opts);
    for col in ["addr", "file_offset"] {
        b = b.set_column_dictionary_enabled(ColumnPath::from(col), false);
    }
    b.build()
}
