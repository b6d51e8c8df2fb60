//! Loading and attaching the BPF program: the only module that touches
//! libbpf. Everything it hands out is plain data (ring-buffer bytes, loss
//! counters), consumed by `memleak_recorder`.

use std::collections::{HashMap, HashSet};
use std::mem::MaybeUninit;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{
    Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder, TracepointCategory,
    UprobeMultiOpts,
};
use memleak_recorder::event::MAX_FRAMES;
use memleak_recorder::targets::{LibraryProbes, ProbeMode};
use memleak_recorder::unwind::{ProcTable, Row, UnwindSink, WalkMode};
use memleak_trace::EventKind;

mod skel {
    #![allow(
        clippy::all,
        missing_docs,
        dead_code,
        unused_imports,
        non_camel_case_types
    )]
    include!(concat!(env!("OUT_DIR"), "/memleak.skel.rs"));
}

use skel::{MemleakSkel, MemleakSkelBuilder};

/// The ring buffer's size for `--ring-size requested`: a power of two
/// (the kernel wants one), at least 64 KiB.
pub fn ring_size(requested: u32) -> u32 {
    requested.next_power_of_two().max(1 << 16)
}

/// Load-time settings of the probes.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    pub min_size: u64,
    pub max_size: u64,
    pub stack_depth: u32,
    pub ring_bytes: u32,
    pub kernel_tgid: u32,
    pub kernel_stacks: bool,
    /// Benchmark floor: attach counting programs instead of the recorder's.
    pub count_only: bool,
    /// Load the kernel allocator programs (`--kernel`).
    pub kernel: bool,
    /// How user stacks are walked (`--unwind`).
    pub unwind: WalkMode,
    /// The agent records the allocator calls: the uprobe programs and the
    /// row array are loaded only for a process that runs without it.
    pub agent: bool,
}

/// The slab and page tracepoints, attached BTF-typed (see memleak.bpf.c),
/// in the order of `slab_programs!`.
const SLAB_TRACEPOINTS: [&str; 9] = [
    "kmalloc",
    "kfree",
    "kmem_cache_alloc",
    "kmem_cache_free",
    "mm_page_alloc",
    "mm_page_free",
    // Kernels before 6.1: kmem_cache_alloc's older arguments, and the
    // _node tracepoints merged since.
    "kmem_cache_alloc",
    "kmalloc_node",
    "kmem_cache_alloc_node",
];

/// The three copies of each slab and page program, in the order of
/// `SLAB_TRACEPOINTS` (`slab_programs!(progs)` or `(progs, mut)`).
macro_rules! slab_programs {
    ($p:expr $(, $m:ident)?) => {
        [
            [&$($m)? $p.on_kmalloc, &$($m)? $p.on_kmalloc_nested, &$($m)? $p.on_kmalloc_nested2],
            [&$($m)? $p.on_kfree, &$($m)? $p.on_kfree_nested, &$($m)? $p.on_kfree_nested2],
            [
                &$($m)? $p.on_kmem_cache_alloc,
                &$($m)? $p.on_kmem_cache_alloc_nested,
                &$($m)? $p.on_kmem_cache_alloc_nested2,
            ],
            [
                &$($m)? $p.on_kmem_cache_free,
                &$($m)? $p.on_kmem_cache_free_nested,
                &$($m)? $p.on_kmem_cache_free_nested2,
            ],
            [&$($m)? $p.on_page_alloc, &$($m)? $p.on_page_alloc_nested, &$($m)? $p.on_page_alloc_nested2],
            [&$($m)? $p.on_page_free, &$($m)? $p.on_page_free_nested, &$($m)? $p.on_page_free_nested2],
            [
                &$($m)? $p.on_kmem_cache_alloc_legacy,
                &$($m)? $p.on_kmem_cache_alloc_legacy_nested,
                &$($m)? $p.on_kmem_cache_alloc_legacy_nested2,
            ],
            [&$($m)? $p.on_kmalloc_node, &$($m)? $p.on_kmalloc_node_nested, &$($m)? $p.on_kmalloc_node_nested2],
            [
                &$($m)? $p.on_kmem_cache_alloc_node,
                &$($m)? $p.on_kmem_cache_alloc_node_nested,
                &$($m)? $p.on_kmem_cache_alloc_node_nested2,
            ],
        ]
    };
}

/// Whether the slab tracepoints have their pre-6.1 shape (there is a
/// kmalloc_node tracepoint).
fn legacy_slab() -> bool {
    btf_has_name("btf_trace_kmalloc_node") == Some(true)
}

/// Whether the programs for `SLAB_TRACEPOINTS[i]` apply to this kernel,
/// and whether its absence is worth a note (the pre-6.1 ones are absent
/// from current kernels by design).
fn slab_entry(i: usize) -> (bool, bool) {
    let name = SLAB_TRACEPOINTS[i];
    let present = has_kmem_tracepoint(name);
    match i {
        2 => (present && !legacy_slab(), !legacy_slab()),
        6 => (present && legacy_slab(), false),
        7 | 8 => (present, false),
        _ => (present, true),
    }
}

/// Whether the kernel's BTF names `name` (None if there is no BTF). The
/// string section is read into a set once: startup makes two dozen
/// lookups, and scanning the whole file for each one was most of its time.
fn btf_has_name(name: &str) -> Option<bool> {
    static NAMES: std::sync::OnceLock<Option<HashSet<Vec<u8>>>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| btf_strings(&std::fs::read("/sys/kernel/btf/vmlinux").ok()?));
    names.as_ref().map(|n| n.contains(name.as_bytes()))
}

