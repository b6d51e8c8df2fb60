//! Building, recording and checking the fixture programs of `fixtures/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use memleak_analyze::report::{analyze, AnalyzeOptions, Report};
use serde_json::Value;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Held while a recording runs. Most recordings share the lock; a fixture
/// whose expected file says `record_alone` takes it exclusively, so that
/// no other recording's probes share its libraries while it runs. It is a
/// file lock, so recordings of other test processes on the machine (a
/// second `cargo test`, nextest) are kept out too; each guard has its own
/// open file, and shared holders never wait on each other.
pub struct RecordingGuard(#[allow(dead_code)] std::fs::File);

pub fn recording_guard(alone: bool) -> RecordingGuard {
    use std::os::fd::AsRawFd;
    let path = std::env::temp_dir().join("memleak-test-recordings.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let op = if alone { libc::LOCK_EX } else { libc::LOCK_SH };
    // SAFETY: flock on a descriptor this guard owns; closing it unlocks.
    let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
    assert_eq!(rc, 0, "flock {}", path.display());
    RecordingGuard(file)
}

/// How the fixtures are compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// The Makefile's flags: `-O2 -g -fno-omit-frame-pointer`, what the
    /// expected files were written for.
    FramePointer,
    /// `-O2 -g -fomit-frame-pointer`.
    OmitFramePointer,
    /// `-O2 -g` and the compiler's default (no frame pointers at -O2).
    O2,
}

impl Build {
    const ALL: [Build; 3] = [Build::FramePointer, Build::OmitFramePointer, Build::O2];

    fn dir(self) -> &'static str {
        match self {
            Build::FramePointer => "fixtures-test",
            Build::OmitFramePointer => "fixtures-test-omit-fp",
            Build::O2 => "fixtures-test-o2",
        }
    }

    fn flags(self) -> Option<&'static str> {
        match self {
            Build::FramePointer => None,
            Build::OmitFramePointer => Some("-O2 -g -fomit-frame-pointer -Wall -Wno-unused-result"),
            Build::O2 => Some("-O2 -g -Wall -Wno-unused-result"),
        }
    }
}

/// Builds every fixture once per test process.
pub fn fixtures_dir() -> &'static Path {
    fixtures_dir_for(Build::FramePointer)
}

/// Builds every fixture once per test process, with `build`'s flags.
pub fn fixtures_dir_for(build: Build) -> &'static Path {
    static DIRS: [OnceLock<PathBuf>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let i = Build::ALL.iter().position(|&b| b == build).unwrap();
    DIRS[i].get_or_init(|| {
        let out = root().join("target").join(build.dir());
        let mut make = Command::new("make");
        make.args(["-s", "-C"])
            .arg(root().join("fixtures"))
            .arg(format!("OUT={}", out.display()));
        if let Some(flags) = build.flags() {
            make.arg(format!("CFLAGS={flags}"))
                .arg(format!("CXXFLAGS={flags}"));
        }
        let status = make.status().expect("make runs");
        assert!(status.success(), "building fixtures ({build:?}) failed");
        out
    })
}

/// Builds `bench/steady.c` (a steady malloc+free workload: `steady RATE
/// [SECONDS [LOG]]`) into `dir`.
pub fn build_steady(dir: &Path) -> PathBuf {
    let exe = dir.join("steady");
    let status = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(root().join("bench/steady.c"))
        .status()
        .expect("cc runs");
    assert!(status.success(), "building bench/steady.c failed");
    exe
}

pub fn memleak() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memleak"))
}

/// Records `cmd` (with `env` added to its environment) to completion,
/// holding a recording guard; returns the trace directory.
pub fn record_command(
    cmd: &[&std::ffi::OsStr],
    env: &[(String, String)],
) -> (tempfile::TempDir, PathBuf) {
    record_command_with(cmd, env, &[])
}

/// [`record_command`] with more options for `record`.
pub fn record_command_with(
    cmd: &[&std::ffi::OsStr],
    env: &[(String, String)],
    options: &[&str],
) -> (tempfile::TempDir, PathBuf) {
    let _guard = recording_guard(false);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let out = memleak()
        .args(["record", "-q", "-o"])
        .arg(&trace)
        .args(options)
        .arg("--")
        .args(cmd)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "record of {cmd:?} failed: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (dir, trace)
}

pub struct Fixture {
    pub name: String,
    pub expected: Value,
    pub build: Build,
}

/// Outstanding allocations with no frame in the program: bytes, count, and
/// the functions and objects on their stack.
pub type RuntimeGroup = (u64, u64, Vec<String>);

