//! What `record` tells someone who comes from bcc's memleak, and its
//! help: hints for bcc's flags that live elsewhere here, a warning for
//! `-o NUMBER`, a missing command named, help grouped with examples.
#![cfg(feature = "bpf")]

mod common;

use common::fixtures::memleak;

fn stderr_of(args: &[&str]) -> (Option<i32>, String) {
    let out = memleak().args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// bcc's flags that mean something elsewhere here fail with one line
/// that says where, before anything runs (no root needed).
#[test]
fn bcc_flags_say_where_they_live_here() {
    for (args, hint) in [
        (&["record", "-a", "-p", "1"][..], "memleak analyze TRACE"),
        (&["record", "--show-allocs", "-p", "1"][..], "events table"),
        (&["record", "-s", "5", "-p", "1"][..], "records every one"),
        (
            &["record", "--older-than", "5000", "-p", "1"][..],
            "memleak analyze TRACE --older-than",
        ),
        (
            &["record", "--older", "5000", "-p", "1"][..],
            "--older-than 5s",
        ),
        (
            &["record", "-t", "-p", "1"][..],
            "every call is in the trace",
        ),
        (
            &["record", "--combined-only", "-p", "1"][..],
            "never drops a free",
        ),
    ] {
        let (code, err) = stderr_of(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(
            lines[0].starts_with("memleak: error: unexpected argument '"),
            "{err}"
        );
        assert!(lines[0].contains(hint), "{args:?}: {err}");
    }
    // Not a bcc flag: clap's error alone.
    let (_, err) = stderr_of(&["record", "--frobnicate"]);
    assert_eq!(
        err.trim_end(),
        "memleak: error: unexpected argument '--frobnicate' found"
    );
}

/// bcc's -o is "older than, in ms"; here it names the trace: `-o 5000`
/// records (that may be what was meant) and says so. -T without
/// --interval is said to limit live reports only.
#[test]
fn a_numeric_output_and_a_lone_top_are_pointed_out() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = memleak()
        .args(["record", "-T", "10", "-o", "5000", "--", "true"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(dir.path().join("5000").join("meta.json").exists());
    assert!(
        err.lines().any(
            |l| l.starts_with("memleak: warning: -o 5000 writes the trace to ./5000")
                && l.contains("memleak analyze TRACE --older-than 5000ms")
        ),
        "{err}"
    );
    assert!(
        err.lines().any(|l| l
            .starts_with("memleak: note: -T/--top 10 sets the stacks of live reports")
            && l.contains("memleak analyze TRACE -T 10")),
        "{err}"
    );
}

/// A command that is not found is named in the one error line, before
/// anything is created.
#[test]
fn a_missing_command_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t");
    let out = memleak()
        .args(["record", "-o"])
        .arg(&trace)
        .args(["--", "nosuchcmd-memleak", "x"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        "memleak: error: nosuchcmd-memleak: command not found (not a file in any directory of PATH)"
    );
    assert!(!trace.exists());
    let out = memleak()
        .args(["record", "-o"])
        .arg(&trace)
        .args(["-c", "nosuchcmd-memleak --flag"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nosuchcmd-memleak: command not found"),
        "{err}"
    );
}

/// `record --help`: options under headings, every enum's values, a few
/// examples, and no pointer to docs/ files an installed binary lacks.
#[test]
fn record_help_is_grouped_with_examples() {
    let out = memleak().args(["record", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let mut at = 0;
    for heading in [
        "Target:",
        "What to record:",
        "Stacks:",
        "Kernel:",
        "Scan:",
        "Live reports:",
        "Output:",
        "Examples:",
    ] {
        let pos = help
            .lines()
            .position(|l| l == heading)
            .unwrap_or_else(|| panic!("no {heading} in\n{help}"));
        assert!(pos >= at, "{heading} out of order:\n{help}");
        at = pos;
    }
    for values in [
        "- preload:",
        "- bpf:",
        "[possible values: auto, fp, dwarf]",
        "[possible values: auto, entry]",
    ] {
        assert!(help.contains(values), "{values} missing:\n{help}");
    }
    let examples = help.split("Examples:").nth(1).unwrap();
    let n = examples
        .lines()
        .filter(|l| l.trim_start().starts_with("memleak "))
        .count();
    assert!((3..=5).contains(&n), "{n} examples:\n{examples}");
    assert!(!help.contains("docs/"), "{help}");
    // The short help too.
    let out = memleak().args(["record", "-h"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("docs/"));
}
