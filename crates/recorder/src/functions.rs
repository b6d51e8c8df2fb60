//! Which function of an object a return address lies in, from the object's
//! ELF function symbols (`STT_FUNC`, `STT_GNU_IFUNC`; `.dynsym`, `.symtab`
//! and the `.symtab` of its separate debug file).
//!
//! The symbolizer (blazesym) answers "which symbol is nearest below this
//! address", of any type, and for a function that DWARF describes with
//! several ranges (a hot part and a `.cold` part) it does not know where
//! the function starts. This index answers the two questions a frame
//! needs: is the address inside a function at all, and where does that
//! function begin.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iced_x86::{Decoder, DecoderOptions, FlowControl};

use crate::elf::ElfFile;

/// One function symbol's address range, `[start, end)` in the object's
/// virtual addresses, with the names of every symbol of that range.
#[derive(Debug, Clone)]
struct Range {
    start: u64,
    end: u64,
    names: Vec<String>,
}

/// The function containing a return address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSym {
    /// Names of the symbols of the function (aliases), as in the symbol
    /// table (mangled, without version).
    pub names: Vec<String>,
    /// Virtual address (in the object) of the function's first byte.
    pub start: u64,
    /// Virtual address (in the object) of the return address.
    pub ret: u64,
    /// The return address is the first instruction of a signal-return
    /// trampoline (`sa_restorer`): the return address the kernel gives a
    /// signal handler, not the successor of a call. `addr - 1` is then
    /// not in the function, and the frame is named by the function that
    /// starts at the address.
    pub trampoline: bool,
}

impl FunctionSym {
    /// Offset of the return address from the function's start.
    pub fn offset(&self) -> u64 {
        self.ret - self.start
    }

    /// Whether this is a part split off a function whose entry is
    /// elsewhere (GCC's `foo.cold`): the offset from its start is not an
    /// offset into the function a debugger would name.
    pub fn is_split_part(&self) -> bool {
        self.names.iter().all(|n| n.contains(".cold"))
    }
}

/// What the index says about a return address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Inside this function.
    Function(FunctionSym),
    /// In no function, and the object lists all of its functions (it has
    /// a `.symtab`, or a debug file with one): not a return address.
    NotCode,
    /// In no function the object lists; it lists only its exported ones
    /// (stripped, no debug file), so nothing can be said.
    Unknown,
}

/// The function symbols of one object.
#[derive(Debug)]
pub struct FunctionIndex {
    /// Sorted by `start`, then `end`.
    ranges: Vec<Range>,
    /// `max_end[i]`: the largest `end` of `ranges[..=i]`, to stop the
    /// backward scan for a containing range.
    max_end: Vec<u64>,
    /// Every function has a symbol (a `.symtab` was found).
    complete: bool,
    /// `(p_vaddr, p_offset, p_filesz)` of the object's `PT_LOAD`s.
    segments: Vec<(u64, u64, u64)>,
    /// The object itself, for the code bytes at an address.
    elf: ElfFile,
}

/// `mov $15, %rax; syscall` and `mov $15, %eax; syscall`: rt_sigreturn,
/// the body of glibc's and musl's `__restore_rt`.
const SIGRETURN: [&[u8]; 2] = [
    &[0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05],
    &[0xb8, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05],
];

impl FunctionIndex {
    /// Reads the function symbols of `path` and of its separate debug
    /// file, if one is installed (by build id, or by `.gnu_debuglink`).
    pub fn open(path: &Path) -> Option<FunctionIndex> {
        let elf = ElfFile::open(path).ok()?;
        // A debug file found by name must be of this very build.
        let debug = debug_files(&elf, path)
            .into_iter()
            .filter_map(|p| ElfFile::open(&p).ok())
            .find(|d| elf.build_id().is_none() || d.build_id() == elf.build_id());
        Some(Self::from_elfs(elf, debug.as_ref()))
    }

    /// The index of an object, with the symbols of its debug file.
    pub fn from_elfs(elf: ElfFile, debug: Option<&ElfFile>) -> FunctionIndex {
        let mut syms: Vec<(u64, u64, bool, &str)> = Vec::new();
        let mut complete = false;
        for s in elf
            .function_symbols()
            .chain(debug.into_iter().flat_map(|d| d.function_symbols()))
        {
            complete |= !s.dynamic;
            syms.push((s.value, s.size, s.dynamic, &s.name));
        }
        // A symbol without a size (hand-written assembly) reaches to the
        // next function's start when it comes from `.symtab`, which lists
        // every function; from `.dynsym` alone it covers nothing.
        let mut starts: Vec<u64> = syms.iter().map(|s| s.0).collect();
        starts.sort_unstable();
        starts.dedup();
        let mut by_range: HashMap<(u64, u64), Vec<String>> = HashMap::new();
        for &(start, size, dynamic, name) in &syms {
            let end = if size > 0 {
                start.saturating_add(size)
            } else if dynamic {
                continue;
            } else {
                let i = starts.partition_point(|&s| s <= start);
                match starts.get(i) {
                    Some(&next) => next,
                    None => continue,
                }
            };
            let names = by_range.entry((start, end)).or_default();
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
        let mut ranges: Vec<Range> = by_range
            .into_iter()
            .map(|((start, end), names)| Range { start, end, names })
            .collect();
        ranges.sort_by_key(|r| (r.start, r.end));
        let mut max_end = Vec::with_capacity(ranges.len());
        let mut m = 0;
        for r in &ranges {
            m = m.max(r.end);
            max_end.push(m);
        }
        let segments = elf.load_segments().collect();
        FunctionIndex {
            ranges,
            max_end,
            complete,
            segments,
            elf,
        }
    }

    /// The virtual address of a file offset, via the `PT_LOAD` holding it.
    pub fn vaddr_of(&self, file_offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|&&(_, off, size)| file_offset >= off && file_offset - off < size)
            .map(|&(vaddr, off, _)| file_offset - off + vaddr)
    }

