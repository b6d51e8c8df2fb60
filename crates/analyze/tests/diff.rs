//! The diff's matching of stacks across traces, on synthetic traces whose
//! truth is known: what must match although it differs (addresses, stack
//! ids, pids, build directories, library load addresses, compiler clone
//! suffixes), what must not (another line, another function), and the
//! golden text and JSON of a diff. Regenerate the golden files with
//! `UPDATE_GOLDEN=1 cargo test -p memleak-analyze --test diff`.

mod common;

use std::path::PathBuf;

use common::TraceBuilder;
use memleak_analyze::diff::{
    self, frame_key, normalize_function, Change, DiffWeight, MatchOptions,
};
use memleak_analyze::report::Frame;
use memleak_analyze::{analyze, AnalyzeOptions, Report};
use memleak_trace::{FrameRecord, StackRecord};

/// One program's frames, as built in `dir` and loaded at `base` (the
/// executable) and `lib` (libc), for pid `pid`.
fn frames(tb: &mut TraceBuilder, pid: u32, dir: &str, base: u64, lib: u64, clone: &str) {
    let f = |addr: u64, function: &str, file: &str, line: u32| FrameRecord {
        pid,
        addr,
        build_id: Some("abcd".into()),
        path: Some(format!("{dir}/leaky")),
        file_offset: Some(addr - base),
        function: Some(function.into()),
        func_offset: Some(addr & 0xff),
        file: Some(format!("{dir}/{file}")),
        line: Some(line),
        column: Some(5),
        inlined: Vec::new(),
    };
    let mut make_leak = f(base + 0x1010, "make_leak", "leak.c", 12);
    make_leak.inlined.push(memleak_trace::InlinedFrame {
        function: "fill_buffer".into(),
        file: Some(format!("{dir}/util.h")),
        line: Some(7),
        column: Some(3),
    });
    tb.frames.push(make_leak);
    tb.frames.push(f(base + 0x1200, "main", "leak.c", 30));
    tb.frames.push(f(
        base + 0x1300,
        &format!("cache_insert{clone}"),
        "cache.c",
        88,
    ));
    tb.frames
        .push(f(base + 0x1400, "parse_line", "parse.c", 41));
    tb.frames
        .push(f(base + 0x1500, "grow_table", "table.c", 19));
    // A libc frame without a symbol: object and offset only.
    tb.frames.push(FrameRecord {
        pid,
        addr: lib + 0x29d90,
        path: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
        file_offset: Some(0x29d90),
        ..FrameRecord::default()
    });
}

fn stack(tb: &mut TraceBuilder, id: u64, pid: u32, frames: &[u64]) {
    tb.stacks.push(StackRecord {
        stack_id: id,
        pid,
        kernel: false,
        truncated: false,
        frames: frames.to_vec(),
    });
}

/// BASE: one process built in /tmp/build-a. make_leak leaks 3 x 100,
/// cache_insert 2 x 64, parse_line 1 x 24; grow_table leaks nothing.
fn base() -> TraceBuilder {
    let mut tb = TraceBuilder::new();
    let (b, l) = (0x400000, 0x7f00_0000_0000);
    frames(&mut tb, 100, "/tmp/build-a", b, l, "");
    stack(&mut tb, 1, 100, &[b + 0x1010, b + 0x1200, l + 0x29d90]);
    stack(&mut tb, 2, 100, &[b + 0x1300, b + 0x1200, l + 0x29d90]);
    stack(&mut tb, 3, 100, &[b + 0x1400, b + 0x1200]);
    stack(&mut tb, 4, 100, &[b + 0x1500, b + 0x1200]);
    tb.malloc(100, 0x5000, 100, 1)
        .malloc(110, 0x5100, 100, 1)
        .malloc(120, 0x5200, 100, 1)
        .malloc(200, 0x6000, 64, 2)
        .malloc(210, 0x6100, 64, 2)
        .malloc(300, 0x7000, 24, 3)
        .malloc(400, 0x8000, 512, 4)
        .free(500, 0x8000);
    tb
}