/// The strings of a BTF blob (header: magic 0xeb9f, version, flags,
/// hdr_len, type_off, type_len, str_off, str_len).
fn btf_strings(btf: &[u8]) -> Option<HashSet<Vec<u8>>> {
    let u32_at = |off: usize| Some(u32::from_le_bytes(btf.get(off..off + 4)?.try_into().ok()?));
    if btf.get(..2)? != [0x9f, 0xeb] {
        return None;
    }
    let start = u32_at(4)? as usize + u32_at(16)? as usize;
    let strings = btf.get(start..start + u32_at(20)? as usize)?;
    Some(strings.split(|&b| b == 0).map(<[u8]>::to_vec).collect())
}

/// Whether this kernel has tracepoint kmem:`name`, by its BTF type
/// (`btf_trace_<name>`): a BTF tracepoint program for a missing one would
/// fail the whole object's load. `MEMLEAK_PRETEND_MISSING_TRACEPOINTS`
/// (comma-separated names) lets the tests exercise a kernel without some.
fn has_kmem_tracepoint(name: &str) -> bool {
    let pretend = std::env::var("MEMLEAK_PRETEND_MISSING_TRACEPOINTS").unwrap_or_default();
    if pretend.split(',').any(|p| p.trim() == name) {
        return false;
    }
    // Without BTF we cannot tell; let the attach decide.
    btf_has_name(&format!("btf_trace_{name}")).unwrap_or(true)
}

/// Kernel events the kernel did not let a program see.
pub struct Recursion {
    /// Skips of the first copy of a slab or page program.
    pub first_copies: u64,
    /// Skips of the other programs, which have no second copy.
    pub others: u64,
    /// Events the later copies recorded: each was a skip of a first copy.
    pub rescued: u64,
}

impl Recursion {
    /// Events no program recorded.
    pub fn lost(&self) -> u64 {
        self.first_copies.saturating_sub(self.rescued) + self.others
    }
}

/// The loaded program and its attachments.
pub struct Probes<'obj> {
    skel: MemleakSkel<'obj>,
    /// With the agent, a second instance of the program with the uprobe
    /// programs and the row array, sharing every other map with `skel`:
    /// loaded when a process first runs without the agent, which most
    /// recordings never see. Verifying those programs takes ~24 ms and
    /// the row array is 32 MiB to allocate, map and free: together about
    /// 12 ns per event of the recorder's CPU with four threads of
    /// `bench/alloc_pairs.c` (4 M events).
    uprobes: std::cell::OnceCell<MemleakSkel<'obj>>,
    /// The storage of `uprobes` until it is loaded.
    uprobes_storage: std::cell::RefCell<Option<&'obj mut MaybeUninit<OpenObject>>>,
    cfg: ProbeConfig,
    links: std::cell::RefCell<Vec<Link>>,
    /// The allocator probes of each process, by pid: a followed child's
    /// go when it exits (see [`Probes::forget_process`]).
    proc_links: std::cell::RefCell<HashMap<u32, Vec<Link>>>,
    /// The `_dl_debug_state` stops, by pid, apart: they must go before a
    /// child is detached, or it would stop for real at its next dlopen.
    dl_links: std::cell::RefCell<HashMap<u32, Vec<Link>>>,
    /// Drops the links of exited processes, off the recorder's thread.
    reaper: LinkReaper,
}

/// Which programs and maps an instance of the program has.
enum Part<'a, 'obj> {
    /// A recording with the probes: everything it uses.
    Everything,
    /// A recording with the agent: no uprobe program, a one-row array.
    WithoutUprobes,
    /// The uprobe programs and the row array; every other map is the
    /// given instance's, so that both see the same state and ring.
    UprobesOnly(&'a MemleakSkel<'obj>),
}

/// Sets which uprobe programs (the allocators', and ld.so's stops) are
/// loaded: none without `on`, else the recording ones or, with
/// `count_only`, the counting ones (the other mode's are not verified).
fn choose_uprobes(p: &mut skel::OpenMemleakProgs<'_>, on: bool, count_only: bool) {
    for prog in [
        &mut p.alloc_session,
        &mut p.malloc_session,
        &mut p.free_entry,
        &mut p.munmap_entry,
    ] {
        prog.set_autoload(on && !count_only);
    }
    for prog in [&mut p.count_session, &mut p.count_entry] {
        prog.set_autoload(on && count_only);
    }
    p.dl_state.set_autoload(on);
}

