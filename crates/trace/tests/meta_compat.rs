//! `meta.json` as released memleak binaries write it: a checked-in sample
//! of format 1.1 with every documented field reads into the typed fields
//! of `Meta`, and is written back byte for byte, checksum included.
//!
//! `tests/data/meta-1.1.json` is the `meta.json` of a kernel recording
//! (`--kernel-pid`, so notes, kernel_recursion, parents) by memleak at
//! commit 9fab26c, with a few values changed to be more telling (a second
//! note with characters JSON escapes, a parent whose pid sorts differently
//! as a number and as a string) and `meta_crc32` recomputed; that binary's
//! `memleak info` accepts it.

use std::path::Path;

use memleak_trace::{Error, KernelRecursion, Meta};

const SAMPLE: &str = include_str!("data/meta-1.1.json");

/// A directory holding `text` as its meta.json.
fn with_meta(text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("meta.json"), text).unwrap();
    dir
}

fn meta_text(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("meta.json")).unwrap()
}

#[test]
fn every_documented_field_of_the_sample_is_typed() {
    let dir = with_meta(SAMPLE);
    let m = Meta::load(dir.path()).unwrap();
    assert_eq!(m.format, "memleak-trace");
    assert_eq!(m.version(), Some((1, 1)));
    assert_eq!(m.tool_version, "0.1.0");
    assert!(m.complete);
    assert_eq!(m.pids, [8475]);
    assert_eq!(m.exit_code, Some(0));
    assert_eq!(m.failed_allocations, Some(3));
    assert_eq!(
        m.parents.iter().map(|(&c, &p)| (c, p)).collect::<Vec<_>>(),
        [(12, 8475), (8478, 8475), (99999, 8475)]
    );
    assert_eq!(
        m.notes,
        [
            "kernel pages are identified by page frame number",
            "a second note, with \"quotes\" and a tab\there"
        ]
    );
    assert_eq!(m.recorder_cpu_ns, Some(425_432_000));
    assert_eq!(
        m.kernel_recursion,
        Some(KernelRecursion {
            first_copy_skips: 5,
            recorded_by_later_copies: 4
        })
    );
    assert_eq!(m.counters.lost_total(), 1);
    assert_eq!(m.segments.as_ref().map(|s| s.len()), Some(4));
    // Nothing documented is left to the untyped rest.
    assert!(m.extra.is_empty(), "untyped: {:?}", m.extra.keys());
}

/// What is read is written back as it was: the same keys, shapes and
/// order, so the same bytes and the same checksum. A trace a released
/// memleak wrote and one this version writes look alike to readers that
/// parse meta.json themselves (DuckDB, pyarrow, jq).
#[test]
fn the_sample_is_written_back_byte_for_byte() {
    let dir = with_meta(SAMPLE);
    let m = Meta::load(dir.path()).unwrap();
    let out = tempfile::tempdir().unwrap();
    m.store(out.path()).unwrap();
    assert_eq!(meta_text(out.path()), SAMPLE);
    assert_eq!(Meta::load(out.path()).unwrap(), m);
}

/// The typed fields are covered by `meta_crc32` like every other value.
#[test]
fn a_changed_typed_value_fails_the_checksum() {
    for (from, to) in [
        ("\"99999\": 8475", "\"99999\": 8476"),
        ("\"failed_allocations\": 3", "\"failed_allocations\": 4"),
        ("\"first_copy_skips\": 5", "\"first_copy_skips\": 6"),
        ("\"recorder_cpu_ns\": 425432000", "\"recorder_cpu_ns\": 1"),
        ("a tab\\there", "a tab\\tthere"),
    ] {
        assert!(SAMPLE.contains(from), "{from}");
        let dir = with_meta(&SAMPLE.replace(from, to));
        match Meta::load(dir.path()) {
            Err(Error::Corrupt { reason, .. }) => {
                assert!(reason.contains("checksum mismatch"), "{reason}")
            }
            other => panic!("{from} -> {to}: {other:?}"),
        }
    }
}

/// Empty typed fields are not written, as the recorder never wrote them:
/// a trace without forks has no `parents`, one without notes no `notes`.
#[test]
fn empty_typed_fields_are_not_written() {
    let out = tempfile::tempdir().unwrap();
    Meta::default().store(out.path()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&meta_text(out.path())).unwrap();
    for key in [
        "failed_allocations",
        "parents",
        "notes",
        "recorder_cpu_ns",
        "kernel_recursion",
        "exit_code",
        "exit_signal",
        "exit_core_dumped",
    ] {
        assert!(v.get(key).is_none(), "{key} written: {v}");
    }
}

/// A field this version does not know stays untyped, and survives a
/// rewrite next to the typed ones.
#[test]
fn unknown_fields_survive_next_to_typed_ones() {
    let dir = with_meta(SAMPLE);
    let mut m = Meta::load(dir.path()).unwrap();
    m.extra
        .insert("rss_sampling_hz".into(), serde_json::json!(10));
    let out = tempfile::tempdir().unwrap();
    m.store(out.path()).unwrap();
    let back = Meta::load(out.path()).unwrap();
    assert_eq!(back, m);
    assert_eq!(back.extra.len(), 1);
}
