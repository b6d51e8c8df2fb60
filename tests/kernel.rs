//! Kernel allocation tracing against the real tracepoints (issue 6).
//!
//! `fixtures/kernel_workload N` opens and closes files, creates and
//! destroys sockets and pipes N times, then sleeps so the kernel's
//! deferred frees land. These tests record it with `memleak record
//! --kernel` and check that
//!
//! * the loop yields kmalloc, kmem_cache and page events, and the kernel
//!   memory it still holds at the end does not grow with N (1,000 against
//!   10,000 iterations);
//! * kernel stacks symbolize to the real function names of the workload's
//!   system calls, at the addresses `/proc/kallsyms` gives;
//! * a kernel without one of the tracepoints still records the others,
//!   with a note.
//!
//! Needs root and real tracepoints, as CI has. Kernel recording is
//! system-wide, so the tests take a lock and record one at a time.
#![cfg(feature = "bpf")]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Mutex;

use common::fixtures::{fixtures_dir, memleak};
use memleak_trace::{EventColumns, EventKind, Trace};
use serde_json::Value;

/// One recording at a time: each would otherwise see (and slow down) the
/// other's workload.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Milliseconds the workload sleeps after its loop, inside the recording.
/// RCU grace periods and task work take milliseconds, but with 500 ms a
/// batch of socket-inode frees was sometimes still pending; a second leaves
/// room on a loaded machine.
const SETTLE_MS: &str = "1000";

/// Kernel functions that only the workload's loop reaches: the system
/// calls it makes and the code paths that allocate for them. An allocation
/// whose stack holds one of them was made by an iteration of the loop.
/// `anon_pipe_write` is `pipe_write` on kernels from 6.15 on.
const LOOP_FUNCTIONS: &[&str] = &[
    "do_sys_openat2",
    "__sys_socket",
    "__sys_socketpair",
    "do_pipe2",
    "pipe_write",
    "anon_pipe_write",
    "unix_stream_sendmsg",
];

fn workload() -> PathBuf {
    fixtures_dir().join("kernel_workload")
}

/// Runs `memleak record --kernel ... -- kernel_workload N SETTLE_MS` to
/// completion (`Command::output` waits for it) and returns the output.
fn record_workload(trace: &Path, iterations: u32, extra: &[&str]) -> Output {
    memleak()
        .args(["record", "--kernel", "-q", "-o"])
        .arg(trace)
        .args(extra)
        .arg("--")
        .arg(workload())
        .arg(iterations.to_string())
        .arg(SETTLE_MS)
        .output()
        .expect("memleak runs")
}

fn check_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The kernel part of a trace, replayed by this test on its own: unlike
/// `memleak analyze`, it remembers which process made each allocation.
///
/// Kernel kinds are keyed by address alone, as in the analyzer: a block
/// allocated by the workload is often freed by someone else (an RCU
/// callback in softirq context, a kworker, the task that closes the last
/// reference), so frees match whatever pid they carry. Slab and per-CPU
/// blocks share one address space; pages are keyed by pfn in another.
struct KernelReplay {
    /// Functions of each kernel stack, innermost first.
    stacks: HashMap<u64, Vec<String>>,
    /// (is_page, addr) -> (pid, stack id, size) of the live block.
    live: HashMap<(bool, u64), (u32, u64, u64)>,
    /// Allocation events by kind, for the workload pid, in the loop.
    loop_allocations: BTreeMap<EventKind, u64>,
    /// Events repeating the previous event on their address (same kind)
    /// within 100 µs: an event recorded twice, or an object freed by a path
    /// with no tracepoint (bulk frees) and allocated again at once.
    /// Reported, not asserted.
    duplicates: u64,
    duplicate_kinds: BTreeMap<EventKind, u64>,
    events: u64,
    meta: memleak_trace::Meta,
}

