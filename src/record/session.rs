//! `memleak record`: attach the probes to a live process (`-p`) or launch a
//! command under them (`-c` / `--`), and write every allocation and free
//! into a trace until the target exits, `--duration` passes, or SIGINT or
//! SIGTERM arrives.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::IsTerminal;
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use memleak_recorder::providers::Allocators;
use memleak_recorder::targets;
use memleak_recorder::{Recorder, TableUpdate};
use memleak_trace::{KernelRecursion, Meta, Sampling, TraceWriter, WriterOptions};

use super::args::RecordArgs;
use super::capture::{self, Agent, Capture, Chosen};
use super::child::{Child, PrivateLibs};
use super::live_report::LiveReport;
use super::probes::{self, ProbeConfig, Probes};
use super::scan;
use super::signals::{
    self, catch_child_events, catch_stop_signals, catch_suspend_signals, sleep_unless_child_event,
    Stopping, Suspending, DEFAULT_KILL_AFTER,
};
use super::status::Status;
use super::summary;
use super::targets::{add_providers, libraries_for, placement_policy, show_probes};
use super::unwinder::Unwinder;
use crate::exit_status::Exit;
use crate::units::{format_duration, format_size};
use memleak_recorder::scan::Stopped;
use memleak_recorder::symbolize::FrameSymbolizer;

/// The advice after a recording whose ring buffer filled: record again
/// with one 4 times as large (at most the largest), as `--ring-size`
/// writes it.
fn ring_advice(used: u32) -> String {
    const MAX: u64 = 1 << 30;
    let used = u64::from(used);
    if used >= MAX {
        return format!(" (the ring buffer was at its {} maximum)", format_size(MAX));
    }
    let bigger = (used * 4).min(MAX);
    let arg = [("G", 30), ("M", 20), ("k", 10)]
        .iter()
        .find(|(_, shift)| bigger % (1 << shift) == 0)
        .map_or(bigger.to_string(), |(unit, shift)| {
            format!("{}{unit}", bigger >> shift)
        });
    format!(
        "; record with --ring-size {arg} ({} times the {} used) to lose fewer",
        bigger / used,
        format_size(used)
    )
}

/// How often the loss counters are read into the metadata that the
/// checkpoints write.
const LOST_EVERY: Duration = Duration::from_millis(500);

/// The program being traced.
enum Target {
    Pids(Vec<u32>),
    Child(Child),
    KernelOnly,
}

pub fn run(mut args: RecordArgs) -> Result<ExitCode> {
    crate::malloc_tuning::keep_freed_memory();
    let argv: Vec<String> = match (&args.command, args.argv.is_empty()) {
        (Some(c), true) => c.split_whitespace().map(str::to_string).collect(),
        (Some(_), false) => bail!("give the command either with -c or after --, not both"),
        (None, _) => args.argv.clone(),
    };
    if let Some(w) = crate::bcc_flags::numeric_output_warning(&args.output.to_string_lossy()) {
        say!("memleak: warning: {w}");
    }
    if let (Some(n), None) = (args.top, args.interval()) {
        say!(
            "memleak: note: -T/--top {n} sets the stacks of live reports (--interval); \
             the trace keeps every stack, see `memleak analyze TRACE -T {n}`"
        );
    }
    if args.pid.is_empty() && argv.is_empty() && !args.kernel && args.kernel_pid.is_none() {
        bail!("nothing to trace: give -p PID, -c CMD, -- CMD ARGS, or --kernel");
    }
    if let Some(program) = argv.first().filter(|p| !p.contains('/')) {
        if find_in_path(program).is_none() {
            bail!("{program}: command not found (not a file in any directory of PATH)");
        }
    }
    if !args.pid.is_empty() && !argv.is_empty() {
        bail!("give either -p PID or a command, not both");
    }
    if args.follow_forks && argv.is_empty() {
        bail!("--follow-forks needs a command (-c or --): only a child memleak starts can be held at fork");
    }
    if args.detach && argv.is_empty() {
        bail!(
            "--detach needs a command (-c or --): processes given with -p are always left running"
        );
    }
    if args.kill_after.is_some() && argv.is_empty() {
        bail!(
            "--kill-after needs a command (-c or --): processes given with -p are never signalled"
        );
    }
    if args.scan && args.pid.is_empty() && argv.is_empty() {
        bail!("--scan needs a process to scan (-p PID, or a command, scanned at exit by default)");
    }
    if args.scan_contents > 0
        && (args.no_scan || (args.pid.is_empty() || !args.scan) && argv.is_empty())
    {
        bail!("--scan-contents needs a scan: a command without --no-scan, or -p with --scan");
    }
    if args.sample.is_some() {
        // Refused before anything starts: one line each.
        if !args.pid.is_empty() && args.capture != Capture::Inject {
            bail!(
                "--sample needs the agent: with -p add --capture inject; the probes \
                 (--capture bpf) trap into the kernel on every call, sampled or not"
            );
        }
        if args.capture == Capture::Bpf {
            bail!(
                "--sample needs --capture preload (or inject with -p): with bpf every call \
                 traps into the kernel, sampled or not"
            );
        }
        if args.scan || args.scan_contents > 0 {
            bail!(
                "--sample records no scan: a pointer held in an unsampled block cannot be \
                 followed, so no block can be judged lost"
            );
        }
    }
    if args.min_size > args.max_size {
        bail!(
            "--min-size ({}) is larger than --max-size ({})",
            args.min_size,
            args.max_size
        );
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("memleak record needs root (or CAP_BPF and CAP_PERFMON) to load BPF programs");
    }
    for &pid in &args.pid {
        if !process_alive(pid) {
            bail!("no such process: {pid}");
        }
        // `exec memleak record -p $$` from a shell: the shell is gone,
        // and its pid is memleak's own.
        if pid == std::process::id() {
            bail!("process {pid} is memleak itself (exec memleak record -p $$?): give the pid of the program to record");
        }
    }
    let object = match &args.object {
        Some(p) => {
            probes::check_object(p)?;
            Some(p.clone())
        }
        None => None,
    };

    let chosen = capture::choose(
        args.capture,
        &capture::Situation {
            argv: &argv,
            pids: args.pid.len(),
            kernel: args.kernel || args.kernel_pid.is_some(),
            custom_allocator: object.is_some() || !args.symbols_prefix.is_empty(),
            count_only: args.count_only,
        },
    )?;
    if let (Chosen::Bpf(why), Some(_)) = (&chosen, args.sample) {
        bail!(
            "--sample needs the agent (--capture preload), and this recording uses the probes{}: \
             with bpf every call traps into the kernel, sampled or not",
            why.as_ref().map(|w| format!(" ({w})")).unwrap_or_default()
        );
    }
    if let (Chosen::Bpf(Some(why)), true) = (&chosen, args.verbose && !argv.is_empty()) {
        say!("memleak: note: capture bpf: {why}");
    }
    let mut meta = Meta::for_this_host(env!("CARGO_PKG_VERSION"));
    if let Some(root) = &args.dataset {
        args.output = super::dataset::trace_dir(root, &meta.host)?;
    }
    meta.capture = Some(chosen.name().to_string());
    meta.sampling = args.sample.map(|mean_bytes| Sampling { mean_bytes });
    meta.command = std::env::args().collect();
    meta.options = serde_json::json!({
        "min_size": args.min_size, "max_size": args.max_size, "stack_depth": args.stack_depth,
        "ring_size": args.ring_size, "probe_placement": format!("{:?}", args.probe_placement).to_lowercase(),
        "kernel": args.kernel, "kernel_pid": args.kernel_pid, "percpu": args.percpu,
        "object": args.object, "symbols_prefix": args.symbols_prefix, "target_command": argv,
        "unwind": args.unwind.mode().name(), "sample": args.sample,
    });
    let opts = WriterOptions {
        force: args.force,
        ..WriterOptions::default()
    };
    // Locks the trace for the whole recording: another `record -o` of the
    // same path, --force or not, is refused naming us.
    let writer = TraceWriter::create(&args.output, meta, opts)?;
    let lock = writer.lock();
    let result = record(&args, argv, object, writer, &chosen);
    if result.is_err()
        && args
            .output
            .join("events")
            .read_dir()
            .map_or(true, |mut d| d.next().is_none())
    {
        // Nothing was recorded: do not leave an empty trace behind (and
        // remove only what memleak wrote there), still holding its lock
        // so that no other recorder has started on it meanwhile.
        let _ = lock.remove_trace();
    }
    drop(lock);
    result
}