fn open<'obj>(
    object: &'obj mut MaybeUninit<OpenObject>,
    cfg: &ProbeConfig,
    part: Part<'_, '_>,
) -> Result<skel::OpenMemleakSkel<'obj>> {
    let open = MemleakSkelBuilder::default()
        .open(object)
        .map_err(explain_bpf_error)
        .context("opening the BPF object")?;
    let mut open = open;
    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata exists");
    ro.min_size = cfg.min_size;
    ro.max_size = cfg.max_size;
    ro.stack_bytes = cfg.stack_depth.clamp(1, MAX_FRAMES) * 8;
    ro.wakeup_bytes = u64::from(cfg.ring_bytes / 4);
    ro.kernel_tgid = cfg.kernel_tgid;
    ro.self_tgid = std::process::id();
    ro.kernel_stacks = cfg.kernel_stacks;
    ro.ck_tag = u64::from(cookie_tag()) << 56;
    ro.unwind_mode = cfg.unwind.code();
    // Kernel programs are verified only when used: loading costs time.
    let p = &mut open.progs;
    let slab = slab_programs!(p, mut);
    for (i, copies) in slab.into_iter().enumerate() {
        // Only --kernel reads the BTF.
        let wanted = cfg.kernel && slab_entry(i).0;
        for prog in copies {
            prog.set_autoload(wanted);
        }
    }
    for prog in [&mut p.on_percpu_alloc, &mut p.on_percpu_free] {
        prog.set_autoload(cfg.kernel);
    }
    let calibrate = cfg.kernel && has_kmem_tracepoint("mm_page_alloc");
    p.calib_page.set_autoload(calibrate);
    p.calib_pfn.set_autoload(calibrate);
    choose_uprobes(p, !matches!(part, Part::WithoutUprobes), cfg.count_only);
    // Maps only --kernel uses are shrunk to one entry otherwise: the
    // kernel objects' LRU map and the slab programs' per-CPU tokens are
    // preallocated, megabytes whose allocation shows in start-up.
    if !cfg.kernel {
        for map in [&mut open.maps.kobjs, &mut open.maps.tokens] {
            map.set_max_entries(1).context("sizing a kernel-mode map")?;
        }
    }
    // The unwind tables only when stacks are walked with rows (the
    // row array is 32 MiB).
    if !cfg.unwind.uses_rows() || cfg.count_only {
        for map in [&mut open.maps.unwind_rows, &mut open.maps.unwind_procs] {
            map.set_max_entries(1).context("sizing an unwind map")?;
        }
    }
    let ring = ring_size(cfg.ring_bytes);
    open.maps
        .events
        .set_max_entries(ring)
        .context("sizing the ring buffer")?;
    // For development: the verifier's statistics (time, instructions
    // processed) of the two programs that walk stacks.
    if std::env::var_os("MEMLEAK_VERIFIER_STATS").is_some() {
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, |_, msg| {
            if msg.contains("verification time") || msg.contains("processed") {
                eprint!("{msg}");
            }
        })));
        open.progs.malloc_session.set_log_level(4);
        open.progs.alloc_session.set_log_level(4);
    }
    match part {
        Part::Everything => {}
        Part::WithoutUprobes => {
            open.maps
                .unwind_rows
                .set_max_entries(1)
                .context("sizing an unwind map")?;
        }
        Part::UprobesOnly(first) => {
            use std::os::fd::AsFd;
            for mut prog in open.open_object_mut().progs_mut() {
                prog.set_autoload(false);
            }
            choose_uprobes(&mut open.progs, true, cfg.count_only);
            // Every map but the row array is the first instance's, the
            // read-only data too: frozen there with the same settings, it
            // is what the verifier reads (the values set above are not
            // written).
            for mut map in open.open_object_mut().maps_mut() {
                let name = map.name().to_owned();
                if name == "unwind_rows" {
                    continue;
                }
                let shared = first
                    .object()
                    .maps()
                    .find(|m| m.name() == name)
                    .with_context(|| format!("the first instance has no map {name:?}"))?;
                map.reuse_fd(shared.as_fd())
                    .with_context(|| format!("sharing the map {name:?}"))?;
            }
        }
    }
    Ok(open)
}

/// Detaching a uprobe link (or a perf-event tracepoint's: the lifecycle
/// and kernel programs are BTF tracepoints where they can be, whose links
/// go without waiting) waits for RCU grace periods (100-180 ms here); one
/// after the other they kept a finished recording alive for a noticeable
/// time, so they are detached in parallel.
fn drop_links(links: Vec<Link>) {
    std::thread::scope(|s| {
        for link in links {
            s.spawn(move || drop(link));
        }
    });
}

/// A thread that drops the links of processes that exited: each is an open
/// file, and a link per allocator program and process made a command
/// that runs a few thousand programs (a shell script, a build) fail with
/// EMFILE; each drop also waits for a grace period, which the recorder's
/// thread must not. What is queued when the thread sees it goes at once,
/// in parallel, as at the end of a recording.
struct LinkReaper {
    tx: Option<std::sync::mpsc::Sender<Vec<Link>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LinkReaper {
    /// Starts the thread.
    fn start() -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<Link>>();
        let thread = std::thread::Builder::new()
            .name("memleak-links".into())
            .spawn(move || {
                while let Ok(mut links) = rx.recv() {
                    while let Ok(more) = rx.try_recv() {
                        links.extend(more);
                    }
                    drop_links(links);
                }
            });
        match thread {
            Ok(t) => LinkReaper {
                tx: Some(tx),
                thread: Some(t),
            },
            // No thread: the links are dropped where they are given.
            Err(_) => LinkReaper {
                tx: None,
                thread: None,
            },
        }
    }

    fn reap(&self, links: Vec<Link>) {
        if links.is_empty() {
            return;
        }
        match &self.tx {
            Some(tx) => {
                if let Err(std::sync::mpsc::SendError(links)) = tx.send(links) {
                    drop_links(links);
                }
            }
            None => drop_links(links),
        }
    }

