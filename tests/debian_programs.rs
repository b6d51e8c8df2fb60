//! Programs nobody here wrote, built the way Debian builds them (no frame
//! pointers), against valgrind on the same command and environment: the
//! heap outstanding at exit must be valgrind's "in use at exit" exactly,
//! at least 98 % of its bytes must have a complete stack, no frame may
//! lack an object, and the stack valgrind shows holding the most bytes
//! must be ours too. The scan at exit must give memcheck's LEAK SUMMARY
//! exactly: definitely, indirectly, possibly lost and still reachable,
//! bytes and blocks (issue 28).
//!
//! valgrind runs with `--run-libc-freeres=no --run-cxx-freeres=no`: by
//! default it frees glibc's and libstdc++'s own allocations before it
//! counts, which no traced process does. perl copies its environment into
//! `%ENV`, and valgrind adds variables to the client's: perl's recording
//! gets the same ones, `LD_PRELOAD` pointing at files that do not exist
//! (same length, so the same allocation sizes; ld.so ignores them).
//!
//! Needs root, valgrind and the programs; skips with a line if not.
#![cfg(feature = "bpf")]

mod common;

use std::path::Path;
use std::process::Command;

use common::fixtures::record_command_with;
use memleak_analyze::report::{analyze, AnalyzeOptions};
use memleak_analyze::{Filter, KindScope};

/// valgrind's verdict: "in use at exit" and the loss record with the most
/// bytes, as (bytes, blocks, the first function below the allocator).
struct Valgrind {
    bytes: u64,
    blocks: u64,
    top: Option<(u64, u64, String)>,
    /// The LEAK SUMMARY: (bytes, blocks) definitely, indirectly, possibly
    /// lost and still reachable.
    leak: [(u64, u64); 4],
}

const LEAK_LABELS: [&str; 4] = [
    "definitely lost: ",
    "indirectly lost: ",
    "possibly lost: ",
    "still reachable: ",
];

fn num(s: &str) -> u64 {
    s.replace(',', "").parse().unwrap()
}

fn valgrind(cmd: &[&str], env: &[(&str, &str)]) -> Valgrind {
    let out = Command::new("valgrind")
        .args([
            "--leak-check=full",
            "--show-leak-kinds=all",
            "--num-callers=40",
            "--run-libc-freeres=no",
            "--run-cxx-freeres=no",
        ])
        .args(cmd)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.split_once("== ").map_or(l, |(_, r)| r).trim())
        .collect();
    let mut v = Valgrind {
        bytes: 0,
        blocks: 0,
        top: None,
        leak: [(0, 0); 4],
    };
    for (i, l) in lines.iter().enumerate() {
        for (k, label) in LEAK_LABELS.iter().enumerate() {
            if let Some(rest) = l.strip_prefix(label) {
                // "144 bytes in 3 blocks"
                let w: Vec<&str> = rest.split_whitespace().collect();
                v.leak[k] = (num(w[0]), num(w[3]));
            }
        }
        if let Some(rest) = l.strip_prefix("in use at exit: ") {
            // "393,984 bytes in 3 blocks"
            let w: Vec<&str> = rest.split_whitespace().collect();
            v.bytes = num(w[0]);
            v.blocks = num(w[3]);
        }
        if l.contains("in loss record") {
            // "N bytes in M blocks are ..." or "N (D direct, I indirect)
            // bytes in M blocks": the first number is the total.
            let w: Vec<&str> = l.split_whitespace().collect();
            let bytes = num(w[0]);
            let blocks = num(w[w.iter().position(|&x| x == "blocks").unwrap() - 1]);
            // The line after "at 0x…: malloc (…)".
            let caller = lines[i + 2]
                .split_once(": ")
                .map(|(_, f)| f.split(" (").next().unwrap().to_string())
                .unwrap_or_default();
            if v.top.as_ref().is_none_or(|t| bytes > t.0) {
                v.top = Some((bytes, blocks, caller));
            }
        }
    }
    v
}

/// The variables valgrind adds to (or changes in) its client's
/// environment, as a recording would have to see them for a program
/// whose allocations depend on its environment; the preloads renamed to
/// files that do not exist, of the same length.
fn valgrind_env() -> Vec<(String, String)> {
    let out = Command::new("valgrind")
        .args(["-q", "/usr/bin/env"])
        .output()
        .unwrap();
    let ours: std::collections::HashMap<String, String> = std::env::vars().collect();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, v)| ours.get(*k).map(String::as_str) != Some(*v))
        .map(|(k, v)| {
            let v = match k {
                "LD_PRELOAD" => v.replace("vgpreload", "vgpreloax"),
                _ => v.to_string(),
            };
            (k.to_string(), v)
        })
        .collect()
}

fn check(cmd: &[&str], env: &[(&str, &str)]) {
    check_with(cmd, env, &[]);
}

