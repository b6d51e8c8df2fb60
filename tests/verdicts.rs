//! Leak verdicts against valgrind's memcheck, on `fixtures/verdicts.c`:
//! the pointer shapes of memcheck's own leak tests (leak-0, leak-cycle,
//! leak-tree, leak-cases), whose verdicts are known. memcheck must report
//! exactly the fixture's `verdicts` (that checks the fixture), and
//! memleak's scan at exit exactly what memcheck reports on the same
//! binary, heap blocks only (memcheck does not count mappings).
//!
//! The reproducers of issue 28 (`fixtures/mc_*`, and sort with jemalloc
//! preloaded) are compared the same way, four figures, bytes and blocks.
//!
//! Debian's valgrind source package (memcheck/tests/leak-*.c) is not
//! built here: this machine has no deb-src entry and no network for
//! `apt-get source`, so the fixture reproduces those shapes in code of
//! its own.

mod common;

use std::ffi::OsString;
use std::process::Command;

use common::fixtures::{fixtures_dir, memleak, recording_guard, Fixture};
use memleak_analyze::report::{analyze, AnalyzeOptions};
use memleak_analyze::{suppress, ClassTotals, KindScope};
use serde_json::Value;

/// memcheck's LEAK SUMMARY: (bytes, blocks) of definitely, indirectly,
/// possibly lost and still reachable.
type Summary = [(u64, u64); 4];

const KINDS: [&str; 4] = ["definitely", "indirectly", "possibly", "reachable"];

fn expected(v: &Value) -> Summary {
    KINDS.map(|k| {
        (
            v[k]["bytes"].as_u64().unwrap(),
            v[k]["blocks"].as_u64().unwrap(),
        )
    })
}

/// Parses `definitely lost: 144 bytes in 3 blocks` and the like.
fn parse_leak_summary(stderr: &str) -> Summary {
    let labels = [
        "definitely lost:",
        "indirectly lost:",
        "possibly lost:",
        "still reachable:",
    ];
    labels.map(|label| {
        let line = stderr
            .lines()
            .find(|l| l.contains(label))
            .unwrap_or_else(|| panic!("no {label:?} in memcheck's output:\n{stderr}"));
        let rest = line.split(label).nth(1).unwrap().replace(',', "");
        let words: Vec<&str> = rest.split_whitespace().collect();
        // "144 bytes in 3 blocks"
        (words[0].parse().unwrap(), words[3].parse().unwrap())
    })
}

fn memcheck(fx: &Fixture, args: &[String]) -> Summary {
    let mut cmd = vec![fx.binary().into_os_string()];
    cmd.extend(args.iter().map(OsString::from));
    memcheck_of(&cmd, &[])
}

/// memcheck's summary of `cmd`, run with `env` added to its environment.
fn memcheck_of(cmd: &[OsString], env: &[(&str, &str)]) -> Summary {
    let out = Command::new("valgrind")
        .args([
            "--leak-check=full",
            "--show-leak-kinds=all",
            // What memleak sees: glibc's and libstdc++'s exit-time frees
            // are not run, as on a process that just exits.
            "--run-libc-freeres=no",
            "--run-cxx-freeres=no",
        ])
        .args(cmd)
        .envs(env.iter().copied())
        .current_dir(fixtures_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "valgrind failed: {out:?}");
    parse_leak_summary(&String::from_utf8_lossy(&out.stderr))
}

fn totals(t: ClassTotals) -> (u64, u64) {
    (t.bytes, t.allocations)
}

/// Records the fixture with memleak and returns its verdict totals (heap
/// blocks only), or `None`, with the reason printed, when this memleak
/// does not scan at exit.
fn memleak_verdicts(
    fx: &Fixture,
    args: &[String],
    default_suppressions: bool,
) -> Option<(Summary, Vec<memleak_analyze::SuppressedTotals>)> {
    let mut cmd = vec![fx.binary().into_os_string()];
    cmd.extend(args.iter().map(OsString::from));
    memleak_verdicts_of(&cmd, &[], default_suppressions)
}

