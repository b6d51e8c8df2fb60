//! What to probe: the allocator functions, the libraries that hold them in
//! a target process, and their file offsets.

use std::path::{Path, PathBuf};

use memleak_trace::EventKind;

use crate::elf::{ElfError, ElfFile};
use crate::placement::{resolve_one, Placement, Policy, ProbeKind};

use crate::procmaps::{read_maps, resolve_in_process};

/// How a function is probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeMode {
    /// Entry and return (a uprobe session): allocators, which report their
    /// result on return, and `operator delete`, which must mark the
    /// `free()` inside it as nested.
    Session,
    /// Entry only: `free` and `munmap`, which only need their arguments.
    EntryOnly,
}

/// One allocator entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocFn {
    /// Symbol name, without any prefix.
    pub symbol: &'static str,
    /// Event kind it produces.
    pub kind: EventKind,
    /// How it is probed.
    pub mode: ProbeMode,
    /// The BPF attach cookie: the kind code, or a wrapper code.
    pub cookie: u8,
}

const fn f(symbol: &'static str, kind: EventKind, mode: ProbeMode) -> AllocFn {
    AllocFn {
        symbol,
        kind,
        mode,
        cookie: kind as u8,
    }
}

const fn w(symbol: &'static str, cookie: u8) -> AllocFn {
    AllocFn {
        symbol,
        kind: EventKind::Malloc,
        mode: ProbeMode::Session,
        cookie,
    }
}

use EventKind as K;
use ProbeMode::{EntryOnly as E, Session as S};

/// The C heap allocator API (glibc, or jemalloc/tcmalloc with `--object`).
pub const C_ALLOCATORS: &[AllocFn] = &[
    f("malloc", K::Malloc, S),
    f("calloc", K::Calloc, S),
    f("realloc", K::Realloc, S),
    f("reallocarray", K::Reallocarray, S),
    f("free", K::Free, E),
    f("posix_memalign", K::PosixMemalign, S),
    f("memalign", K::Memalign, S),
    f("aligned_alloc", K::AlignedAlloc, S),
    f("valloc", K::Valloc, S),
    f("pvalloc", K::Pvalloc, S),
];

/// Memory mappings: always libc's, whatever allocator `--object` names.
pub const C_MAPPINGS: &[AllocFn] = &[
    f("mmap", K::Mmap, S),
    f("munmap", K::Munmap, E),
    f("mremap", K::Mremap, S),
];

/// Every mangled C++ operator new/delete variant (plain, nothrow, aligned,
/// sized), in the Itanium ABI used by libstdc++ and libc++.
pub const CXX_ALLOCATORS: &[AllocFn] = &[
    f("_Znwm", K::New, S),
    f("_ZnwmRKSt9nothrow_t", K::New, S),
    f("_ZnwmSt11align_val_t", K::New, S),
    f("_ZnwmSt11align_val_tRKSt9nothrow_t", K::New, S),
    f("_Znam", K::NewArray, S),
    f("_ZnamRKSt9nothrow_t", K::NewArray, S),
    f("_ZnamSt11align_val_t", K::NewArray, S),
    f("_ZnamSt11align_val_tRKSt9nothrow_t", K::NewArray, S),
    f("_ZdlPv", K::Delete, S),
    f("_ZdlPvm", K::Delete, S),
    f("_ZdlPvRKSt9nothrow_t", K::Delete, S),
    f("_ZdlPvSt11align_val_t", K::Delete, S),
    f("_ZdlPvmSt11align_val_t", K::Delete, S),
    f("_ZdlPvSt11align_val_tRKSt9nothrow_t", K::Delete, S),
    f("_ZdaPv", K::DeleteArray, S),
    f("_ZdaPvm", K::DeleteArray, S),
    f("_ZdaPvRKSt9nothrow_t", K::DeleteArray, S),
    f("_ZdaPvSt11align_val_t", K::DeleteArray, S),
    f("_ZdaPvmSt11align_val_t", K::DeleteArray, S),
    f("_ZdaPvSt11align_val_tRKSt9nothrow_t", K::DeleteArray, S),
];

