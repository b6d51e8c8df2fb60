//! What a scan starts from: the process's memory that is not heap, as
//! memcheck's leak check sees it. The rules, one writable (`rw`) mapping
//! at a time:
//!
//! - a mapping that holds a thread's stack pointer is that thread's
//!   stack: a root from the stack pointer minus the 128-byte red zone up
//!   to the mapping's end (above it: the caller frames, and for threads
//!   other than the main one their TLS and `struct pthread`);
//! - `[heap]` is the allocator's, never a root, nor is a glibc arena heap
//!   in anonymous memory (found by its `heap_info` header at a 64 MiB
//!   boundary): free chunks there hold stale pointers that would hide
//!   leaks;
//! - the parts of a mapping covered by an outstanding `mmap` block, and
//!   in anonymous memory by a heap block (glibc's mmap'd large chunks),
//!   are blocks, scanned only when reached;
//! - `[vvar]`, `[vdso]`, `[vsyscall]` and device files (`/dev/...`) are
//!   skipped;
//! - everything else is a root: the writable segments of the loaded
//!   objects (`.data`, `.bss` with its anonymous tail, the GOT), the
//!   main thread's static TLS (an anonymous mapping ld.so made), and
//!   other anonymous memory the program mapped without the traced
//!   functions.
//!
//! Every general register of every stopped thread is a root too.

use super::mem::Memory;
use super::stop::StoppedThread;
use super::{Block, ScanError};
use crate::procmaps::Mapping;

/// Bytes below the stack pointer that the x86-64 ABI lets a function use
/// without moving it (the red zone): live data, scanned.
pub(crate) const RED_ZONE: u64 = 128;

/// glibc's arena heaps (`HEAP_MAX_SIZE` on 64-bit) are aligned to this.
const ARENA_HEAP_ALIGN: u64 = 64 << 20;

/// glibc's chunk header before a heap block.
const CHUNK_HEADER: u64 = 16;

/// The roots of a scan.
#[derive(Debug, Default)]
pub(crate) struct Roots {
    /// Memory ranges (address, length), 8-byte aligned.
    pub ranges: Vec<(u64, u64)>,
    /// The register values of the stopped threads.
    pub words: Vec<u64>,
    /// The mappings that are a thread's stack (start, end): an `mmap`
    /// block there is a live thread's stack, reachable.
    pub stacks: Vec<(u64, u64)>,
    /// Threads whose registers could not be read.
    pub threads_without_registers: u32,
}

/// Every general register of a thread, as words.
fn register_words(r: &libc::user_regs_struct) -> [u64; 27] {
    [
        r.r15, r.r14, r.r13, r.r12, r.rbp, r.rbx, r.r11, r.r10, r.r9, r.r8, r.rax, r.rcx, r.rdx,
        r.rsi, r.rdi, r.orig_rax, r.rip, r.cs, r.eflags, r.rsp, r.ss, r.fs_base, r.gs_base, r.ds,
        r.es, r.fs, r.gs,
    ]
}

fn is_special(m: &Mapping) -> bool {
    match m.path.as_deref() {
        Some("[heap]")
        | Some("[vvar]")
        | Some("[vvar_vclock]")
        | Some("[vdso]")
        | Some("[vsyscall]") => true,
        // memleak's own agent (`--capture preload`): its ring holds
        // every recorded address, none of them the program's pointer.
        Some(p) => p.starts_with("/dev/") || p.starts_with(AGENT_MEMORY),
        None => false,
    }
}

/// How the agent's memfds (its ring, its code) appear in the maps.
const AGENT_MEMORY: &str = "/memfd:memleak-agent";

fn is_anonymous(m: &Mapping) -> bool {
    !m.is_file()
}

/// `range` minus the sorted, disjoint `holes`.
fn subtract(range: (u64, u64), holes: &[(u64, u64)], out: &mut Vec<(u64, u64)>) {
    let (mut start, end) = range;
    let first = holes.partition_point(|h| h.1 <= start);
    for &(hs, he) in &holes[first..] {
        if hs >= end {
            break;
        }
        if hs > start {
            out.push((start, hs));
        }
        start = start.max(he);
        if start >= end {
            return;
        }
    }
    if start < end {
        out.push((start, end));
    }
}

