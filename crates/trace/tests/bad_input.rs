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
    as_format_1_0(&root);
    let p = root.join("events/part-00001.parquet");
    write_foreign_parquet(&p, None);
    let e = open_err(&root, &p, "foreign Parquet file (not written by memleak)");
    assert!(matches!(e, Error::Foreign { .. }), "{e:?}");
}

#[test]
fn segment_of_another_table_is_foreign() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    as_format_1_0(&root);
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
    as_format_1_0(&root);
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

fn force() -> WriterOptions {
    WriterOptions {
        force: true,
        ..WriterOptions::default()
    }
}

#[test]
fn force_replaces_a_trace_and_an_empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let w = TraceWriter::create(&root, meta(), force()).expect("replaces a trace");
    w.finish().unwrap();
    assert_eq!(Trace::open(&root).unwrap().event_count(), 0);

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let w = TraceWriter::create(&empty, meta(), force()).expect("replaces an empty directory");
    w.finish().unwrap();
    assert!(empty.join("meta.json").exists());
}

#[test]
fn force_never_deletes_what_memleak_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |path: &Path, needle: &str| {
        let Err(err) = TraceWriter::create(path, meta(), force()) else {
            panic!("{} must be refused", path.display())
        };
        let msg = err.to_string();
        assert!(matches!(err, Error::NotReplaced { .. }), "{err:?}");
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.starts_with(&path.display().to_string()), "{msg}");
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
    };

    // A directory of someone's files.
    let precious = dir.path().join("precious");
    std::fs::create_dir(&precious).unwrap();
    std::fs::write(precious.join("thesis.tex"), "years of work").unwrap();
    refused(&precious, "not a memleak trace");
    assert!(precious.join("thesis.tex").exists());

    // A plain file.
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "x").unwrap();
    refused(&file, "a file, not a memleak trace");
    assert!(file.exists());

    // A trace with a file of the user's inside: nothing of it goes.
    let root = full_trace(dir.path(), "t.parquet");
    std::fs::write(root.join("events/mine.csv"), "keep").unwrap();
    refused(&root, "mine.csv was not written by memleak");
    assert!(root.join("events/mine.csv").exists());
    assert!(root.join("meta.json").exists());
    assert_eq!(segments(&root, "events").len(), 1);

    // A symbolic link to a trace.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&root, &link).unwrap();
    refused(&link, "a symbolic link");

    // The root, and the working directory and its parents (a trace or
    // not): the test's own working directory is a parent of `dir`.
    refused(
        Path::new("/"),
        "the root, the working directory or one of its parents",
    );
    let cwd = std::env::current_dir().unwrap();
    refused(
        &cwd,
        "the root, the working directory or one of its parents",
    );
    refused(
        Path::new("."),
        "the root, the working directory or one of its parents",
    );
    refused(
        Path::new(".."),
        "the root, the working directory or one of its parents",
    );
}

#[test]
fn deleted_listed_segment_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for table in ["events", "stacks", "frames", "maps", "scan"] {
        let root = full_trace(dir.path(), &format!("{table}.parquet"));
        let seg = segments(&root, table)[0].clone();
        std::fs::remove_file(&seg).unwrap();
        let e = open_err(&root, &seg, "listed in meta.json but missing");
        assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
    }
}

/// A trace opened with its events' checksums checked as read, whose
/// events segment `seg` is damaged: either the opening fails (a damaged
/// footer), or decoding every row group and then checking
/// (`verify_events`) does, and so does any other read of the events;
/// always with the checksum mismatch that names `seg`.
fn deferred_err(root: &Path, seg: &Path) {
    let mismatch = |e: Error| {
        let msg = e.to_string();
        assert!(
            msg.starts_with(&seg.display().to_string()) && msg.contains("checksum mismatch"),
            "{msg}"
        );
    };
    let trace = match Trace::open_deferred(root) {
        Ok(t) => t,
        Err(e) => return mismatch(e),
    };
    let decoder = memleak_trace::events::Decoder::new(&trace);
    for u in trace.event_units() {
        // Garbage decoded is fine here: the check below refuses it.
        let _ = decoder.read(&u);
    }
    mismatch(trace.verify_events().unwrap_err());
    // Checked again: still refused.
    mismatch(trace.verify_events().unwrap_err());
    let trace = Trace::open_deferred(root).unwrap();
    let u = trace.event_units()[0].clone();
    mismatch(
        trace
            .read_unit(&u, memleak_trace::EventColumns::ALL)
            .unwrap_err(),
    );
}