fn record(
    args: &RecordArgs,
    argv: Vec<String>,
    object: Option<PathBuf>,
    writer: TraceWriter,
    chosen: &Chosen,
) -> Result<ExitCode> {
    let cfg = ProbeConfig {
        min_size: args.min_size,
        max_size: args.max_size,
        stack_depth: args.stack_depth,
        // With the agent the probe's ring carries the processes' lifecycle
        // (and the events of a process that runs without the agent after
        // an exec): a sixteenth of the size, which costs a sixteenth of
        // the time to make, map and unmap (64 MiB: ~30 ms).
        ring_bytes: match chosen {
            Chosen::Preload | Chosen::Inject => args.ring_size / 16,
            Chosen::Bpf(_) => args.ring_size,
        },
        kernel_tgid: args.kernel_pid.unwrap_or(0),
        kernel_stacks: !args.no_kernel_stacks,
        count_only: args.count_only,
        kernel: args.kernel || args.kernel_pid.is_some(),
        unwind: args.unwind.mode(),
        agent: chosen.agent(),
    };
    // Unwind tables, for user-space targets: the objects' rows are built
    // while the BPF program loads.
    let has_user_targets = !args.pid.is_empty() || !argv.is_empty();
    let prefetch = match has_user_targets && !args.count_only {
        true => prefetch_paths(&args.pid, &argv),
        false => Vec::new(),
    };
    let unwinder = (cfg.unwind.uses_rows() && !prefetch.is_empty()).then(|| {
        let u = Unwinder::start();
        u.prefetch(prefetch.clone());
        u
    });
    // And their symbols (libc's DWARF alone takes 35 ms to parse).
    let symbolizer = FrameSymbolizer::default();
    symbolizer.prewarm(prefetch);
    let agent_cfg = memleak_recorder::agent::Config {
        ring_bytes: u64::from(args.ring_size),
        min_size: args.min_size,
        max_size: args.max_size,
        max_frames: args.stack_depth,
        unwind_mode: cfg.unwind.code(),
        sample_mean: args.sample.unwrap_or(0),
    };
    let mut agent = match chosen {
        Chosen::Preload => Some(Agent::new(&agent_cfg)?),
        Chosen::Bpf(_) | Chosen::Inject => None,
    };
    // The agent records the allocator calls; the probe's ring has the
    // lifecycle only.
    let preload = chosen.agent();
    let injected = *chosen == Chosen::Inject;
    let mut object_storage = MaybeUninit::uninit();
    let mut uprobes_storage = MaybeUninit::uninit();
    let mut probes = Probes::load(&mut object_storage, &mut uprobes_storage, &cfg)?;
    probes.attach_lifecycle()?;
    if let (true, Some(&pid)) = (injected, args.pid.first()) {
        // Ctrl-C from here on ends the recording the usual way, which
        // detaches the agent: dying now would leave it attached.
        catch_stop_signals();
        agent = Some(super::inject::attach(
            pid,
            &agent_cfg,
            unwinder.as_ref(),
            &probes,
            args.verbose,
        )?);
    } else if let Some(u) = &unwinder {
        match (&agent, probes.unwind_maps()?) {
            (Some(a), Some(maps)) => {
                u.set_sink(Box::new(capture::BothTables(a.shared.sink(), maps)))
            }
            (Some(a), None) => u.set_sink(Box::new(a.shared.sink())),
            (None, maps) => u.set_sink(Box::new(maps.context("the probe's unwind maps")?)),
        }
    }

    let mut notes: Vec<String> = Vec::new();
    let mut target = if !argv.is_empty() {
        // On the main thread: see Child::spawn.
        // The agent needs no private copies: nothing is probed in them.
        let mut plan = if preload { None } else { private_plan(args) };
        let env = agent.as_ref().map(Agent::env).unwrap_or_default();
        if let Some(a) = &mut agent {
            a.shared.ready()?;
        }
        let child = Child::spawn(&argv, args.detach, plan.as_mut(), &env)?;
        match &child.private_libs {
            PrivateLibs::Failed(why) => notes.push(format!(
                "private copies of libc and libstdc++ could not be made ({why}); \
                 the system's files are probed, shared with other recordings"
            )),
            PrivateLibs::Done if args.verbose => {
                if let Some(plan) = &plan {
                    for p in plan.paths() {
                        say!("memleak: {} is a private copy for the command", p.display());
                    }
                }
            }
            _ => {}
        }
        Target::Child(child)
    } else if !args.pid.is_empty() {
        Target::Pids(args.pid.clone())
    } else {
        Target::KernelOnly
    };
    let pids: Vec<u32> = match &target {
        Target::Pids(p) => p.clone(),
        Target::Child(c) => vec![c.pid],
        Target::KernelOnly => vec![],
    };

    let mut libs = Vec::new();
    let user_heap = object.is_some() || !args.symbols_prefix.is_empty();
    let search = RefCell::new(Allocators::new(placement_policy(args), user_heap));
    for &pid in &pids {
        probes.trace_pid(pid)?;
        if let Some(a) = &agent {
            a.shared.add_pid(pid);
            continue;
        }
        libs = libraries_for(
            pid,
            matches!(target, Target::Child(_)),
            object.as_ref(),
            args,
            &mut search.borrow_mut(),
            &mut notes,
        )?;
        for lib in &libs {
            show_probes(lib, args.verbose);
            probes.attach_library(pid as i32, lib)?;
            search.borrow_mut().mark_attached(pid, lib);
        }
    }
    let libs = RefCell::new(libs);
    // Our own ld.so is the one the child will run (same system).
    let ld_so = targets::find_library(std::process::id(), "ld-linux");
    // The agent stops the process itself at its start and around dlopen
    // and dlclose: no uprobe (whose removal alone costs a ~180 ms RCU
    // grace period at the end).
    if let (Target::Child(c), false) = (&target, preload) {
        match &ld_so {
            Some(ld) => probes.attach_dl_stops(c.pid as i32, ld)?,
            None if args.verbose => {
                say!("memleak: no ld.so found; dlclosed libraries may not symbolize")
            }
            None => {}
        }
    }
    let mut page_frames = None;
    if args.kernel || args.kernel_pid.is_some() {
        page_frames = probes.calibrate_pages();
        notes.push(match page_frames {
            Some(_) => "kernel pages are identified by page frame number".to_string(),
            None => {
                let note = "kernel pages are identified by struct page address: \
                            the pfn mapping could not be learned";
                say!("memleak: note: {note}");
                note.to_string()
            }
        });
        for note in probes.attach_kernel(args.percpu)? {
            say!("memleak: note: {note}");
            notes.push(note);
        }
    }

    let status_line = !args.quiet && std::io::stderr().is_terminal();
    let mut recorder = Recorder::new(writer, status_line || args.interval().is_some());
    recorder.set_symbolizer(symbolizer);
    recorder.set_sampling(args.sample.map(|mean_bytes| Sampling { mean_bytes }));
    if let Some((base, size)) = page_frames {
        recorder.set_page_frames(base, size);
    }
    recorder.meta_mut().pids = pids.clone();
    // The leak scans: at the command's exit, or of each process at the
    // end with -p --scan. A sampled recording is not scanned: a pointer
    // held in an unsampled block cannot be followed.
    let scans = !args.no_scan && !args.count_only && args.sample.is_none();
    let child_pid = match &target {
        Target::Child(c) => c.pid,
        _ => 0,
    };
    let scan_at_exit = child_pid != 0 && scans;
    let scan_pids = matches!(target, Target::Pids(_)) && args.scan;
    // What they scan for is followed from the start.
    let follower = match scan_at_exit || scan_pids {
        true => Some(scan::Follower::start(&mut recorder)?),
        false => None,
    };
    // Whoever analyzes the trace must know what was not recorded.
    recorder.meta_mut().notes = notes;
    for &pid in &pids {
        if !matches!(target, Target::Child(_)) {
            recorder.snapshot_maps(pid)?;
            // An injected agent's process was tracked before it attached.
            if let (Some(u), false) = (&unwinder, injected) {
                u.track(pid);
            }
        }
    }
    recorder.track_tables(unwinder.is_some());
    // A process whose mappings may have changed (exec, ld.so), stopped
    // until its table is rebuilt.
    let mut on_maps = |pid: u32| -> Result<()> {
        if let Some(u) = &unwinder {
            u.track(pid);
        }
        Ok(())
    };

    catch_stop_signals();
    if matches!(target, Target::Child(_)) && !args.detach {
        catch_suspend_signals();
    }
    // A program whose loader is not ours (a glibc of its own, as a Nix
    // store or a foreign tree has; musl's, which is its libc too) gets
    // ld.so's stops in its own loader, or its malloc would be found only
    // at its exit.
    let own_loaders: RefCell<HashMap<u32, u64>> = RefCell::default();
    let ours = ld_so.as_deref().and_then(|p| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).ok().map(|m| m.ino())
    });
    if let Target::Child(c) = &mut target {
        // The program is mapped now, not run: a static one is probed here,
        // and its table written.
        let (pid, kernel) = (c.pid, cfg.kernel);
        let notes = &mut recorder.meta_mut().notes;
        c.release(args.follow_forks, &mut || {
            if !preload {
                stops_in_own_loader(&probes, ours, &mut own_loaders.borrow_mut(), pid, notes);
                add_providers(&probes, &search, pid, &libs, notes, args, !kernel)?;
            }
            on_maps(pid)
        })?;
    }

    let recorder = RefCell::new(recorder);
    let failure: RefCell<Option<memleak_trace::Error>> = RefCell::new(None);
    // With the agent, the probe's ring only has lifecycle events (exec,
    // fork, exit): each is held until the agent's ring is drained, where
    // the events its process made before it are.
    let lifecycle: RefCell<Vec<Vec<u8>>> = RefCell::new(Vec::new());
    let rb = probes.ring_buffer(|data| {
        if preload {
            lifecycle.borrow_mut().push(data.to_vec());
            return true;
        }
        match recorder.borrow_mut().handle(data) {
            Ok(()) => true,
            Err(e) => {
                failure.borrow_mut().get_or_insert(e);
                false
            }
        }
    })?;
    // The agent's entry in LD_PRELOAD, which it puts back at every exec
    // it sees.
    let agent_entry = agent.as_ref().and_then(Agent::preload_entry);
    let agent = agent.map(RefCell::new);
    // A command's threads wait for us at each of their ptrace stops.
    if matches!(target, Target::Child(_)) {
        catch_child_events();
    }
    // Drains the probe's ring (waiting up to `timeout` for it), then the
    // agent's; `last`: the command is gone, a record it left half-written
    // is skipped.
    let drain = |timeout: Duration, last: bool| -> Result<()> {
        let Some(a) = &agent else {
            return sleep_unless_child_event(timeout, |t| probes::drain(&rb, t));
        };
        // The agents wake us when the ring fills; the probe's ring has
        // lifecycle events only, which can wait for the poll.
        sleep_unless_child_event(timeout, |t| {
            if !t.is_zero() {
                a.borrow().shared.wait(t);
            }
        });
        probes::drain(&rb, Duration::ZERO)?;
        let mut rec = recorder.borrow_mut();
        a.borrow_mut()
            .shared
            .drain(last, &mut |d| match rec.handle(d) {
                Ok(()) => true,
                Err(e) => {
                    failure.borrow_mut().get_or_insert(e);
                    false
                }
            });
        for ev in lifecycle.borrow_mut().drain(..) {
            rec.handle(&ev)?;
        }
        Ok(())
    };

    let mut on_fork = |pid: u32| -> Result<()> {
        // The new process is held stopped: its probes go in before its
        // first instruction.
        probes.trace_pid(pid)?;
        if let Some(a) = &agent {
            a.borrow().shared.add_pid(pid);
        }
        // The objects probed so far that the new process maps (a copy of
        // its parent's): not those of another followed process's exec (a
        // static program), whose path may have died with it.
        let mapped: std::collections::HashSet<u64> = memleak_recorder::procmaps::read_maps(pid)
            .unwrap_or_default()
            .iter()
            .map(|m| m.inode)
            .filter(|&i| i != 0)
            .collect();
        for lib in libs.borrow().iter().filter(|_| !preload) {
            use std::os::unix::fs::MetadataExt;
            if !std::fs::metadata(&lib.path).is_ok_and(|m| mapped.contains(&m.ino())) {
                continue;
            }
            probes.attach_library(pid as i32, lib)?;
            search.borrow_mut().mark_attached(pid, lib);
        }
        if let (Some(ld), false) = (&ld_so, preload) {
            probes.attach_dl_stops(pid as i32, ld)?;
        }
        recorder.borrow_mut().meta_mut().pids.push(pid);
        recorder.borrow_mut().snapshot_maps(pid)?;
        // The child's address space is a copy of its parent's, and it is
        // still stopped: its table, from its own maps, is exact.
        if let Some(u) = &unwinder {
            u.track(pid);
        }
        Ok(())
    };
    // A followed process that ended lets go of its probes and its place
    // in the traced sets, which would otherwise fill after a few thousand
    // programs of a script or a build.
    let forget_ended = |c: &mut Child| {
        for pid in c.take_ended() {
            probes.forget_process(pid);
            // Its exit event may have come while it was still exiting,
            // not yet a zombie: the table was kept then.
            if let Some(u) = &unwinder {
                u.forget(pid);
            }
            if let Some(a) = &agent {
                a.borrow().shared.remove_pid(pid);
            }
        }
    };
    let without_agent: RefCell<std::collections::HashSet<u32>> = RefCell::default();
    let dl_stopped: RefCell<std::collections::HashSet<u32>> = RefCell::default();

    // The first process without the agent loads the uprobe programs and
    // their row array, to which the tables written so far are copied.
    let load_uprobes = || -> Result<()> {
        if probes.load_uprobes()? {
            if let (Some(u), Some(a), Some(maps)) = (&unwinder, &agent, probes.unwind_maps()?) {
                u.set_sink(Box::new(capture::BothTables(
                    a.borrow().shared.sink(),
                    maps,
                )));
            }
        }
        Ok(())
    };

    let mut on_stop = |pid: u32| -> Result<()> {
        // The child (or a process it forked that we follow) is stopped
        // at exit, after an exec, or in ld.so before it unmaps a
        // library, with its address space intact: drain what it did and
        // capture its maps, so a program that lives 5 ms, or a dlclosed
        // library, still symbolizes. After an exec or a dlopen, the
        // process may have another allocator: it is probed before it runs.
        drain(Duration::ZERO, false)?;
        let mut rec = recorder.borrow_mut();
        let notes = &mut rec.meta_mut().notes;
        if !preload {
            stops_in_own_loader(&probes, ours, &mut own_loaders.borrow_mut(), pid, notes);
            add_providers(&probes, &search, pid, &libs, notes, args, false)?;
        } else if capture::runs_without_agent(pid) {
            // A static or setuid program, or one executed behind the
            // agent's back (a raw execve): the probes take over.
            // Said of the first few: a followed shell loop can run
            // thousands of such programs.
            let new = without_agent.borrow_mut().insert(pid);
            let note = match without_agent.borrow().len() {
                1..=3 if new => Some(format!(
                    "process {pid} runs without memleak's agent since an exec \
                     (LD_PRELOAD no longer names it): recorded with the probes from then on"
                )),
                4 if new => Some(
                    "more processes run without memleak's agent since an exec: recorded with \
                     the probes"
                        .to_string(),
                ),
                _ => None,
            };
            if let Some(note) = note {
                say!("memleak: note: {note}");
                notes.push(note);
            }
            load_uprobes()?;
            stops_in_own_loader(&probes, ours, &mut own_loaders.borrow_mut(), pid, notes);
            add_providers(&probes, &search, pid, &libs, notes, args, false)?;
        } else if let (Some(entry), Some(ld)) = (&agent_entry, &ld_so) {
            // Just executed, and ld.so will not load the agent: its
            // allocators are probed at ld.so's stop, once it has loaded
            // the program's objects.
            if !dl_stopped.borrow().contains(&pid) && capture::agent_left_out(pid, entry) {
                load_uprobes()?;
                probes.attach_dl_stops(pid as i32, ld)?;
                dl_stopped.borrow_mut().insert(pid);
            }
        }
        rec.snapshot_maps(pid)?;
        rec.flush_frames()?;
        Ok(())
    };

    // The leak scan at the command's exit (on_stop has drained the ring).
    let scan_lines: RefCell<Vec<String>> = RefCell::new(Vec::new());
    let contents = args.scan_contents as usize;
    let mut on_exit = || -> Result<()> {
        if !scan_at_exit {
            return Ok(());
        }
        let mut rec = recorder.borrow_mut();
        if !scan::whole_process_exiting(child_pid) {
            let why = "the main thread exited before the other threads: no scan".to_string();
            scan_lines
                .borrow_mut()
                .push(format!("memleak: warning: {why}"));
            return scan::record_failure(&mut rec, child_pid, why);
        }
        let stopped = Stopped::traced(child_pid);
        let line = match scan::scan_into(&mut rec, follower.as_ref(), stopped, contents)? {
            Ok(line) => line,
            Err(why) => format!("memleak: warning: scan of pid {child_pid} failed: {why}"),
        };
        scan_lines.borrow_mut().push(line);
        Ok(())
    };

    if args.verbose && !args.pid.is_empty() {
        // Scripts (and tests) wait for this: from here on, what the
        // processes do is recorded.
        let pids: Vec<String> = args.pid.iter().map(u32::to_string).collect();
        say!("memleak: recording pid {}", pids.join(","));
    }
    let started = Instant::now();
    let poll = Duration::from_millis(args.poll_ms.max(1));
    let kill_after = args.kill_after.unwrap_or(DEFAULT_KILL_AFTER);
    let probes_on_pids = matches!(chosen, Chosen::Bpf(_)) && !args.pid.is_empty();
    let mut status = Status::new(status_line, args.duration, &pids, probes_on_pids);
    let mut live = args.interval().map(|every| {
        let start_ns = recorder.borrow_mut().meta_mut().start_ns;
        LiveReport::new(every, args.top.unwrap_or(10), args.count, start_ns).sampled(args.sample)
    });
    let mut exit: Option<Exit> = None;
    let mut stopping: Option<Stopping> = None;
    let mut suspending: Option<Suspending> = None;
    let mut last_lost = Instant::now();
    loop {
        let drained = drain(poll, false);
        if let Some(e) = failure.borrow_mut().take() {
            return Err(e.into());
        }
        drained?;
        {
            let mut rec = recorder.borrow_mut();
            if last_lost.elapsed() >= LOST_EVERY {
                // So that the checkpoints' meta.json counts the losses too,
                // should the recorder not live to write the final one.
                rec.set_lost(&lost(&probes, agent.as_ref()));
                if has_user_targets {
                    let tables = unwinder.as_ref().map(Unwinder::stats).unwrap_or_default();
                    rec.set_unwind(cfg.unwind, &unwind_ends(&probes, agent.as_ref()), tables);
                }
                last_lost = Instant::now();
            }
            if let Some(u) = &unwinder {
                for update in rec.take_table_updates() {
                    match update {
                        TableUpdate::Refresh(pid) => u.refresh(pid),
                        TableUpdate::Forget(pid) => u.forget(pid),
                    }
                }
            }
            rec.tick()?;
            status.update(&rec, probes.lost().iter().take(3).sum());
            if let (Some(live), Some(now)) = (&mut live, rec.outstanding()) {
                if live.due() {
                    status.clear();
                    live.print(now);
                }
            }
        }
        let signals = signals::stop_signals_received();
        let reports_done = live.as_ref().is_some_and(LiveReport::done);
        let time_up = args.duration.is_some_and(|d| started.elapsed() >= d) || reports_done;
        match &mut target {
            // The recording ends with the command: ask it to stop, and keep
            // recording until it has, so that its exit is in the trace.
            Target::Child(c) if !args.detach => {
                match &mut stopping {
                    None if signals > 0 || time_up => {
                        let why = match args.duration {
                            _ if reports_done => {
                                format!("after {} reports", args.count.unwrap_or(0))
                            }
                            Some(d) => format!("after --duration {}", format_duration(d)),
                            None => String::new(),
                        };
                        stopping = Some(Stopping::begin(c, signals, why));
                    }
                    None => {}
                    Some(s) => s.escalate(c, signals, kill_after),
                }
                c.poll(&mut on_stop, &mut on_exit, &mut on_fork, &mut on_maps)?;
                forget_ended(c);
                if suspending.is_none() {
                    suspending = Suspending::received(c);
                }
                if suspending
                    .as_ref()
                    .is_some_and(|s| s.settle(c, || status.clear()))
                {
                    suspending = None;
                }
                if let Some(e) = c.exit() {
                    // Followed processes got the signal too: wait for them.
                    if stopping.is_none() || !c.followed_running() {
                        exit = Some(e);
                        break;
                    }
                }
                if stopping.as_ref().is_some_and(Stopping::given_up) {
                    exit = c.exit();
                    break;
                }
            }
            _ if signals > 0 || time_up => break,
            Target::Pids(pids) => {
                if pids.iter().all(|&p| !process_alive(p)) {
                    break;
                }
            }
            Target::Child(c) => {
                c.poll(&mut on_stop, &mut on_exit, &mut on_fork, &mut on_maps)?;
                forget_ended(c);
                if let Some(e) = c.exit() {
                    exit = Some(e);
                    break;
                }
            }
            Target::KernelOnly => {}
        }
    }
    status.finish();
    let mut ending = None;
    if let Target::Child(c) = &mut target {
        if let Some(s) = &stopping {
            if exit.is_none() {
                c.abandon();
            }
            ending = Some(s.describe(c.pid, exit));
        } else if let Some(e @ Exit::Signal { .. }) = exit {
            // A death by signal is said, not just passed on as 128+N.
            ending = Some(format!("the command (pid {}) {e}", c.pid));
        } else if exit.is_none() {
            // --detach: no more stops for dlopen, then let go of it.
            probes.detach_dl_stops();
            if let Some(a) = &agent {
                a.borrow().shared.stop();
            }
            c.detach();
            ending = Some(format!(
                "--detach: the command (pid {}) keeps running",
                c.pid
            ));
        }
    }
    // -p --scan: stop each process, take the events it made up to then,
    // scan, let it go: an allocation between the last drain and the stop
    // is in the trace, and none can follow before the scan.
    if let (Target::Pids(pids), true) = (&target, scan_pids) {
        for &pid in pids {
            if !process_alive(pid) {
                let why = format!("process {pid} exited before the scan");
                scan_lines
                    .borrow_mut()
                    .push(format!("memleak: warning: {why}"));
                scan::record_failure(&mut recorder.borrow_mut(), pid, why)?;
                continue;
            }
            let stopped = Stopped::seize(pid);
            drain(Duration::ZERO, false)?;
            if let Some(e) = failure.borrow_mut().take() {
                return Err(e.into());
            }
            let mut rec = recorder.borrow_mut();
            let line = match stopped {
                Ok(stopped) => {
                    match scan::scan_into(&mut rec, follower.as_ref(), stopped, contents)? {
                        Ok(line) => line,
                        Err(why) => format!("memleak: warning: scan of pid {pid} failed: {why}"),
                    }
                }
                Err(e) => {
                    scan::record_failure(&mut rec, pid, e.to_string())?;
                    format!("memleak: warning: scan of pid {pid} failed: {e}")
                }
            };
            scan_lines.borrow_mut().push(line);
        }
    }
    // The injected agent's call sites are put back first: the process
    // runs on at its old speed, and nothing more comes into the ring.
    if let (true, Target::Pids(pids)) = (injected, &target) {
        for &pid in pids.iter().filter(|&&p| process_alive(p)) {
            if let Some(note) = super::inject::detach(pid, args.verbose) {
                recorder.borrow_mut().meta_mut().notes.push(note);
            }
        }
    }
    if let Some(a) = &agent {
        a.borrow().shared.stop();
    }
    // Whatever is still in the ring happened before we stopped: keep it.
    let command_gone = exit.is_some() || matches!(target, Target::Pids(_));
    drain(Duration::ZERO, command_gone)?;
    if let Some(e) = failure.borrow_mut().take() {
        return Err(e.into());
    }
    drop(rb);
    if let (true, Some(a)) = (injected, &agent) {
        // The memory stays mapped in the process; its pages go.
        if let Err(e) = a.borrow().shared.release_pages() {
            say!("memleak: warning: the agent's memory in the process could not be released: {e}");
        }
    }
    let mut rec = recorder.into_inner();
    rec.set_lost(&lost(&probes, agent.as_ref()));
    if let Some(a) = &agent {
        let a = a.borrow();
        if a.shared.unfinished() > 0 {
            rec.meta_mut()
                .counters
                .lost
                .insert("unfinished".into(), a.shared.unfinished());
        }
        if a.shared.corrupt() > 0 {
            let n = a.shared.corrupt();
            rec.meta_mut()
                .counters
                .lost
                .insert("corrupt_slot".into(), n);
        }
        let set_full = a.shared.lost()[memleak_recorder::agent::LOST_SAMPLE_SET];
        if set_full > 0 {
            rec.meta_mut()
                .counters
                .lost
                .insert("sample_set_full".into(), set_full);
        }
        if a.shared.sandboxed() > 0 {
            let note = format!(
                "{} process(es) installed a seccomp filter: from then on their agent made no \
                 system call (the recorder polled every millisecond, a writer that found the \
                 ring full spun for room; threads first seen then are named by their process, \
                 their stacks cut at the first frame, forks not recorded)",
                a.shared.sandboxed()
            );
            say!("memleak: note: {note}");
            rec.meta_mut().notes.push(note);
        }
        if a.shared.agents() == 0 {
            let note = "the agent did not start in the command (LD_PRELOAD ignored or \
                        cleared): nothing was recorded; record with --capture bpf"
                .to_string();
            say!("memleak: warning: {note}");
            rec.meta_mut().notes.push(note);
        }
    }
    // A process whose malloc was found only at its exit ran unrecorded:
    // a loss every report shows, not only a note.
    let unrecorded = search.borrow().found_at_exit();
    if !unrecorded.is_empty() {
        rec.meta_mut()
            .counters
            .lost
            .insert("unprobed_process".into(), unrecorded.len() as u64);
    }
    for note in unrecorded {
        say!("memleak: warning: {note}");
        rec.meta_mut().notes.push(note);
    }
    if has_user_targets {
        let tables = unwinder.as_ref().map(Unwinder::stats).unwrap_or_default();
        rec.set_unwind(cfg.unwind, &unwind_ends(&probes, agent.as_ref()), tables);
        if args.verbose && cfg.unwind.uses_rows() {
            say!(
                "memleak: unwind tables: {} objects, {} rows, {} process tables written, \
                 {:.1} ms building them",
                tables.objects,
                tables.rows,
                tables.tables_written,
                tables.build_ns as f64 / 1e6
            );
        }
    }
    if let Some(e) = unwinder.and_then(Unwinder::finish) {
        say!("memleak: warning: {e}");
        rec.meta_mut().notes.push(e);
    }
    let recursion = probes.recursion_misses();
    rec.meta_mut()
        .counters
        .lost
        .insert("recursion".into(), recursion.lost());
    if args.kernel || args.kernel_pid.is_some() {
        // Every event a later copy records is one the kernel skipped for the
        // first copy: more rescued than skipped would mean double records.
        rec.meta_mut().kernel_recursion = Some(KernelRecursion {
            first_copy_skips: recursion.first_copies,
            recorded_by_later_copies: recursion.rescued,
        });
    }
    Exit::store(exit, rec.meta_mut());
    // Our own CPU (consumer, Parquet, symbolization): the probes themselves
    // run in the target's context and are charged to it.
    let cpu_ns = self_cpu_ns();
    rec.meta_mut().recorder_cpu_ns = Some(cpu_ns);
    let stats = rec.stats().clone();
    let meta = rec.finish()?;
    if args.count_only {
        say!("memleak: count-only: {} probe hits", probes.hits());
    }
    if !args.quiet {
        if let Some(ending) = ending {
            say!("memleak: {ending}");
        }
        for line in scan_lines.borrow().iter() {
            // analyze's figures: the default suppressions applied and said.
            say!("{}", scan::closing_line(&args.output, line));
        }
    }
    // Even with -q: the trace is not what it seems.
    let losses = meta.counters.losses();
    if let Some(w) = losses.warning() {
        let advice = if losses.missing_of("ring_full") > 0 {
            ring_advice(probes::ring_size(args.ring_size))
        } else {
            String::new()
        };
        say!("memleak: warning: {w}{advice}");
    }
    if !args.quiet {
        let (elapsed, out) = (started.elapsed(), &args.output);
        say!(
            "{}",
            summary::figures(&stats, elapsed, cpu_ns, out, &meta.counters.lost)
        );
        say!("{}", summary::next_command(out));
    }
    // A shell's status for the command: its code, or 128 + the signal.
    Ok(match exit {
        Some(e) => ExitCode::from(e.shell_code().clamp(0, 255) as u8),
        None => ExitCode::SUCCESS,
    })
}

