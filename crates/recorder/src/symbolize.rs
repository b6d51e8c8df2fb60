//! Symbolization of normalized frames with blazesym, done by the recorder
//! while the binaries are at hand, so a trace analyzes on any machine.
//!
//! Every frame of a user stack is a return address, so the lookup uses
//! `addr - 1`, inside the call instruction: that gives the line of the
//! call, not the line after it (bcc's memleak is off by one here), and the
//! function of the call even when the call is a function's last
//! instruction. Frame 0 is no exception: `walk_user_stack` stores the
//! instruction pointer as frame 0 only in the return halves of the
//! allocator probes, when the kernel has already sent the thread back to
//! the address the allocator returns to (the uretprobe trampoline sets
//! `ip` to the original return address before the program runs): the
//! instruction after the call in the caller, like every other frame.
//! Only the entry of a signal-return trampoline, where the kernel makes a
//! signal handler return, is a return address that follows no call; the
//! recorder recognizes it (see `crate::functions`). Kernel frames are
//! looked up the same way.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{channel, SendError, Sender};

use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{Input, Sym, Symbolized, Symbolizer};
use memleak_trace::{FrameRecord, InlinedFrame};

use crate::functions::FunctionSym;
use crate::procmaps::{same_object_here, Normalized};

/// A frame waiting for symbolization.
#[derive(Debug, Clone)]
pub struct PendingFrame {
    /// Process (0 for kernel frames).
    pub pid: u32,
    /// Raw return address.
    pub addr: u64,
    /// Where the address lives; `None` if no mapping contained it.
    pub normalized: Option<Normalized>,
    /// Path our process opens to read the object.
    pub open_path: Option<PathBuf>,
    /// The ELF function symbol containing the address, if the object's
    /// symbol tables have one.
    pub function: Option<FunctionSym>,
}

/// Turns pending frames into `frames` rows, in batches per object, on a
/// thread of its own. The first lookup in an object parses its DWARF,
/// all of it: for Debian's libc (libc6-dbg, compressed sections) 35 ms,
/// during which the recorder's thread, which asks, handled nothing and
/// the command waited at its next ptrace stop. [`prewarm`](Self::prewarm)
/// has the thread parse the objects a recording will need while the BPF
/// program loads. (blazesym's symbolizer cannot move between threads:
/// it stays on this one.)
pub struct FrameSymbolizer {
    requests: Sender<Request>,
}

enum Request {
    Prewarm(Vec<PathBuf>),
    Symbolize(Vec<PendingFrame>, Sender<Vec<FrameRecord>>),
}

impl Default for FrameSymbolizer {
    fn default() -> Self {
        let (requests, todo) = channel::<Request>();
        let spawned = std::thread::Builder::new()
            .name("memleak-symbols".into())
            .spawn(move || {
                let blaze = Blaze::default();
                for r in todo {
                    match r {
                        Request::Prewarm(paths) => blaze.prewarm(&paths),
                        Request::Symbolize(frames, reply) => {
                            // A panic in blazesym leaves the batch
                            // unsymbolized, not the recorder without frames.
                            let symbolized =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    blaze.symbolize(&frames)
                                }));
                            let _ = reply.send(
                                symbolized
                                    .unwrap_or_else(|_| frames.iter().map(unsymbolized).collect()),
                            );
                        }
                    }
                }
            });
        if spawned.is_err() {
            // No thread: every batch comes back unsymbolized.
            let (dead, _) = channel();
            return FrameSymbolizer { requests: dead };
        }
        FrameSymbolizer { requests }
    }
}

impl FrameSymbolizer {
    /// Has the objects at `paths` parsed ahead of their first frames
    /// (blazesym caches them by device and inode, whatever path names
    /// them later).
    pub fn prewarm(&self, paths: Vec<PathBuf>) {
        let _ = self.requests.send(Request::Prewarm(paths));
    }

    /// Symbolizes a batch. Frames that cannot be symbolized keep their
    /// normalized form, so the report can still name the object and
    /// offset; so do all of them if the thread is gone.
    pub fn symbolize(&self, frames: Vec<PendingFrame>) -> Vec<FrameRecord> {
        let (reply, answer) = channel();
        if let Err(SendError(Request::Symbolize(frames, _))) =
            self.requests.send(Request::Symbolize(frames, reply))
        {
            return frames.iter().map(unsymbolized).collect();
        }
        answer
            .recv()
            .expect("the symbolization thread answers every batch")
    }
}

/// blazesym's symbolizer, on the symbolization thread.
struct Blaze {
    symbolizer: Symbolizer,
}

impl Default for Blaze {
    fn default() -> Self {
        Blaze {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .enable_demangling(true)
                .build(),
        }
    }
}