    /// The function containing `vaddr`: the range starting last among
    /// those that contain it, with the names of every symbol of that
    /// start whose range contains it.
    fn containing(&self, vaddr: u64) -> Option<(u64, Vec<String>)> {
        let mut i = self.ranges.partition_point(|r| r.start <= vaddr);
        let mut found: Option<(u64, Vec<String>)> = None;
        while i > 0 {
            i -= 1;
            if self.max_end[i] <= vaddr {
                break;
            }
            let r = &self.ranges[i];
            match &mut found {
                Some((start, _)) if r.start != *start => break,
                _ => {}
            }
            if vaddr < r.end {
                let (_, names) = found.get_or_insert_with(|| (r.start, Vec::new()));
                for n in &r.names {
                    if !names.contains(n) {
                        names.push(n.clone());
                    }
                }
            }
        }
        found
    }

    /// Judges a return address, given as its offset in the object file.
    pub fn lookup(&self, file_offset: u64) -> Lookup {
        let Some(ret) = self.vaddr_of(file_offset) else {
            return if self.complete {
                Lookup::NotCode
            } else {
                Lookup::Unknown
            };
        };
        // The call instruction is the byte before the return address.
        if let Some((start, names)) = ret.checked_sub(1).and_then(|a| self.containing(a)) {
            return Lookup::Function(FunctionSym {
                names,
                start,
                ret,
                trampoline: false,
            });
        }
        if self.is_sigreturn(ret) {
            let names = self
                .containing(ret)
                .filter(|(start, _)| *start == ret)
                .map(|(_, names)| names)
                .unwrap_or_default();
            return Lookup::Function(FunctionSym {
                names,
                start: ret,
                ret,
                trampoline: true,
            });
        }
        if self.complete {
            Lookup::NotCode
        } else {
            Lookup::Unknown
        }
    }

    /// Whether the instruction before a return address (given as its
    /// offset in the object file) is a call: some instruction of 2 to 15
    /// bytes ending right at it decodes as a call. A return address is
    /// pushed by a call (the entry of a signal-return trampoline excepted,
    /// see [`FunctionSym::trampoline`]); a word of data that points into
    /// code rarely follows one. `None` when the file holds no code there.
    pub fn follows_call(&self, file_offset: u64) -> Option<bool> {
        let ret = self.vaddr_of(file_offset)?;
        let mut any_bytes = false;
        for len in 2..=15u64 {
            let Some(code) = ret.checked_sub(len).and_then(|a| self.elf.bytes_at(a, len)) else {
                continue;
            };
            if code.len() as u64 != len {
                continue;
            }
            any_bytes = true;
            let insn = Decoder::with_ip(64, code, ret - len, DecoderOptions::NONE).decode();
            if !insn.is_invalid()
                && insn.len() as u64 == len
                && matches!(
                    insn.flow_control(),
                    FlowControl::Call | FlowControl::IndirectCall
                )
            {
                return Some(true);
            }
        }
        any_bytes.then_some(false)
    }

    fn is_sigreturn(&self, vaddr: u64) -> bool {
        SIGRETURN
            .iter()
            .any(|code| self.elf.bytes_at(vaddr, code.len() as u64) == Some(code))
    }
}

/// Where the separate debug file of `elf` (opened from `path`) may be:
/// by build id under /usr/lib/debug, then by `.gnu_debuglink` next to the
/// object, in its `.debug` directory, and under /usr/lib/debug.
fn debug_files(elf: &ElfFile, path: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = elf.debug_file_path().into_iter().collect();
    if let Some(link) = elf.section(".gnu_debuglink") {
        let name_len = link.bytes.iter().position(|&b| b == 0).unwrap_or(0);
        let name = String::from_utf8_lossy(&link.bytes[..name_len]).into_owned();
        let dir = path.parent().unwrap_or(Path::new("/"));
        if !name.is_empty() && !name.contains('/') {
            out.push(dir.join(&name));
            out.push(dir.join(".debug").join(&name));
            let rel = dir.strip_prefix("/").unwrap_or(dir);
            out.push(Path::new("/usr/lib/debug").join(rel).join(&name));
        }
    }
    out.retain(|p| p != path);
    out
}

