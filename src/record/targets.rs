//! Where `memleak record` puts the allocator probes of its targets: in
//! the objects each process's calls really bind to
//! (`memleak_recorder::providers`), with warnings for what cannot be
//! probed.

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use memleak_recorder::placement::Policy;
use memleak_recorder::providers::{Allocators, Search};
use memleak_recorder::targets::{self, LibraryProbes, CXX_ALLOCATORS, C_ALLOCATORS};

use super::args::{Placement, RecordArgs};
use super::probes::Probes;

/// The placement `--probe-placement` asks for.
pub fn placement_policy(args: &RecordArgs) -> Policy {
    match args.probe_placement {
        Placement::Auto => Policy::Auto,
        Placement::Entry => Policy::Entry,
    }
}

/// With `-v`: where each probe of `lib` goes, and what it lacks.
pub fn show_probes(lib: &LibraryProbes, verbose: bool) {
    if !verbose {
        return;
    }
    for p in &lib.points {
        say!(
            "memleak: probe {}:{} at +{:#x} ({})",
            lib.path.display(),
            p.symbol,
            p.probe_offset - p.entry_offset,
            p.note
        );
    }
    for m in &lib.missing {
        say!("memleak: {} has no {m}; skipped", lib.path.display());
    }
}

/// The libraries to probe in `pid` before recording starts. A running
/// process (`-p`) is probed where its allocator functions really are (see
/// `memleak_recorder::providers`). A command is not running yet: libc and
/// libstdc++ are probed, and [`add_providers`] adds the allocator the
/// program turns out to use, at its exec and once ld.so has loaded it.
pub fn libraries_for(
    pid: u32,
    launched: bool,
    object: Option<&PathBuf>,
    args: &RecordArgs,
    search: &mut Allocators,
    notes: &mut Vec<String>,
) -> Result<Vec<LibraryProbes>> {
    let placement = placement_policy(args);
    let user_heap = object.is_some() || !args.symbols_prefix.is_empty();
    let found = match launched {
        true => None,
        false => providers_of_running(pid, search, args, notes)?,
    };
    let mut out = Vec::new();
    // In -c mode the child will run our libc (same system), seen through
    // its root: the private copy when it has one (super::private_libs).
    let in_child = |p: PathBuf| match launched {
        true => super::private_libs::as_seen_by(pid, &std::fs::canonicalize(&p).unwrap_or(p)),
        false => p,
    };
    let libc = targets::find_library(if launched { std::process::id() } else { pid }, "libc.so")
        .map(in_child);
    if found.is_none() || user_heap {
        let heap_lib = object.cloned().or_else(|| libc.clone()).with_context(|| {
            format!("process {pid} has no libc mapped; use -O to name its allocator library")
        })?;
        let heap = targets::resolve(&heap_lib, C_ALLOCATORS, &args.symbols_prefix, placement)
            .map_err(anyhow::Error::msg)?;
        if heap.points.is_empty() {
            bail!(
                "{}: none of the allocator functions found (symbols prefix {:?})",
                heap_lib.display(),
                args.symbols_prefix
            );
        }
        out.push(heap);
    }
    if let Some(found) = found {
        out.extend(found);
        return Ok(out);
    }
    // Mappings and the allocating wrappers are libc's even when -O names
    // another allocator.
    if let Some(path) = libc {
        let funcs = [targets::C_MAPPINGS, targets::C_WRAPPERS].concat();
        out.push(targets::resolve(&path, &funcs, "", placement).map_err(anyhow::Error::msg)?);
    }
    let cxx = if launched {
        targets::system_cxx_library().map(in_child)
    } else {
        targets::find_library(pid, "libstdc++.so")
            .or_else(|| targets::find_library(pid, "libc++.so"))
    };
    if let Some(path) = cxx {
        let lib =
            targets::resolve(&path, CXX_ALLOCATORS, "", placement).map_err(anyhow::Error::msg)?;
        if !lib.points.is_empty() {
            out.push(lib);
        }
    }
    Ok(out)
}

/// The probes a running process needs, from its link map or its static
/// executable; `None` when that cannot be read (a warning says so) and
/// libc is probed as it is found in the maps. Fails when its malloc cannot
/// be probed and nothing else (`--kernel`) is recorded.
fn providers_of_running(
    pid: u32,
    search: &mut Allocators,
    args: &RecordArgs,
    notes: &mut Vec<String>,
) -> Result<Option<Vec<LibraryProbes>>> {
    // Inside dlopen or dlclose the list is being changed: wait a little.
    let deadline = Instant::now() + Duration::from_millis(200);
    let found = loop {
        let found = search.update(pid);
        if found.search != Search::NotReady || Instant::now() > deadline {
            break found;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    if let (Some(why), false) = (&found.no_malloc, args.kernel || args.kernel_pid.is_some()) {
        bail!("{why}");
    }
    report(&found.warnings, &found.notes, notes, args.verbose);
    match found.search {
        Search::Ready => Ok(Some(found.libs)),
        Search::NotReady => {
            report(
                &[format!(
                    "the link map of pid {pid} kept changing: allocators other than libc's are not probed"
                )],
                &[],
                notes,
                args.verbose,
            );
            Ok(None)
        }
        Search::Failed(_) => Ok(None),
    }
}

/// Prints warnings (always) and notes (with `-v`), and keeps both for the
/// trace's meta.json.
fn report(warnings: &[String], found: &[String], notes: &mut Vec<String>, verbose: bool) {
    for w in warnings {
        say!("memleak: warning: {w}");
        notes.push(w.clone());
    }
    for n in found {
        if verbose {
            say!("memleak: {n}");
        }
        notes.push(n.clone());
    }
}

/// Attaches the allocator probes `pid` needs now that were not attached
/// yet: its static executable's after an exec, a preloaded allocator's
/// once ld.so has loaded it. `fatal` (the command's first exec, with
/// nothing else recorded): a malloc that cannot be probed, or a probe that
/// cannot be attached, ends the recording; otherwise it is a warning.
pub fn add_providers(
    probes: &Probes<'_>,
    search: &RefCell<Allocators>,
    pid: u32,
    libs: &RefCell<Vec<LibraryProbes>>,
    notes: &mut Vec<String>,
    args: &RecordArgs,
    fatal: bool,
) -> Result<()> {
    let found = search.borrow_mut().update(pid);
    if let (Some(why), true) = (&found.no_malloc, fatal) {
        bail!("{why}");
    }
    report(&found.warnings, &found.notes, notes, args.verbose);
    for lib in found.libs {
        show_probes(&lib, args.verbose);
        match probes.attach_library(pid as i32, &lib) {
            Ok(()) => libs.borrow_mut().push(lib),
            Err(e) if fatal => return Err(e),
            Err(e) => report(&[format!("{e:#}: not probed")], &[], notes, args.verbose),
        }
    }
    Ok(())
}