    /// Waits for the queued drops.
    fn finish(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Probes<'_> {
    fn drop(&mut self) {
        let mut links = std::mem::take(self.links.get_mut());
        for (_, l) in self.proc_links.get_mut().drain() {
            links.extend(l);
        }
        for (_, l) in self.dl_links.get_mut().drain() {
            links.extend(l);
        }
        self.reaper.reap(links);
        self.reaper.finish();
    }
}

impl<'obj> Probes<'obj> {
    /// Loads the program. With the agent (`cfg.agent`) the uprobe
    /// programs wait in `late` until [`load_uprobes`](Self::load_uprobes).
    pub fn load(
        object: &'obj mut MaybeUninit<OpenObject>,
        late: &'obj mut MaybeUninit<OpenObject>,
        cfg: &ProbeConfig,
    ) -> Result<Self> {
        // BPF memory is charged to the memory cgroup on current kernels; an
        // RLIMIT_MEMLOCK that cannot be raised is harmless, so ignore it.
        let unlimited = libc::rlimit {
            rlim_cur: libc::RLIM_INFINITY,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: plain syscall with a valid pointer.
        let _ = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
        let part = match cfg.agent {
            true => Part::WithoutUprobes,
            false => Part::Everything,
        };
        let skel = open(object, cfg, part)?
            .load()
            .map_err(explain_bpf_error)
            .context("loading the BPF program")?;
        Ok(Probes {
            skel,
            uprobes: Default::default(),
            uprobes_storage: std::cell::RefCell::new(cfg.agent.then_some(late)),
            cfg: cfg.clone(),
            links: Default::default(),
            proc_links: Default::default(),
            dl_links: Default::default(),
            reaper: LinkReaper::start(),
        })
    }

    /// Loads the uprobe programs if they wait (see `Probes::uprobes`).
    /// Returns whether this call loaded them: the row array is new, and
    /// the unwind tables must be written to it (`unwind_maps`).
    pub fn load_uprobes(&self) -> Result<bool> {
        let Some(storage) = self.uprobes_storage.borrow_mut().take() else {
            return Ok(false);
        };
        let skel = open(storage, &self.cfg, Part::UprobesOnly(&self.skel))?
            .load()
            .map_err(explain_bpf_error)
            .context("loading the BPF program's uprobes")?;
        let _ = self.uprobes.set(skel);
        Ok(true)
    }

    /// The instance with the uprobe programs, loaded if need be.
    fn with_uprobes(&self) -> Result<&MemleakSkel<'obj>> {
        if !self.cfg.agent {
            return Ok(&self.skel);
        }
        self.load_uprobes()?;
        self.uprobes
            .get()
            .context("the BPF program's uprobes failed to load before")
    }

    /// Attaches the allocator probes of one library for `pid` (-1: every
    /// process). Session probes and entry-only probes are one link each.
    pub fn attach_library(&self, pid: i32, lib: &LibraryProbes) -> Result<()> {
        // One link per program: malloc has its own session program, one
        // more serves the other allocators (the attach cookie says which),
        // and free and munmap have an entry program each.
        let malloc = EventKind::Malloc as u8;
        let progs = &self.with_uprobes()?.progs;
        let groups = [
            (ProbeMode::Session, Some(malloc), &progs.malloc_session),
            (ProbeMode::Session, None, &progs.alloc_session),
            (
                ProbeMode::EntryOnly,
                Some(EventKind::Free as u8),
                &progs.free_entry,
            ),
            (
                ProbeMode::EntryOnly,
                Some(EventKind::Munmap as u8),
                &progs.munmap_entry,
            ),
        ];
        for (mode, cookie, recording) in groups {
            let points: Vec<_> = lib
                .points
                .iter()
                .filter(|p| {
                    p.func.mode == mode
                        && match cookie {
                            Some(c) => p.func.cookie == c,
                            None => p.func.cookie != malloc,
                        }
                })
                .collect();
            if points.is_empty() {
                continue;
            }
            let opts = UprobeMultiOpts {
                offsets: points.iter().map(|p| p.probe_offset as usize).collect(),
                cookies: points.iter().map(|p| u64::from(p.func.cookie)).collect(),
                session: mode == ProbeMode::Session,
                ..Default::default()
            };
            let prog = match (mode, self.cfg.count_only) {
                (_, false) => recording,
                (ProbeMode::Session, true) => &progs.count_session,
                (ProbeMode::EntryOnly, true) => &progs.count_entry,
            };
            let link = prog
                .attach_uprobe_multi_with_opts(pid, &lib.path, "", opts)
                .map_err(explain_bpf_error)
                .with_context(|| format!("attaching uprobes to {}", lib.path.display()))?;
            self.proc_links
                .borrow_mut()
                .entry(pid as u32)
                .or_default()
                .push(link);
        }
        Ok(())
    }

    /// Stops the (ptraced) threads of `pid` whenever ld.so changes its list
    /// of loaded objects, so the caller can snapshot the maps before a
    /// dlclose unmaps a library. Only for a ptraced child: anyone else
    /// would really be stopped.
    pub fn attach_dl_stops(&self, pid: i32, ld_so: &Path) -> Result<()> {
        let link = self
            .with_uprobes()?
            .progs
            .dl_state
            .attach_uprobe_multi_with_opts(
                pid,
                ld_so,
                "_dl_debug_state",
                UprobeMultiOpts::default(),
            )
            .map_err(explain_bpf_error)
            .with_context(|| format!("attaching to {}:_dl_debug_state", ld_so.display()))?;
        self.dl_links
            .borrow_mut()
            .entry(pid as u32)
            .or_default()
            .push(link);
        Ok(())
    }

    /// Removes the stops of [`attach_dl_stops`](Self::attach_dl_stops):
    /// once this returns, no new SIGSTOP is sent.
    pub fn detach_dl_stops(&self) {
        let links = std::mem::take(&mut *self.dl_links.borrow_mut());
        drop_links(links.into_values().flatten().collect());
    }

