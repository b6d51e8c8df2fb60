//! What a scan starts from: the process's memory that is not heap, as
//! memcheck's leak check sees it (`docs/scan.md`, *Roots*, rule by
//! rule). One readable and writable (`rw`) mapping at a time:
//!
//! - a mapping that holds a thread's stack pointer, or the one an exited
//!   thread had at its exit (glibc keeps such stacks cached), is that
//!   thread's stack: a root from the stack pointer minus the 128-byte red
//!   zone up to the mapping's end;
//! - the allocator's own memory is never a root: `[heap]`, glibc's arena
//!   heaps, `main_arena` in libc's data, glibc's mmap'd chunks, and an
//!   anonymous mapping holding another allocator's blocks;
//! - `[vvar]`, `[vdso]`, `[vsyscall]` and device files are skipped;
//! - everything else is a root, `mmap` blocks included, as memcheck
//!   scans every client `rw` segment.
//!
//! The 16 general registers of every stopped thread are roots too.

use super::mem::Memory;
use super::stop::{ExitedThread, StoppedThread};
use super::types::{Block, ScanError};
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
    /// Memory in use that is never scanned (start, end): the mappings that
    /// are a thread's stack, live or cached by glibc after the thread
    /// exited, and the allocator's own heaps. An `mmap` block there is in
    /// use, reachable.
    pub in_use: Vec<(u64, u64)>,
    /// Threads whose registers could not be read.
    pub threads_without_registers: u32,
}

