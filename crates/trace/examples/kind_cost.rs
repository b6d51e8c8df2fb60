//! What Parquet's Arrow writer spends on one column of the `events` table,
//! per row: `kind` as it is given to the writer (Int8 keys into a string
//! dictionary), the same keys as a plain Int8 column, and an
//! address-like u64 column, each written alone, best of 5.
//!
//! ```text
//! cargo run --release -p memleak-trace --example kind_cost
//! ```
//!
//! The dictionary column costs about twice the Int8 one: the writer looks
//! every row's string up in its own dictionary again. That is why the
//! trace writer encodes `kind` itself (src/events/encode/).

use std::sync::Arc;
use std::time::Instant;

use arrow_array::types::Int8Type;
use arrow_array::{ArrayRef, DictionaryArray, Int8Array, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use memleak_trace::EventKind;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};

const ROWS: usize = 4_000_000;

fn run(name: &str, dt: DataType, keys: &[i8], column: &dyn Fn(usize, &[i8]) -> ArrayRef) {
    let schema = Arc::new(Schema::new(vec![Field::new("c", dt, false)]));
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).expect("level 1")))
        .set_statistics_enabled(EnabledStatistics::None)
        .set_data_page_row_count_limit(64 << 10)
        .set_max_row_group_row_count(Some(256 << 10))
        .build();
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut best = f64::MAX;
    for _ in 0..5 {
        let file = std::fs::File::create(dir.path().join("c.parquet")).expect("create");
        let start = Instant::now();
        let mut w =
            ArrowWriter::try_new(file, schema.clone(), Some(props.clone())).expect("writer");
        for (i, chunk) in keys.chunks(64 << 10).enumerate() {
            let batch =
                RecordBatch::try_new(schema.clone(), vec![column(i << 16, chunk)]).expect("batch");
            w.write(&batch).expect("write");
        }
        w.close().expect("close");
        best = best.min(start.elapsed().as_nanos() as f64 / keys.len() as f64);
    }
    println!("{name:<28} {best:5.1} ns/row");
}

fn main() {
    let key = |k: EventKind| EventKind::ALL.iter().position(|&x| x == k).expect("a kind") as i8;
    let (malloc, free) = (key(EventKind::Malloc), key(EventKind::Free));
    let keys: Vec<i8> = (0..ROWS)
        .map(|i| if i % 2 == 0 { malloc } else { free })
        .collect();
    let names = Arc::new(StringArray::from_iter_values(
        EventKind::ALL.iter().map(|k| k.name()),
    ));
    let dict_type = DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8));
    run("kind: Int8 keys, strings", dict_type, &keys, &|_, c| {
        Arc::new(
            DictionaryArray::<Int8Type>::try_new(Int8Array::from(c.to_vec()), names.clone())
                .expect("keys in range"),
        )
    });
    run("the keys as Int8", DataType::Int8, &keys, &|_, c| {
        Arc::new(Int8Array::from(c.to_vec()))
    });
    // A malloc and its free share an address; 64 addresses recycle.
    run(
        "addresses (u64 dictionary)",
        DataType::UInt64,
        &keys,
        &|start, c| {
            Arc::new(UInt64Array::from_iter_values(
                (start..start + c.len()).map(|i| 0x5555_0000 + ((i as u64 / 2) % 64) * 48),
            ))
        },
    );
}
