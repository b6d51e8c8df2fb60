//! Decodes every event row group with the events decoder replay uses, one
//! thread, and prints wall time per event (for profiling decoding alone).
//!
//! `cargo run --release -p memleak-trace --example decode_only -- TRACE [REPS]`

use std::time::Instant;

use memleak_trace::events::Decoder;
use memleak_trace::Trace;

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: decode_only TRACE [REPS]");
    let reps: usize = std::env::args()
        .nth(2)
        .map_or(1, |r| r.parse().expect("REPS"));
    let trace = Trace::open(&path).expect("open");
    let units = trace.event_units();
    let dec = Decoder::new(&trace);
    for _ in 0..reps {
        let t = Instant::now();
        let rows: usize = units
            .iter()
            .map(|u| {
                let c = dec.read(u).unwrap();
                let n = c.len();
                dec.recycle(c);
                n
            })
            .sum();
        let s = t.elapsed().as_secs_f64();
        println!(
            "{rows} rows, {:.3}s, {:.1} ns/event",
            s,
            s * 1e9 / rows as f64
        );
    }
}