    /// Records exec/exit/fork of traced processes.
    pub fn attach_lifecycle(&mut self) -> Result<()> {
        let p = &self.skel.progs;
        for (prog, name) in [
            (&p.on_exec, "sched_process_exec"),
            (&p.on_exit, "sched_process_exit"),
            (&p.on_fork, "sched_process_fork"),
        ] {
            let link = prog
                .attach()
                .with_context(|| format!("attaching sched:{name}"))?;
            self.links.borrow_mut().push(link);
        }
        Ok(())
    }

    /// Attaches the kernel allocator tracepoints. Returns notes about the
    /// ones this kernel lacks; fails only if none could be attached.
    pub fn attach_kernel(&mut self, percpu: bool) -> Result<Vec<String>> {
        let p = &self.skel.progs;
        let mut notes = Vec::new();
        let mut attached = 0;
        let slab = slab_programs!(p);
        for (i, copies) in slab.into_iter().enumerate() {
            let name = SLAB_TRACEPOINTS[i];
            let (wanted, noted) = slab_entry(i);
            if !wanted {
                if noted {
                    notes.push(format!(
                        "tracepoint kmem:{name} does not exist on this kernel; not recorded"
                    ));
                }
                continue;
            }
            // All copies or none: the later ones alone record nothing.
            match copies
                .iter()
                .map(|prog| prog.attach())
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(links) => {
                    self.links.borrow_mut().extend(links);
                    attached += 1;
                }
                Err(e) => notes.push(format!(
                    "tracepoint kmem:{name} unavailable ({e}); not recorded"
                )),
            }
        }
        let mut list = vec![];
        if percpu {
            list.push((
                &p.on_percpu_alloc,
                TracepointCategory::Percpu,
                "percpu_alloc_percpu",
            ));
            list.push((
                &p.on_percpu_free,
                TracepointCategory::Percpu,
                "percpu_free_percpu",
            ));
        }
        for (prog, cat, name) in list {
            match prog.attach_tracepoint(cat.clone(), name) {
                Ok(link) => {
                    self.links.borrow_mut().push(link);
                    attached += 1;
                }
                Err(e) => notes.push(format!(
                    "tracepoint {}:{name} unavailable ({e}); not recorded",
                    cat.as_ref()
                )),
            }
        }
        if attached == 0 {
            bail!("no kernel allocation tracepoint could be attached");
        }
        Ok(notes)
    }

    /// Marks a process whose lifecycle events are recorded.
    pub fn trace_pid(&self, pid: u32) -> Result<()> {
        self.skel
            .maps
            .traced
            .update(&pid.to_ne_bytes(), &[1], MapFlags::ANY)
            .context("updating the traced-pid map")
    }

    /// Lets go of a followed process that exited (and was reaped by us,
    /// so its pid is not yet anyone else's): its probes' links are
    /// dropped in the background, and its pid leaves the traced set,
    /// which has room for 4,096 at a time. Its exit event was written
    /// before the kernel told us of its death.
    pub fn forget_process(&self, pid: u32) {
        let mut links = self
            .proc_links
            .borrow_mut()
            .remove(&pid)
            .unwrap_or_default();
        links.extend(self.dl_links.borrow_mut().remove(&pid).unwrap_or_default());
        self.reaper.reap(links);
        let _ = self.skel.maps.traced.delete(&pid.to_ne_bytes());
    }

