use std::fs::File;
use std::time::Instant;

use arrow_array::cast::AsArray;
use arrow_array::types::{UInt32Type, UInt64Type};
use arrow_array::Array;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use rayon::prelude::*;

fn main() {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap()).join("events");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let cols: Vec<&str> = std::env::args()
        .nth(2)
        .map(|s| s.leak().split(',').collect())
        .unwrap_or(vec![
            "ts_ns", "pid", "kind", "addr", "size", "old_addr", "stack_id", "old_size",
        ]);
    let mut units = Vec::new();
    for f in &files {
        let meta =
            ArrowReaderMetadata::load(&File::open(f).unwrap(), ArrowReaderOptions::new()).unwrap();
        for rg in 0..meta.metadata().num_row_groups() {
            units.push((f.clone(), meta.clone(), rg));
        }
    }
    let decode = |(f, meta, rg): &(std::path::PathBuf, ArrowReaderMetadata, usize)| -> u64 {
        let mask = ProjectionMask::columns(meta.parquet_schema(), cols.iter().copied());
        let rows = meta.metadata().row_group(*rg).num_rows() as usize;
        let r = ParquetRecordBatchReaderBuilder::new_with_metadata(
            File::open(f).unwrap(),
            meta.clone(),
        )
        .with_projection(mask)
        .with_row_groups(vec![*rg])
        .with_batch_size(rows)
        .build()
        .unwrap();
        let mut s = 0u64;
        for b in r {
            let b = b.unwrap();
            for c in b.columns() {
                if let Some(a) = c.as_primitive_opt::<UInt64Type>() {
                    s = s.wrapping_add(a.values()[a.len() / 2]);
                }
                if let Some(a) = c.as_primitive_opt::<UInt32Type>() {
                    s = s.wrapping_add(a.values()[a.len() / 2] as u64);
                }
            }
        }
        s
    };
    let t = Instant::now();
    let s: u64 = units.iter().map(decode).fold(0, u64::wrapping_add);
    println!("seq {:.3}s {s}", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let s: u64 = units.par_iter().map(decode).reduce(|| 0, u64::wrapping_add);
    println!("par {:.3}s {s}", t.elapsed().as_secs_f64());
}