/// Cookie kinds of libc wrappers (see `enum memleak_wrapper`).
pub mod wrapper {
    /// strdup, strndup: size of the nested allocation.
    pub const STRDUP: u8 = 64;
    /// asprintf, vasprintf: block at `*arg0`.
    pub const ASPRINTF: u8 = 65;
    /// getline, getdelim: block at `*arg0`.
    pub const GETLINE: u8 = 66;
    /// libc housekeeping whose nested frees are not the program's.
    pub const SILENT: u8 = 67;
}

/// libc functions that allocate for their caller. libc is built without
/// frame pointers, so a stack captured at the nested malloc would skip the
/// caller; probing the wrapper as the outermost call keeps it.
pub const C_WRAPPERS: &[AllocFn] = &[
    w("strdup", wrapper::STRDUP),
    w("strndup", wrapper::STRDUP),
    w("asprintf", wrapper::ASPRINTF),
    w("vasprintf", wrapper::ASPRINTF),
    w("getline", wrapper::GETLINE),
    w("getdelim", wrapper::GETLINE),
    // At thread exit glibc flushes the thread's tcache by calling free() on
    // blocks the program freed long ago: not frees of the program's.
    w("__libc_thread_freeres", wrapper::SILENT),
];

/// A resolved probe point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePoint {
    /// The function.
    pub func: AllocFn,
    /// Symbol as found (with prefix).
    pub symbol: String,
    /// File offset of the function entry.
    pub entry_offset: u64,
    /// Function size in bytes (0 if unknown).
    pub size: u64,
    /// File offset where the probe goes (entry, or later; see placement).
    pub probe_offset: u64,
    /// Why this placement, for `-v`.
    pub note: String,
}

/// The probes for one library file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryProbes {
    /// Path our process opens (may go through `/proc/PID/root`).
    pub path: PathBuf,
    /// Resolved functions.
    pub points: Vec<ProbePoint>,
    /// Functions the library does not have.
    pub missing: Vec<String>,
}

/// Resolves `funcs` (with `prefix`) in an ELF file and places each probe
/// (see [`crate::placement`]; `Policy::Entry` keeps every probe at the
/// function entry). Several names may share an address (aliases: glibc's
/// memalign and aligned_alloc); each address is probed once, by its first
/// name.
pub fn resolve(
    path: &Path,
    funcs: &[AllocFn],
    prefix: &str,
    policy: Policy,
) -> Result<LibraryProbes, String> {
    let elf = ElfFile::open(path).map_err(|e| match e {
        // Says "reading PATH" itself.
        ElfError::Io { .. } => e.to_string(),
        _ => format!("{}: {e}", path.display()),
    })?;
    let mut out = LibraryProbes {
        path: path.to_path_buf(),
        points: Vec::new(),
        missing: Vec::new(),
    };
    for func in funcs {
        let Some(point) = resolve_function(path, &elf, func, prefix, policy) else {
            out.missing.push(format!("{prefix}{}", func.symbol));
            continue;
        };
        if out
            .points
            .iter()
            .any(|p| p.entry_offset == point.entry_offset)
        {
            continue;
        }
        out.points.push(point);
    }
    Ok(out)
}

/// One function of [`resolve`], in the already parsed file at `path`;
/// `None` if the file does not define it. Aliases are not looked for.
pub fn resolve_function(
    path: &Path,
    elf: &ElfFile,
    func: &AllocFn,
    prefix: &str,
    policy: Policy,
) -> Option<ProbePoint> {
    let name = format!("{prefix}{}", func.symbol);
    let kind = match func.mode {
        ProbeMode::Session => ProbeKind::EntryAndReturn,
        ProbeMode::EntryOnly => ProbeKind::EntryOnly,
    };
    if let Some(r) = resolve_one(elf, &name, kind, policy) {
        return Some(ProbePoint {
            func: *func,
            symbol: name,
            entry_offset: r.file_offset,
            size: r.func_size,
            probe_offset: r.probe_file_offset(),
            note: match &r.placement {
                Placement::Entry { reason } => format!("entry: {reason}"),
                Placement::Offset { skipped, .. } => format!("skips {}", skipped.join("; ")),
            },
        });
    }
    if func.cookie != wrapper::SILENT {
        return None;
    }
    let off = debug_symbol_offset(path, elf, &name)?;
    Some(ProbePoint {
        func: *func,
        symbol: name,
        entry_offset: off,
        size: 0,
        probe_offset: off,
        note: "entry: found in separate debug symbols".into(),
    })
}

