//! The fuzz target's corpus (`fuzz/corpus/trace_reader`), and seeded
//! mutations of it, through the same harness on the stable toolchain:
//! what the fuzzer found once stays fixed. `cargo fuzz run trace_reader`
//! (fuzz/README.md) explores further.

#[path = "../../../fuzz/src/harness.rs"]
mod harness;

use std::path::PathBuf;

fn corpus() -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/trace_reader");
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn corpus_and_its_mutations_never_panic() {
    let corpus = corpus();
    assert!(corpus.len() >= 5, "a seed for every file of a trace");
    for (path, bytes) in &corpus {
        eprintln!("{}", path.display());
        harness::run(bytes);
    }
    // xorshift64*, seeded: the same mutations every run.
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for _ in 0..400 {
        let (_, seed) = &corpus[next() as usize % corpus.len()];
        let mut b = seed.clone();
        for _ in 0..1 + next() % 4 {
            if b.len() < 2 {
                break;
            }
            let at = 1 + next() as usize % (b.len() - 1);
            match next() % 4 {
                0 => b[at] ^= 1 << (next() % 8),
                1 => b[at] = next() as u8,
                2 => b.truncate(at),
                _ => b[at..].iter_mut().take(8).for_each(|x| *x = 0xff),
            }
        }
        harness::run(&b);
    }
}