/// Puts ld.so's stops in `pid`'s own loader when that is not `ours` (by
/// inode), once per process and loader: `done` keeps where each process's
/// loader was mapped, which changes only at an exec, so that the stops
/// between (new threads, dlopen) read no maps. The uprobe programs must
/// be loaded. A loader without `_dl_debug_state` gets a warning, not an
/// error.
fn stops_in_own_loader(
    probes: &Probes<'_>,
    ours: Option<u64>,
    done: &mut HashMap<u32, u64>,
    pid: u32,
    notes: &mut Vec<String>,
) {
    use memleak_recorder::procmaps::{loader, loader_base, read_maps, resolve_in_process};
    let Some(base) = loader_base(pid) else {
        return;
    };
    if done.insert(pid, base) == Some(base) {
        return;
    }
    let Ok(maps) = read_maps(pid) else {
        return;
    };
    let Some(ld) = loader(pid, &maps) else {
        return;
    };
    if Some(ld.inode) == ours {
        return;
    }
    let Some(path) = ld.path.as_deref() else {
        return;
    };
    if let Err(e) = probes.attach_dl_stops(pid as i32, &resolve_in_process(pid, path)) {
        let note = format!(
            "process {pid}: no stop in its loader {path} ({e:#}): a library it loads later is \
             found at its exit"
        );
        say!("memleak: warning: {note}");
        notes.push(note);
    }
}

