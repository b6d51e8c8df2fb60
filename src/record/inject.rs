//! `--capture inject`: memleak's agent into a running process at the
//! start of the recording, and its call sites put back at the end. The
//! ptrace work is [`memleak_recorder::inject`]'s; this is its place in a
//! recording: the shared memory, the unwind table the agent walks stacks
//! with (written before any call is recorded), and what is said.

use std::time::Instant;

use anyhow::{anyhow, Result};
use memleak_recorder::agent::{Config, Shared};
use memleak_recorder::inject::{self, Process};

use super::capture::{Agent, BothTables};
use super::probes::Probes;
use super::unwinder::Unwinder;

/// Injects the agent into `pid` and attaches it to a new shared memory.
/// The process's thread that makes the calls is held until the memory
/// is ready, the agent may record in the process, and its unwind table
/// is written.
pub fn attach(
    pid: u32,
    cfg: &Config,
    unwinder: Option<&Unwinder>,
    probes: &Probes<'_>,
    verbose: bool,
) -> Result<Agent> {
    let refused =
        |e: inject::InjectError| anyhow!("--capture inject: {e}; record with --capture bpf");
    let started = Instant::now();
    let process = Process::inspect(pid).map_err(refused)?;
    let again = process.has_agent();
    let maps = match unwinder {
        Some(_) => probes.unwind_maps()?,
        None => None,
    };
    let (shared, done) = inject::attach(&process, Agent::image(), |fd| {
        let mut shared = Shared::create_on(fd, cfg)?;
        shared.ready()?;
        shared.add_pid(pid);
        if let Some(u) = unwinder {
            match maps {
                Some(maps) => u.set_sink(Box::new(BothTables(shared.sink(), maps))),
                None => u.set_sink(Box::new(shared.sink())),
            }
            u.track(pid);
        }
        Ok(shared)
    })
    .map_err(refused)?;
    if verbose {
        say!(
            "memleak: agent {} process {pid}: {} call sites patched in {:.1} ms",
            if again {
                "attached again in"
            } else {
                "injected into"
            },
            done.sites,
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(Agent::injected(shared))
}

/// Puts the call sites of the agent in `pid` back. A failure is said,
/// not fatal: the recording is kept, and the agent, told to stop, only
/// passes the calls through. Returns a note for the trace when the
/// recording of the process ended before the detach.
pub fn detach(pid: u32, verbose: bool) -> Option<String> {
    let started = Instant::now();
    match inject::detach(pid, Agent::image()) {
        Ok(Some(n)) if verbose => say!(
            "memleak: agent detached from process {pid}: {n} call sites restored in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        ),
        Ok(Some(_)) => {}
        Ok(None) => {
            let note = format!(
                "process {pid} executed another program during the recording: the agent \
                 went with the old one, and its allocations end at the exec"
            );
            say!("memleak: note: {note}");
            return Some(note);
        }
        Err(e) => say!(
            "memleak: warning: the agent could not be detached from process {pid} ({e}): \
             it stays, recording nothing"
        ),
    }
    None
}