/// One outstanding-allocation group: bytes, count, frames.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Group {
    pub frames: Vec<(String, String, u32, bool)>,
    pub bytes: u64,
    pub count: u64,
}

impl Fixture {
    pub fn load(name: &str) -> Fixture {
        let path = root()
            .join("fixtures")
            .join(format!("{name}.expected.json"));
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        Fixture {
            name: name.to_string(),
            expected,
            build: Build::FramePointer,
        }
    }

    /// The fixture compiled with `build`'s flags (same expected file).
    pub fn load_built(name: &str, build: Build) -> Fixture {
        Fixture {
            build,
            ..Fixture::load(name)
        }
    }

    pub fn binary(&self) -> PathBuf {
        fixtures_dir_for(self.build).join(self.expected["program"].as_str().unwrap())
    }

    /// The strings of the expected file's array `key` (extra argument
    /// lists of a fixture).
    pub fn args_of(&self, key: &str) -> Vec<String> {
        self.expected[key]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    }

    pub fn args(&self) -> Vec<String> {
        self.expected["args"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    }

    /// Records the fixture to completion; returns the trace directory.
    pub fn record(&self, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
        let _guard = recording_guard(self.expected.get("record_alone").is_some());
        self.record_unguarded(extra)
    }

    /// [`Fixture::record`] for a caller that holds a recording guard
    /// already.
    pub fn record_unguarded(&self, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("trace.parquet");
        let out = memleak()
            .args(["record", "-q", "-o"])
            .arg(&trace)
            .args(extra)
            .arg("--")
            .arg(self.binary())
            .args(self.args())
            .current_dir(fixtures_dir_for(self.build))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "record of {} failed: {:?}\n{}",
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        (dir, trace)
    }

    fn sources(&self) -> Vec<String> {
        std::fs::read_dir(root().join("fixtures"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".c") || n.ends_with(".cc") || n.ends_with(".h"))
            .collect()
    }

    pub fn expected_groups(&self, keys: &[&str]) -> Vec<Group> {
        let mut out = Vec::new();
        for key in keys {
            for g in self.expected[*key].as_array().into_iter().flatten() {
                out.push(Group {
                    frames: g["frames"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|f| {
                            (
                                f["function"].as_str().unwrap().to_string(),
                                f["file"].as_str().unwrap().to_string(),
                                f["line"].as_u64().unwrap() as u32,
                                f["inlined"].as_bool().unwrap_or(false),
                            )
                        })
                        .collect(),
                    bytes: g["bytes"].as_u64().unwrap(),
                    count: g["count"].as_u64().unwrap(),
                });
            }
        }
        out.sort();
        out
    }

    /// Splits the report's outstanding stacks into the program's groups
    /// (compared exactly) and runtime groups: allocations the C runtime
    /// makes itself (ld.so, libstdc++ and libc before main, or inside
    /// pthread_create, dlopen, register_printf_specifier), whose innermost
    /// frame is not the program's. An unwinder that reaches through the
    /// runtime finds the program's frames beyond those too.
    pub fn actual_groups(&self, report: &Report) -> (Vec<Group>, Vec<RuntimeGroup>) {
        let sources = self.sources();
        let fixtures_src = root().join("fixtures");
        let mut user = Vec::new();
        let mut runtime = Vec::new();
        for s in report.stacks.iter().filter(|s| s.count > 0) {
            let mut flat = Vec::new();
            let mut ours = Vec::new();
            let mut all_functions = Vec::new();
            // glibc has a strdup.c too: a frame is ours only if its full
            // path is in fixtures/.
            let is_ours = |file: Option<&str>| {
                file.is_some_and(|f| {
                    Path::new(f).starts_with(&fixtures_src) && sources.contains(&basename(Some(f)))
                })
            };
            for f in &s.frames {
                for i in &f.inlined {
                    flat.push((
                        strip_params(&i.function),
                        basename(i.file.as_deref()),
                        i.line.unwrap_or(0),
                        true,
                    ));
                    ours.push(is_ours(i.file.as_deref()));
                    all_functions.push(i.function.clone());
                }
                let func = f
                    .function
                    .clone()
                    .unwrap_or_else(|| format!("{:#x}", f.addr));
                all_functions.push(func.clone());
                all_functions.push(f.path.clone().unwrap_or_default());
                flat.push((
                    strip_params(&func),
                    basename(f.file.as_deref()),
                    f.line.unwrap_or(0),
                    false,
                ));
                ours.push(is_ours(f.file.as_deref()));
            }
            match ours.first() {
                Some(true) => {
                    // Keep the stack up to the last fixture frame: what lies
                    // beyond (libc start code, thread start) is not ours.
                    let last = ours.iter().rposition(|&o| o).unwrap();
                    flat.truncate(last + 1);
                    user.push(Group {
                        frames: flat,
                        bytes: s.bytes,
                        count: s.count,
                    });
                }
                _ => runtime.push((s.bytes, s.count, all_functions)),
            }
        }
        user.sort();
        (user, runtime)
    }
}

fn basename(p: Option<&str>) -> String {
    p.map(|p| {
        Path::new(p)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    })
    .unwrap_or_default()
}

/// `ns::f(int, char*)` -> `ns::f`, as the expected files write names.
pub fn strip_params(name: &str) -> String {
    let trimmed = name.trim_end();
    if !trimmed.ends_with(')') {
        return trimmed.to_string();
    }
    let mut depth = 0;
    for (i, c) in trimmed.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    return trimmed[..i].to_string();
                }
            }
            _ => {}
        }
    }
    trimmed.to_string()
}