/// The loss counters by `LOST_REASONS` index: the probe's, and the
/// agent's.
fn lost(probes: &Probes<'_>, agent: Option<&RefCell<Agent>>) -> Vec<u64> {
    let agent = agent.map(|a| a.borrow().shared.lost());
    summed(probes.lost(), agent.as_ref().map(|l| &l[..]))
}

/// Stack walks by how they ended: the probe's counters, plus the agent's
/// records (the probe walks the stacks of processes without the agent).
fn unwind_ends(probes: &Probes<'_>, agent: Option<&RefCell<Agent>>) -> Vec<u64> {
    let agent = agent.map(|a| a.borrow());
    summed(
        probes.unwind_ends(),
        agent.as_ref().map(|a| a.shared.unwind_ends()),
    )
}

/// The probe's counters plus the agent's, index by index.
fn summed(mut probe: Vec<u64>, agent: Option<&[u64]>) -> Vec<u64> {
    for (n, a) in probe.iter_mut().zip(agent.unwrap_or_default()) {
        *n = n.saturating_add(*a);
    }
    probe
}

/// The libraries a command gets private copies of (super::private_libs):
/// libc and libstdc++, where the allocators are, unless
/// `--shared-libraries`. Bind mounts need root.
fn private_plan(args: &RecordArgs) -> Option<super::private_libs::Plan> {
    // SAFETY: geteuid has no preconditions.
    if args.shared_libraries || unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let mut libs: Vec<PathBuf> = targets::find_library(std::process::id(), "libc.so")
        .into_iter()
        .collect();
    libs.extend(targets::system_cxx_library());
    Some(super::private_libs::Plan::new(&libs))
}

