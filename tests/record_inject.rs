//! `record -p PID --capture inject`: memleak's agent loaded into
//! processes that were running before the recording, with the real
//! ptrace, the real agent and the real lifecycle probes. Each test
//! checks what the trace holds (exactly the leaks made after the attach)
//! and what the process does after the detach (runs on, its call sites
//! back on its own allocator, and exits 0).
#![cfg(feature = "bpf")]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::fixtures::{check_trace, fixtures_dir, memleak, recording_guard, Fixture};
use memleak_analyze::report::{analyze, AnalyzeOptions};

/// A fixture program driven through its stdin and stdout.
struct Target {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Target {
    fn start(program: &Path, args: &[&str]) -> Target {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut t = Target {
            child,
            stdin,
            stdout,
        };
        t.expect("ready");
        t
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a command line.
    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next line, which must start with `prefix`.
    fn expect(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        assert!(
            self.stdout.read_line(&mut line).unwrap() > 0,
            "the program ended before saying {prefix:?}"
        );
        assert!(line.starts_with(prefix), "{line:?} is not {prefix:?}");
        line.trim_end().to_string()
    }

    fn ask(&mut self, cmd: &str, prefix: &str) -> String {
        self.send(cmd);
        self.expect(prefix)
    }

    fn count(&mut self) -> u64 {
        let line = self.ask("count", "count ");
        line["count ".len()..].parse().unwrap()
    }

    /// Sends `cmd`, after which the program says "done" and exits: with
    /// status 0.
    fn end_with(mut self, cmd: &str) {
        self.send(cmd);
        self.expect("done");
        assert_eq!(self.child.wait().unwrap().code(), Some(0));
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A recording of `pid` under way; it ends at SIGINT.
struct Recording {
    child: Child,
    stderr: mpsc::Receiver<String>,
    trace: PathBuf,
}

impl Recording {
    /// Starts `memleak record -v -p PID --capture inject` and returns once
    /// the agent is attached.
    fn start(pid: u32, trace: &Path, extra: &[&str]) -> Recording {
        let mut args = vec!["--capture", "inject"];
        args.extend_from_slice(extra);
        Recording::start_with(pid, trace, &args, "call sites patched")
    }

    /// Starts `memleak record -v -p PID ARGS` and returns once it said
    /// `ready`.
    fn start_with(pid: u32, trace: &Path, args: &[&str], ready: &str) -> Recording {
        let mut child = memleak()
            .args(["record", "-v", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(trace)
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let err = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let r = Recording {
            child,
            stderr: rx,
            trace: trace.to_path_buf(),
        };
        let mut seen = Vec::new();
        loop {
            match r.stderr.recv_timeout(Duration::from_secs(60)) {
                Ok(line) if line.contains(ready) => break,
                Ok(line) => seen.push(line),
                Err(_) => panic!("the agent did not attach:\n{}", seen.join("\n")),
            }
        }
        r
    }

    /// Ends the recording (SIGINT) and waits for it; its stderr.
    fn finish(mut self) -> String {
        // SAFETY: kill(2) on our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().unwrap();
        let err: Vec<String> = self.stderr.try_iter().collect();
        let err = err.join("\n");
        assert!(status.success(), "record failed: {status}\n{err}");
        assert!(self.trace.exists());
        err
    }
}

fn can_inject() -> bool {
    common::can_record() && common::has_tool("cc") && common::has_tool("c++")
}

/// The fixture started first, its leaks made after the attach: exactly
/// those are in the trace (3 stacks of malloc, calloc, strdup, realloc),
/// the 4 frees of blocks it allocated before are counted as unknown, and
/// after the detach the process makes a million more allocations and
/// exits 0.
#[test]
fn inject_records_exactly_the_leaks_made_after_the_attach() {
    if !can_inject() {
        return;
    }
    let fx = Fixture::load("attach");
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.parquet");
    let _guard = recording_guard(false);
    let mut target = Target::start(&fx.binary(), &[]);
    let rec = Recording::start(target.pid(), &trace, &[]);
    target.ask("go", "leaked");
    let err = rec.finish();
    assert!(err.contains("call sites restored"), "{err}");
    target.end_with("more");

    let report = check_trace(&fx, &trace, &["outstanding"]);
    assert_eq!(
        report.summary.anomalies.unknown_frees,
        fx.expected["unknown_frees"].as_u64().unwrap()
    );
    let meta = memleak_trace::Trace::open(&trace).unwrap().meta().clone();
    assert_eq!(meta.capture.as_deref(), Some("inject"));
}

/// Four threads allocating without pause, attached to: the leak made on
/// each thread after the attach is exact (40 Nodes from leak_node), the
/// only other outstanding blocks are at most one churned block per
/// thread (allocated just before the detach, freed just after), and one
/// per record lost when the recording stopped; while
/// attached the program's own call site reaches the agent, after it libc
/// again; and the threads make a million more allocations before the
/// program exits 0.
#[test]
fn inject_into_a_multithreaded_cxx_program() {
    if !can_inject() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.parquet");
    let _guard = recording_guard(false);
    let mut target = Target::start(&fixtures_dir().join("attach_threads"), &[]);
    let before = target.ask("where", "malloc in ");
    assert!(before.contains("libc.so"), "{before}");
    let rec = Recording::start(target.pid(), &trace, &[]);
    // The agent, loaded from its memfd by /proc/self/fd/N.
    let during = target.ask("where", "malloc in ");
    assert!(during.contains("/proc/self/fd/"), "{during}");
    target.ask("leak", "leaked");
    rec.finish();
    let after = target.ask("where", "malloc in ");
    assert!(after.contains("libc.so"), "{after}");
    let from = target.count();
    while target.count() < from + 1_000_000 {
        std::thread::sleep(Duration::from_millis(10));
    }
    target.end_with("quit");

    let report = analyze(&trace, &AnalyzeOptions::default()).unwrap();
    let fn_names = |s: &memleak_analyze::model::StackReport| -> Vec<String> {
        s.frames
            .iter()
            .flat_map(|f| {
                f.inlined
                    .iter()
                    .map(|i| i.function.clone())
                    .chain(f.function.clone())
            })
            .collect()
    };
    let mut leak = None;
    let mut churned = 0;
    for s in report.stacks.iter().filter(|s| s.count > 0) {
        let names = fn_names(s);
        if names.iter().any(|n| n.starts_with("leak_node")) {
            assert!(leak.is_none(), "two leak_node stacks");
            leak = Some((s.bytes, s.count, names));
        } else {
            assert!(
                names.iter().any(|n| n.starts_with("worker")),
                "outstanding outside the workers: {names:?}"
            );
            churned += s.count;
        }
    }
    let (bytes, count, names) = leak.expect("the leak_node stack");
    assert_eq!((bytes, count), (40 * 64, 40), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("worker")), "{names:?}");
    // A writer waiting for room in a full ring when the recording stops
    // loses its record (counted): a lost free leaves one more block.
    let meta = memleak_trace::Trace::open(&trace).unwrap().meta().clone();
    let lost: u64 = meta.counters.lost.values().sum();
    assert!(
        churned <= 4 + lost,
        "{churned} churned blocks outstanding, {lost} records lost"
    );
}

/// A running python3 leaking through ctypes (malloc looked up after the
/// attach: dlsym answers with the agent's): the 25 blocks of 4096 bytes
/// are found, with the ctypes call in their stack; python exits 0 after
/// a million more allocations.
#[test]
fn inject_into_a_running_python3() {
    if !can_inject() || !common::has_tool("python3") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("leaky.py");
    std::fs::write(
        &script,
        "import ctypes, sys\n\
         print('ready', flush=True)\n\
         sys.stdin.readline()\n\
         libc = ctypes.CDLL(None)\n\
         libc.malloc.restype = ctypes.c_void_p\n\
         keep = [libc.malloc(4096) for _ in range(25)]\n\
         print('leaked', flush=True)\n\
         sys.stdin.readline()\n\
         for i in range(1000000):\n    x = bytearray(64 + i % 100)\n\
         print('done', flush=True)\n",
    )
    .unwrap();
    let trace = dir.path().join("trace.parquet");
    let _guard = recording_guard(false);
    let python = which("python3");
    let mut target = Target::start(&python, &[script.to_str().unwrap()]);
    let rec = Recording::start(target.pid(), &trace, &[]);
    target.ask("go", "leaked");
    rec.finish();
    target.end_with("more");

    let report = analyze(&trace, &AnalyzeOptions::default()).unwrap();
    let found = report.stacks.iter().find(|s| {
        s.count == 25
            && s.bytes == 25 * 4096
            && s.frames.iter().any(|f| {
                f.function
                    .as_deref()
                    .is_some_and(|n| n.contains("ffi_call"))
            })
    });
    assert!(
        found.is_some(),
        "no stack of 25 x 4096 bytes through ffi_call in {:?}",
        report
            .stacks
            .iter()
            .map(|s| (s.bytes, s.count))
            .collect::<Vec<_>>()
    );
}

fn which(tool: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(tool))
                .find(|p| p.is_file())
        })
        .unwrap()
}

/// One `record --capture inject -d DURATION -p PID` to `trace`, which
/// must succeed and leave the process alive; `what` names it.
fn inject_once(pid: u32, trace: &Path, duration: &str, what: &str) {
    let out = memleak()
        .args(["record", "-q", "--capture", "inject", "--force", "-d"])
        .arg(duration)
        .arg("-p")
        .arg(pid.to_string())
        .arg("-o")
        .arg(trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        common::procs::proc_state(pid).is_some_and(|s| s != 'Z'),
        "{what}: the process died"
    );
}

/// 200 attach/detach cycles of 100 ms on four threads that allocate
/// without pause: every recording succeeds, the threads keep running, the
/// agent is loaded once and its shared memory mapped once, and after the
/// last cycle the program's call site reaches libc again. The allocation
/// rates before and after are printed (not asserted: no timing assertion
/// in tests; the figures are in docs/benchmarks.md).
#[test]
fn attach_and_detach_200_times() {
    if !can_inject() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _guard = recording_guard(false);
    let mut target = Target::start(&fixtures_dir().join("attach_threads"), &[]);
    let rate = |t: &mut Target| {
        let a = t.count();
        std::thread::sleep(Duration::from_millis(500));
        (t.count() - a) * 2
    };
    let before = rate(&mut target);
    let trace = dir.path().join("t");
    for cycle in 0..200 {
        inject_once(target.pid(), &trace, "100ms", &format!("cycle {cycle}"));
        if cycle % 50 == 0 {
            // On a loaded machine the workers may wait for a core: give
            // them up to 10 s to be seen counting.
            let c = target.count();
            let mut moved = false;
            for _ in 0..200 {
                std::thread::sleep(Duration::from_millis(50));
                if target.count() > c {
                    moved = true;
                    break;
                }
            }
            assert!(moved, "the threads stopped at cycle {cycle}");
        }
    }
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", target.pid())).unwrap();
    let copies = maps
        .lines()
        .filter(|l| l.contains("memleak-inject.so"))
        .filter(|l| l.split_whitespace().nth(2) == Some("00000000"))
        .count();
    assert_eq!(copies, 1, "{maps}");
    // And one shared memory: each attach takes the last one's place.
    let rings = maps
        .lines()
        .filter(|l| l.contains("memleak-agent-ring"))
        .count();
    assert_eq!(rings, 1, "{maps}");
    let after_site = target.ask("where", "malloc in ");
    assert!(after_site.contains("libc.so"), "{after_site}");
    let after = rate(&mut target);
    eprintln!(
        "allocations per second before the cycles {before}, after {after} ({:+.1} %)",
        (after as f64 / before as f64 - 1.0) * 100.0
    );
    target.end_with("quit");
}

/// What cannot be injected is refused with one line naming
/// `--capture bpf`, before anything touches the process; and inject is
/// for -p only.
#[test]
fn inject_refuses_what_it_cannot_do_with_one_line() {
    if !can_inject() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t");
    let one_line = |out: &std::process::Output, want: &str| {
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(lines[0].contains(want), "{err}");
    };
    // A command: preload's job.
    let out = memleak()
        .args(["record", "--capture", "inject", "-o"])
        .arg(&trace)
        .args(["--", "true"])
        .output()
        .unwrap();
    one_line(&out, "--capture inject: it attaches to a running process");

    let _guard = recording_guard(false);
    // A statically linked program.
    let src = dir.path().join("sleeper.c");
    std::fs::write(
        &src,
        "#include <unistd.h>\nint main(void) { sleep(60); return 0; }\n",
    )
    .unwrap();
    let exe = dir.path().join("sleeper");
    let built = Command::new("cc")
        .arg("-static")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(built.success());
    let mut stat = Command::new(&exe).spawn().unwrap();
    let out = memleak()
        .args(["record", "--capture", "inject", "-p"])
        .arg(stat.id().to_string())
        .arg("-o")
        .arg(&trace)
        .output()
        .unwrap();
    let _ = stat.kill();
    let _ = stat.wait();
    one_line(&out, "--capture bpf");

    // A stopped process.
    let mut target = Target::start(&fixtures_dir().join("attach"), &[]);
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(target.pid() as i32, libc::SIGSTOP) };
    for _ in 0..500 {
        if common::procs::proc_state(target.pid()) == Some('T') {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = memleak()
        .args(["record", "--capture", "inject", "-p"])
        .arg(target.pid().to_string())
        .arg("-o")
        .arg(&trace)
        .output()
        .unwrap();
    one_line(&out, "is stopped");
    assert!(!trace.exists(), "a refused recording left a trace");
    // SAFETY: as above.
    unsafe { libc::kill(target.pid() as i32, libc::SIGCONT) };
    target.send("go");
    target.expect("leaked");
}

/// `--sample` with inject: the agent samples in the running process. Four
/// threads make millions of allocations while attached; the trace says it
/// is sampled with the mean asked for and holds far fewer events than the
/// calls made.
#[test]
fn inject_samples_with_sample() {
    if !can_inject() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.parquet");
    let _guard = recording_guard(false);
    let mut target = Target::start(&fixtures_dir().join("attach_threads"), &[]);
    let rec = Recording::start(target.pid(), &trace, &["--sample", "512k"]);
    let from = target.count();
    while target.count() < from + 2_000_000 {
        std::thread::sleep(Duration::from_millis(10));
    }
    rec.finish();
    let made = target.count() - from;
    target.end_with("quit");
    let t = memleak_trace::Trace::open(&trace).unwrap();
    let meta = t.meta().clone();
    assert_eq!(meta.sampling.map(|s| s.mean_bytes), Some(512 << 10));
    let events: u64 = meta.counters.events.values().sum();
    // Blocks of 24-87 bytes at one sample per 512 KiB: about one in
    // 10,000 is recorded (each with its free).
    assert!(
        events > 0 && events * 100 < made,
        "{events} events for {made} allocations"
    );
}

/// A second recording of a process whose agent is attached is refused
/// with one line, and the first goes on unharmed.
#[test]
fn a_second_inject_recording_is_refused() {
    if !can_inject() {
        return;
    }
    let fx = Fixture::load("attach");
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.parquet");
    let _guard = recording_guard(false);
    let mut target = Target::start(&fx.binary(), &[]);
    let rec = Recording::start(target.pid(), &trace, &[]);
    let out = memleak()
        .args(["record", "--capture", "inject", "-d", "1s", "-p"])
        .arg(target.pid().to_string())
        .arg("-o")
        .arg(dir.path().join("second"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("another recording is attached"), "{err}");
    assert!(!dir.path().join("second").exists());
    target.ask("go", "leaked");
    rec.finish();
    target.end_with("more");
    check_trace(&fx, &trace, &["outstanding"]);
}

/// A library dlopened while the agent is attached gets its call sites
/// patched too: libleaky.so, loaded after the attach, leaks 4 blocks of
/// 48 bytes from leaky_inner, and they are in the trace.
#[test]
fn inject_patches_a_library_loaded_later() {
    if !can_inject() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.parquet");
    let _guard = recording_guard(false);
    let mut target = Target::start(&fixtures_dir().join("attach_threads"), &[]);
    let rec = Recording::start(target.pid(), &trace, &[]);
    let lib = fixtures_dir().join("libleaky.so");
    target.ask(&format!("dl {}", lib.display()), "dl done");
    rec.finish();
    target.end_with("quit");
    let report = analyze(&trace, &AnalyzeOptions::default()).unwrap();
    let leaky: Vec<(u64, u64)> = report
        .stacks
        .iter()
        .filter(|s| s.count > 0)
        .filter(|s| {
            s.frames
                .first()
                .and_then(|f| f.function.as_deref())
                .is_some_and(|n| n.starts_with("leaky_inner"))
        })
        .map(|s| (s.bytes, s.count))
        .collect();
    assert_eq!(leaky, vec![(4 * 48, 4)]);
}

/// A server started in a pipe, its port read from its first line.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(program: &Path, args: &[&str], port_after: &str) -> Server {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let port = line
            .split_once(port_after)
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        // The rest of its output goes nowhere.
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        Server { child, port }
    }

    fn answers(&self) -> bool {
        answers(self.port)
    }
}

/// One GET to 127.0.0.1:`port` over a new connection; whether a 200 came
/// back.
fn answers(port: u16) -> bool {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = "GET / HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.") && reply.contains(" 200 ")
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// 20 attach/detach cycles into a real server while a client keeps asking
/// it: every recording succeeds and holds events, the server answers
/// every request, and it is alive at the end. The agent mapped its ring
/// at an offset made of stack garbage (an int through a variadic
/// syscall()), and python's and node's servers died of SIGBUS at the
/// first inject.
fn cycles_into(server: &Server, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let _guard = recording_guard(false);
    let pid = server.child.id();
    assert!(server.answers(), "{name} does not answer before the cycles");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let port = server.port;
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if answers(port) {
                    ok += 1;
                } else {
                    failed += 1;
                }
            }
            (ok, failed)
        })
    };
    let trace = dir.path().join("t");
    let mut events = 0;
    for cycle in 0..20 {
        inject_once(pid, &trace, "300ms", &format!("{name}, cycle {cycle}"));
        let meta = memleak_trace::Trace::open(&trace).unwrap().meta().clone();
        events += meta.counters.events.values().sum::<u64>();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = client.join().unwrap();
    assert_eq!(
        failed,
        0,
        "{name}: {failed} of {} requests failed",
        ok + failed
    );
    assert!(
        ok > 0 && server.answers(),
        "{name} does not answer after the cycles"
    );
    assert!(events > 0, "{name}: 20 recordings and no event");
    eprintln!("{name}: 20 cycles, {ok} requests answered, {events} events recorded");
}