impl KernelReplay {
    fn new(trace: &Path) -> KernelReplay {
        let t = Trace::open(trace).expect("trace opens");
        let names: HashMap<(u32, u64), String> = t
            .frames()
            .unwrap()
            .into_iter()
            .filter_map(|f| Some(((f.pid, f.addr), f.function?)))
            .collect();
        let stacks = t
            .stacks()
            .unwrap()
            .into_iter()
            .filter(|s| s.kernel)
            .map(|s| {
                let funcs = s
                    .frames
                    .iter()
                    .map(|a| names.get(&(s.pid, *a)).cloned().unwrap_or_default())
                    .collect();
                (s.stack_id, funcs)
            })
            .collect();
        let mut r = KernelReplay {
            stacks,
            live: HashMap::new(),
            loop_allocations: BTreeMap::new(),
            duplicates: 0,
            duplicate_kinds: BTreeMap::new(),
            events: 0,
            meta: t.meta().clone(),
        };
        let workload_pid = r.workload_pid();
        let mut previous: HashMap<(bool, u64), (EventKind, u64)> = HashMap::new();
        for batch in t.events(EventColumns::ALL).unwrap() {
            let b = batch.unwrap();
            for i in 0..b.len() {
                let kind = b.kind[i];
                let page = matches!(kind, EventKind::PageAlloc | EventKind::PageFree);
                let key = (page, b.addr[i]);
                if kind.is_kernel() {
                    r.events += 1;
                    let ts = b.ts_ns[i];
                    if let Some((k, t)) = previous.insert(key, (kind, ts)) {
                        if k == kind && ts.saturating_sub(t) < 100_000 {
                            r.duplicates += 1;
                            *r.duplicate_kinds.entry(kind).or_default() += 1;
                        }
                    }
                }
                match kind {
                    EventKind::Kmalloc
                    | EventKind::KmemCacheAlloc
                    | EventKind::PageAlloc
                    | EventKind::PercpuAlloc => {
                        if b.pid[i] == workload_pid && r.in_loop(b.stack_id[i]) {
                            *r.loop_allocations.entry(kind).or_default() += 1;
                        }
                        r.live.insert(key, (b.pid[i], b.stack_id[i], b.size[i]));
                    }
                    EventKind::Kfree
                    | EventKind::KmemCacheFree
                    | EventKind::PageFree
                    | EventKind::PercpuFree => {
                        r.live.remove(&key);
                    }
                    _ => {}
                }
            }
        }
        r
    }

    fn workload_pid(&self) -> u32 {
        self.meta.pids[0]
    }

    fn in_loop(&self, stack_id: u64) -> bool {
        self.stacks
            .get(&stack_id)
            .is_some_and(|f| f.iter().any(|n| LOOP_FUNCTIONS.contains(&n.as_str())))
    }

    /// (allocations, bytes) still live at the end of the trace that `keep`
    /// selects by (pid, stack id).
    fn outstanding(&self, keep: impl Fn(u32, u64) -> bool) -> (u64, u64) {
        self.live
            .values()
            .filter(|(pid, stack, _)| keep(*pid, *stack))
            .fold((0, 0), |(n, b), (_, _, size)| (n + 1, b + size))
    }

    /// Live blocks allocated by the workload's loop.
    fn loop_outstanding(&self) -> (u64, u64) {
        let pid = self.workload_pid();
        self.outstanding(|p, s| p == pid && self.in_loop(s))
    }

    /// A one-line summary for assertion messages.
    fn describe(&self) -> String {
        let pid = self.workload_pid();
        format!(
            "pid {pid}: loop allocations {:?}, loop outstanding {:?}, all of pid outstanding {:?}, lost {:?}, duplicates {} {:?}",
            self.loop_allocations,
            self.loop_outstanding(),
            self.outstanding(|p, _| p == pid),
            self.meta.counters.lost,
            self.duplicates,
            self.duplicate_kinds
        )
    }
}

fn analyze_json(trace: &Path, extra: &[&str]) -> Value {
    let out = memleak()
        .arg("analyze")
        .arg(trace)
        .args(["--format", "json"])
        .args(extra)
        .output()
        .unwrap();
    check_success("memleak analyze", &out);
    serde_json::from_slice(&out.stdout).expect("analyze prints JSON")
}