    /// A ring-buffer consumer calling `f` for every record; `f` returns
    /// false to stop consumption (an error it will report).
    pub fn ring_buffer<'cb, F>(&'cb self, mut f: F) -> Result<RingBuffer<'cb>>
    where
        F: FnMut(&[u8]) -> bool + 'cb,
    {
        let mut b = RingBufferBuilder::new();
        b.add(
            &self.skel.maps.events,
            move |data: &[u8]| if f(data) { 0 } else { -1 },
        )?;
        Ok(b.build()?)
    }

    /// The kernel's `vmemmap_base` and `sizeof(struct page)`, to turn the
    /// struct page pointers of page events into page frame numbers. Learned
    /// by attaching, for a moment, a BTF and a classic `mm_page_alloc`
    /// program (the second sees the pfn of the page the first saw) while
    /// this process touches fresh pages; None unless several page
    /// allocations agree within 300 ms.
    pub fn calibrate_pages(&self) -> Option<(u64, u64)> {
        let p = &self.skel.progs;
        if !p.calib_page.autoload() {
            return None;
        }
        let first = p.calib_page.attach().ok()?;
        let second = p.calib_pfn.attach().ok()?;
        let bss = self.skel.maps.bss_data.as_deref()?;
        let deadline = std::time::Instant::now() + Duration::from_millis(300);
        let found = loop {
            touch_fresh_pages(16);
            // SAFETY: the fields live in the mmapped .bss the programs write.
            let n = unsafe { std::ptr::read_volatile(&bss.calib_n) } as usize;
            let samples: Vec<u64> = (0..n.min(bss.calib_base.len()))
                .map(|i| unsafe { std::ptr::read_volatile(&bss.calib_base[i]) })
                .collect();
            let size = unsafe { std::ptr::read_volatile(&bss.page_struct_size) };
            let agreed = samples
                .iter()
                .find(|&&b| b != 0 && samples.iter().filter(|&&o| o == b).count() >= 3);
            if let (Some(&base), true) = (agreed, size > 0) {
                break Some((base, size));
            }
            if std::time::Instant::now() > deadline || n >= bss.calib_base.len() * 4 {
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        std::thread::scope(|s| {
            s.spawn(move || drop(first));
            s.spawn(move || drop(second));
        });
        found
    }

    /// Probe hits counted in `count_only` mode.
    pub fn hits(&self) -> u64 {
        sum_percpu(&self.skel.maps.hits, 0)
    }

    /// Kernel events no program saw because the kernel skipped them (a
    /// program never runs inside itself on a CPU). For the slab and page
    /// tracepoints the first copy's misses were recorded by a later copy
    /// unless all were busy, so the events the later copies recorded are
    /// subtracted.
    pub fn recursion_misses(&self) -> Recursion {
        let p = &self.skel.progs;
        // Rescued first: the kernel counts a skip before a later copy
        // records the event, so skips read after it cover every rescue.
        let rescued = sum_percpu(&self.skel.maps.rescued, 0);
        Recursion {
            first_copies: prog_misses(&slab_programs!(p).map(|[first, ..]| first)),
            others: prog_misses(&[
                &p.on_percpu_alloc,
                &p.on_percpu_free,
                &p.on_exec,
                &p.on_exit,
            ]),
            rescued,
        }
    }

    /// A writer of the unwind tables, for another thread; None while the
    /// uprobe programs, the tables' only reader, wait to be loaded.
    pub fn unwind_maps(&self) -> Result<Option<UnwindMaps>> {
        let skel = match self.cfg.agent {
            true => match self.uprobes.get() {
                Some(s) => s,
                None => return Ok(None),
            },
            false => &self.skel,
        };
        UnwindMaps::new(&skel.maps.unwind_rows, &skel.maps.unwind_procs).map(Some)
    }

    /// User stack walks by how they ended, summed over CPUs, indexed by
    /// `memleak_recorder::event::UnwindEnd` code.
    pub fn unwind_ends(&self) -> Vec<u64> {
        let n = memleak_recorder::event::UNWIND_ENDS.len();
        (0..n as u32)
            .map(|i| sum_percpu(&self.skel.maps.unwind_ends, i))
            .collect()
    }

    /// Loss counters summed over CPUs, indexed like
    /// `memleak_recorder::event::LOST_REASONS`.
    pub fn lost(&self) -> Vec<u64> {
        let n = memleak_recorder::event::LOST_REASONS.len();
        (0..n as u32)
            .map(|i| sum_percpu(&self.skel.maps.lost, i))
            .collect()
    }
}

/// The probe's unwind maps, written from the table-building thread: the
/// row array through a shared mapping of it (`BPF_F_MMAPABLE`: one copy
/// per object instead of a syscall per row), the per-process tables by
/// map updates.
pub struct UnwindMaps {
    procs: libbpf_rs::MapHandle,
    /// The row array's handle, kept while `rows` maps it.
    _rows_map: libbpf_rs::MapHandle,
    rows: *mut Row,
    capacity: u32,
    len: usize,
}

// SAFETY: `rows` points into a shared mapping owned by this struct (unmapped
// on drop); it is only written through `&mut self`.
unsafe impl Send for UnwindMaps {}

impl UnwindMaps {
    fn new(rows: &libbpf_rs::Map<'_>, procs: &libbpf_rs::Map<'_>) -> Result<Self> {
        use std::os::fd::{AsFd, AsRawFd};
        let rows_map = libbpf_rs::MapHandle::try_from(rows).context("duplicating unwind_rows")?;
        let procs = libbpf_rs::MapHandle::try_from(procs).context("duplicating unwind_procs")?;
        let capacity = rows_map.max_entries();
        let len = (capacity as usize * std::mem::size_of::<Row>()).next_multiple_of(4096);
        // SAFETY: a shared mapping of an mmapable array map's fd, as long
        // as the map's data.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                rows_map.as_fd().as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!(
                "mapping the unwind rows: {}",
                crate::output::describe(&std::io::Error::last_os_error())
            );
        }
        Ok(UnwindMaps {
            procs,
            _rows_map: rows_map,
            rows: p.cast(),
            capacity,
            len,
        })
    }
}

impl Drop for UnwindMaps {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new(), unmapped once.
        unsafe { libc::munmap(self.rows.cast(), self.len) };
    }
}

impl UnwindSink for UnwindMaps {
    fn row_capacity(&self) -> u32 {
        self.capacity
    }

    fn write_rows(&mut self, first: u32, rows: &[Row]) -> std::io::Result<()> {
        let end = first as usize + rows.len();
        if end > self.capacity as usize {
            return Err(std::io::Error::other("rows past the end of the array"));
        }
        // SAFETY: [first, end) is within the mapping (checked above); the
        // probe only reads ranges that a table names, written after this.
        unsafe {
            std::ptr::copy_nonoverlapping(rows.as_ptr(), self.rows.add(first as usize), rows.len())
        };
        Ok(())
    }