#[test]
fn twenty_injects_into_a_python_http_server_that_keeps_answering() {
    if !can_inject() || !common::has_tool("python3") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &which("python3"),
        &[
            "-u",
            "-m",
            "http.server",
            "0",
            "--bind",
            "127.0.0.1",
            "--directory",
            dir.path().to_str().unwrap(),
        ],
        " port ",
    );
    cycles_into(&server, "python3 -m http.server");
}

#[test]
fn twenty_injects_into_a_node_server_that_keeps_answering() {
    if !can_inject() || !common::has_tool("node") {
        return;
    }
    let server = Server::start(
        &which("node"),
        &[
            "-e",
            "require('http').createServer((q, s) => s.end('ok ' + 'x'.repeat(q.url.length)))\
             .listen(0, '127.0.0.1', function () { console.log('port ' + this.address().port) })",
        ],
        "port ",
    );
    cycles_into(&server, "node");
}

/// The attach fixture, started as `target` and running as process `pid`,
/// recorded by `record -v -p PID ARGS` (once it says `ready`) from before
/// its leaks to after them: exactly its expected leaks. The report, and
/// record's stderr.
fn record_the_attach_fixture(
    mut target: Target,
    pid: u32,
    trace: &Path,
    args: &[&str],
    ready: &str,
) -> (memleak_analyze::Report, String) {
    let rec = Recording::start_with(pid, trace, args, ready);
    target.ask("go", "leaked");
    let err = rec.finish();
    target.end_with("more");
    (
        check_trace(&Fixture::load("attach"), trace, &["outstanding"]),
        err,
    )
}