/// NEW: the program rebuilt in /tmp/build-b (other addresses, libc loaded
/// elsewhere, other stack ids, cache_insert now a `.isra.0` clone), run as
/// two processes, 200 and 300. make_leak leaks 2 x 100 + 1 x 100 (same as
/// BASE, across both processes), cache_insert 5 x 64 (grown), parse_line
/// nothing (fixed), grow_table 1 x 4096 (new) and parse_line from another
/// line 1 x 8 (a different stack).
fn new() -> TraceBuilder {
    let mut tb = TraceBuilder::new();
    tb.meta.pids = vec![200, 300];
    let (b, l) = (0x500000, 0x7f10_0000_0000);
    for pid in [200, 300] {
        frames(&mut tb, pid, "/tmp/build-b", b, l, ".isra.0");
    }
    tb.frames.push(FrameRecord {
        pid: 200,
        addr: b + 0x1404,
        file: Some("/tmp/build-b/parse.c".into()),
        line: Some(45),
        function: Some("parse_line".into()),
        ..FrameRecord::default()
    });
    stack(&mut tb, 11, 200, &[b + 0x1010, b + 0x1200, l + 0x29d90]);
    stack(&mut tb, 12, 300, &[b + 0x1010, b + 0x1200, l + 0x29d90]);
    stack(&mut tb, 13, 200, &[b + 0x1300, b + 0x1200, l + 0x29d90]);
    stack(&mut tb, 14, 200, &[b + 0x1400, b + 0x1200]);
    stack(&mut tb, 15, 300, &[b + 0x1500, b + 0x1200]);
    stack(&mut tb, 16, 200, &[b + 0x1404, b + 0x1200]);
    let ev = memleak_trace::EventKind::Malloc;
    tb.ev(100, 200, ev, 0x5000, 100, 11)
        .ev(110, 200, ev, 0x5100, 100, 11)
        .ev(120, 300, ev, 0x5000, 100, 12);
    for i in 0..5 {
        tb.ev(200 + i, 200, ev, 0x6000 + i * 0x100, 64, 13);
    }
    tb.ev(300, 200, ev, 0x7000, 24, 14)
        .ev(310, 200, memleak_trace::EventKind::Free, 0x7000, 0, 0)
        .ev(400, 300, ev, 0x8000, 4096, 15)
        .ev(500, 200, ev, 0x9000, 8, 16);
    tb
}

fn report(tb: &TraceBuilder, name: &str) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let path = tb.write(dir.path());
    let mut r = analyze(&path, &AnalyzeOptions::default()).unwrap();
    // The temporary directory differs per run.
    r.summary.trace = format!("golden/{name}.parquet");
    r
}

fn the_diff(opts: MatchOptions) -> diff::Diff {
    diff::diff(&report(&base(), "base"), &report(&new(), "new"), opts, 0)
}

/// (function of the innermost frame, line) -> (base bytes, count, new
/// bytes, count).
fn table(d: &diff::Diff) -> Vec<(String, u32, u64, u64, u64, u64)> {
    d.stacks
        .iter()
        .map(|s| {
            let f = &s.frames[0];
            (
                f.function.clone().unwrap(),
                f.line.unwrap_or(0),
                s.base.bytes,
                s.base.count,
                s.new.bytes,
                s.new.count,
            )
        })
        .collect()
}

#[test]
fn stacks_match_by_frames_across_builds_and_processes() {
    let d = the_diff(MatchOptions::default());
    // Grown (most first), shrunk (most first), unchanged.
    assert_eq!(
        table(&d),
        vec![
            ("grow_table".into(), 19, 0, 0, 4096, 1),
            ("cache_insert.isra.0".into(), 88, 128, 2, 320, 5),
            ("parse_line".into(), 45, 0, 0, 8, 1),
            ("parse_line".into(), 41, 24, 1, 0, 0),
            ("make_leak".into(), 12, 300, 3, 300, 3),
        ]
    );
    let changes: Vec<Change> = d.stacks.iter().map(|s| s.change()).collect();
    assert_eq!(
        changes,
        [
            Change::Grown,
            Change::Grown,
            Change::Grown,
            Change::Shrunk,
            Change::Unchanged
        ]
    );
    // make_leak: two processes of NEW merged, one of BASE.
    let leak = &d.stacks[4];
    assert_eq!((leak.base.stacks, leak.base.pids.clone()), (1, vec![100]));
    assert_eq!(
        (leak.new.stacks, leak.new.pids.clone()),
        (2, vec![200, 300])
    );
    // NEW's frames name the stack.
    assert_eq!(leak.frames[0].file.as_deref(), Some("/tmp/build-b/leak.c"));
    let s = &d.summary;
    assert_eq!((s.grown, s.shrunk, s.unchanged), (3, 1, 1));
    assert_eq!((s.only_in_base, s.only_in_new), (1, 2));
    assert_eq!(s.delta_bytes(), (300 + 320 + 4096 + 8) - (300 + 128 + 24));
    assert_eq!(s.delta_allocations(), (3 + 5 + 1 + 1) - (3 + 2 + 1));
    assert_eq!((s.base.keys, s.new.keys), (3, 4));
    assert_eq!(
        (s.base.outstanding_stacks, s.new.outstanding_stacks),
        (3, 5)
    );
}