    fn set_process(&mut self, pid: u32, table: &ProcTable) -> std::io::Result<()> {
        self.procs
            .update(&pid.to_ne_bytes(), table.as_bytes(), MapFlags::ANY)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    fn remove_process(&mut self, pid: u32) -> std::io::Result<()> {
        match self.procs.delete(&pid.to_ne_bytes()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }
}

/// Sum of the kernel's `recursion_misses` of programs (0 for programs not
/// loaded).
fn prog_misses(progs: &[&libbpf_rs::ProgramMut<'_>]) -> u64 {
    use std::os::fd::{AsFd, AsRawFd};
    progs
        .iter()
        .map(|prog| {
            let mut info = libbpf_sys::bpf_prog_info::default();
            let mut len = std::mem::size_of_val(&info) as u32;
            // SAFETY: info is a valid bpf_prog_info of `len` bytes.
            let ret = unsafe {
                libbpf_sys::bpf_obj_get_info_by_fd(
                    prog.as_fd().as_raw_fd(),
                    (&mut info as *mut libbpf_sys::bpf_prog_info).cast(),
                    &mut len,
                )
            };
            if ret == 0 {
                info.recursion_misses
            } else {
                0
            }
        })
        .sum()
}

/// A u64 counter of a per-CPU array, summed over CPUs (0 if unreadable).
fn sum_percpu(map: &dyn MapCore, key: u32) -> u64 {
    map.lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)
        .ok()
        .flatten()
        .map(|per_cpu| {
            per_cpu
                .iter()
                .map(|v| u64::from_ne_bytes(v[..8].try_into().expect("u64")))
                .sum()
        })
        .unwrap_or(0)
}

/// Waits up to `timeout` for a forced wakeup, then drains the ring.
pub fn drain(rb: &RingBuffer<'_>, timeout: Duration) -> Result<()> {
    // Wakeups are suppressed except under pressure (see memleak.bpf.c), so
    // poll() mostly just sleeps; consume() does the work either way.
    let _ = rb.poll_raw(timeout);
    let n = rb.consume_raw();
    if n < 0 && n != -libc::EINTR {
        bail!(
            "consuming the ring buffer failed ({})",
            crate::output::describe(&std::io::Error::from_raw_os_error(-n))
        );
    }
    Ok(())
}

fn explain_bpf_error(e: libbpf_rs::Error) -> anyhow::Error {
    let msg = e.to_string();
    if msg.contains("Operation not permitted") || msg.contains("EPERM") {
        anyhow::anyhow!("{msg}: loading BPF programs needs root (or CAP_BPF and CAP_PERFMON)")
    } else {
        anyhow::Error::new(e)
    }
}

/// Whether `path` can be probed at all (exists and is an ELF file).
pub fn check_object(path: &Path) -> Result<()> {
    let mut magic = [0u8; 4];
    use std::io::Read;
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .with_context(|| format!("{}: cannot read allocator library", path.display()))?;
    if &magic != b"\x7fELF" {
        bail!("{}: not an ELF file", path.display());
    }
    Ok(())
}

/// Maps `pages` fresh anonymous pages, writes to each (a page allocation
/// apiece) and unmaps them.
fn touch_fresh_pages(pages: usize) {
    let len = pages * 4096;
    // SAFETY: a private anonymous mapping used only here.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return;
        }
        for i in 0..pages {
            std::ptr::write_volatile((p as *mut u8).add(i * 4096), 1);
        }
        libc::munmap(p, len);
    }
}