/// The indexes of the objects seen so far, by build id (or path when the
/// object has none), so each is read once whatever process maps it.
#[derive(Default)]
pub struct FunctionIndexes {
    by_key: HashMap<String, Option<Arc<FunctionIndex>>>,
}

impl FunctionIndexes {
    /// The index of the object opened at `path`, else at the path
    /// `fallback` gives (the process's path can die with it before the
    /// open); `None` if neither can be read as ELF. Kept by build id: the
    /// answer, a failure included, is the same for every later frame.
    pub fn get(
        &mut self,
        build_id: Option<&str>,
        path: &Path,
        fallback: impl FnOnce() -> Option<PathBuf>,
    ) -> Option<Arc<FunctionIndex>> {
        let key = match build_id {
            Some(b) => format!("b:{b}"),
            None => format!("p:{}", path.display()),
        };
        self.by_key
            .entry(key)
            .or_insert_with(|| {
                FunctionIndex::open(path)
                    .or_else(|| FunctionIndex::open(&fallback()?))
                    .map(Arc::new)
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn probe_target(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(3)
    }

    /// Addresses of this test binary: its own functions are found, with
    /// their start; the bytes just before a function (after the previous
    /// one) and data are not code. Kept out of line: the search for calls
    /// below looks for its own symbol, which the compiler may otherwise
    /// fold into the test harness's closure.
    #[test]
    #[inline(never)]
    fn finds_functions_of_this_binary() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let idx = FunctionIndex::open(&exe).unwrap();
        assert!(idx.complete, "test binaries keep .symtab");
        let mut maps = crate::procmaps::MapsCache::default();
        let pid = std::process::id();
        maps.snapshot(pid, 0);
        let f = probe_target as *const () as u64;
        let n = maps.normalize(pid, f + 4).unwrap();
        match idx.lookup(n.file_offset.unwrap()) {
            Lookup::Function(s) => {
                assert_eq!(s.offset(), 4);
                assert!(
                    s.names.iter().any(|n| n.contains("probe_target")),
                    "{:?}",
                    s.names
                );
                assert!(!s.trampoline);
            }
            other => panic!("{other:?}"),
        }
        // A string constant lives in .rodata: no function there.
        static TEXT: &str = "not a function, just some bytes";
        let n = maps.normalize(pid, TEXT.as_ptr() as u64 + 8).unwrap();
        assert_eq!(idx.lookup(n.file_offset.unwrap()), Lookup::NotCode);
        probe_target(1);
        // A return address follows a call; the middle of a function
        // rarely does.
        let after_call = idx
            .ranges
            .iter()
            .find(|r| {
                r.names
                    .iter()
                    .any(|n| n.contains("finds_functions_of_this_binary"))
            })
            .map(|r| (r.start, r.end))
            .unwrap();
        let code = idx
            .elf
            .bytes_at(after_call.0, after_call.1 - after_call.0)
            .unwrap();
        let mut calls = 0;
        let mut others = 0;
        let mut d = Decoder::with_ip(64, code, after_call.0, DecoderOptions::NONE);
        for insn in &mut d {
            let next = insn.next_ip();
            let (seg_vaddr, seg_off, _) = *idx
                .segments
                .iter()
                .find(|&&(v, _, sz)| next >= v && next - v < sz)
                .unwrap();
            let follows = idx.follows_call(next - seg_vaddr + seg_off);
            if insn.flow_control() == FlowControl::Call {
                assert_eq!(follows, Some(true), "after the call at {:#x}", insn.ip());
                calls += 1;
            } else if follows == Some(false) {
                others += 1;
            }
        }
        assert!(calls > 3 && others > 10, "{calls} calls, {others} others");
    }

    /// glibc's `__restore_rt` is where a signal handler returns to: its
    /// first byte is the return address, and the byte before it is padding.
    #[test]
    fn a_sigreturn_trampoline_is_a_frame() {
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists());
        let Some(libc) = libc else {
            return crate::skip::skip("no libc.so.6 at the Debian or Fedora path");
        };
        let idx = FunctionIndex::open(libc).unwrap();
        let Some(r) = idx
            .ranges
            .iter()
            .find(|r| r.names.iter().any(|n| n == "__restore_rt"))
        else {
            return crate::skip::skip("no __restore_rt symbol (libc without debug symbols)");
        };
        let (vaddr, off, _) = *idx
            .segments
            .iter()
            .find(|&&(v, _, sz)| r.start >= v && r.start - v < sz)
            .unwrap();
        match idx.lookup(r.start - vaddr + off) {
            Lookup::Function(s) => {
                assert!(s.trampoline);
                assert_eq!(s.start, r.start);
                assert_eq!(s.offset(), 0);
                assert!(s.names.iter().any(|n| n == "__restore_rt"));
            }
            other => panic!("{other:?}"),
        }
    }
}