/// A root for a container: `program` and the objects it loads, copied to
/// the paths they have here (the copies have the same build ids and no
/// debug information: Debian keeps libc's in /usr/lib/debug/.build-id).
fn container_root(dir: &Path, program: &Path) -> PathBuf {
    let root = dir.join("root");
    for sub in ["proc", "old"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    common::copy_executable(program, &root.join("program"));
    let ldd = Command::new("ldd").arg(program).output().unwrap();
    for lib in String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
    {
        let to = root.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        common::copy_executable(&std::fs::canonicalize(lib).unwrap(), &to);
    }
    root
}

/// The fixture `attach` in a container of its own: new pid and mount
/// namespaces, its root pivoted to a copy of what it needs. It is pid 1
/// there. Recorded from here by its pid here, with `capture`: exactly the
/// leaks it makes after the attach, with full stacks, and libc's frames
/// with their file and line from this host's debug files (the
/// container's libc has none). Inject recorded nothing there: the agent
/// compared its own pid, 1, with the pid here.
fn in_a_container(capture: &str) {
    let fx = Fixture::load("attach");
    let dir = tempfile::tempdir().unwrap();
    let root = container_root(dir.path(), &fx.binary());
    let script = format!(
        "set -e; mount --make-rprivate /; mount --bind {r} {r}; \
         mount -t proc proc {r}/proc; cd {r}; pivot_root . old; exec /program",
        r = root.display()
    );
    let trace = dir.path().join("trace.parquet");
    let _guard = recording_guard(false);
    let target = Target::start(
        Path::new("unshare"),
        &["--pid", "--fork", "--mount", "sh", "-c", &script],
    );
    // unshare's child is the container's pid 1.
    let pid = common::procs::children(target.pid())[0];
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.ends_with("\t1")),
        "not pid 1 of its namespace: {status}"
    );
    let (report, _) = record_the_attach_fixture(
        target,
        pid,
        &trace,
        &["--capture", capture],
        "memleak: recording pid",
    );
    let libc_lines = report
        .stacks
        .iter()
        .flat_map(|s| &s.frames)
        .filter(|f| f.function.as_deref() == Some("__libc_start_call_main"))
        .filter(|f| f.line.is_some())
        .count();
    assert!(libc_lines > 0, "libc's frames have no line");
    eprintln!(
        "{capture}: {} stacks outstanding, {libc_lines} libc frames with a line",
        report.stacks.len()
    );
}