impl Blaze {
    /// Parses `paths` (ELF and DWARF, a separate debug file's too) now,
    /// as a first lookup in each would.
    fn prewarm(&self, paths: &[PathBuf]) {
        for path in paths {
            let src = Source::Elf(Elf::new(path.clone()));
            let _ = self.symbolizer.symbolize(&src, Input::FileOffset(&[0]));
        }
    }

    /// Symbolizes a batch. Frames that cannot be symbolized keep their
    /// normalized form, so the report can still name the object and offset.
    fn symbolize(&self, frames: &[PendingFrame]) -> Vec<FrameRecord> {
        let mut out = Vec::with_capacity(frames.len());
        // Group user frames by object so each ELF is parsed once per batch.
        let mut by_object: HashMap<PathBuf, Vec<&PendingFrame>> = HashMap::new();
        let mut kernel = Vec::new();
        for f in frames {
            if f.pid == 0 {
                kernel.push(f);
            } else if f.function.as_ref().is_none_or(|func| func.trampoline) {
                // Named by the function symbol or not at all (see
                // `named_user_frame`): nothing to ask blazesym.
                out.push(named_user_frame(f, None));
            } else if let (Some(path), Some(_)) = (
                f.open_path.clone(),
                f.normalized.as_ref().and_then(|n| n.file_offset),
            ) {
                by_object.entry(path).or_default().push(f);
            } else {
                out.push(unsymbolized(f));
            }
        }
        for (path, group) in by_object {
            let offsets: Vec<u64> = group
                .iter()
                .map(|f| {
                    f.normalized
                        .as_ref()
                        .and_then(|n| n.file_offset)
                        .unwrap_or(1)
                        .saturating_sub(1)
                })
                .collect();
            let syms = self.symbolize_object(path, group[0], &offsets);
            for (i, f) in group.iter().enumerate() {
                let sym = match syms.get(i) {
                    Some(Symbolized::Sym(sym)) => Some(sym),
                    _ => None,
                };
                out.push(named_user_frame(f, sym));
            }
        }
        if !kernel.is_empty() {
            let src = Source::Kernel(Kernel::default());
            let addrs: Vec<u64> = kernel.iter().map(|f| f.addr.saturating_sub(1)).collect();
            let syms = self
                .symbolizer
                .symbolize(&src, Input::AbsAddr(&addrs))
                .unwrap_or_default();
            for (i, f) in kernel.iter().enumerate() {
                let mut rec = unsymbolized(f);
                if let Some(Symbolized::Sym(sym)) = syms.get(i) {
                    fill(&mut rec, sym);
                    rec.path = Some(sym.module.as_ref().map_or_else(
                        || "[kernel]".to_string(),
                        |m| m.to_string_lossy().into_owned(),
                    ));
                }
                out.push(rec);
            }
        }
        out
    }

    /// blazesym's answers for `offsets` in the object `f` lies in, opened
    /// at `path`: the process's own view of it. Such a path through
    /// `/proc/PID/root` (a process in another mount namespace, or the
    /// command in its private one) dies with the process, which can exit
    /// between the moment its frames were judged and this open: a forked
    /// child, a moment after its last allocation. The same object at its
    /// plain path, if the build ids agree, answers then.
    fn symbolize_object(
        &self,
        path: PathBuf,
        f: &PendingFrame,
        offsets: &[u64],
    ) -> Vec<Symbolized<'_>> {
        let at = |p: PathBuf| {
            self.symbolizer
                .symbolize(&Source::Elf(Elf::new(p)), Input::FileOffset(offsets))
        };
        match at(path.clone()) {
            Ok(syms) => syms,
            Err(_) => f
                .normalized
                .as_ref()
                .and_then(same_object_here)
                .filter(|plain| *plain != path)
                .and_then(|plain| at(plain).ok())
                .unwrap_or_default(),
        }
    }
}

fn unsymbolized(f: &PendingFrame) -> FrameRecord {
    let n = f.normalized.as_ref();
    FrameRecord {
        pid: f.pid,
        addr: f.addr,
        build_id: n.and_then(|n| n.build_id.clone()),
        path: n.and_then(|n| n.path.clone()),
        file_offset: n.and_then(|n| n.file_offset),
        ..FrameRecord::default()
    }
}

/// The row of a user frame. Only a function may name a frame: the ELF
/// function symbol containing the address (`f.function`, which the
/// recorder found when it judged the frame), by the name blazesym gives
/// it (from DWARF, demangled) with blazesym's source location and
/// inlined chain. blazesym alone names the nearest symbol below an
/// address, of any type: a table in `.rodata`, a label inside a
/// function. When its symbol is not the function (it starts elsewhere),
/// the function symbol's own name is used; without a function symbol the
/// frame has no name, only its object and offset.
fn named_user_frame(f: &PendingFrame, sym: Option<&Sym<'_>>) -> FrameRecord {
    let mut rec = unsymbolized(f);
    let Some(func) = &f.function else {
        return rec;
    };
    match sym {
        // 0: a DWARF subprogram without a start (see `user_func_offset`).
        Some(sym) if !func.trampoline && (sym.addr == func.start || sym.addr == 0) => {
            fill(&mut rec, sym);
            rec.func_offset = user_func_offset(sym, Some(func));
        }
        _ => {
            rec.function = func.names.first().cloned();
            rec.func_offset = rec.function.as_ref().map(|_| func.offset());
            if let Some(ci) = sym.and_then(|s| s.code_info.as_ref()) {
                // The line table still places the address.
                rec.file = Some(file_name(ci));
                rec.line = ci.line;
                rec.column = ci.column.map(u32::from);
            }
        }
    }
    rec
}

