//! The allocator actually in use: which loaded object provides each
//! allocator function to a process.
//!
//! The dynamic linker binds a call to `malloc` (to any symbol) to the first
//! object of its global search order that exports it: the executable, the
//! `LD_PRELOAD` objects, then the `DT_NEEDED` libraries breadth first.
//! With jemalloc preloaded, jemalloc provides malloc, free and the C++
//! operators, and libc only mmap and its wrappers (strdup, ...). A
//! statically linked executable (no `PT_INTERP`) provides everything
//! itself, found in its `.symtab` unless it was stripped.
//!
//! The order is read from the process itself: its link map, the list of
//! loaded objects ld.so keeps for debuggers (`struct r_debug`, reached
//! through the executable's `DT_DEBUG` entry), read through
//! `/proc/PID/mem` while ld.so says it is consistent. ld.so links objects
//! into that list as it loads them: the executable, the preloads, then the
//! needed libraries breadth first, which is its global search order (ld.so
//! itself is moved to its place in that order). Rebuilding the order from
//! the executable's `DT_NEEDED`, `LD_PRELOAD` in `/proc/PID/environ` and
//! `/etc/ld.so.preload` would mean redoing ld.so's path search (RUNPATH,
//! RPATH, LD_LIBRARY_PATH, its cache, hwcaps directories) and would miss
//! what `dlopen` adds; `/proc/PID/maps` lists objects by address, which is
//! not the search order.
//!
//! Objects added later by `dlopen` come after the initial ones, so they
//! only provide what no initial object exports (libstdc++ loaded by a C
//! program's plugin): that is also how the plugin's own calls bind, its
//! local scope being searched after the global one. `RTLD_DEEPBIND`,
//! `dlmopen` namespaces and `-Bsymbolic` libraries are not modelled.
//!
//! [`Allocators`] keeps, per process, what is attached already, so that a
//! function probed once (in `-c` mode libc and libstdc++ are probed before
//! the command starts) is never attached twice: two probes on one place
//! would count every call twice.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use memleak_trace::describe_io;

use crate::elf::ElfFile;
use crate::placement::Policy;
use crate::procmaps::{read_maps, resolve_in_process};
use crate::targets::{
    self, wrapper, AllocFn, LibraryProbes, ProbePoint, CXX_ALLOCATORS, C_ALLOCATORS, C_MAPPINGS,
    C_WRAPPERS,
};

/// A loaded object of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// Its path as the process sees it (as `/proc/PID/maps` shows it).
    pub name: String,
    /// A path our process can open (through `/proc/PID/root` when that
    /// exists).
    pub path: PathBuf,
}

/// The objects of a process in symbol search order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchOrder {
    /// The executable is statically linked: it is the only object.
    Static(Object),
    /// The link map: the executable, the preloads, the needed libraries
    /// breadth first, then what `dlopen` added.
    Dynamic(Vec<Object>),
    /// ld.so has not built the list yet: the process has just exec'd,
    /// and only the executable and its program interpreter are mapped.
    Loading {
        /// The executable.
        exe: Object,
        /// Its program interpreter, ld.so (the file mapped at `AT_BASE`);
        /// `None` if the maps do not show it.
        interpreter: Option<Object>,
    },
    /// ld.so is changing the list (inside `dlopen` or `dlclose`).
    NotReady,
}

const AT_BASE: u64 = 7;
const AT_ENTRY: u64 = 9;
const DT_DEBUG: u64 = 21;
const DT_NULL: u64 = 0;
/// `r_debug.r_state` when the list may be read.
const RT_CONSISTENT: u32 = 0;
/// More objects than any real process links.
const MAX_OBJECTS: usize = 1 << 16;

/// `/proc/PID/mem`.
struct Mem(File);