/// memleak's verdict totals (heap blocks) of `cmd`, run with `env`.
fn memleak_verdicts_of(
    cmd: &[OsString],
    env: &[(&str, &str)],
    default_suppressions: bool,
) -> Option<(Summary, Vec<memleak_analyze::SuppressedTotals>)> {
    let _guard = recording_guard(false);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    // The environment through env(1): memleak itself runs without it
    // (an LD_PRELOAD is the command's, not memleak's).
    let mut full: Vec<OsString> = Vec::new();
    if !env.is_empty() {
        full.push("env".into());
        full.extend(env.iter().map(|(k, v)| OsString::from(format!("{k}={v}"))));
    }
    full.extend(cmd.iter().cloned());
    let out = memleak()
        .args(["record", "-q", "-o"])
        .arg(&trace)
        .arg("--")
        .args(&full)
        .current_dir(fixtures_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "record failed: {out:?}");
    let t = memleak_trace::Trace::open(&trace).unwrap();
    if t.meta().scans.is_empty() {
        common::skip(
            "the memleak side: this memleak does not scan at exit (no scans in meta.json)",
        );
        return None;
    }
    for s in &t.meta().scans {
        assert!(s.error.is_none(), "the scan failed: {s:?}");
    }
    let mut opts = AnalyzeOptions::default();
    opts.filter.kind = KindScope::Heap;
    if default_suppressions {
        opts.suppressions = suppress::parse(suppress::DEFAULT_SUPPRESSIONS, "default").unwrap();
    }
    let report = analyze(&trace, &opts).unwrap();
    let leak = report.summary.leak.expect("a scan applies at the end");
    assert_eq!(leak.totals.unscanned.allocations, 0, "{leak:?}");
    let l = leak.totals;
    Some((
        [
            totals(l.definitely),
            totals(l.indirectly),
            totals(l.possibly),
            totals(l.reachable),
        ],
        report.summary.suppressed,
    ))
}

#[test]
fn memcheck_reports_the_fixture_verdicts() {
    if !common::has_tool("valgrind") {
        return;
    }
    let fx = Fixture::load("verdicts");
    assert_eq!(memcheck(&fx, &[]), expected(&fx.expected["verdicts"]));
    let thread = fx.args_of("thread_args");
    assert_eq!(
        memcheck(&fx, &thread),
        expected(&fx.expected["thread_verdicts"])
    );
}

#[test]
fn memleak_verdicts_equal_memchecks() {
    if !common::can_record() || !common::has_tool("valgrind") {
        return;
    }
    let fx = Fixture::load("verdicts");
    let vg = memcheck(&fx, &[]);
    let Some((ours, suppressed)) = memleak_verdicts(&fx, &[], true) else {
        return;
    };
    assert_eq!(ours, vg, "memleak (left) and memcheck (right), {KINDS:?}");
    assert!(suppressed.is_empty(), "{suppressed:?}");
}

#[test]
fn a_blocked_threads_stack_is_a_root() {
    if !common::can_record() || !common::has_tool("valgrind") {
        return;
    }
    let fx = Fixture::load("verdicts");
    let thread = fx.args_of("thread_args");
    let vg = memcheck(&fx, &thread);
    let Some((ours, _)) = memleak_verdicts(&fx, &thread, false) else {
        return;
    };
    assert_eq!(ours, vg, "memleak (left) and memcheck (right), {KINDS:?}");
    // The default suppressions take the thread's DTV (ld.so) out, and
    // nothing else.
    let (ours, suppressed) = memleak_verdicts(&fx, &thread, true).unwrap();
    let rt = &fx.expected["thread_runtime"][0];
    let dtv = (rt["bytes"].as_u64().unwrap(), rt["count"].as_u64().unwrap());
    let mut want = vg;
    want[2] = (vg[2].0 - dtv.0, vg[2].1 - dtv.1);
    assert_eq!(ours, want);
    assert_eq!(suppressed.len(), 1, "{suppressed:?}");
    assert_eq!(suppressed[0].name, rt["suppression"].as_str().unwrap());
    assert_eq!((suppressed[0].bytes, suppressed[0].allocations), dtv);
}

/// memcheck's and memleak's four figures for `cmd`, which must agree
/// exactly (heap blocks, no suppressions).
fn agrees_with_memcheck(cmd: &[OsString], env: &[(&str, &str)]) {
    let vg = memcheck_of(cmd, env);
    let Some((ours, _)) = memleak_verdicts_of(cmd, env, false) else {
        return;
    };
    assert_eq!(
        ours, vg,
        "{cmd:?}: memleak (left) and memcheck (right), {KINDS:?}"
    );
}