#[test]
fn ignoring_lines_merges_what_only_lines_tell_apart() {
    let d = the_diff(MatchOptions { ignore_lines: true });
    // parse_line at lines 41 and 45 is one stack: 24 bytes then 8.
    let parse: Vec<_> = table(&d)
        .into_iter()
        .filter(|r| r.0 == "parse_line")
        .collect();
    assert_eq!(parse.len(), 1, "{parse:?}");
    assert_eq!(
        (parse[0].2, parse[0].3, parse[0].4, parse[0].5),
        (24, 1, 8, 1)
    );
    assert_eq!(d.stacks.len(), 4);
}

#[test]
fn a_trace_against_itself_has_no_change() {
    let r = report(&new(), "new");
    let d = diff::diff(&r, &r, MatchOptions::default(), 0);
    assert!(d.stacks.iter().all(|s| s.change() == Change::Unchanged));
    assert_eq!(d.summary.unchanged, 4);
    assert_eq!(d.summary.delta_bytes(), 0);
    assert!(diff::render_text(&d).contains("Grown: no stacks."));
}

#[test]
fn frame_keys_leave_out_what_differs_between_builds() {
    let opts = MatchOptions::default();
    let frame = |addr: u64, path: &str, file: &str| Frame {
        addr,
        function: Some("ns::f(int)".into()),
        offset: Some(addr & 0xf),
        file: Some(file.into()),
        line: Some(10),
        column: Some(addr as u32),
        path: Some(path.into()),
        file_offset: Some(addr),
        build_id: None,
        inlined: Vec::new(),
    };
    let a = frame(0x1234, "/opt/a/prog", "/tmp/tmp.x1/src/f.cc");
    let b = frame(0x5678, "/usr/bin/prog", "/home/ci/build/src/f.cc");
    assert_eq!(frame_key(&a, opts), frame_key(&b, opts));
    assert_eq!(frame_key(&a, opts), "ns::f(int) @ f.cc:10");
    let mut other_line = b.clone();
    other_line.line = Some(11);
    assert_ne!(frame_key(&a, opts), frame_key(&other_line, opts));
    assert_eq!(
        frame_key(&a, MatchOptions { ignore_lines: true }),
        frame_key(&other_line, MatchOptions { ignore_lines: true })
    );
    // Unsymbolized: object base name and offset, not the address.
    let raw = |addr: u64, path: Option<&str>, off: Option<u64>| Frame {
        addr,
        path: path.map(str::to_string),
        file_offset: off,
        ..Default::default()
    };
    assert_eq!(
        frame_key(
            &raw(0x7f00_0002_9d90, Some("/lib/libc.so.6"), Some(0x29d90)),
            opts
        ),
        frame_key(
            &raw(0x7f55_0002_9d90, Some("/usr/lib/libc.so.6"), Some(0x29d90)),
            opts
        )
    );
    assert_eq!(
        frame_key(&raw(1, Some("/lib/libc.so.6"), Some(0x29d90)), opts),
        "[libc.so.6+0x29d90]"
    );
    assert_ne!(
        frame_key(&raw(1, Some("/lib/libc.so.6"), Some(0x29d90)), opts),
        frame_key(&raw(1, Some("/lib/libc.so.6"), Some(0x29d94)), opts)
    );
    assert_eq!(frame_key(&raw(0x1234, None, None), opts), "[unknown]");
}