impl Mem {
    fn open(pid: u32) -> Result<Mem, String> {
        File::open(format!("/proc/{pid}/mem"))
            .map(Mem)
            .map_err(|e| format!("/proc/{pid}/mem: {}", describe_io(&e)))
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), String> {
        self.0.read_exact_at(buf, addr).map_err(|e| {
            format!(
                "reading {} bytes at {addr:#x}: {}",
                buf.len(),
                describe_io(&e)
            )
        })
    }

    fn u64(&self, addr: u64) -> Result<u64, String> {
        let mut b = [0; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn u32(&self, addr: u64) -> Result<u32, String> {
        let mut b = [0; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}

/// A value of the process's auxiliary vector.
fn auxv(pid: u32, key: u64) -> Result<u64, String> {
    let data = std::fs::read(format!("/proc/{pid}/auxv"))
        .map_err(|e| format!("/proc/{pid}/auxv: {}", describe_io(&e)))?;
    data.chunks_exact(16)
        .map(|c| {
            let k = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
            let v = u64::from_le_bytes(c[8..].try_into().expect("8 bytes"));
            (k, v)
        })
        .find(|&(k, _)| k == key)
        .map(|(_, v)| v)
        .ok_or_else(|| format!("/proc/{pid}/auxv has no entry {key}"))
}

/// Whether `pid` runs in secure-execution mode (`AT_SECURE`: setuid or
/// setgid, or file capabilities), where ld.so ignores LD_PRELOAD paths.
pub fn secure_exec(pid: u32) -> bool {
    const AT_SECURE: u64 = 23;
    auxv(pid, AT_SECURE).is_ok_and(|v| v != 0)
}

/// An openable path for a file the process maps at `start..end` under
/// `name`: through its root, else (a deleted or unreachable file) through
/// `/proc/PID/map_files`, which root can open.
fn openable(pid: u32, name: &str, range: Option<(u64, u64)>) -> PathBuf {
    let path = resolve_in_process(pid, name);
    match range {
        Some((start, end)) if !path.exists() => {
            PathBuf::from(format!("/proc/{pid}/map_files/{start:x}-{end:x}"))
        }
        _ => path,
    }
}

const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;

/// What the search needs of the executable's ELF header and program
/// headers, read alone: at every stop of the process, parsing the whole
/// file (all its symbols) again would cost milliseconds for a large
/// program.
struct ExeHeaders {
    /// `e_entry`.
    entry: u64,
    /// `PT_DYNAMIC`'s address and size when there is a `PT_INTERP`: a
    /// dynamically linked program. `None` for a static one (static-pie
    /// included).
    dynamic: Option<(u64, u64)>,
}

impl ExeHeaders {
    fn read(path: &Path) -> Result<ExeHeaders, String> {
        let bad = |what: &str| format!("{}: {what}", path.display());
        let file = File::open(path).map_err(|e| bad(&describe_io(&e)))?;
        let mut eh = [0u8; 64];
        file.read_exact_at(&mut eh, 0)
            .map_err(|e| bad(&describe_io(&e)))?;
        if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
            return Err(bad("not a 64-bit little-endian ELF file"));
        }
        let u16_at = |o: usize| u64::from(u16::from_le_bytes([eh[o], eh[o + 1]]));
        let u64_at = |o: usize| u64::from_le_bytes(eh[o..o + 8].try_into().expect("8 bytes"));
        let (entry, phoff, phentsize, phnum) = (u64_at(24), u64_at(32), u16_at(54), u16_at(56));
        if phentsize < 56 {
            return Err(bad("bad program header size"));
        }
        let mut ph = vec![0u8; (phentsize * phnum) as usize];
        file.read_exact_at(&mut ph, phoff)
            .map_err(|e| bad(&format!("program headers: {}", describe_io(&e))))?;
        let (mut interp, mut dynamic) = (false, None);
        for h in ph.chunks_exact(phentsize as usize) {
            let word = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8 bytes"));
            match u32::from_le_bytes(h[..4].try_into().expect("4 bytes")) {
                PT_INTERP => interp = true,
                PT_DYNAMIC => dynamic = Some((word(16), word(40))),
                _ => {}
            }
        }
        Ok(ExeHeaders {
            entry,
            dynamic: dynamic.filter(|_| interp),
        })
    }
}

/// The objects of process `pid` in the dynamic linker's symbol search
/// order (see the module documentation).
pub fn search_order(pid: u32) -> Result<SearchOrder, String> {
    let exe_link = format!("/proc/{pid}/exe");
    let exe_name = std::fs::read_link(&exe_link)
        .map_err(|e| format!("{exe_link}: {}", describe_io(&e)))?
        .to_string_lossy()
        .into_owned();
    let exe_path = match resolve_in_process(pid, &exe_name) {
        p if p.exists() => p,
        _ => PathBuf::from(&exe_link),
    };
    let exe = ExeHeaders::read(&exe_path)?;
    let Some((dyn_vaddr, dyn_size)) = exe.dynamic else {
        return Ok(SearchOrder::Static(Object {
            name: exe_name,
            path: exe_path,
        }));
    };
    // The load bias of the executable: where its entry point really is.
    let bias = auxv(pid, AT_ENTRY)?.wrapping_sub(exe.entry);
    let mem = Mem::open(pid)?;
    let mut dynamic = vec![0u8; dyn_size.min(64 << 10) as usize / 16 * 16];
    mem.read(bias.wrapping_add(dyn_vaddr), &mut dynamic)?;
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let r_debug = dynamic
        .chunks_exact(16)
        .map(|e| (word(&e[..8]), word(&e[8..])))
        .take_while(|&(tag, _)| tag != DT_NULL)
        .find(|&(tag, _)| tag == DT_DEBUG)
        .map(|(_, value)| value);
    let r_debug = r_debug.ok_or_else(|| format!("{exe_name} has no DT_DEBUG entry"))?;
    let maps = || read_maps(pid).map_err(|e| format!("/proc/{pid}/maps: {}", describe_io(&e)));
    // struct r_debug { int r_version; struct link_map *r_map;
    //                  ElfW(Addr) r_brk; int r_state; ElfW(Addr) r_ldbase; }
    // (musl's struct debug has the same layout, and its struct dso begins
    // as struct link_map does.)
    let first = match r_debug {
        0 => 0,
        _ if mem.u32(r_debug)? == 0 => 0,
        _ => mem.u64(r_debug + 8)?,
    };
    if first == 0 {
        let base = auxv(pid, AT_BASE)?;
        let interpreter = maps()?
            .into_iter()
            .find(|m| m.is_file() && m.start == base && m.offset == 0)
            .and_then(|m| {
                let name = m.path?;
                Some(Object {
                    path: openable(pid, &name, Some((m.start, m.end))),
                    name,
                })
            });
        return Ok(SearchOrder::Loading {
            exe: Object {
                name: exe_name,
                path: exe_path,
            },
            interpreter,
        });
    }
    if mem.u32(r_debug + 24)? != RT_CONSISTENT {
        return Ok(SearchOrder::NotReady);
    }
    let maps = maps()?;
    let mut objects: Vec<Object> = Vec::new();
    let mut seen = HashSet::new();
    let mut lm = first;
    while lm != 0 && seen.insert(lm) && seen.len() <= MAX_OBJECTS {
        // struct link_map { ElfW(Addr) l_addr; char *l_name;
        //                   ElfW(Dyn) *l_ld; struct link_map *l_next, *l_prev; }
        let mut b = [0u8; 32];
        mem.read(lm, &mut b)?;
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let (l_ld, l_next) = (word(2), word(3));
        // The object is the file mapped where its dynamic section is:
        // l_name is "" for the executable and may be relative.
        if let Some(m) = maps
            .iter()
            .find(|m| m.is_file() && m.start <= l_ld && l_ld < m.end)
        {
            let name = m.path.clone().expect("file mappings have a path");
            if !objects.iter().any(|o| o.name == name) {
                objects.push(Object {
                    path: openable(pid, &name, Some((m.start, m.end))),
                    name,
                });
            }
        }
        lm = l_next;
    }
    Ok(SearchOrder::Dynamic(objects))
}

/// A file, whatever path reaches it: (device, inode).
type FileId = (u64, u64);

fn file_id(path: &Path) -> Result<FileId, String> {
    std::fs::metadata(path)
        .map(|m| (m.dev(), m.ino()))
        .map_err(|e| format!("{}: {}", path.display(), describe_io(&e)))
}

/// How a search went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Search {
    /// The providers were found; `libs` has what is new.
    Ready,
    /// The link map is not there yet or is changing: ask again later.
    NotReady,
    /// The process could not be read (the reason).
    Failed(String),
}

/// The outcome of [`Allocators::update`].
#[derive(Debug, Clone)]
pub struct Found {
    /// How the search went.
    pub search: Search,
    /// Probes to attach now: only places not attached for this process
    /// yet, grouped by object.
    pub libs: Vec<LibraryProbes>,
    /// Allocators that cannot be probed, one line each, each reported
    /// once per process: for a warning and the trace's notes.
    pub warnings: Vec<String>,
    /// Allocators that are not libc's (jemalloc, a static executable),
    /// each reported once per process: for `-v` and the trace's notes.
    pub notes: Vec<String>,
    /// The process's malloc was not found: why, in one line (also in
    /// `warnings` the first time).
    pub no_malloc: Option<String>,
}

impl Found {
    fn new(search: Search) -> Found {
        Found {
            search,
            libs: Vec::new(),
            warnings: Vec::new(),
            notes: Vec::new(),
            no_malloc: None,
        }
    }
}

/// An object's file, parsed once.
struct Loaded {
    elf: ElfFile,
    /// The functions `.dynsym` defines at their default version (or
    /// unversioned): what the dynamic linker binds new references to.
    exports: HashSet<String>,
}

impl Loaded {
    fn open(path: &Path) -> Result<Loaded, String> {
        let elf = ElfFile::open(path).map_err(|e| e.to_string())?;
        let exports = elf
            .function_symbols()
            .filter(|s| s.dynamic && s.default_version)
            .map(|s| s.name.clone())
            .collect();
        Ok(Loaded { elf, exports })
    }
}

/// Finds the allocator functions' providers in processes and remembers
/// what is attached where.
pub struct Allocators {
    policy: Policy,
    funcs: Vec<AllocFn>,
    files: HashMap<FileId, Result<Loaded, String>>,
    points: HashMap<(FileId, &'static str), Option<ProbePoint>>,
    attached: HashMap<u32, HashSet<(FileId, u64)>>,
    reported: HashSet<(u32, String)>,
    heap: HashMap<u32, Heap>,
}

/// What the searches saw of a process's malloc: whether the process ran
/// with it probed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Heap {
    /// Executed; its malloc not found yet.
    Waiting,
    /// Found and probed (in this object) by the last search, after the
    /// process had been waiting for it: at a stop of ld.so's before the
    /// program ran, or at its exit, after it ran without.
    Found(String),
    /// Found, then seen again at a later stop; or found probed already
    /// (libc, probed before a command starts), before the program ran (at
    /// its exec), or when the recording started (a running process).
    Probed,
}

/// Objects whose allocator functions are the usual ones: no note. musl's
/// libc is its ld.so, `ld-musl-ARCH.so.1` (on Debian a link to
/// `x86_64-linux-musl/libc.so`, the name its maps show).
fn usual_provider(name: &str) -> bool {
    let file = Path::new(name)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    ["libc.so", "ld-musl", "libstdc++.so", "libc++.so"]
        .iter()
        .any(|p| file.starts_with(p))
}

impl Allocators {
    /// Every function memleak probes, placed with `policy`; without the C
    /// heap API when the user named its library (`-O`, `--symbols-prefix`).
    pub fn new(policy: Policy, user_heap: bool) -> Allocators {
        let heap: &[AllocFn] = if user_heap { &[] } else { C_ALLOCATORS };
        Allocators {
            policy,
            funcs: [heap, C_MAPPINGS, C_WRAPPERS, CXX_ALLOCATORS].concat(),
            files: HashMap::new(),
            points: HashMap::new(),
            attached: HashMap::new(),
            reported: HashSet::new(),
            heap: HashMap::new(),
        }
    }

    /// Records probes attached for `pid` by other means (the libraries
    /// probed before a command starts, or a parent's at fork), so that
    /// [`update`](Self::update) does not attach them again.
    pub fn mark_attached(&mut self, pid: u32, lib: &LibraryProbes) {
        let Ok(id) = file_id(&lib.path) else { return };
        let set = self.attached.entry(pid).or_default();
        set.extend(lib.points.iter().map(|p| (id, p.entry_offset)));
    }

    /// Finds the providers of every function in `pid` as it is now, and
    /// returns the probes not attached yet, which the caller attaches.
    pub fn update(&mut self, pid: u32) -> Found {
        let order = match search_order(pid) {
            Ok(o) => o,
            Err(e) => {
                let mut found = Found::new(Search::Failed(e.clone()));
                found.warnings = self.once(
                    pid,
                    vec![format!(
                        "cannot read the link map of pid {pid} ({e}): allocators other than libc's are not probed"
                    )],
                );
                return found;
            }
        };
        // `before_run`: the objects are all there is before the program
        // runs.
        let (objects, is_static, before_run) = match order {
            SearchOrder::Loading {
                exe,
                interpreter: Some(ld),
            } if self.is_libc(&ld) => (vec![exe, ld], false, true),
            SearchOrder::Loading { .. } => {
                self.heap.insert(pid, Heap::Waiting);
                return Found::new(Search::NotReady);
            }
            SearchOrder::NotReady => {
                self.heap_seen(pid, false, None);
                return Found::new(Search::NotReady);
            }
            SearchOrder::Static(exe) => (vec![exe], true, true),
            SearchOrder::Dynamic(objects) => (objects, false, false),
        };
        let mut found = Found::new(Search::Ready);
        let mut warnings = Vec::new();
        let mut ids = Vec::new();
        for obj in objects {
            match file_id(&obj.path) {
                Ok(id) => {
                    let elf = self
                        .files
                        .entry(id)
                        .or_insert_with(|| Loaded::open(&obj.path));
                    if let Err(e) = elf {
                        warnings.push(format!(
                            "cannot read {} ({e}): allocator functions it may provide are not probed",
                            obj.name
                        ));
                    }
                    ids.push((obj, id));
                }
                Err(e) => warnings.push(format!(
                    "cannot find {} ({e}): allocator functions it may provide are not probed",
                    obj.name
                )),
            }
        }
        // The provider of each function, by index in `ids`.
        let exports = |files: &HashMap<FileId, Result<Loaded, String>>, id: &FileId, f: &str| {
            files
                .get(id)
                .is_some_and(|e| e.as_ref().is_ok_and(|e| e.exports.contains(f)))
        };
        let first_exporter = |name: &str| {
            ids.iter()
                .position(|(_, id)| exports(&self.files, id, name))
        };
        // libc's housekeeping hooks are not exported: they go with libc,
        // the provider of mmap.
        let libc = if is_static {
            Some(0)
        } else {
            first_exporter("mmap")
        };
        let providers: Vec<Option<usize>> = self
            .funcs
            .iter()
            .map(|f| match (is_static, f.cookie == wrapper::SILENT) {
                (true, _) => Some(0),
                (false, true) => libc,
                (false, false) => first_exporter(f.symbol),
            })
            .collect();
        let attached = self.attached.entry(pid).or_default();
        let mut malloc_in = None;
        for (i, (obj, id)) in ids.iter().enumerate() {
            let Some(Ok(Loaded { elf, .. })) = self.files.get(id) else {
                continue;
            };
            let mut lib = LibraryProbes {
                path: obj.path.clone(),
                points: Vec::new(),
                missing: Vec::new(),
            };
            let mut provided = Vec::new();
            for (func, _) in self
                .funcs
                .iter()
                .zip(&providers)
                .filter(|(_, p)| **p == Some(i))
            {
                let point = self
                    .points
                    .entry((*id, func.symbol))
                    .or_insert_with(|| {
                        targets::resolve_function(&obj.path, elf, func, "", self.policy)
                    })
                    .clone();
                let Some(point) = point else {
                    lib.missing.push(func.symbol.to_string());
                    continue;
                };
                if C_ALLOCATORS.contains(func) || CXX_ALLOCATORS.contains(func) {
                    provided.push(func.symbol);
                }
                if attached.insert((*id, point.entry_offset)) {
                    lib.points.push(point);
                }
            }
            if provided.contains(&"malloc") {
                let new = lib.points.iter().any(|p| p.func.symbol == "malloc");
                malloc_in = Some((obj.name.clone(), new));
            }
            if is_static {
                if !provided.contains(&"malloc") && self.funcs.iter().any(|f| f.symbol == "malloc")
                {
                    let why = if elf.has_symtab() {
                        format!(
                            "{} is statically linked and has no malloc symbol: its heap allocations cannot be probed",
                            obj.name
                        )
                    } else {
                        format!(
                            "{} is statically linked and stripped: its malloc cannot be probed",
                            obj.name
                        )
                    };
                    warnings.push(why.clone());
                    found.no_malloc = Some(why);
                } else {
                    found.notes.push(format!(
                        "pid {pid} runs {}, statically linked: its own {} are probed",
                        obj.name,
                        list(&provided)
                    ));
                }
            } else if !provided.is_empty() && !usual_provider(&obj.name) {
                found.notes.push(format!(
                    "pid {pid}: {} come from {}, first in the symbol search order: probed there",
                    list(&provided),
                    obj.name
                ));
            }
            if !lib.points.is_empty() {
                found.libs.push(lib);
            }
        }
        if !is_static && self.funcs.iter().any(|f| f.symbol == "malloc") {
            let malloc = self.funcs.iter().position(|f| f.symbol == "malloc");
            if malloc.is_some_and(|m| providers[m].is_none()) {
                let why = format!(
                    "no object loaded in pid {pid} exports malloc: its heap allocations cannot be probed"
                );
                warnings.push(why.clone());
                found.no_malloc = Some(why);
            }
        }
        self.heap_seen(pid, before_run, malloc_in);
        found.warnings = self.once(pid, warnings);
        let notes = std::mem::take(&mut found.notes);
        found.notes = self.once(pid, notes);
        found
    }

    /// Records a search of `pid` that found its malloc in `malloc_in`,
    /// probed by this search (true) or before (`None`: not found, or not
    /// searched for).
    fn heap_seen(&mut self, pid: u32, before_run: bool, malloc_in: Option<(String, bool)>) {
        let next = match (self.heap.remove(&pid), malloc_in) {
            (Some(Heap::Waiting), Some((object, true))) if !before_run => Heap::Found(object),
            (_, Some(_)) | (Some(Heap::Found(_)), None) => Heap::Probed,
            (Some(state), None) => state,
            (None, None) => return,
        };
        self.heap.insert(pid, next);
    }

    /// The processes that ran without their heap probed, one line each:
    /// their malloc was found only by the search at their exit (ld.so
    /// never stopped before: a loader other than the one memleak stops
    /// in), and they are gone. A process whose malloc no object exports
    /// was warned about by [`update`](Self::update) already.
    pub fn found_at_exit(&self) -> Vec<String> {
        let mut lines: Vec<(u32, String)> = self
            .heap
            .iter()
            .filter_map(|(&pid, state)| match state {
                Heap::Found(object) if crate::procmaps::gone(pid) => Some((
                    pid,
                    format!(
                        "process {pid} ran without its allocator probed: memleak found its \
                         malloc (in {object}) only at its exit, and recorded none of its heap"
                    ),
                )),
                _ => None,
            })
            .collect();
        lines.sort();
        lines.into_iter().map(|(_, line)| line).collect()
    }

    /// Whether `ld`, a program interpreter, is also the C library: it
    /// exports `__libc_start_main`, which a program's start code calls.
    /// musl's ld.so is its libc.so; glibc's is not (before glibc 2.32 it
    /// exported a malloc of its own, so malloc does not tell). The
    /// allocator functions of such a loader are probed as soon as the
    /// process is executed, before ld.so runs, as glibc's libc is before a
    /// command starts: no stop of ours may come before the program runs
    /// (the `_dl_debug_state` stops are put in this system's ld.so, not
    /// musl's). A preloaded allocator, which comes before libc in the
    /// search order, is found in the link map at a later stop.
    fn is_libc(&mut self, ld: &Object) -> bool {
        let Ok(id) = file_id(&ld.path) else {
            return false;
        };
        let loaded = self
            .files
            .entry(id)
            .or_insert_with(|| Loaded::open(&ld.path));
        loaded
            .as_ref()
            .is_ok_and(|l| l.exports.contains("__libc_start_main"))
    }

    /// The lines not reported for `pid` yet.
    fn once(&mut self, pid: u32, lines: Vec<String>) -> Vec<String> {
        lines
            .into_iter()
            .filter(|l| self.reported.insert((pid, l.clone())))
            .collect()
    }
}

/// `malloc, free, calloc and 27 more`.
fn list(names: &[&str]) -> String {
    match names {
        [] => "no allocator functions".into(),
        [one] => (*one).to_string(),
        _ if names.len() <= 4 => format!(
            "{} and {}",
            names[..names.len() - 1].join(", "),
            names[names.len() - 1]
        ),
        _ => format!("{} and {} more", names[..3].join(", "), names.len() - 3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test process: dynamic, its libc provides malloc, and nothing
    /// is attached twice.
    #[test]
    fn this_process_gets_its_malloc_from_libc() {
        let pid = std::process::id();
        let SearchOrder::Dynamic(objects) = search_order(pid).unwrap() else {
            panic!("the test binary is dynamically linked");
        };
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(Path::new(&objects[0].name), exe, "{objects:?}");
        let libc = objects
            .iter()
            .position(|o| o.name.contains("/libc.so"))
            .expect("libc is loaded");
        let ld = objects
            .iter()
            .position(|o| o.name.contains("/ld-linux"))
            .expect("ld.so is in the link map");
        assert!(libc > 0 && ld > 0);
        let mut a = Allocators::new(Policy::Auto, false);
        let found = a.update(pid);
        assert_eq!(found.search, Search::Ready);
        assert!(found.no_malloc.is_none(), "{found:?}");
        assert!(found.warnings.is_empty(), "{:?}", found.warnings);
        let heap = found
            .libs
            .iter()
            .find(|l| l.points.iter().any(|p| p.symbol == "malloc"))
            .expect("malloc is probed");
        assert_eq!(file_id(&heap.path), file_id(&objects[libc].path));
        assert!(heap.points.iter().any(|p| p.symbol == "mmap"));
        // Everything is attached now: a second search adds nothing.
        let again = a.update(pid);
        assert!(again.libs.is_empty(), "{:?}", again.libs);
    }

    /// A preloaded jemalloc comes right after the executable, before libc
    /// and libstdc++ (which it links), and provides malloc and operator
    /// new; libc still provides mmap and strdup.
    #[test]
    fn a_preloaded_allocator_comes_first() {
        let je = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
        if !Path::new(je).exists() {
            return crate::skip::skip(format_args!("{je} is not installed (libjemalloc2)"));
        }
        struct Killed(std::process::Child);
        impl Drop for Killed {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let child = Killed(
            std::process::Command::new("sleep")
                .arg("30")
                .env("LD_PRELOAD", je)
                .spawn()
                .unwrap(),
        );
        let pid = child.0.id();
        // Until ld.so has loaded the needed libraries too.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let objects = loop {
            match search_order(pid) {
                Ok(SearchOrder::Dynamic(o)) if o.iter().any(|o| o.name.contains("/libc.so")) => {
                    break o
                }
                _ if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                other => panic!("{other:?}"),
            }
        };
        let at = |needle: &str| {
            objects
                .iter()
                .position(|o| o.name.contains(needle))
                .unwrap_or_else(|| panic!("{needle} not in {objects:?}"))
        };
        assert!(objects[0].name.ends_with("/sleep"), "{objects:?}");
        assert_eq!(at("libjemalloc"), 1, "{objects:?}");
        assert!(at("/libc.so") > 1 && at("libstdc++") > 1);
        let mut a = Allocators::new(Policy::Auto, false);
        let found = a.update(pid);
        assert_eq!(found.search, Search::Ready);
        let provider = |symbol: &str| {
            found
                .libs
                .iter()
                .find(|l| l.points.iter().any(|p| p.symbol == symbol))
                .map(|l| file_id(&l.path).unwrap())
        };
        let je_id = file_id(Path::new(je)).unwrap();
        let libc_id = file_id(&objects[at("/libc.so")].path).unwrap();
        for symbol in ["malloc", "free", "_Znwm", "_Znam", "_ZdaPv"] {
            assert_eq!(provider(symbol), Some(je_id), "{symbol}");
        }
        for symbol in ["mmap", "strdup", "reallocarray"] {
            assert_eq!(provider(symbol), Some(libc_id), "{symbol}");
        }
        assert!(
            found
                .notes
                .iter()
                .any(|n| n.contains("malloc") && n.contains("libjemalloc.so.2")),
            "{:?}",
            found.notes
        );
    }

    /// A process found waiting for ld.so at its exec whose malloc the
    /// search at its exit probes ran unrecorded: it is named once gone.
    /// One whose malloc was probed already (libc, before the command
    /// started), or found at a stop it then ran on from (a preloaded
    /// allocator), or at its exec (musl, a static program), is not.
    #[test]
    fn only_a_malloc_probed_at_the_exit_is_reported() {
        let mut a = Allocators::new(Policy::Auto, false);
        // Beyond any pid_max: gone.
        let [late, glibc, preloaded, musl] = [u32::MAX, u32::MAX - 1, u32::MAX - 2, u32::MAX - 3];
        let found = |object: &str, new: bool| Some((object.to_string(), new));
        for pid in [late, glibc, preloaded] {
            a.heap.insert(pid, Heap::Waiting);
        }
        a.heap_seen(late, false, found("/opt/lib/libc.so.6", true));
        a.heap_seen(glibc, false, found("/lib/libc.so.6", false));
        a.heap_seen(glibc, false, found("/lib/libc.so.6", false));
        a.heap_seen(preloaded, false, found("/lib/libjemalloc.so.2", true));
        a.heap_seen(preloaded, false, None);
        a.heap_seen(musl, true, found("/lib/ld-musl-x86_64.so.1", true));
        a.heap_seen(musl, false, found("/lib/ld-musl-x86_64.so.1", false));
        assert_eq!(
            a.found_at_exit(),
            [format!(
                "process {late} ran without its allocator probed: memleak found its malloc \
                 (in /opt/lib/libc.so.6) only at its exit, and recorded none of its heap"
            )]
        );
    }

    #[test]
    fn lists_are_short() {
        assert_eq!(list(&["malloc"]), "malloc");
        assert_eq!(list(&["malloc", "free"]), "malloc and free");
        assert_eq!(list(&["a", "b", "c", "d", "e", "f"]), "a, b, c and 3 more");
    }
}