fn check_with(cmd: &[&str], env: &[(&str, &str)], record_env: &[(String, String)]) {
    if !Path::new(cmd[0]).exists() {
        common::skip(format_args!("{} is not installed", cmd[0]));
        return;
    }
    let vg = valgrind(cmd, env);
    assert!(vg.blocks > 0, "{cmd:?}: no valgrind summary");
    let env: Vec<(String, String)> = env
        .iter()
        .map(|&(k, v)| (k.to_string(), v.to_string()))
        .chain(record_env.iter().cloned())
        .collect();
    let args: Vec<&std::ffi::OsStr> = cmd.iter().map(std::ffi::OsStr::new).collect();
    // The probes, and memleak's agent inside the program: both equal
    // valgrind.
    for capture in ["bpf", "preload"] {
        let (_dir, trace) = record_command_with(&args, &env, &["--capture", capture]);
        let cmd = format!("{cmd:?} --capture {capture}");
        check_trace(&cmd, &trace, &vg);
    }
}

fn check_trace(cmd: &str, trace: &Path, vg: &Valgrind) {
    common::fixtures::no_agent_frames(trace);
    let opts = AnalyzeOptions {
        filter: Filter {
            kind: KindScope::Heap,
            ..Filter::default()
        },
        ..AnalyzeOptions::default()
    };
    let report = analyze(trace, &opts).unwrap();
    let heap = report.summary.outstanding_by_class.heap;
    assert_eq!(
        (heap.bytes, heap.allocations),
        (vg.bytes, vg.blocks),
        "{cmd}: heap outstanding at exit against valgrind's in use at exit"
    );
    // The scan at exit: memcheck's four figures, exactly.
    if let Some(leak) = &report.summary.leak {
        let t = &leak.totals;
        let ours =
            [t.definitely, t.indirectly, t.possibly, t.reachable].map(|c| (c.bytes, c.allocations));
        assert_eq!(
            ours, vg.leak,
            "{cmd:?}: memleak's verdicts (left) against memcheck's LEAK SUMMARY (right): \
             definitely, indirectly, possibly lost, still reachable"
        );
    }
    let stacks: Vec<_> = report.stacks.iter().filter(|s| s.count > 0).collect();
    let complete: u64 = stacks
        .iter()
        .filter(|s| !s.truncated)
        .map(|s| s.bytes)
        .sum();
    assert!(
        complete * 100 >= heap.bytes * 98,
        "{cmd}: {complete} of {} heap bytes have a complete stack",
        heap.bytes
    );
    for s in &stacks {
        for f in &s.frames {
            assert!(
                f.path.is_some(),
                "{cmd}: frame {:#x} of stack {} is in no object",
                f.addr,
                s.stack_id
            );
        }
    }
    // valgrind's biggest holder: the same bytes and blocks, from the same
    // function, in our stacks (split by call site where valgrind merges
    // them, so summed by the innermost function).
    let (bytes, blocks, caller) = vg.top.clone().expect("a loss record");
    if caller.starts_with("???") {
        return; // a stripped program: valgrind names no function
    }
    let caller = plain(&caller);
    let ours = stacks
        .iter()
        .filter(|s| {
            s.frames.first().is_some_and(|f| {
                f.function.as_deref().map(plain) == Some(caller)
                    || f.inlined.iter().any(|i| plain(&i.function) == caller)
            })
        })
        .fold((0, 0), |(b, c), s| (b + s.bytes, c + s.count));
    assert!(
        ours.0 >= bytes && ours.1 >= blocks,
        "{cmd}: valgrind's top record ({bytes} bytes in {blocks} blocks from {caller}) \
         against {ours:?} of ours from that function"
    );
}

/// A glibc function by its public name: valgrind prints the exported alias
/// (`_IO_file_doallocate`, `_IO_file_overflow@@GLIBC_2.2.5`), the symbol
/// table may give the internal one (`__GI__IO_file_doallocate`).
fn plain(name: &str) -> &str {
    let name = name.split('@').next().unwrap_or(name);
    name.strip_prefix("__GI_").unwrap_or(name)
}

#[test]
fn python3_matches_valgrind() {
    if !common::can_record() || !common::has_tool("valgrind") {
        return;
    }
    check(
        &["/usr/bin/python3.11", "-c", "pass"],
        &[("PYTHONHASHSEED", "0")],
    );
}

#[test]
fn perl_matches_valgrind() {
    if !common::can_record() || !common::has_tool("valgrind") {
        return;
    }
    let env = valgrind_env();
    assert!(
        env.iter().any(|(k, _)| k == "LD_PRELOAD"),
        "valgrind's client environment: {env:?}"
    );
    check_with(
        &["/usr/bin/perl", "-e", "1"],
        &[("PERL_HASH_SEED", "0"), ("PERL_PERTURB_KEYS", "0")],
        &env,
    );
}

#[test]
fn sort_matches_valgrind() {
    if !common::can_record() || !common::has_tool("valgrind") {
        return;
    }
    check(&["/usr/bin/sort", "/etc/services"], &[]);
}

#[test]
fn sqlite3_matches_valgrind() {
    if !common::can_record() || !common::has_tool("valgrind") {
        return;
    }
    check(&["/usr/bin/sqlite3", ":memory:", "select 1;"], &[]);
}

#[test]
fn xz_matches_valgrind() {
    if !common::can_record() || !common::has_tool("valgrind") {
        return;
    }
    check(&["/usr/bin/xz", "--help"], &[]);
}