/// Records the workload with `iterations` and replays it.
fn run(dir: &Path, iterations: u32) -> KernelReplay {
    let trace = dir.join(format!("k{iterations}.parquet"));
    let out = record_workload(&trace, iterations, &[]);
    check_success("memleak record --kernel", &out);
    let r = KernelReplay::new(&trace);
    assert_eq!(r.meta.exit_code, Some(0), "the workload failed");

    // The loop makes every kind of event the issue names, once or more per
    // iteration: struct file, socket inodes and pipe_inode_info come from
    // kmem_cache_alloc, pipe buffer arrays and sk_buff data from kmalloc,
    // the pipe's buffer from the page allocator.
    let n = u64::from(iterations);
    let got = |k| r.loop_allocations.get(&k).copied().unwrap_or(0);
    assert!(
        got(EventKind::KmemCacheAlloc) >= 10 * n
            && got(EventKind::Kmalloc) >= n
            && got(EventKind::PageAlloc) >= n / 2,
        "too few allocations from the loop for {n} iterations: {}",
        r.describe()
    );

    // The analyzer replays the same events into the same totals.
    let report = analyze_json(&trace, &["--kind", "kernel", "-T", "1"]);
    let s = &report["summary"];
    assert_eq!(
        (
            s["outstanding_allocations"].as_u64(),
            s["outstanding_bytes"].as_u64()
        ),
        {
            let (a, b) = r.outstanding(|_, _| true);
            (Some(a), Some(b))
        },
        "memleak analyze --kind kernel disagrees with the test's replay"
    );
    eprintln!("{iterations} iterations: {}", r.describe());
    r
}

/// The outstanding set of the loop after 10,000 iterations against 1,000.
///
/// What stays allocated at the end without being a leak:
/// * slab pages (and their `alloc_slab_obj_exts` vectors) that a
///   `kmem_cache_alloc` of the loop had to add to a cache: the slab keeps
///   them, whoever frees the objects; bounded by the caches' per-CPU and
///   partial lists, not by the iteration count;
/// * RCU-deferred frees not yet run (the settle period is there for them);
/// * ghosts: objects whose free the trace did not see: kernel paths free
///   some objects in bulk with no tracepoint (maple-tree node spares,
///   `kfree_rcu` batches; docs/kernel.md). A ghost stays outstanding until
///   its address is allocated again, which in a busy cache is soon, so how
///   many there are at the end depends on chance and on the last second or
///   so of the loop, not on the iteration count. Observed on 2 cores: 27
///   to 475 ghosts and slab
///   pages in either run.
///
/// A leak of one block per iteration would leave 9,000 more outstanding
/// blocks after the long run than after the short one; the bound allows
/// one block per nine extra iterations, above the ghost noise. The strict
/// bound the issue wants is the next test.
#[test]
fn kernel_outstanding_does_not_grow_with_iterations() {
    if !common::can_record() {
        return;
    }
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let short = run(dir.path(), 1_000);
    let long = run(dir.path(), 10_000);

    const SLACK: u64 = 1_000;
    let (short_n, _) = short.loop_outstanding();
    let (long_n, _) = long.loop_outstanding();
    assert!(
        long_n <= short_n + SLACK,
        "kernel memory held after the loop grows with the iteration count:\n  1k: {}\n 10k: {}",
        short.describe(),
        long.describe()
    );
}

/// The same with the bound the issue asks for: no more than a few hundred
/// blocks of slab growth between the runs, and the recorder accounting for
/// every free the kernel did not let it see.
#[test]
fn kernel_outstanding_strict_bound() {
    if !common::can_record() {
        return;
    }
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let short = run(dir.path(), 1_000);
    let long = run(dir.path(), 10_000);
    for r in [&short, &long] {
        assert!(
            r.meta.counters.lost.contains_key("recursion"),
            "no recursion-miss counter in meta.json: {:?}",
            r.meta.counters.lost
        );
    }
    // Three program copies hand each event on with a token: whichever
    // copies the kernel skips (an interrupt on top of one), one records the
    // event and no other. The two-copy flag scheme before it lost 100-420
    // of ~900,000 events per 10,000-iteration run (over 1 in 10,000).
    for r in [&short, &long] {
        let lost = r.meta.counters.lost.get("recursion").copied().unwrap_or(0);
        assert!(
            lost * 20_000 <= r.events,
            "{lost} of {} kernel events lost to recursion: {}",
            r.events,
            r.describe()
        );
        // A later copy records only what the kernel skipped for the first
        // copy; recording more than it skipped means recording twice.
        let rec = r
            .meta
            .kernel_recursion
            .expect("a kernel recording writes kernel_recursion");
        let (skips, rescued) = (rec.first_copy_skips, rec.recorded_by_later_copies);
        assert!(
            rescued <= skips,
            "later copies recorded {rescued} events, the first copies were skipped {skips} times: {}",
            r.describe()
        );
    }
    let (short_n, _) = short.loop_outstanding();
    let (long_n, _) = long.loop_outstanding();
    assert!(
        long_n <= short_n + 256,
        "1k: {}\n10k: {}",
        short.describe(),
        long.describe()
    );
}