#[test]
fn altered_or_emptied_segment_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let seg = segments(&root, "events")[0].clone();
    let good = std::fs::read(&seg).unwrap();

    // One bit anywhere, in the data pages or the footer.
    for at in [4, good.len() / 2, good.len() - 9] {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        std::fs::write(&seg, &bad).unwrap();
        open_err(&root, &seg, "checksum mismatch");
        deferred_err(&root, &seg);
    }
    std::fs::write(&seg, b"").unwrap();
    open_err(&root, &seg, "0 bytes, meta.json lists");
    // Another table's segment in its place.
    std::fs::copy(&segments(&root, "stacks")[0], &seg).unwrap();
    open_err(&root, &seg, "meta.json lists");
    std::fs::write(&seg, &good).unwrap();
    assert_eq!(
        read_events(&Trace::open(&root).unwrap()),
        every_kind_events()
    );
    let trace = Trace::open_deferred(&root).unwrap();
    let decoder = memleak_trace::events::Decoder::new(&trace);
    for u in trace.event_units() {
        decoder.read(&u).unwrap();
    }
    trace.verify_events().unwrap();
    assert_eq!(read_events(&trace), every_kind_events());
}

#[test]
fn unlisted_files_are_ignored_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let p = root.join("events/part-00001.parquet");
    std::fs::copy(&segments(&root, "events")[0], &p).unwrap();
    let trace = Trace::open(&root).unwrap();
    let w = trace.warnings().join("\n");
    assert!(
        w.contains("part-00001.parquet: not listed in meta.json"),
        "{w}"
    );
    assert_eq!(read_events(&trace), every_kind_events(), "counted once");
}

#[test]
fn listed_segment_left_with_its_temporary_name_is_read() {
    // A checkpoint lists a segment before it renames it: a recorder killed
    // in between leaves the finished file under its temporary name.
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let seg = segments(&root, "events")[0].clone();
    let tmp = seg.with_file_name("part-00000.parquet.inprogress");
    std::fs::rename(&seg, &tmp).unwrap();
    let trace = Trace::open(&root).unwrap();
    let w = trace.warnings().join("\n");
    assert!(w.contains("stopped before renaming"), "{w}");
    assert_eq!(read_events(&trace), every_kind_events());
    // But only if it is the listed file, byte for byte.
    let mut bad = std::fs::read(&tmp).unwrap();
    bad[10] ^= 1;
    std::fs::write(&tmp, bad).unwrap();
    open_err(&root, &tmp, "checksum mismatch");
}

#[test]
fn altered_meta_json_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let path = root.join("meta.json");
    let good = std::fs::read_to_string(&path).unwrap();
    // Still valid JSON, another value: a count, a time, a pid.
    for (from, to) in [("\"malloc\": 1", "\"malloc\": 3"), ("4242", "4243")] {
        assert!(good.contains(from), "{from}");
        std::fs::write(&path, good.replacen(from, to, 1)).unwrap();
        open_err(&root, &path, "checksum mismatch");
    }
    // Whitespace and key order are not values.
    let v: serde_json::Value = serde_json::from_str(&good).unwrap();
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    Trace::open(&root).expect("the same values, written compactly");
}

#[test]
fn altered_scan_segment_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    let seg = segments(&root, "scan")[0].clone();
    let good = std::fs::read(&seg).unwrap();
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x04;
    std::fs::write(&seg, &bad).unwrap();
    open_err(&root, &seg, "checksum mismatch");
    std::fs::write(&seg, &good).unwrap();
    assert_eq!(Trace::open(&root).unwrap().scans().unwrap().len(), 4);
}

