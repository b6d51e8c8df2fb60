//! The scan on a real process: a C program builds pointer shapes with
//! known verdicts (reachable from a global, only from a thread's stack,
//! only from a register, only through an interior pointer, a lost cycle,
//! a tree lost at its root, a pointer behind an unreadable page), reports
//! its blocks, and is stopped with ptrace and scanned.

#[path = "../../../tests/common/skip.rs"]
mod skip;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use memleak_recorder::scan::{self, Block, ScanOptions, Stopped, Verdict};

struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn build_shapes(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scan_shapes.c");
    let exe = dir.join("scan_shapes");
    let ok = Command::new("cc")
        .args(["-O0", "-g", "-pthread", "-o"])
        .arg(&exe)
        .arg(src)
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(exe)
}

#[test]
fn verdicts_of_known_pointer_shapes_in_a_stopped_process() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_shapes(dir.path()) else {
        skip::skip("no C compiler (cc)");
        return;
    };
    let child = Command::new(&exe)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start scan_shapes");
    let mut child = Reaped(child);
    let pid = child.0.id();
    let mut named: Vec<(String, Block)> = Vec::new();
    for line in BufReader::new(child.0.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line == "ready" {
            break;
        }
        let f: Vec<&str> = line.split(' ').collect();
        named.push((
            f[0].to_string(),
            Block {
                addr: u64::from_str_radix(f[1], 16).unwrap(),
                size: f[2].parse().unwrap(),
                is_mapping: f[0] == "mapping",
            },
        ));
    }
    assert_eq!(named.len(), 19, "{named:?}");
    let blocks: Vec<Block> = named.iter().map(|n| n.1).collect();
    let stopped = Stopped::seize(pid).expect("stop the child");
    assert_eq!(stopped.threads.len(), 3);
    assert!(stopped.threads.iter().all(|t| t.regs.is_some()));
    let opts = ScanOptions {
        contents: 8,
        ..ScanOptions::default()
    };
    let out = scan::scan(&stopped, &blocks, &opts).expect("scan");
    stopped.resume();
    let mut by_name: HashMap<&str, Vec<Verdict>> = HashMap::new();
    for ((name, _), v) in named.iter().zip(&out.verdicts) {
        by_name.entry(name.as_str()).or_default().push(*v);
    }
    use Verdict::*;
    let one = |n: &str| by_name[n].as_slice().to_vec();
    assert_eq!(one("reach_a"), [Reachable]);
    assert_eq!(one("reach_b"), [Reachable]);
    assert_eq!(
        one("stack"),
        [Reachable],
        "only the thread's stack holds it"
    );
    assert_eq!(one("register"), [Reachable], "only r15 holds it");
    assert_eq!(one("possible_c"), [PossiblyLost], "an interior pointer");
    assert_eq!(one("possible_d"), [PossiblyLost], "reached from c only");
    let mut cycle = one("cycle");
    cycle.sort();
    assert_eq!(cycle, [DefinitelyLost, IndirectlyLost]);
    assert_eq!(one("tree_root"), [DefinitelyLost]);
    assert_eq!(one("tree_inner"), [IndirectlyLost; 6]);
    assert_eq!(one("newarray"), [Reachable], "memcheck's new[] heuristic");
    assert_eq!(one("lost"), [DefinitelyLost]);
    assert_eq!(one("mapping"), [Reachable]);
    assert_eq!(
        one("behind_unreadable"),
        [Reachable],
        "the page after the unreadable one is read"
    );
    // The mapping's pages are roots, as for memcheck, where they are
    // readable and writable: the PROT_NONE page is not read at all.
    assert_eq!(out.stats.unreadable_pages, 0);
    assert_eq!(out.stats.heuristic_reachable, 1);
    assert!(out.stats.roots_bytes > 0 && out.stats.heap_bytes > 0);
    // Contents: kept for the lost blocks only; the lost cycle's first
    // word points to its other block.
    for ((name, b), c) in named.iter().zip(&out.contents) {
        let v = out.verdicts[named.iter().position(|n| n.1 == *b).unwrap()];
        assert_eq!(c.is_some(), v.is_lost(), "{name}");
    }
    let cycle_blocks: Vec<(Block, &Option<Vec<u8>>)> = named
        .iter()
        .zip(&out.contents)
        .filter(|(n, _)| n.0 == "cycle")
        .map(|(n, c)| (n.1, c))
        .collect();
    assert_eq!(
        cycle_blocks[0].1.as_deref(),
        Some(&cycle_blocks[1].0.addr.to_ne_bytes()[..])
    );
    // Let go: the child runs again (it answers a signal).
    assert!(process_state(pid) != 't', "left stopped");
}

fn process_state(pid: u32) -> char {
    std::thread::sleep(std::time::Duration::from_millis(50));
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit_once(')')
        .and_then(|(_, r)| r.trim_start().chars().next())
        .unwrap()
}

#[test]
fn a_process_that_is_gone_is_a_clear_error() {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    match Stopped::seize(pid) {
        Err(scan::ScanError::Gone(p)) => assert_eq!(p, pid),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("seized a reaped process"),
    }
}
