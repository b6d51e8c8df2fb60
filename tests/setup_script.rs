//! The first run: `scripts/demo.sh` installs only what building,
//! recording and analyzing need; the test-only tools (Chromium, Go,
//! valgrind, cargo-fuzz, the Python readers) come with `scripts/test.sh`.

use std::process::Command;

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What `scripts/setup.sh [--demo] --list` would install.
fn listed(demo: bool) -> String {
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("scripts/setup.sh"));
    if demo {
        cmd.arg("--demo");
    }
    let out = cmd.arg("--list").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const TEST_ONLY: &[&str] = &[
    "chromium",
    "golang-go",
    "protobuf-compiler",
    "valgrind",
    "python3-pip",
    "cargo-fuzz",
    "duckdb",
];

#[test]
fn the_demo_installs_no_test_only_tool_and_the_tests_install_them() {
    let demo = listed(true);
    let words: Vec<&str> = demo.split_whitespace().collect();
    for tool in TEST_ONLY {
        assert!(!words.contains(tool), "the demo installs {tool}: {demo}");
    }
    for needed in ["clang", "libelf-dev", "make", "gcc"] {
        assert!(words.contains(&needed), "the demo lacks {needed}: {demo}");
    }
    let all = listed(false);
    let words: Vec<&str> = all.split_whitespace().collect();
    for tool in TEST_ONLY {
        assert!(words.contains(tool), "the tests lack {tool}: {all}");
    }
    // Each script asks for its own set.
    let script = |name: &str| std::fs::read_to_string(root().join("scripts").join(name)).unwrap();
    let setup_lines = |text: String| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| l.starts_with("scripts/setup.sh"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(setup_lines(script("demo.sh")), ["scripts/setup.sh --demo"]);
    assert_eq!(setup_lines(script("test.sh")), ["scripts/setup.sh"]);
}