#[test]
fn scan_rows_that_meta_json_does_not_account_for_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    // A scan entry dropped from meta.json: its rows belong to no scan.
    let root = full_trace(dir.path(), "unlisted.parquet");
    edit_meta(&root, |m| {
        m["scans"].as_array_mut().unwrap().remove(0);
    });
    let trace = Trace::open(&root).unwrap();
    let e = trace.scans().expect_err("rows of an unlisted scan");
    let msg = e.to_string();
    assert!(msg.contains("a scan meta.json does not list"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");

    // The block count of a scan changed: rows are missing or extra.
    let root = full_trace(dir.path(), "count.parquet");
    edit_meta(&root, |m| {
        m["scans"][0]["blocks"] = 5.into();
    });
    let msg = Trace::open(&root).unwrap().scans().unwrap_err().to_string();
    assert!(msg.contains("4 rows for the scan of pid 4242"), "{msg}");
    assert!(msg.contains("meta.json lists 5 blocks"), "{msg}");

    // The table and its listing gone: the scans in meta.json have no rows.
    let root = full_trace(dir.path(), "gone.parquet");
    std::fs::remove_dir_all(root.join("scan")).unwrap();
    edit_meta(&root, |m| {
        m["segments"].as_object_mut().unwrap().remove("scan");
    });
    let msg = Trace::open(&root).unwrap().scans().unwrap_err().to_string();
    assert!(msg.contains("0 rows for the scan of pid 4242"), "{msg}");
}

#[test]
fn scan_segment_with_an_unknown_verdict_is_corrupt() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    // A scan segment another writer made, with a verdict we do not know.
    let schema = memleak_trace::schema::scan_schema();
    let cols: Vec<arrow_array::ArrayRef> = vec![
        Arc::new(arrow_array::UInt64Array::from(vec![3_000_000_000u64])),
        Arc::new(arrow_array::UInt32Array::from(vec![4242u32])),
        Arc::new(arrow_array::UInt64Array::from(vec![0x9000u64])),
        Arc::new(arrow_array::UInt64Array::from(vec![8u64])),
        Arc::new(arrow_array::StringArray::from(vec!["leaked"])),
        Arc::new(arrow_array::BinaryArray::from(vec![None::<&[u8]>])),
    ];
    let batch = arrow_array::RecordBatch::try_new(schema.clone(), cols).unwrap();
    let path = root.join("scan/part-00009.parquet");
    let kv = vec![parquet::file::metadata::KeyValue::new(
        memleak_trace::schema::TABLE_KEY.to_string(),
        "scan".to_string(),
    )];
    let props = parquet::file::properties::WriterProperties::builder()
        .set_key_value_metadata(Some(kv))
        .build();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        schema,
        Some(props),
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    list_segment(&root, "scan", "part-00009.parquet", 1);
    edit_meta(&root, |m| {
        m["scans"][0]["blocks"] = 5.into();
    });
    let msg = Trace::open(&root).unwrap().scans().unwrap_err().to_string();
    assert!(msg.contains("part-00009.parquet: corrupt"), "{msg}");
    assert!(msg.contains("unknown scan verdict \"leaked\""), "{msg}");
}

/// A data page that names a dictionary its column chunk does not have:
/// Parquet's decoder panics on it (`cargo fuzz run trace_reader` found
/// this), and the reader must report the file as corrupt instead.
#[test]
fn data_page_without_its_dictionary_is_corrupt_not_a_panic() {
    use parquet::file::reader::{FileReader, SerializedFileReader};

    let dir = tempfile::tempdir().unwrap();
    let root = full_trace(dir.path(), "t.parquet");
    // Format 1.0 has no checksums, which would catch the damage first.
    as_format_1_0(&root);
    let seg = segments(&root, "stacks")[0].clone();
    let mut bytes = std::fs::read(&seg).unwrap();
    let reader = SerializedFileReader::new(std::fs::File::open(&seg).unwrap()).unwrap();
    let dict_pages: Vec<usize> = reader.metadata().row_groups()[0]
        .columns()
        .iter()
        .filter_map(|c| c.dictionary_page_offset())
        .map(|o| o as usize)
        .collect();
    assert!(
        !dict_pages.is_empty(),
        "the stacks table has a dictionary page"
    );
    for at in dict_pages {
        // The page header starts with its type (thrift compact: field 1,
        // i32, zigzag): DICTIONARY_PAGE (2) becomes INDEX_PAGE (1), which
        // the decoder skips, so the data page finds no dictionary.
        assert_eq!(&bytes[at..at + 2], &[0x15, 0x04], "page header at {at}");
        bytes[at + 1] = 0x02;
    }
    std::fs::write(&seg, &bytes).unwrap();
    let trace = Trace::open(&root).expect("the footer is intact");
    let msg = trace.stacks().expect_err("stacks must fail").to_string();
    assert!(!msg.contains('\n'), "message is not one line: {msg:?}");
    assert!(
        msg.starts_with(&seg.display().to_string()) && msg.contains("corrupt ("),
        "{msg}"
    );
}