/// The reproducers of issue 28, each a program memleak disagreed with
/// memcheck on (`fixtures/mc_*`): the `expected` file says what memcheck
/// reports, and memleak must report the same.
fn reproducer(name: &str) {
    if !common::can_record() || !common::has_tool("valgrind") {
        return;
    }
    let fx = Fixture::load(name);
    let want = expected(&fx.expected["memcheck"]);
    let cmd = vec![fx.binary().into_os_string()];
    assert_eq!(memcheck_of(&cmd, &[]), want, "memcheck on {name}");
    agrees_with_memcheck(&cmd, &[]);
}

/// A lost block whose last bytes hold glibc's top-chunk address (in
/// `main_arena`, libc's data): memcheck's allocator has no such state.
#[test]
fn inlined_leak_in_front_of_the_top_chunk_is_definitely_lost() {
    reproducer("mc_inline");
}

/// -O0, a call graph of leaks and a lost tree; one block ends just before
/// the top chunk.
#[test]
fn call_graph_at_o0_agrees_with_memcheck() {
    reproducer("mc_callgraph");
}

/// Threads joined before main leaks blocks whose addresses their dead
/// stacks still hold below their last stack pointer (glibc caches the
/// stacks): memcheck does not read there.
#[test]
fn stale_words_below_exited_threads_stack_pointers_are_not_roots() {
    reproducer("mc_threads");
}

/// A dropped mmap holds the only pointer to a block (memcheck scans every
/// rw mapping: reachable), a lost large block glibc mmapped holds another
/// (its mapping is not a root), threads still blocked at exit hold blocks
/// in their frames, and a cycle is held by an interior pointer.
#[test]
fn mappings_large_chunks_and_running_threads_agree_with_memcheck() {
    reproducer("mc_mappings");
}

/// iostream: libstdc++'s emergency pool and the stdout buffer reachable,
/// the program's `new[]` lost.
#[test]
fn iostream_agrees_with_memcheck() {
    reproducer("mc_iostream");
}

/// A C++ program's allocations made before main, by libstdc++'s
/// constructor run from ld.so's `_dl_init`, have complete stacks: they end
/// at `_dl_start_user`, ld.so's start code, which has no CFI.
#[test]
fn pre_main_stacks_end_complete_at_ld_so_start_code() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("mc_iostream");
    let (_dir, trace) = fx.record(&[]);
    let t = memleak_trace::Trace::open(&trace).unwrap();
    let stacks = t.stacks().unwrap();
    let user: Vec<_> = stacks.iter().filter(|s| !s.kernel).collect();
    assert!(!user.is_empty());
    let cut: Vec<_> = user.iter().filter(|s| s.truncated).collect();
    assert!(cut.is_empty(), "truncated stacks: {cut:?}");
    assert_eq!(t.meta().unwind.as_ref().map(|u| u.truncated.len()), Some(0));
}