#[test]
fn inject_into_a_container_with_its_own_pids_and_root() {
    if !can_inject() {
        return;
    }
    in_a_container("inject");
}

#[test]
fn probes_on_a_container_with_its_own_pids_and_root() {
    if !can_inject() {
        return;
    }
    in_a_container("bpf");
}

/// A running program whose executable was deleted after it started (an
/// upgrade, a build that replaced it): its maps name it `... (deleted)`,
/// and every stack was one frame, `??`, marked truncated, with each
/// capture. It is read through /proc/PID/map_files now: exactly the
/// leaks, with full stacks.
#[test]
fn a_program_whose_executable_was_deleted_keeps_its_stacks() {
    if !can_inject() {
        return;
    }
    let fx = Fixture::load("attach");
    for capture in ["inject", "bpf"] {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("attach");
        common::copy_executable(&fx.binary(), &exe);
        let trace = dir.path().join("trace.parquet");
        let _guard = recording_guard(false);
        let target = Target::start(&exe, &[]);
        std::fs::remove_file(&exe).unwrap();
        let pid = target.pid();
        let args = ["--capture", capture];
        record_the_attach_fixture(target, pid, &trace, &args, "memleak: recording pid");
    }
}

/// A program whose loader has another file name than Debian's (a glibc
/// of its own, as a container image or a Nix store has): the attach
/// fixture built with `-Wl,--dynamic-linker` pointing at a renamed copy
/// of ld.so. The loader is found by what it is (the object at AT_BASE),
/// and inject records exactly the leaks; by its name, it was refused.
#[test]
fn inject_finds_a_loader_of_another_name() {
    if !can_inject() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ld = dir.path().join("ld-glibc-copy.so");
    common::copy_executable(
        &std::fs::canonicalize("/lib64/ld-linux-x86-64.so.2").unwrap(),
        &ld,
    );
    let linker = format!("-Wl,--dynamic-linker={}", ld.display());
    inject_into_attach_built_with(dir.path(), "cc", Some(&linker), "ld-glibc-copy.so");
}