#[test]
fn compiler_clones_are_their_function() {
    for (name, base) in [
        ("f.isra.0", "f"),
        ("f.constprop.3", "f"),
        ("f.part.1", "f"),
        ("f.cold", "f"),
        ("f.constprop.0.isra.0", "f"),
        ("f.lto_priv.0", "f"),
        ("f.llvm.1234567", "f"),
        ("f", "f"),
        // Not clones: kept whole.
        ("f.2", "f.2"),
        ("obj.method", "obj.method"),
        (".isra.0", ".isra.0"),
        (
            "std::vector<int>::push_back(int const&)",
            "std::vector<int>::push_back(int const&)",
        ),
    ] {
        assert_eq!(normalize_function(name), base, "{name}");
    }
}

#[test]
fn folded_has_both_columns_and_the_svg_is_drawn() {
    let d = the_diff(MatchOptions::default());
    let folded = diff::render_folded(&d, DiffWeight::Bytes);
    let lines: Vec<&str> = folded.lines().collect();
    assert!(
        lines.contains(&"[libc.so.6+0x29d90];main;cache_insert 128 320"),
        "{folded}"
    );
    assert!(
        lines.contains(&"[libc.so.6+0x29d90];main;make_leak;fill_buffer_[i] 300 300"),
        "{folded}"
    );
    assert!(lines.contains(&"main;parse_line 24 8"), "{folded}");
    assert!(lines.contains(&"main;grow_table 0 4096"), "{folded}");
    let mut sorted = lines.clone();
    sorted.sort_unstable();
    assert_eq!(lines, sorted);
    let counts = diff::render_folded(&d, DiffWeight::Count);
    assert!(counts.contains("main;cache_insert 2 5\n"), "{counts}");
    for base_widths in [false, true] {
        let svg = String::from_utf8(diff::render_svg(&d, DiffWeight::Bytes, base_widths).unwrap())
            .unwrap();
        assert!(
            svg.contains("memleak diff: base.parquet -&gt; new.parquet")
                || svg.contains("memleak diff: base.parquet -> new.parquet"),
            "title"
        );
        assert!(svg.contains("cache_insert"));
    }
}

fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{name} differs from the golden file (run with UPDATE_GOLDEN=1 to accept):\n{actual}"
    );
}

#[test]
fn golden_text_and_json() {
    let mut d = the_diff(MatchOptions::default());
    d.top = 2;
    golden("diff.txt", &diff::render_text(&d));
    let json = diff::render_json(&d);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["report"], "diff");
    assert_eq!(v["summary"]["stacks_shown"], 4); // 2 grown, 1 shrunk, 1 unchanged
    assert_eq!(v["stacks"][0]["delta_bytes"], 4096);
    golden("diff.json", &json);
}

#[test]
fn a_side_that_lost_events_puts_the_diff_in_doubt() {
    // Without losses: no warning, nothing uncertain (the golden diff).
    let clean = the_diff(MatchOptions::default());
    assert!(!clean.summary.uncertain());
    assert!(!diff::render_text(&clean).contains("WARNING"));

    let mut lossy = new();
    lossy.meta.counters.lost = [("unsafe_return", 12), ("stack_failed", 3)]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    let d = diff::diff(
        &report(&base(), "base"),
        &report(&lossy, "new"),
        MatchOptions::default(),
        0,
    );
    assert!(d.summary.uncertain());
    let text = diff::render_text(&d);
    assert_eq!(
        text.lines().next().unwrap(),
        "WARNING: in the NEW recording, 12 calls not traced (a signal stack above the thread's \
         stack; tracing them could crash the program): outstanding figures are uncertain."
    );
    assert_eq!(text.matches("WARNING").count(), 1, "{text}");
    let v: serde_json::Value = serde_json::from_str(&diff::render_json(&d)).unwrap();
    let s = &v["summary"];
    assert_eq!(s["uncertain"], true);
    assert_eq!(s["base"]["uncertain"], false);
    assert_eq!(s["new"]["uncertain"], true);
    assert_eq!(s["new"]["lost_events"]["missing"], 12);
    assert_eq!(s["new"]["lost_events"]["stackless"], 3);
    assert_eq!(s["new"]["lost_events"]["by_reason"]["unsafe_return"], 12);
}