/// The general registers memcheck scans (`rax` to `r15`, `rsp` and
/// `rbp` among them), as words; not `rip`, the segment registers nor
/// `fs_base`.
fn register_words(r: &libc::user_regs_struct) -> [u64; 16] {
    [
        r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11, r.r12,
        r.r13, r.r14, r.r15,
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

/// Whether a file mapping is glibc's libc (`libc.so.6`, `libc-2.NN.so`).
fn is_libc(m: &Mapping) -> bool {
    let name = m
        .path
        .as_deref()
        .and_then(|p| p.rsplit('/').next())
        .unwrap_or("");
    name.starts_with("libc.so") || (name.starts_with("libc-") && name.ends_with(".so"))
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

fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut m: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for h in v {
        match m.last_mut() {
            Some(last) if h.0 <= last.1 => last.1 = last.1.max(h.1),
            _ => m.push(h),
        }
    }
    m
}

fn word_at(b: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(b[off..off + 8].try_into().unwrap())
}

/// glibc's `struct malloc_state` (glibc 2.27 and later, 64-bit): offsets
/// of `top`, `bins` and `next`, and its size.
const ARENA_TOP: u64 = 96;
const ARENA_BINS: u64 = 112;
const ARENA_NEXT: u64 = 2160;
const ARENA_SIZE: u64 = 2200;

/// glibc's `main_arena` in libc's writable data, `[start, end)`: the
/// allocator's own state (free lists, the top chunk), which memcheck
/// never sees (its allocator replaces glibc's). Its `top` points to the
/// top chunk, just past the last block, and can fall inside that block's
/// last bytes; its bins point to free chunks. Found by the arena list:
/// `next` leads back to the arena itself (through the other arenas'
/// states, each right after the `heap_info` at its heap's start), and an
/// empty bin points to itself.
fn find_main_arena(
    m: &Mapping,
    maps: &[Mapping],
    mem: &mut dyn Memory,
) -> Result<Option<(u64, u64)>, ScanError> {
    let mut buf = Vec::new();
    mem.read(&[(m.start, m.end - m.start)], &mut buf)?;
    let len = buf.len() as u64;
    let mut one = Vec::new();
    for off in (ARENA_NEXT..len.saturating_sub(7)).step_by(8) {
        let x = m.start + off - ARENA_NEXT;
        if off - ARENA_NEXT + ARENA_SIZE > len {
            break;
        }
        // An empty bin's two links point to the bin's own header.
        let empty_bins = (0..127u64)
            .filter(|k| {
                let b = (off - ARENA_NEXT + ARENA_BINS + 16 * k) as usize;
                let own = x + ARENA_TOP + 16 * k;
                word_at(&buf, b) == own && word_at(&buf, b + 8) == own
            })
            .count();
        if empty_bins < 2 {
            continue;
        }
        let mut next = word_at(&buf, off as usize);
        let mut hops = 0;
        while next != x && next != 0 && hops < 256 {
            let Some(field) = next.checked_add(ARENA_NEXT) else {
                break;
            };
            if next >= m.start && field + 8 <= m.end {
                next = word_at(&buf, (field - m.start) as usize);
            } else if maps
                .iter()
                .any(|r| r.perms.starts_with("rw") && field >= r.start && field + 8 <= r.end)
            {
                mem.read(&[(field, 8)], &mut one)?;
                next = word_at(&one, 0);
            } else {
                break;
            }
            hops += 1;
        }
        if next == x {
            return Ok(Some((x, x + ARENA_SIZE)));
        }
    }
    Ok(None)
}

/// The roots of a stopped process, given its maps (sorted by start) and
/// the outstanding blocks sorted by address.
pub(crate) fn find_roots(
    maps: &[Mapping],
    threads: &[StoppedThread],
    exited: &[ExitedThread],
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
    let heap_blocks: Vec<&Block> = blocks.iter().filter(|b| !b.is_mapping).collect();
    let mut header = Vec::new();
    for m in maps {
        let p = m.perms.as_bytes();
        let rw = p.first() == Some(&b'r') && p.get(1) == Some(&b'w');
        if m.path.as_deref() == Some("[heap]") {
            roots.in_use.push((m.start, m.end));
            continue;
        }
        if !rw || is_special(m) {
            continue;
        }
        // A thread's stack, from its stack pointer (less the red zone)
        // up: the live threads', then the stacks glibc keeps of threads
        // that exited (their thread pointer still in place).
        let live = sps
            .iter()
            .copied()
            .filter(|&sp| sp >= m.start && sp < m.end)
            .min();
        let sp = match live {
            Some(sp) => Some(sp),
            None => {
                let mut found = None;
                for e in exited
                    .iter()
                    .filter(|e| e.sp >= m.start && e.sp < m.end)
                    .filter(|e| e.fs_base >= m.start && e.fs_base + 8 <= m.end)
                {
                    mem.read(&[(e.fs_base, 8)], &mut header)?;
                    if word_at(&header, 0) == e.fs_base {
                        found = Some(found.map_or(e.sp, |f: u64| f.min(e.sp)));
                    }
                }
                found
            }
        };
        if let Some(sp) = sp {
            let from = (sp.saturating_sub(RED_ZONE) & !7).max(m.start);
            roots.ranges.push((from, m.end));
            roots.in_use.push((m.start, m.end));
            continue;
        }
        if !is_anonymous(m) {
            if is_libc(m) {
                if let Some(arena) = find_main_arena(m, maps, mem)? {
                    subtract((m.start, m.end), &[arena], &mut roots.ranges);
                    continue;
                }
            }
            roots.ranges.push((m.start, m.end));
            continue;
        }
        // Anonymous: minus glibc arena heaps (a `heap_info` header at a
        // 64 MiB boundary: arena pointer, previous heap, size in use) and
        // glibc's mmap'd chunks; a mapping that holds heap blocks of
        // another kind is another allocator's heap (jemalloc, tcmalloc),
        // not a root at all. What is left (ld.so's TLS, memory the
        // program mapped itself, adjacent mappings the kernel merged) is a
        // root.
        let mut holes = Vec::new();
        let mut a = m.start.next_multiple_of(ARENA_HEAP_ALIGN);
        while a + 4096 <= m.end {
            mem.read(&[(a, 24)], &mut header)?;
            let w = |i: usize| word_at(&header, i * 8);
            let (arena, prev, size) = (w(0), w(1), w(2));
            let arena_heap = arena != 0
                && (prev == 0 || prev.is_multiple_of(ARENA_HEAP_ALIGN))
                && size > 0
                && size <= ARENA_HEAP_ALIGN
                && size.is_multiple_of(4096);
            if arena_heap {
                holes.push((a, a + ARENA_HEAP_ALIGN));
                roots.in_use.push((a, (a + ARENA_HEAP_ALIGN).min(m.end)));
            }
            a += ARENA_HEAP_ALIGN;
        }
        let first = heap_blocks.partition_point(|b| b.addr < m.start);
        let mut foreign = false;
        for b in heap_blocks[first..].iter().take_while(|b| b.addr < m.end) {
            if holes.iter().any(|h| b.addr >= h.0 && b.addr < h.1) {
                continue;
            }
            // glibc's mmap'd chunk: its header (offset to the mapping's
            // start, then the size with IS_MMAPPED) right before it.
            let chunk = b.addr.saturating_sub(CHUNK_HEADER);
            mem.read(&[(chunk, 16)], &mut header)?;
            let (prev, size) = (word_at(&header, 0), word_at(&header, 8));
            let len = size & !7;
            let base = chunk.wrapping_sub(prev);
            let mmapped = size & 2 != 0
                && base.is_multiple_of(4096)
                && base >= m.start
                && (chunk + len).is_multiple_of(4096)
                && chunk + len <= m.end
                && b.addr + b.size <= chunk + len;
            if mmapped {
                holes.push((base, chunk + len));
            } else {
                foreign = true;
                break;
            }
        }
        if foreign {
            roots.in_use.push((m.start, m.end));
            continue;
        }
        let hm = merge(holes);
        subtract((m.start, m.end), &hm, &mut roots.ranges);
    }
    roots.in_use = merge(std::mem::take(&mut roots.in_use));
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