/// The attach fixture built with `cc [FLAG]` into `dir`, started, checked
/// to map `mapped`, injected into and recorded: exactly its leaks.
/// record's stderr.
fn inject_into_attach_built_with(dir: &Path, cc: &str, flag: Option<&str>, mapped: &str) -> String {
    let exe = dir.join("attach");
    let fixtures = common::fixtures::root().join("fixtures");
    let status = Command::new(cc)
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(format!("-I{}", fixtures.display()))
        .arg(fixtures.join("attach.c"))
        .args(flag)
        .status()
        .unwrap();
    assert!(status.success());
    let trace = dir.join("trace.parquet");
    let _guard = recording_guard(false);
    let target = Target::start(&exe, &[]);
    let pid = target.pid();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains(mapped), "{maps}");
    let args = ["--capture", "inject"];
    record_the_attach_fixture(target, pid, &trace, &args, "call sites patched").1
}

/// A running musl program (as on Alpine): its loader is its libc, which
/// the injector takes for both, and the agent finds its own functions by
/// the handle of its dlopen (musl's dlopen cannot find it again by the
/// memfd's path). Exactly the leaks made after the attach. It was refused
/// ("not glibc's loader"), then patched no call site.
#[test]
fn inject_into_a_musl_program() {
    if !can_inject() || !common::has_tool("musl-gcc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let err = inject_into_attach_built_with(dir.path(), "musl-gcc", None, "-musl/libc.so");
    assert!(!err.contains(" 0 call sites patched"), "{err}");
}