/// Events of each kind in the trace.
pub fn event_counts(trace: &Path) -> BTreeMap<String, u64> {
    memleak_trace::Trace::open(trace)
        .unwrap()
        .meta()
        .counters
        .events
        .clone()
}

/// Outstanding (bytes, blocks) of each stack through `function`, sorted.
pub fn through(trace: &Path, function: &str) -> Vec<(u64, u64)> {
    let report = analyze(trace, &AnalyzeOptions::default()).unwrap();
    let mut out: Vec<(u64, u64)> = report
        .stacks
        .iter()
        .filter(|s| {
            s.count > 0
                && s.frames
                    .iter()
                    .any(|f| f.function.as_deref() == Some(function))
        })
        .map(|s| (s.bytes, s.count))
        .collect();
    out.sort();
    out
}

/// No frame of any stack is in memleak's agent (its dlopen, around the
/// loader's allocations, used to be in every stack through dlopen).
pub fn no_agent_frames(trace: &Path) {
    let frames = memleak_trace::Trace::open(trace).unwrap().frames().unwrap();
    let agent: Vec<_> = frames
        .iter()
        .filter(|f| {
            f.path
                .as_deref()
                .is_some_and(|p| p.contains("memleak-agent") || p.contains("memleak-inject"))
        })
        .collect();
    assert!(agent.is_empty(), "frames of the agent: {agent:?}");
}

/// Events a recording lost, whatever the reason; a program's own failed
/// allocations (`failed_alloc`) are not lost events.
pub fn lost_events(meta: &memleak_trace::Meta) -> u64 {
    meta.counters
        .lost
        .iter()
        .filter(|(k, _)| k.as_str() != "failed_alloc")
        .map(|(_, &n)| n)
        .sum()
}

/// glibc functions that create mappings the runtime keeps until exit.
const RUNTIME_MAPPINGS: &[&str] = &["allocate_stack", "new_heap", "alloc_new_heap"];

/// Records a fixture and checks every outstanding allocation exactly.
pub fn check_fixture(fx: &Fixture) {
    let (_dir, trace) = fx.record(&[]);
    check_trace(fx, &trace, &["outstanding", "mappings"]);
}

/// Records a fixture with `extra` options, checks every outstanding
/// allocation exactly, and that the program's stacks are complete: the
/// walk reached the outermost frame.
pub fn check_fixture_complete(fx: &Fixture, extra: &[&str]) -> Report {
    let (_dir, trace) = fx.record(extra);
    let report = check_trace(fx, &trace, &["outstanding", "mappings"]);
    let fixtures_src = root().join("fixtures");
    for s in report.stacks.iter().filter(|s| s.count > 0) {
        let ours = s.frames.first().is_some_and(|f| {
            let file = f
                .inlined
                .first()
                .map_or(f.file.as_deref(), |i| i.file.as_deref());
            file.is_some_and(|p| Path::new(p).starts_with(&fixtures_src))
        });
        let names: Vec<_> = s.frames.iter().map(|f| f.function.clone()).collect();
        assert!(
            !ours || !s.truncated,
            "{} ({:?}): stack {} is truncated: {names:?}",
            fx.name,
            fx.build,
            s.stack_id
        );
    }
    report
}

/// Rows are in time order: `ts_ns` never steps back, across threads and
/// CPUs included (docs/format.md), so a free is never stamped before the
/// allocation it frees.
fn check_times(fx: &Fixture, trace: &Path) {
    let t = memleak_trace::Trace::open(trace).unwrap();
    let mut last = 0u64;
    let mut rows = 0u64;
    for batch in t.events(memleak_trace::reader::EventColumns::TS).unwrap() {
        for ts in batch.unwrap().ts_ns {
            assert!(
                ts >= last,
                "{}: row {rows} is stamped {} ns before the row before it",
                fx.name,
                last - ts
            );
            last = ts;
            rows += 1;
        }
    }
}