/// The top byte of this recording's session cookies (see `ck_tag` in the
/// BPF program): random, never 0 (an entry's cookie starts at 0) nor 0xff
/// (the top byte of small negative numbers).
fn cookie_tag() -> u8 {
    let mut byte = 0u8;
    // SAFETY: getrandom writes at most one byte into `byte`.
    let n = unsafe { libc::getrandom((&mut byte as *mut u8).cast(), 1, libc::GRND_NONBLOCK) };
    if n != 1 {
        // No entropy yet (early boot): time and pid are different enough.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mix = u64::from(nanos ^ std::process::id().rotate_left(16));
        byte = (mix.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8;
    }
    byte % 254 + 1
}

#[cfg(test)]
mod tests {
    use memleak_recorder::event::offsets;
    use std::mem::offset_of;

    use super::skel::types::memleak_event as E;

    #[test]
    fn rust_decoder_matches_the_bpf_event_layout() {
        assert_eq!(offset_of!(E, ts_ns), offsets::TS_NS);
        assert_eq!(offset_of!(E, addr), offsets::ADDR);
        assert_eq!(offset_of!(E, size), offsets::SIZE);
        assert_eq!(offset_of!(E, old_addr), offsets::OLD_ADDR);
        assert_eq!(offset_of!(E, old_size), offsets::OLD_SIZE);
        assert_eq!(offset_of!(E, pid), offsets::PID);
        assert_eq!(offset_of!(E, tid), offsets::TID);
        assert_eq!(offset_of!(E, kind), offsets::KIND);
        assert_eq!(offset_of!(E, flags), offsets::FLAGS);
        assert_eq!(offset_of!(E, nframes), offsets::NFRAMES);
        assert_eq!(offset_of!(E, stack_err), offsets::STACK_ERR);
        assert_eq!(offset_of!(E, frames), offsets::FRAMES);
        let frames = super::MAX_FRAMES as usize;
        assert_eq!(std::mem::size_of::<E>(), offsets::FRAMES + frames * 8);
    }

    #[test]
    fn unwind_tables_match_the_bpf_layout() {
        use super::skel::types::{unwind_map as M, unwind_proc as P, unwind_row as R};
        use memleak_recorder::unwind::{MapEntry, ProcTable, Row};
        assert_eq!(offset_of!(R, pc), offset_of!(Row, pc));
        assert_eq!(offset_of!(R, info), offset_of!(Row, info));
        assert_eq!(std::mem::size_of::<R>(), std::mem::size_of::<Row>());
        assert_eq!(offset_of!(M, start), offset_of!(MapEntry, start));
        assert_eq!(offset_of!(M, end), offset_of!(MapEntry, end));
        assert_eq!(offset_of!(M, bias), offset_of!(MapEntry, bias));
        assert_eq!(offset_of!(M, first_row), offset_of!(MapEntry, first_row));
        assert_eq!(offset_of!(M, nrows), offset_of!(MapEntry, nrows));
        assert_eq!(std::mem::size_of::<M>(), std::mem::size_of::<MapEntry>());
        assert_eq!(offset_of!(P, nmaps), offset_of!(ProcTable, nmaps));
        assert_eq!(offset_of!(P, flags), offset_of!(ProcTable, flags));
        assert_eq!(offset_of!(P, gen), offset_of!(ProcTable, gen));
        assert_eq!(offset_of!(P, maps), offset_of!(ProcTable, maps));
        assert_eq!(std::mem::size_of::<P>(), std::mem::size_of::<ProcTable>());
    }

    /// The value of `#define NAME value` or `NAME = value,` in memleak.h,
    /// evaluated for the simple forms the header uses (`40 + 128`, `1u`).
    fn header_value(name: &str) -> i64 {
        let header = include_str!("../../bpf/memleak.h");
        let line = header
            .lines()
            .map(str::trim)
            .find(|l| {
                l.strip_prefix("#define ")
                    .is_some_and(|r| r.split_whitespace().next() == Some(name))
                    || l.split_whitespace().next() == Some(name) && l.contains('=')
            })
            .unwrap_or_else(|| panic!("{name} not in memleak.h"));
        let expr = match line.strip_prefix("#define ") {
            Some(r) => r[name.len()..].to_string(),
            None => line.split_once('=').unwrap().1.to_string(),
        };
        let expr = expr.split("/*").next().unwrap();
        let expr = expr
            .trim()
            .trim_end_matches(',')
            .trim_matches(|c| c == '(' || c == ')');
        expr.split('+')
            .map(|t| {
                let t = t.trim().trim_end_matches('u');
                match t.strip_prefix("0x") {
                    Some(h) => i64::from_str_radix(h, 16).unwrap(),
                    None => t.parse::<i64>().unwrap_or_else(|_| panic!("{name}: {t}")),
                }
            })
            .sum()
    }

    #[test]
    fn unwind_constants_match_the_bpf_header() {
        use memleak_recorder::event::{FLAG_END_MASK, FLAG_END_SHIFT, UNWIND_ENDS};
        use memleak_recorder::unwind::{row, tables, WalkMode};
        let names = [
            "UE_NONE",
            "UE_COMPLETE",
            "UE_FP_END",
            "UE_MAX_DEPTH",
            "UE_NO_MAPPING",
            "UE_NO_TABLE",
            "UE_MAPS_FULL",
            "UE_ANONYMOUS",
            "UE_NO_UNWIND_INFO",
            "UE_ROWS_FULL",
            "UE_INVALID_ROW",
            "UE_READ_FAILED",
            "UE_NULL_RA",
            "UE_NOT_PROGRESSING",
        ];
        for (end, name) in UNWIND_ENDS.iter().zip(names) {
            assert_eq!(header_value(name), *end as i64, "{name}");
        }
        assert_eq!(header_value("UE_NR"), UNWIND_ENDS.len() as i64);
        assert!(UNWIND_ENDS.len() <= usize::from(FLAG_END_MASK) + 1);
        assert_eq!(header_value("MEF_END_SHIFT"), i64::from(FLAG_END_SHIFT));
        assert_eq!(header_value("MEF_END_MASK"), i64::from(FLAG_END_MASK));
        for (name, v) in [
            ("UR_KIND_MASK", i64::from(row::KIND_MASK)),
            ("UR_RBP_SHIFT", i64::from(row::RBP_SHIFT)),
            ("UR_CFA_SHIFT", i64::from(row::CFA_SHIFT)),
            ("UR_INVALID", i64::from(row::KIND_INVALID)),
            ("UR_CFA_RSP", i64::from(row::KIND_CFA_RSP)),
            ("UR_CFA_RBP", i64::from(row::KIND_CFA_RBP)),
            ("UR_PLT", i64::from(row::KIND_PLT)),
            ("UR_SIGNAL", i64::from(row::KIND_SIGNAL)),
            ("UR_END", i64::from(row::KIND_END)),
            ("UR_SIGNAL_RIP", row::SIGNAL_RIP as i64),
            ("UR_SIGNAL_RSP", row::SIGNAL_RSP as i64),
            ("UR_SIGNAL_RBP", row::SIGNAL_RBP as i64),
            ("UR_PLT_PUSHED_FROM", row::PLT_PUSHED_FROM as i64),
            ("UR_SEARCH_STEPS", i64::from(row::MAX_SEARCH_STEPS)),
            ("UNWIND_MAX_MAPS", tables::MAX_MAPS as i64),
            ("UPF_MAPS_FULL", i64::from(tables::MAPS_FULL)),
            ("MU_FP", i64::from(WalkMode::FramePointer.code())),
            ("MU_AUTO", i64::from(WalkMode::Auto.code())),
            ("MU_DWARF", i64::from(WalkMode::Dwarf.code())),
        ] {
            assert_eq!(header_value(name), v, "{name}");
        }
    }

    #[test]
    fn kind_codes_match_the_trace_schema() {
        use memleak_trace::EventKind;
        // memleak.h enumerates the same codes; spot-check both ends.
        assert_eq!(EventKind::Malloc as u8, 0);
        assert_eq!(EventKind::DeleteArray as u8, 16);
        assert_eq!(EventKind::Kmalloc as u8, 32);
        assert_eq!(EventKind::Fork as u8, 50);
    }
}
