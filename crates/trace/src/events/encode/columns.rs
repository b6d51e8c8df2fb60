//! The values of a row group's columns that are encoded here, buffered
//! until the row group is written; and which columns those are, by the
//! writer's properties.

use arrow_array::types::Int8Type;
use arrow_array::{Array, DictionaryArray, StringArray, UInt32Array, UInt64Array};
use arrow_schema::{DataType, Field};
use parquet::basic::Encoding;
use parquet::errors::{ParquetError, Result};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use crate::schema::EventKind;

/// A column encoded here, with its values of the row group being filled.
pub(super) enum Custom {
    /// `kind`: the Arrow dictionary keys (indexes of [`EventKind::ALL`]).
    Kind(Vec<i8>),
    /// An integer column written DELTA_BINARY_PACKED (`ts_ns`, `pid`,
    /// `tid`): the values as the physical type's bits, and whether the
    /// chunk gets min/max statistics.
    Delta {
        values: Vec<i64>,
        int32: bool,
        stats: bool,
    },
    /// A u64 column written BYTE_STREAM_SPLIT (`size`).
    Split(Vec<u64>),
    /// A u64 column written RLE_DICTIONARY (`addr`, and the nullable
    /// `old_addr`, `old_size`, `stack_id`): the values present, and for a
    /// nullable column each row's definition level (1 present, 0 null).
    Dict {
        values: Vec<u64>,
        levels: Option<Vec<u8>>,
    },
}

impl Custom {
    /// How `field` is encoded here, if it is: `kind` always; the integer
    /// columns as `props` say, when that is DELTA_BINARY_PACKED,
    /// BYTE_STREAM_SPLIT or a dictionary (the `write_speed` example can
    /// ask for other settings, which Parquet's writers then follow).
    pub(super) fn for_field(field: &Field, props: &WriterProperties) -> Option<Custom> {
        let path = ColumnPath::from(field.name().as_str());
        // What only Parquet's writers do: version 2 pages, statistics in
        // pages (in chunks: `ts_ns`'s min/max only), bloom filters, and
        // dictionaries that could outgrow their page limit.
        let stats = props.statistics_enabled(&path);
        if props.writer_version() != WriterVersion::PARQUET_1_0
            || stats == EnabledStatistics::Page
            || props.bloom_filter_properties(&path).is_some()
            || props.dictionary_page_size_limit()
                < props
                    .max_row_group_row_count()
                    .unwrap_or(usize::MAX)
                    .saturating_mul(8)
        {
            return None;
        }
        let chunk_stats = stats == EnabledStatistics::Chunk;
        if field.name() == "kind" {
            return (!chunk_stats).then(|| Custom::Kind(Vec::new()));
        }
        let int32 = match field.data_type() {
            DataType::UInt32 => true,
            DataType::UInt64 => false,
            _ => return None,
        };
        let nullable = field.is_nullable();
        match (props.dictionary_enabled(&path), props.encoding(&path)) {
            (true, _) if !int32 && !chunk_stats => Some(Custom::Dict {
                values: Vec::new(),
                levels: nullable.then(Vec::new),
            }),
            (false, Some(Encoding::DELTA_BINARY_PACKED)) if !nullable => Some(Custom::Delta {
                values: Vec::new(),
                int32,
                stats: chunk_stats,
            }),
            (false, Some(Encoding::BYTE_STREAM_SPLIT)) if !nullable && !int32 && !chunk_stats => {
                Some(Custom::Split(Vec::new()))
            }
            _ => None,
        }
    }

    pub(super) fn append(&mut self, col: &dyn Array) -> Result<()> {
        let wrong = || ParquetError::General(format!("unexpected {:?} column", col.data_type()));
        let u64s = || col.as_any().downcast_ref::<UInt64Array>().ok_or_else(wrong);
        let required = !matches!(
            self,
            Custom::Dict {
                levels: Some(_),
                ..
            }
        );
        if required && col.null_count() > 0 {
            return Err(ParquetError::General("nulls in a required column".into()));
        }
        match self {
            Custom::Kind(keys) => {
                let dict = col
                    .as_any()
                    .downcast_ref::<DictionaryArray<Int8Type>>()
                    .ok_or_else(wrong)?;
                let names = dict.values().as_any().downcast_ref::<StringArray>();
                let same = names.is_some_and(|n| {
                    n.len() == EventKind::ALL.len()
                        && n.iter()
                            .zip(EventKind::ALL)
                            .all(|(a, k)| a == Some(k.name()))
                });
                if !same {
                    return Err(ParquetError::General(
                        "kind dictionary is not the kinds".into(),
                    ));
                }
                keys.extend_from_slice(dict.keys().values());
            }
            Custom::Delta {
                values,
                int32: true,
                ..
            } => {
                let a = col
                    .as_any()
                    .downcast_ref::<UInt32Array>()
                    .ok_or_else(wrong)?;
                values.extend(a.values().iter().map(|&v| v as i32 as i64));
            }
            Custom::Delta { values, .. } => {
                values.extend(u64s()?.values().iter().map(|&v| v as i64));
            }
            Custom::Split(values)
            | Custom::Dict {
                values,
                levels: None,
            } => {
                values.extend_from_slice(u64s()?.values());
            }
            Custom::Dict {
                values,
                levels: Some(levels),
            } => {
                let a = u64s()?;
                match a.nulls() {
                    None => {
                        values.extend_from_slice(a.values());
                        levels.resize(levels.len() + a.len(), 1);
                    }
                    Some(nulls) => {
                        for (&v, present) in a.values().iter().zip(nulls.iter()) {
                            if present {
                                values.push(v);
                            }
                            levels.push(present as u8);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Rows buffered.
    pub(super) fn len(&self) -> usize {
        match self {
            Custom::Kind(keys) => keys.len(),
            Custom::Delta { values, .. } => values.len(),
            Custom::Split(values) => values.len(),
            Custom::Dict {
                levels: Some(levels),
                ..
            } => levels.len(),
            Custom::Dict { values, .. } => values.len(),
        }
    }

    pub(super) fn clear(&mut self) {
        match self {
            Custom::Kind(keys) => keys.clear(),
            Custom::Delta { values, .. } => values.clear(),
            Custom::Split(values) => values.clear(),
            Custom::Dict { values, levels } => {
                values.clear();
                if let Some(levels) = levels {
                    levels.clear();
                }
            }
        }
    }
}