/// Checks a recorded trace against the expected groups under `keys`.
pub fn check_trace(fx: &Fixture, trace: &Path, keys: &[&str]) -> Report {
    check_times(fx, trace);
    no_agent_frames(trace);
    let report = analyze(trace, &AnalyzeOptions::default()).unwrap();
    // Losses: none, unless the expected file lists them (exactly).
    let lost: BTreeMap<String, u64> = report
        .summary
        .lost_by_reason
        .iter()
        .filter(|(_, &n)| n > 0)
        .map(|(k, &n)| (k.clone(), n))
        .collect();
    // `lost_CAPTURE` when the captures differ (the probes must decline
    // calls the agent records).
    let capture = memleak_trace::Trace::open(trace)
        .unwrap()
        .meta()
        .capture
        .clone()
        .unwrap_or_else(|| "bpf".into());
    let lost_key = format!("lost_{capture}");
    let lost_key = if fx.expected.get(&lost_key).is_some() {
        lost_key.as_str()
    } else {
        "lost"
    };
    let expected_lost: BTreeMap<String, u64> = fx.expected[lost_key]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    assert_eq!(lost, expected_lost, "{} ({capture}): lost events", fx.name);
    let (user, runtime) = fx.actual_groups(&report);
    let keys: Vec<String> = keys
        .iter()
        .map(|k| {
            let own = format!("{k}_{capture}");
            if fx.expected.get(&own).is_some() {
                own
            } else {
                k.to_string()
            }
        })
        .collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let expected = fx.expected_groups(&keys);
    assert_eq!(
        user, expected,
        "{}: outstanding allocations by stack differ",
        fx.name
    );

    // Runtime allocations (before main, inside libstdc++/ld.so/pthread):
    // every expected one must be found, and nothing else may remain.
    let mut runtime = runtime;
    for r in fx.expected["runtime"].as_array().into_iter().flatten() {
        // A runtime frame may have no symbol (`???`): then the object names it.
        let needle = r["object_contains"]
            .as_str()
            .or(r["function_contains"].as_str())
            .unwrap_or("");
        let (bytes, count) = (r["bytes"].as_u64().unwrap(), r["count"].as_u64().unwrap());
        // ld.so, libc and libstdc++ have no frame pointers, so the frame
        // valgrind names may be beyond what a frame-pointer stack reaches:
        // prefer a stack that shows it, else accept the same bytes and count.
        let same = |(b, c, _): &&(u64, u64, Vec<String>)| *b == bytes && *c == count;
        let pos = runtime
            .iter()
            .position(|r| same(&r) && r.2.iter().any(|f| f.contains(needle)))
            .or_else(|| runtime.iter().position(|r| same(&r)))
            .unwrap_or_else(|| panic!("{}: runtime allocation {bytes} bytes x{count} ({needle}) not found in {runtime:?}", fx.name));
        runtime.remove(pos);
    }
    // Runtime *mappings* are not listed by the fixtures (valgrind cannot see
    // them): cached thread stacks and malloc arenas stay mapped at exit.
    runtime.retain(|(_, _, funcs)| !funcs.iter().any(|f| RUNTIME_MAPPINGS.contains(&f.as_str())));
    // A static program's runtime is linked in: blocks of its start-up
    // whose sizes depend on where it runs (`runtime_callers`).
    let callers: Vec<&str> = fx.expected["runtime_callers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str())
        .collect();
    // (gcc's clones carry a suffix: `fillin_rpath.isra.0`.)
    let listed = |f: &String| {
        callers
            .iter()
            .any(|c| f == c || f.strip_prefix(c).is_some_and(|s| s.starts_with('.')))
    };
    runtime.retain(|(_, _, funcs)| !funcs.iter().any(listed));
    assert!(
        runtime.is_empty(),
        "{}: unexpected outstanding allocations outside the program: {runtime:?}",
        fx.name
    );

    check_call_counts(fx, trace, &report, &capture);
    report
}

/// The program's own allocator calls: each successful call is exactly one
/// event with a stack in the program's code. Runtime allocations (ld.so,
/// libstdc++, pthread) have no fixture frame and are not the program's
/// calls; failed calls (NULL) record nothing and are counted in meta.json.
/// glibc's aligned_alloc is memalign (one address, one probe), and the libc
/// wrappers (strdup, asprintf, getline) record a malloc.
fn check_call_counts(fx: &Fixture, trace: &Path, report: &Report, capture: &str) {
    let own = format!("calls_{capture}");
    let key = if fx.expected.get(&own).is_some() {
        own.as_str()
    } else {
        "calls"
    };
    let Some(calls) = fx.expected[key].as_object() else {
        return;
    };
    if fx.expected.get("exec_into").is_some() {
        return;
    }
    let fixtures_src = root().join("fixtures");
    // The program's calls: the innermost frame is the program's (see
    // actual_groups).
    let user_stacks: std::collections::HashSet<u64> = report
        .stacks
        .iter()
        .filter(|s| {
            s.frames.first().is_some_and(|f| {
                let file = f
                    .inlined
                    .first()
                    .map_or(f.file.as_deref(), |i| i.file.as_deref());
                file.is_some_and(|p| Path::new(p).starts_with(&fixtures_src))
            })
        })
        .map(|s| s.stack_id)
        .collect();
    let t = memleak_trace::Trace::open(trace).unwrap();
    let mut user: BTreeMap<String, u64> = BTreeMap::new();
    let cols = memleak_trace::EventColumns::KIND
        | memleak_trace::EventColumns::STACK_ID
        | memleak_trace::EventColumns::PID;
    let first_pid = t.meta().pids.first().copied();
    for batch in t.events(cols).unwrap() {
        let b = batch.unwrap();
        for i in 0..b.len() {
            // The parent's own calls (a followed child has its own list).
            if Some(b.pid[i]) != first_pid {
                continue;
            }
            // realloc(p, 0) frees: like a free, it carries no stack.
            let freeing_realloc =
                b.kind[i] == memleak_trace::EventKind::Realloc && b.stack_id[i] == 0;
            if freeing_realloc || user_stacks.contains(&b.stack_id[i]) {
                *user.entry(b.kind[i].name().to_string()).or_default() += 1;
            }
        }
    }
    let failed = t.meta().failed_allocations.unwrap_or(0);
    let wrapper = |names: &[&str]| -> u64 {
        fx.expected["wrapper_calls"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| names.contains(&k.as_str()))
            .map(|(_, v)| v.as_u64().unwrap())
            .sum()
    };
    let wrappers = wrapper(&["strdup", "strndup", "asprintf", "vasprintf"]);
    // getline allocates only when the caller's buffer is too small.
    let maybe = wrapper(&["getline", "getdelim"]);
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for (kind, n) in calls {
        if ["free", "delete", "delete[]", "munmap"].contains(&kind.as_str()) {
            continue; // frees carry no stack
        }
        let kind = if kind == "aligned_alloc" {
            "memalign"
        } else {
            kind.as_str()
        };
        *want.entry(kind.to_string()).or_default() += n.as_u64().unwrap();
    }
    if wrappers > 0 {
        *want.entry("malloc".into()).or_default() += wrappers;
    }
    for (kind, &n) in &want {
        let got = user.get(kind).copied().unwrap_or(0);
        let n = n + if kind == "malloc" { maybe } else { 0 };
        assert!(
            got <= n,
            "{}: {got} {kind} events from the program for {n} calls",
            fx.name
        );
    }
    let (got, n): (u64, u64) = (user.values().sum(), want.values().sum());
    let n = n + maybe.min(got.saturating_sub(n));
    assert_eq!(
        got + failed,
        n,
        "{}: {got} allocation events + {failed} failed for {n} calls ({user:?} vs {want:?})",
        fx.name
    );
}

/// Compiles `fixtures/diff_leak.c` with the Makefile's flags and
/// `defines`, with `prefix` put before its first line, from a copy of the
/// sources in a new temporary directory (so that two builds' source paths
/// differ too); returns the directory and the program.
pub fn build_diff_leak(defines: &[&str], prefix: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for f in ["diff_leak.c", "fx.h"] {
        std::fs::copy(root().join("fixtures").join(f), dir.path().join(f)).unwrap();
    }
    let source = dir.path().join("diff_leak.c");
    let text = std::fs::read_to_string(&source).unwrap();
    std::fs::write(&source, format!("{prefix}{text}")).unwrap();
    let bin = dir.path().join("diff_leak");
    let out = Command::new("gcc")
        .args([
            "-O2",
            "-g",
            "-fno-omit-frame-pointer",
            "-Wall",
            "-Wno-unused-result",
        ])
        .args(defines)
        .arg("-o")
        .arg(&bin)
        .arg("diff_leak.c")
        .current_dir(dir.path())
        .output()
        .expect("gcc runs");
    assert!(
        out.status.success(),
        "gcc {defines:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (dir, bin)
}