/// Start addresses of kernel functions by name, from `/proc/kallsyms`
/// (empty when addresses are hidden).
fn kallsyms() -> HashMap<String, Vec<u64>> {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let mut out: HashMap<String, Vec<u64>> = HashMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(addr), Some(_), Some(name)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        if addr != 0 {
            out.entry(name.to_string()).or_default().push(addr);
        }
    }
    out
}

#[test]
fn kernel_stacks_symbolize_to_syscall_functions() {
    if !common::can_record() {
        return;
    }
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("k.parquet");
    check_success(
        "memleak record --kernel",
        &record_workload(&trace, 200, &[]),
    );
    let t = Trace::open(&trace).unwrap();
    let pid = t.meta().pids[0];

    // Pages are identified by page frame number, as bcc and the classic
    // tracepoint do, not by struct page pointer (kernel addresses, all
    // above 0xffff_8000_0000_0000): pfns of this machine are below 2^36.
    let notes = &t.meta().notes;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("identified by page frame number")),
        "no pfn note in {notes:?}"
    );
    let mut pages = 0;
    // Stacks of the workload's own kernel allocations.
    let mut workload_stacks = std::collections::HashSet::new();
    for batch in t.events(EventColumns::ALL).unwrap() {
        let b = batch.unwrap();
        for i in 0..b.len() {
            if matches!(b.kind[i], EventKind::PageAlloc | EventKind::PageFree) {
                assert!(
                    b.addr[i] < 1 << 36,
                    "page event at {:#x}, not a pfn",
                    b.addr[i]
                );
                pages += 1;
            }
            if b.kind[i].is_kernel() && b.pid[i] == pid && b.stack_id[i] != 0 {
                workload_stacks.insert(b.stack_id[i]);
            }
        }
    }
    let stacks: Vec<_> = t
        .stacks()
        .unwrap()
        .into_iter()
        .filter(|s| workload_stacks.contains(&s.stack_id))
        .collect();
    assert!(pages > 0, "no page events");
    assert!(!stacks.is_empty(), "no kernel stacks for pid {pid}");
    for s in &stacks {
        assert!(s.kernel && s.pid == 0, "kernel stack {s:?} not marked so");
    }
    let frames: HashMap<u64, memleak_trace::FrameRecord> = t
        .frames()
        .unwrap()
        .into_iter()
        .filter(|f| f.pid == 0)
        .map(|f| (f.addr, f))
        .collect();
    let symbols = kallsyms();

    // Each system call of the loop shows up by name, through one of the
    // names this kernel gives its entry points.
    let wanted: &[&[&str]] = &[
        &["do_sys_openat2", "__x64_sys_openat"],
        &["__sys_socket", "__x64_sys_socket"],
        &["do_pipe2", "__x64_sys_pipe2"],
    ];
    let mut seen = Vec::new();
    for names in wanted {
        let hit = stacks.iter().flat_map(|s| &s.frames).find_map(|a| {
            let f = frames.get(a)?;
            let name = f.function.as_deref()?;
            names.contains(&name).then_some(f)
        });
        let Some(f) = hit else {
            panic!("no workload stack passes through any of {names:?}");
        };
        let name = f.function.clone().unwrap();
        // The name is the symbol that really contains the address.
        if let (Some(starts), Some(off)) = (symbols.get(&name), f.func_offset) {
            assert!(
                starts.contains(&(f.addr - off)),
                "{name}+{off:#x} at {:#x} does not match /proc/kallsyms {starts:x?}",
                f.addr
            );
        }
        assert_eq!(f.path.as_deref(), Some("[kernel]"), "{f:?}");
        seen.push(name);
    }
    eprintln!("symbolized: {seen:?}");

    // analyze prints outstanding stacks only, which need not include the
    // loop's: check that the top one is symbolized, frame by frame.
    let report = analyze_json(&trace, &["--kind", "kernel", "-T", "1"]);
    let top = &report["stacks"][0]["frames"];
    assert!(
        top.as_array()
            .is_some_and(|f| !f.is_empty() && f.iter().all(|f| f["function"].is_string())),
        "top kernel stack not symbolized: {top}"
    );
}

