//! A seeded sweep of corruptions over a real recording: every damaged
//! trace gives the original report, a report with a warning that names
//! what was skipped, or an error that names the file. Never a different
//! report in silence.
#![cfg(feature = "bpf")]

mod common;

use std::path::{Path, PathBuf};

use common::fixtures::Fixture;
use memleak_analyze::report::{analyze_trace, AnalyzeOptions};
use memleak_trace::Trace;

/// xorshift64*: the sweep is the same at every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for f in files(from) {
        let rel = f.strip_prefix(from).unwrap();
        let dst = to.join(rel);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(&f, &dst).unwrap();
    }
}

/// The JSON report of `root`, or the error; and the warnings. With
/// `deferred`, the events files' checksums are checked as replay reads
/// them (`Trace::open_deferred`, as `memleak analyze` opens a trace).
fn report(root: &Path, deferred: bool) -> (Result<String, String>, Vec<String>) {
    let opened = if deferred {
        Trace::open_deferred(root)
    } else {
        Trace::open(root)
    };
    let trace = match opened {
        Ok(t) => t,
        Err(e) => return (Err(e.to_string()), Vec::new()),
    };
    let warnings = trace.warnings().to_vec();
    let r = analyze_trace(&trace, &AnalyzeOptions::default(), None)
        .map(|r| memleak_analyze::json::render(&r))
        .map_err(|e| e.to_string());
    (r, warnings)
}

#[test]
fn no_corruption_changes_a_report_silently() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("seed");
    let (_dir, recorded) = fx.record(&[]);
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("t.parquet");
    copy_dir(&recorded, &root);
    let (original, warnings) = report(&root, false);
    let original = original.expect("the recorded trace analyzes");
    assert!(warnings.is_empty(), "{warnings:?}");

    let mut rng = Rng(0x6d65_6d6c_6561_6b21);
    let (mut same, mut warned, mut errors) = (0, 0, 0);
    for round in 0..300 {
        copy_dir(&recorded, &root);
        let all = files(&root);
        let victim = &all[rng.below(all.len() as u64) as usize];
        let mut bytes = std::fs::read(victim).unwrap();
        let len = bytes.len() as u64;
        let what = match rng.below(6) {
            0 => {
                let bit = rng.below(len * 8);
                bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
                format!("bit {bit} flipped")
            }
            1 => {
                let at = rng.below(len) as usize;
                let n = (1 + rng.below(64) as usize).min(bytes.len() - at);
                bytes[at..at + n].fill(0);
                format!("{n} bytes zeroed at {at}")
            }
            2 => {
                let at = rng.below(len) as usize;
                bytes.truncate(at);
                format!("truncated to {at}")
            }
            3 => {
                bytes.clear();
                "emptied".to_string()
            }
            4 => {
                let n = 1 + rng.below(100) as usize;
                bytes.extend((0..n).map(|_| rng.next() as u8));
                format!("{n} bytes appended")
            }
            _ => {
                std::fs::remove_file(victim).unwrap();
                bytes = Vec::new();
                "deleted".to_string()
            }
        };
        if victim.exists() {
            std::fs::write(victim, &bytes).unwrap();
        }
        let case = format!(
            "round {round}: {} {what}",
            victim.strip_prefix(&root).unwrap().display()
        );
        let checked_first = report(&root, false);
        let (deferred, _) = report(&root, true);
        // Checked as read or before: the same report, or the same error.
        assert_eq!(
            deferred, checked_first.0,
            "{case}: checksums checked as read and checked first differ"
        );
        match checked_first {
            (Ok(r), _) if r == original => same += 1,
            (Ok(_), w) => {
                // A different report is allowed only with a warning that
                // names what was left out.
                let name = victim.file_name().unwrap().to_string_lossy().into_owned();
                assert!(
                    w.iter().any(|w| w.contains(&name)),
                    "{case}: a different report without a warning naming {name}: {w:?}"
                );
                warned += 1;
            }
            (Err(e), _) => {
                assert!(!e.contains('\n'), "{case}: {e}");
                assert!(e.contains(&root.display().to_string()), "{case}: {e}");
                errors += 1;
            }
        }
    }
    eprintln!(
        "300 corruptions: {same} gave the same report, {warned} a warned one, {errors} an error"
    );
    assert!(errors > 200, "most corruptions must be caught: {errors}");
}