/// File offset of a local symbol known only to the separate debug file
/// (glibc's `__libc_thread_freeres` is not exported). Only the housekeeping
/// hooks come here, and only when the exported tables lack them. The debug
/// file found by build id is read for its symbol table alone; blazesym's
/// lookup, the fallback, also decompresses the DWARF, tens of milliseconds
/// of CPU at every start for glibc.
fn debug_symbol_offset(path: &Path, elf: &ElfFile, name: &str) -> Option<u64> {
    debug_symbol_by_build_id(elf, name).or_else(|| debug_symbol_by_blazesym(path, elf, name))
}

fn debug_symbol_by_build_id(elf: &ElfFile, name: &str) -> Option<u64> {
    let debug = ElfFile::open(&elf.debug_file_path()?).ok()?;
    elf.vaddr_to_offset(debug.lookup_function(name)?.value)
}

fn debug_symbol_by_blazesym(path: &Path, elf: &ElfFile, name: &str) -> Option<u64> {
    use blazesym::inspect::source::{Elf, Source};
    let src = Source::Elf(Elf::new(path));
    let inspector = blazesym::inspect::Inspector::new();
    let found = inspector.lookup(&src, &[name]).ok()?;
    let info = found.into_iter().next()?.into_iter().next()?;
    info.file_offset.or_else(|| elf.vaddr_to_offset(info.addr))
}

/// This system's libstdc++: the one a command memleak starts will load
/// (it is not running yet, so its maps cannot say).
pub fn system_cxx_library() -> Option<PathBuf> {
    [
        "/lib/x86_64-linux-gnu/libstdc++.so.6",
        "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
        "/usr/lib64/libstdc++.so.6",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// Finds the libraries of `pid` that provide `name_prefix` (e.g.
/// `libc.so`), as paths our process can open.
pub fn find_library(pid: u32, name_prefix: &str) -> Option<PathBuf> {
    let maps = read_maps(pid).ok()?;
    maps.iter().filter(|m| m.is_file()).find_map(|m| {
        let path = m.path.as_deref()?;
        let file = Path::new(path).file_name()?.to_str()?;
        file.starts_with(name_prefix)
            .then(|| resolve_in_process(pid, path))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_glibc_allocators_and_dedups_aliases() {
        let libc = find_library(std::process::id(), "libc.so").expect("tests link glibc");
        let probes = resolve(&libc, C_ALLOCATORS, "", Policy::Auto).unwrap();
        let names: Vec<&str> = probes.points.iter().map(|p| p.symbol.as_str()).collect();
        for must in ["malloc", "free", "calloc", "realloc"] {
            assert!(names.contains(&must), "{must} missing from {names:?}");
        }
        // glibc's memalign and aligned_alloc are one function.
        assert!(!(names.contains(&"memalign") && names.contains(&"aligned_alloc")));
        let offsets: std::collections::HashSet<u64> =
            probes.points.iter().map(|p| p.entry_offset).collect();
        assert_eq!(offsets.len(), probes.points.len());
        let none = resolve(&libc, C_ALLOCATORS, "je_", Policy::Auto).unwrap();
        assert!(none.points.is_empty());
        assert_eq!(none.missing.len(), C_ALLOCATORS.len());
    }

    /// The symbol table of the debug file found by build id gives the same
    /// place as blazesym's lookup (which also parses the DWARF); with no
    /// debug file installed, neither finds glibc's unexported hook.
    #[test]
    fn debug_symbol_by_build_id_matches_blazesym() {
        let libc = find_library(std::process::id(), "libc.so").expect("tests link glibc");
        let elf = ElfFile::open(&libc).unwrap();
        assert!(elf.build_id().is_some_and(|id| id.len() >= 16));
        let name = "__libc_thread_freeres";
        assert_eq!(
            debug_symbol_by_build_id(&elf, name),
            debug_symbol_by_blazesym(&libc, &elf, name)
        );
    }
}