/// The roots of a stopped process, given its maps (sorted by start) and
/// the outstanding blocks sorted by address.
pub(crate) fn find_roots(
    maps: &[Mapping],
    threads: &[StoppedThread],
    blocks: &[Block],
    mem: &mut dyn Memory,
) -> Result<Roots, ScanError> {
    let mut roots = Roots::default();
    let mut sps = Vec::new();
    for t in threads {
        match &t.regs {
            Some(r) => {
                roots.words.extend(register_words(r));
                sps.push(r.rsp);
            }
            None => roots.threads_without_registers += 1,
        }
    }
    // The blocks' extents: mmap blocks whole, heap blocks with their
    // 16-byte chunk header, merged. Heap blocks matter in anonymous
    // mappings only (glibc's mmap'd chunks; elsewhere they are in
    // `[heap]` or in an arena).
    let mut extents: Vec<(u64, u64)> = blocks
        .iter()
        .filter(|b| b.size > 0)
        .map(|b| {
            if b.is_mapping {
                (b.addr, b.addr + b.size)
            } else {
                (b.addr.saturating_sub(CHUNK_HEADER), b.addr + b.size)
            }
        })
        .collect();
    extents.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(extents.len());
    for h in extents {
        match merged.last_mut() {
            Some(last) if h.0 <= last.1 => last.1 = last.1.max(h.1),
            _ => merged.push(h),
        }
    }
    let mmap_only: Vec<(u64, u64)> = {
        let mut v: Vec<(u64, u64)> = blocks
            .iter()
            .filter(|b| b.is_mapping && b.size > 0)
            .map(|b| (b.addr, b.addr + b.size))
            .collect();
        v.sort_unstable();
        let mut m: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for h in v {
            match m.last_mut() {
                Some(last) if h.0 <= last.1 => last.1 = last.1.max(h.1),
                _ => m.push(h),
            }
        }
        m
    };
    let mut header = Vec::new();
    for m in maps {
        let p = m.perms.as_bytes();
        if p.first() != Some(&b'r') || p.get(1) != Some(&b'w') || is_special(m) {
            continue;
        }
        if let Some(sp) = sps
            .iter()
            .copied()
            .filter(|&sp| sp >= m.start && sp < m.end)
            .min()
        {
            let from = (sp.saturating_sub(RED_ZONE) & !7).max(m.start);
            roots.ranges.push((from, m.end));
            roots.stacks.push((m.start, m.end));
            continue;
        }
        if !is_anonymous(m) {
            subtract((m.start, m.end), &mmap_only, &mut roots.ranges);
            continue;
        }
        // Anonymous: minus glibc arena heaps (a `heap_info` header at a
        // 64 MiB boundary: arena pointer, previous heap, size in use) and
        // the blocks; what is left (ld.so's TLS, memory the program mapped
        // itself, adjacent mappings the kernel merged) is a root.
        let mut holes = Vec::new();
        let mut a = m.start.next_multiple_of(ARENA_HEAP_ALIGN);
        while a + 4096 <= m.end {
            mem.read(&[(a, 24)], &mut header)?;
            let w = |i: usize| u64::from_ne_bytes(header[i * 8..i * 8 + 8].try_into().unwrap());
            let (arena, prev, size) = (w(0), w(1), w(2));
            let arena_heap = arena != 0
                && (prev == 0 || prev.is_multiple_of(ARENA_HEAP_ALIGN))
                && size > 0
                && size <= ARENA_HEAP_ALIGN
                && size.is_multiple_of(4096);
            if arena_heap {
                holes.push((a, a + ARENA_HEAP_ALIGN));
            }
            a += ARENA_HEAP_ALIGN;
        }
        let first = merged.partition_point(|h| h.1 <= m.start);
        for &h in &merged[first..] {
            if h.0 >= m.end {
                break;
            }
            holes.push(h);
        }
        holes.sort_unstable();
        let mut hm: Vec<(u64, u64)> = Vec::with_capacity(holes.len());
        for h in holes {
            match hm.last_mut() {
                Some(last) if h.0 <= last.1 => last.1 = last.1.max(h.1),
                _ => hm.push(h),
            }
        }
        subtract((m.start, m.end), &hm, &mut roots.ranges);
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtracts_holes() {
        let mut out = Vec::new();
        subtract(
            (100, 200),
            &[(0, 110), (120, 130), (150, 160), (190, 300)],
            &mut out,
        );
        assert_eq!(out, vec![(110, 120), (130, 150), (160, 190)]);
        out.clear();
        subtract((100, 200), &[(0, 50), (250, 300)], &mut out);
        assert_eq!(out, vec![(100, 200)]);
        out.clear();
        subtract((100, 200), &[(100, 200)], &mut out);
        assert!(out.is_empty());
    }
}
