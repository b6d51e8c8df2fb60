//! Every way a path can fail to be a readable trace, and the one-line
//! message each gives.

mod common;

use std::path::Path;

use common::*;
use memleak_trace::{Error, Trace, TraceWriter, WriterOptions};

/// Opens a path that must fail, and checks the message is one line that
/// names `names` and contains `needle`.
fn open_err(path: &Path, names: &Path, needle: &str) -> Error {
    let err = Trace::open(path).expect_err("open must fail");
    let msg = err.to_string();
    assert!(!msg.contains('\n'), "message is not one line: {msg:?}");
    assert!(
        msg.starts_with(&names.display().to_string()),
        "message does not start with {}: {msg}",
        names.display()
    );
    assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
    err
}

#[test]
fn missing_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("nope.parquet");
    let e = open_err(&p, &p, "no such file or directory");
    assert!(matches!(e, Error::Missing(_)), "{e:?}");
}

#[test]
fn directory_without_meta_json_is_not_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("events")).unwrap();
    let e = open_err(dir.path(), dir.path(), "not a memleak trace (no meta.json)");
    assert!(matches!(e, Error::NotATrace { .. }), "{e:?}");
}

#[test]
fn regular_file_is_not_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("notes.txt");
    std::fs::write(&p, "hello").unwrap();
    let e = open_err(&p, &p, "not a memleak trace (not a directory)");
    assert!(matches!(e, Error::NotATrace { .. }), "{e:?}");
}

#[test]
fn garbage_meta_json_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    std::fs::write(
        root.join("meta.json"),
        b"{\"format\": \"memleak-trace\", \x00\xff garbage",
    )
    .unwrap();
    let meta = root.join("meta.json");
    let e = open_err(&root, &meta, "corrupt (invalid JSON");
    assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
}

#[test]
fn meta_json_of_something_else_is_not_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    std::fs::write(root.join("meta.json"), r#"{"name": "some other tool"}"#).unwrap();
    let e = open_err(
        &root,
        &root,
        "not a memleak trace (meta.json has no \"format\": \"memleak-trace\")",
    );
    assert!(matches!(e, Error::NotATrace { .. }), "{e:?}");
}

#[test]
fn unparsable_format_version_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    edit_meta(&root, |m| m["format_version"] = "one".into());
    let e = open_err(&root, &root.join("meta.json"), "bad format_version \"one\"");
    assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
}

#[test]
fn newer_major_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    edit_meta(&root, |m| m["format_version"] = "2.0".into());
    let e = open_err(
        &root,
        &root,
        "trace format 2.0 is newer than this memleak supports (1.x); upgrade memleak",
    );
    assert!(matches!(e, Error::NewerVersion { .. }), "{e:?}");
}

#[test]
fn truncated_middle_segment_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write_trace(
        &root,
        small_opts(100),
        &synthetic_events(300),
        &[],
        &[],
        &[],
    );
    let segs = segments(&root, "events");
    truncate_half(&segs[1]);
    let e = open_err(&root, &segs[1], "corrupt (");
    assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
}

#[test]
fn garbage_middle_segment_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write_trace(
        &root,
        small_opts(100),
        &synthetic_events(300),
        &[],
        &[],
        &[],
    );
    let segs = segments(&root, "events");
    std::fs::write(&segs[0], vec![0xa5u8; 4096]).unwrap();
    let e = open_err(&root, &segs[0], "corrupt (");
    assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
}

#[test]
fn parquet_file_written_by_someone_else_is_foreign() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let p = root.join("events/part-00001.parquet");
    write_foreign_parquet(&p, None);
    let e = open_err(&root, &p, "foreign Parquet file (not written by memleak)");
    assert!(matches!(e, Error::Foreign { .. }), "{e:?}");
}

#[test]
fn segment_of_another_table_is_foreign() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let p = root.join("events/part-00001.parquet");
    std::fs::copy(&segments(&root, "stacks")[0], &p).unwrap();
    let e = open_err(
        &root,
        &p,
        "foreign Parquet file (a memleak stacks segment in the events directory)",
    );
    assert!(matches!(e, Error::Foreign { .. }), "{e:?}");
}

#[test]
fn segment_missing_a_column_is_foreign() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let p = root.join("maps/part-00001.parquet");
    write_foreign_parquet(&p, Some("maps"));
    let e = open_err(&root, &p, "foreign Parquet file (missing column ts_ns)");
    assert!(matches!(e, Error::Foreign { .. }), "{e:?}");
}

#[test]
fn single_parquet_file_is_foreign() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let seg = &segments(&root, "events")[0];
    let e = open_err(seg, seg, "foreign Parquet file (a single Parquet file; a memleak trace is a directory with meta.json)");
    assert!(matches!(e, Error::Foreign { .. }), "{e:?}");

    let p = dir.path().join("other.parquet");
    write_foreign_parquet(&p, None);
    let e = open_err(&p, &p, "foreign Parquet file");
    assert!(matches!(e, Error::Foreign { .. }), "{e:?}");
}

#[test]
fn existing_output_is_refused_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let Err(err) = TraceWriter::create(&root, meta(), WriterOptions::default()) else {
        panic!("must refuse")
    };
    assert!(matches!(err, Error::Exists(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: already exists (use --force to overwrite)",
            root.display()
        )
    );
    // The existing trace is untouched.
    assert_eq!(
        read_events(&Trace::open(&root).unwrap()),
        every_kind_events()
    );

    // A plain file in the way is refused the same way.
    let f = dir.path().join("file");
    std::fs::write(&f, "x").unwrap();
    assert!(matches!(
        TraceWriter::create(&f, meta(), WriterOptions::default()),
        Err(Error::Exists(_))
    ));
}

#[test]
fn output_in_a_missing_directory_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("no/such/dir/t.parquet");
    let Err(err) = TraceWriter::create(&p, meta(), WriterOptions::default()) else {
        panic!("must fail")
    };
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(!err.to_string().contains('\n'));
}
