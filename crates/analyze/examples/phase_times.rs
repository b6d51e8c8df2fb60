//! Times the phases of an analysis: decoding alone (sequential and
//! parallel) and the whole replay, to see where the time goes.
//!
//! `cargo run --release -p memleak-analyze --example phase_times -- TRACE`

use std::time::Instant;

use memleak_analyze::{analyze_trace, AnalyzeOptions};
use memleak_trace::events::Decoder;
use memleak_trace::{EventColumns, Trace};
use rayon::prelude::*;

fn main() {
    let path = std::env::args().nth(1).expect("usage: phase_times TRACE");
    let trace = Trace::open(&path).expect("open");
    let n = trace.event_count() as f64;
    let units = trace.event_units();
    let rate = |t: Instant| {
        format!(
            "{:.3}s, {:.1} M events/s",
            t.elapsed().as_secs_f64(),
            n / t.elapsed().as_secs_f64() / 1e6
        )
    };

    let t = Instant::now();
    let rows: usize = units
        .iter()
        .map(|u| trace.read_unit(u, EventColumns::REPLAY).unwrap().len())
        .sum();
    println!("decode, 1 thread:   {} ({rows} rows)", rate(t));
    let t = Instant::now();
    let _: usize = units
        .par_iter()
        .map(|u| trace.read_unit(u, EventColumns::REPLAY).unwrap().len())
        .sum();
    println!(
        "decode, {} threads: {}",
        rayon::current_num_threads(),
        rate(t)
    );
    let dec = Decoder::new(&trace);
    let t = Instant::now();
    let rows: usize = units.iter().map(|u| dec.read(u).unwrap().len()).sum();
    println!("fast decode, 1 thread:   {} ({rows} rows)", rate(t));
    let t = Instant::now();
    let _: usize = units.par_iter().map(|u| dec.read(u).unwrap().len()).sum();
    println!(
        "fast decode, {} threads: {}",
        rayon::current_num_threads(),
        rate(t)
    );
    for parts in [1, 2] {
        let t = Instant::now();
        let r = analyze_trace(
            &trace,
            &AnalyzeOptions {
                partitions: parts,
                ..Default::default()
            },
            None,
        )
        .unwrap();
        println!(
            "analyze, {parts} partitions: {} ({} outstanding)",
            rate(t),
            r.summary.outstanding_allocations
        );
    }
    let t = Instant::now();
    let r = analyze_trace(&trace, &AnalyzeOptions::default(), None).unwrap();
    println!(
        "analyze:            {} ({} outstanding)",
        rate(t),
        r.summary.outstanding_allocations
    );
}
