//! memleak beside other users of uprobes must never kill the program it
//! records. The `sigalt` fixture runs signal handlers on a signal stack
//! above its threads' stacks, inside a traced call (asprintf); any
//! uretprobe asked for from such a handler makes the kernel drop the
//! interrupted call's pending return, and the thread dies of SIGILL (exit
//! 132) when that call returns. Before memleak asked for no return on such
//! a thread and gave a launched command its own copies of libc, both runs
//! below died every time (8 of 8, 10 of 10).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::elfsyms::ElfSyms;
use common::fixtures::{check_trace, memleak, recording_guard, Fixture};

const RUNS: usize = 20;

/// Whether `pid` has ended (a zombie counts: PID 1 reaps nothing here).
fn ended(pid: u32) -> bool {
    matches!(common::procs::proc_state(pid), None | Some('Z'))
}

/// Kills and reaps a child however the test ends.
struct Reaped(Child);
impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Records `sigalt` `RUNS` times with `extra` flags; each recording must
/// end as the program does alone (exit 0) with the fixture's exact report.
fn record_sigalt_repeatedly(extra: &[&str]) {
    let fx = Fixture::load("sigalt");
    for run in 0..RUNS {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("t.parquet");
        // The probes: the agent (--capture preload) puts no uprobe in the
        // program, so nothing here could crash it.
        let out = memleak()
            .args(["record", "-q", "--capture", "bpf", "-o"])
            .arg(&trace)
            .args(extra)
            .arg("--")
            .arg(fx.binary())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "run {run} of {RUNS}: sigalt under memleak {extra:?} ended with {:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        check_trace(&fx, &trace, &["outstanding", "mappings"]);
    }
}

/// Another recording, of another process, attached with `-p` as in
/// production: its probes are on the system's libc, and the kernel lets
/// its sessions ask for returns in every process that runs that file.
#[test]
fn sigalt_survives_beside_another_recording() {
    if !common::can_record() {
        return;
    }
    let _guard = recording_guard(false);
    let sleeper = Reaped(
        Command::new("sleep")
            .arg("300")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let other_trace = dir.path().join("other.parquet");
    let other = Reaped(
        memleak()
            .args(["record", "-q", "-o"])
            .arg(&other_trace)
            .arg("-p")
            .arg(sleeper.0.id().to_string())
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Attached once the trace's first checkpoint is on disk.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !other_trace.join("meta.json").exists() {
        assert!(!ended(other.0.id()), "the other recording ended early");
        assert!(
            Instant::now() < deadline,
            "the other recording did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    record_sigalt_repeatedly(&[]);
    assert!(!ended(other.0.id()), "the other recording ended early");
}

/// A plain uretprobe on the system's malloc and mmap, made through
/// tracefs by hand (what `perf probe` or a bpftrace script on
/// `uretprobe:libc:malloc` do), watching every process. With
/// `--shared-libraries` memleak probes that same libc file, so the
/// handler's malloc asks for a return there: nothing of memleak's may be
/// pending below it.
#[test]
fn sigalt_survives_beside_a_system_wide_uretprobe() {
    if !common::can_record() {
        return;
    }
    let tracing = Path::new("/sys/kernel/tracing");
    if !tracing.join("uprobe_events").exists() {
        common::skip("/sys/kernel/tracing/uprobe_events is not available (tracefs)");
        return;
    }
    // Alone: a uretprobe in every process would slow every other test.
    let _guard = recording_guard(true);
    let libc = find_libc();
    let syms = ElfSyms::read(&libc);
    let events: Vec<String> = ["malloc", "mmap"]
        .iter()
        .map(|name| {
            let f = syms.functions_named(name);
            let off = syms.file_offset(f[0].value).unwrap();
            format!("r:memleak_test/{name}_ret {}:0x{off:x}", libc.display())
        })
        .collect();
    let probes = TracefsProbes::add(tracing, &events);
    record_sigalt_repeatedly(&["--shared-libraries"]);
    // The probes really fired in the recorded programs.
    assert!(probes.hits() > 0, "the tracefs uretprobes never fired");
    // And with the private copies, as by default.
    record_sigalt_repeatedly(&[]);
}

/// The libc this test process runs (a launched command runs the same).
fn find_libc() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let path = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        })
        .expect("the test links glibc");
    std::fs::canonicalize(path).unwrap()
}

/// uretprobes defined in tracefs, enabled, with hit counts; removed when
/// dropped.
struct TracefsProbes {
    dir: PathBuf,
}

impl TracefsProbes {
    fn add(tracing: &Path, defs: &[String]) -> TracefsProbes {
        let probes = TracefsProbes {
            dir: tracing.to_path_buf(),
        };
        // A run that was killed may have left them.
        probes.remove();
        let mut text = String::new();
        for d in defs {
            text.push_str(d);
            text.push('\n');
        }
        append(&tracing.join("uprobe_events"), &text);
        std::fs::write(tracing.join("events/memleak_test/enable"), "1").unwrap();
        probes
    }

    fn hits(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("uprobe_profile"))
            .unwrap_or_default()
            .lines()
            // "  FILE EVENT HITS"
            .filter(|l| l.contains(" malloc_ret ") || l.contains(" mmap_ret "))
            .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
            .sum()
    }

    fn remove(&self) {
        let _ = std::fs::write(self.dir.join("events/memleak_test/enable"), "0");
        for name in ["malloc_ret", "mmap_ret"] {
            let _ = std::fs::OpenOptions::new()
                .append(true)
                .open(self.dir.join("uprobe_events"))
                .and_then(|mut f| {
                    use std::io::Write;
                    writeln!(f, "-:memleak_test/{name}")
                });
        }
    }
}

impl Drop for TracefsProbes {
    fn drop(&mut self) {
        self.remove();
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