/// Runs `memleak record --kernel` in a private mount namespace where the
/// tracefs directory of `kmem:mm_page_free` is hidden behind an empty
/// directory, which is what libbpf sees on a kernel without that
/// tracepoint: no `events/kmem/mm_page_free/id`. The host's tracefs is
/// untouched.
fn record_without_page_free(_dir: &Path, trace: &Path) -> Output {
    // A kernel without kmem:mm_page_free, as memleak sees it: the recorder
    // checks the kernel's BTF for each tracepoint, and this variable makes
    // it report the tracepoint as absent.
    memleak()
        .env("MEMLEAK_PRETEND_MISSING_TRACEPOINTS", "mm_page_free")
        .args(["record", "--kernel", "-q", "-o"])
        .arg(trace)
        .arg("--")
        .arg(workload())
        .args(["200", "100"])
        .output()
        .expect("memleak runs")
}

#[test]
fn kernel_without_a_tracepoint_records_the_rest_with_a_note() {
    if !common::can_record() {
        return;
    }
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("k.parquet");
    let out = record_without_page_free(dir.path(), &trace);
    check_success("memleak record --kernel without mm_page_free", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("memleak: note:") && l.contains("kmem:mm_page_free")),
        "no note about the missing tracepoint:\n{stderr}"
    );

    let t = Trace::open(&trace).unwrap();
    let events = &t.meta().counters.events;
    for kind in [
        "kmalloc",
        "kfree",
        "kmem_cache_alloc",
        "kmem_cache_free",
        "page_alloc",
    ] {
        assert!(
            events.get(kind).copied().unwrap_or(0) > 0,
            "no {kind} events: {events:?}"
        );
    }
    assert_eq!(
        events.get("page_free").copied().unwrap_or(0),
        0,
        "{events:?}"
    );
    // The trace is complete and replays.
    assert!(t.meta().complete);
    let report = analyze_json(&trace, &["--kind", "kernel", "-T", "1"]);
    assert!(report["summary"]["outstanding_allocations"].as_u64() > Some(0));
}

/// The note must travel with the trace, not only to the recorder's stderr:
/// without page frees every page looks leaked, and whoever analyzes the
/// trace later has to be told.
#[test]
fn missing_tracepoint_note_is_stored_in_the_trace() {
    if !common::can_record() {
        return;
    }
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("k.parquet");
    let out = record_without_page_free(dir.path(), &trace);
    check_success("memleak record --kernel without mm_page_free", &out);
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(trace.join("meta.json")).unwrap()).unwrap();
    let notes = meta["notes"].as_array().cloned().unwrap_or_default();
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().is_some_and(|s| s.contains("kmem:mm_page_free"))),
        "meta.json has no note about kmem:mm_page_free: {meta}"
    );
    // And `memleak info` shows it.
    let info = memleak().arg("info").arg(&trace).output().unwrap();
    check_success("memleak info", &info);
    assert!(String::from_utf8_lossy(&info.stdout).contains("kmem:mm_page_free"));
}

/// With --kernel there is something to record even when the program's
/// malloc cannot be probed (a stripped static program): a warning, kept
/// in the trace's notes, instead of a refusal.
#[test]
fn stripped_static_program_is_a_warning_with_kernel() {
    if !common::can_record() {
        return;
    }
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("k.parquet");
    let prog = fixtures_dir().join("seed_static_stripped");
    let out = memleak()
        .args(["record", "--kernel", "-q", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&prog)
        .output()
        .unwrap();
    check_success("memleak record --kernel of a stripped static program", &out);
    let warning = format!(
        "{} is statically linked and stripped: its malloc cannot be probed",
        prog.display()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("memleak: warning: {warning}")),
        "{stderr}"
    );
    let notes = Trace::open(&trace).unwrap().meta().notes.clone();
    assert!(notes.contains(&warning), "{notes:?}");
}