/// Objects whose unwind rows a recording will need first: for a command,
/// its executable, libc, libstdc++ and ld.so (those of this system); for
/// running processes, their executable mappings.
fn prefetch_paths(pids: &[u32], argv: &[String]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for &pid in pids {
        for m in memleak_recorder::procmaps::read_maps(pid).unwrap_or_default() {
            if m.perms.contains('x') && m.is_file() {
                let p = memleak_recorder::procmaps::resolve_in_process(
                    pid,
                    m.path.as_deref().unwrap_or_default(),
                );
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
    }
    if let Some(cmd) = argv.first() {
        let exe = if cmd.contains('/') {
            Some(PathBuf::from(cmd))
        } else {
            find_in_path(cmd)
        };
        let me = std::process::id();
        // libstdc++ only for a program linked with it (its name is in the
        // dynamic string table): it is the largest of them.
        let cxx = exe.as_ref().is_some_and(|p| {
            memleak_recorder::elf::ElfFile::open(p).is_ok_and(|elf| {
                elf.section(".dynstr")
                    .is_some_and(|s| s.bytes.windows(9).any(|w| w == b"libstdc++"))
            })
        });
        out.extend(exe);
        out.extend(targets::find_library(me, "libc.so"));
        if cxx {
            out.extend(targets::system_cxx_library());
        }
        out.extend(targets::find_library(me, "ld-linux"));
    }
    out
}

/// Where a command name without a slash is found in PATH, as execvp
/// looks for it.
fn find_in_path(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(cmd))
            .find(|p| p.is_file())
    })
}

fn self_cpu_ns() -> u64 {
    // SAFETY: getrusage fills the struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn process_alive(pid: u32) -> bool {
    !memleak_recorder::procmaps::gone(pid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::args::parse_ring_size;

    #[test]
    fn the_ring_advice_names_a_ring_four_times_as_large() {
        assert_eq!(
            ring_advice(probes::ring_size(4 << 10)),
            "; record with --ring-size 256k (4 times the 64 KiB used) to lose fewer"
        );
        assert_eq!(
            ring_advice(64 << 20),
            "; record with --ring-size 256M (4 times the 64 MiB used) to lose fewer"
        );
        assert_eq!(
            ring_advice(512 << 20),
            "; record with --ring-size 1G (2 times the 512 MiB used) to lose fewer"
        );
        assert_eq!(
            ring_advice(1 << 30),
            " (the ring buffer was at its 1 GiB maximum)"
        );
        // What it names, --ring-size takes.
        assert_eq!(parse_ring_size("256k"), Ok(256 << 10));
        assert_eq!(parse_ring_size("1G"), Ok(1 << 30));
    }
}