/// The offset of a user frame's return address into the function blazesym
/// named, or `None` when where that function starts is unknown.
///
/// blazesym reports the offset from the start it knows: an ELF symbol's
/// value, or a DWARF subprogram's `DW_AT_low_pc`. A subprogram described
/// by `DW_AT_ranges` instead (GCC's hot/cold splitting, as glibc's
/// `__pthread_create_2_1`) has no start for blazesym: it reports start 0,
/// and the "offset" is the address itself. The ELF function symbol
/// containing the address then gives the start, unless that symbol is the
/// split-off part (`foo.cold`) of a function that starts elsewhere.
fn user_func_offset(sym: &Sym<'_>, func: Option<&FunctionSym>) -> Option<u64> {
    if sym.addr != 0 {
        return Some(sym.offset as u64 + 1);
    }
    let func = func?;
    let same_name = func.names.iter().any(|n| *n == *sym.name);
    (same_name || !func.is_split_part()).then(|| func.offset())
}

fn file_name(ci: &blazesym::symbolize::CodeInfo<'_>) -> String {
    ci.to_path().to_string_lossy().into_owned()
}

/// Copies a blazesym symbol into a frame row. blazesym reports the outer
/// function with the location of its (inlined) call, then the inlined
/// functions outermost first, each with its own location; the trace stores
/// inlined functions innermost first.
fn fill(rec: &mut FrameRecord, sym: &Sym<'_>) {
    rec.function = Some(sym.name.to_string());
    rec.func_offset = Some(sym.offset as u64 + 1);
    if let Some(ci) = &sym.code_info {
        rec.file = Some(file_name(ci));
        rec.line = ci.line;
        rec.column = ci.column.map(u32::from);
    }
    rec.inlined = sym
        .inlined
        .iter()
        .rev()
        .map(|i| InlinedFrame {
            function: i.name.to_string(),
            file: i.code_info.as_ref().map(file_name),
            line: i.code_info.as_ref().and_then(|c| c.line),
            column: i.code_info.as_ref().and_then(|c| c.column).map(u32::from),
        })
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::functions::{FunctionIndex, Lookup};

    #[inline(never)]
    fn symbolized_target(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(7)
    }

    /// The process's path to an object fails at blazesym's open (a forked
    /// child's `/proc/PID/root` path, the child gone since its frames were
    /// judged; here a path that names no such process, and a file that is
    /// not the object): the frame still gets its function and source line,
    /// from the same object at its plain path.
    #[test]
    fn a_process_path_that_fails_at_the_open_falls_back_to_the_plain_path() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let pid = std::process::id();
        let mut maps = crate::procmaps::MapsCache::default();
        maps.snapshot(pid, 0);
        let addr = symbolized_target as *const () as u64 + 4;
        let n = maps.normalize(pid, addr).unwrap();
        if n.build_id.is_none() {
            return crate::skip::skip("the test binary has no build id");
        }
        let function = match FunctionIndex::open(&exe)
            .unwrap()
            .lookup(n.file_offset.unwrap())
        {
            Lookup::Function(f) => f,
            other => panic!("{other:?}"),
        };
        let dir = tempfile::tempdir().unwrap();
        let not_the_object = dir.path().join("forks");
        std::fs::write(&not_the_object, b"not an ELF file").unwrap();
        let gone = PathBuf::from(format!("/proc/4294967295/root{}", exe.display()));
        let blaze = Blaze::default();
        for open_path in [not_the_object, gone] {
            let f = PendingFrame {
                pid,
                addr,
                normalized: Some(n.clone()),
                open_path: Some(open_path.clone()),
                function: Some(function.clone()),
            };
            let rec = blaze.symbolize(&[f]).pop().unwrap();
            let name = rec.function.clone().unwrap_or_default();
            assert!(name.contains("symbolized_target"), "{open_path:?}: {rec:?}");
            assert!(
                rec.file
                    .as_deref()
                    .is_some_and(|f| f.ends_with("symbolize.rs")),
                "{open_path:?}: {rec:?}"
            );
            assert!(rec.line.is_some(), "{open_path:?}: {rec:?}");
        }
        assert_eq!(symbolized_target(1), 7);
    }
}