/// Suppressions never change a figure silently: record's closing scan
/// line prints analyze's figures (default suppressions) and says what
/// they hid, as analyze's outstanding row and LEAK SUMMARY do.
#[test]
fn record_and_analyze_print_the_same_figures_and_say_what_is_suppressed() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("mc_iostream");
    let _guard = recording_guard(false);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let out = memleak()
        .args(["record", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(fx.binary())
        .output()
        .unwrap();
    assert!(out.status.success(), "record failed: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("memleak: scan of pid"))
        .unwrap_or_else(|| panic!("no scan line in {stderr}"));
    // The pool (72704 bytes) is suppressed; the stdout buffer stays.
    assert!(line.contains("definitely lost 40 B in 1 blocks"), "{line}");
    assert!(
        line.contains("still reachable 4.0 KiB in 1 blocks"),
        "{line}"
    );
    assert!(
        line.contains("71.0 KiB in 1 blocks suppressed (libstdc++ emergency pool)"),
        "{line}"
    );
    let text = memleak()
        .args(["analyze", "-T", "0"])
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let row = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no {name:?} in {text}"))
            .to_string()
    };
    assert!(
        row("outstanding  ")
            .ends_with("72704 bytes (71.0 KiB) in 1 block suppressed (libstdc++ emergency pool)"),
        "{text}"
    );
    assert!(row("peak outstanding").ends_with("(suppressed blocks included)"));
    assert!(row("still reachable:").contains("4096 bytes"), "{text}");
    assert!(row("suppressed:").contains("72704 bytes"), "{text}");
}

/// sort with jemalloc preloaded: jemalloc's slab metadata points at its
/// regions, and is not a root.
#[test]
fn sort_with_jemalloc_preloaded_agrees_with_memcheck() {
    const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
    if !common::can_record() || !common::has_tool("valgrind") {
        return;
    }
    if !std::path::Path::new(JEMALLOC).exists() {
        common::skip(format_args!("{JEMALLOC} is not installed (libjemalloc2)"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("numbers");
    let text: String = (0..3000u32)
        .map(|i| format!("{}\n", (i * 7919) % 3001))
        .collect();
    std::fs::write(&input, text).unwrap();
    let cmd = vec![OsString::from("sort"), input.into_os_string()];
    agrees_with_memcheck(&cmd, &[("LD_PRELOAD", JEMALLOC)]);
}

/// `memleak analyze --format json` of a trace, parsed.
fn analyze_json(trace: &std::path::Path, extra: &[&str]) -> Value {
    let out = memleak()
        .args(["analyze", "-q", "--format", "json", "-T", "0"])
        .arg(trace)
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "analyze failed: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_default_suppressions_hide_the_libstdcxx_pool_and_the_flag_shows_it() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("cxx_new");
    let (_dir, trace) = fx.record(&[]);
    let pool = fx.expected["runtime"][0]["bytes"].as_u64().unwrap();
    let has_pool = |v: &Value| {
        v["stacks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["bytes"] == pool && s["count"] == 1)
    };
    let v = analyze_json(&trace, &[]);
    assert!(!has_pool(&v), "the pool is shown by default");
    let supp = &v["summary"]["suppressed"];
    let entry = supp
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "libstdc++ emergency pool")
        .unwrap_or_else(|| panic!("{supp}"));
    assert_eq!(entry["bytes"], pool);
    assert_eq!(entry["allocations"], 1);

    let v = analyze_json(&trace, &["--no-default-suppressions"]);
    assert!(has_pool(&v), "the pool is hidden without suppressions");
    assert!(v["summary"].get("suppressed").is_none());
}

#[test]
fn verdict_and_suppress_errors_are_one_line() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("verdicts");
    let (dir, trace) = fx.record(&["--no-scan"]);
    let err = |args: &[&str], needle: &str| {
        let out = memleak()
            .args(["analyze", "-q"])
            .arg(&trace)
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.starts_with("memleak: error: "), "{e}");
        assert_eq!(e.trim_end().lines().count(), 1, "{e}");
        assert!(e.contains(needle), "{e}");
    };
    err(
        &["--verdict", "definitely"],
        "has no scan to take verdicts from",
    );
    err(&["--verdict", "leaked"], "unknown verdict \"leaked\"");
    let bad = dir.path().join("bad.supp");
    std::fs::write(&bad, "[x]\nfun: a\nkind: heap\n").unwrap();
    err(
        &["--suppress", bad.to_str().unwrap()],
        "bad.supp:3: kind: must come before the frame lines",
    );
    // The same trace reads without a scan: every block, no verdicts.
    let v = analyze_json(&trace, &[]);
    assert!(v["summary"].get("leak_summary").is_none());
    assert_eq!(v["summary"]["outstanding_bytes"], 144 + 104 + 80 + 156);
}

#[test]
fn info_shows_the_scan() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("verdicts");
    let (_dir, trace) = fx.record(&[]);
    let out = memleak().arg("info").arg(&trace).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("scan:      pid "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(" ms/MiB, "), "{line}");
    assert!(!line.contains("failed"), "{line}");
    let out = memleak()
        .args(["info", "--json"])
        .arg(&trace)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let scans = v["scans"].as_array().unwrap();
    assert_eq!(scans.len(), 1, "{v}");
    // The fixture's 11 outstanding heap blocks, and nothing the process
    // did not allocate itself.
    assert_eq!(scans[0]["blocks"], 11, "{v}");
    assert_eq!(v["tables"]["scan"]["rows"], 11, "{v}");
}
