//! Leak verdicts like valgrind's memcheck, from the memory of a stopped
//! process: which outstanding blocks a pointer still reaches.
//!
//! The recorder knows every outstanding block (address, size) from the
//! trace; a scan stops the process ([`Stopped`]), reads its roots (see
//! [`roots`] for what counts) and, from them, the blocks their words
//! point to, transitively (see [`mark`]): a block reached through a word
//! equal to its start is *reachable*, one reached only through interior
//! pointers (or only from such blocks) *possibly lost*; of the rest, a
//! block that other lost blocks point to is *indirectly lost*, the others
//! *definitely lost*. Memory is read with `process_vm_readv`, many ranges
//! per call ([`mem`]). The design, the rules and the cost are in
//! `docs/scan.md`.
//!
//! This module needs no libbpf: the binary wires it to the recording
//! (which blocks are outstanding comes from replaying the trace).

mod mark;
mod mem;
pub mod roots;
pub mod stop;
mod types;

use std::time::Instant;

pub use stop::{monotonic_ns, note_thread_exit, ExitedThread, Stopped, StoppedThread};
pub use types::{Block, ScanError, Verdict};

use mark::{MarkInput, Marker, Segment};
use mem::{Memory, ProcessMemory};

/// The most bytes of a lost block a scan keeps (`--scan-contents`).
pub const MAX_CONTENTS: usize = 4096;

/// Options of a scan.
#[derive(Debug, Clone, Copy)]
pub struct ScanOptions {
    /// Keep the first bytes of each lost block, up to this many
    /// (capped at [`MAX_CONTENTS`]); 0: none.
    pub contents: usize,
    /// memcheck's default `--leak-check-heuristics=all` (std::string,
    /// length64, new[], multiple inheritance): an interior pointer that
    /// fits one of them counts as a pointer to the start.
    pub heuristics: bool,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            contents: 0,
            heuristics: true,
        }
    }
}

/// Figures of a scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Threads stopped.
    pub threads: u32,
    /// Of them, those whose registers could not be read.
    pub threads_without_registers: u32,
    /// Bytes of roots read.
    pub roots_bytes: u64,
    /// Bytes of blocks read.
    pub heap_bytes: u64,
    /// Pages that could not be read (counted as zeros).
    pub unreadable_pages: u64,
    /// Blocks reachable only through a heuristic's interior pointer.
    pub heuristic_reachable: u64,
    /// `process_vm_readv` calls.
    pub read_calls: u64,
    /// Time spent reading the maps, the roots and marking.
    pub scan_ns: u64,
}

/// The result of a scan.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// One per block, in the order given.
    pub verdicts: Vec<Verdict>,
    /// With [`ScanOptions::contents`]: the first bytes of each lost block
    /// (`None` for a reachable one); empty otherwise.
    pub contents: Vec<Option<Vec<u8>>>,
    /// Figures.
    pub stats: ScanStats,
}

/// Counts and bytes per verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Blocks per verdict, in [`Verdict::ALL`] order.
    pub blocks: [u64; 4],
    /// Bytes per verdict, in [`Verdict::ALL`] order.
    pub bytes: [u64; 4],
}

impl Totals {
    /// Totals of a scan's blocks and verdicts.
    pub fn of(blocks: &[Block], verdicts: &[Verdict]) -> Totals {
        let mut t = Totals::default();
        for (b, v) in blocks.iter().zip(verdicts) {
            let k = Verdict::ALL.iter().position(|x| x == v).expect("a verdict");
            t.blocks[k] += 1;
            t.bytes[k] += b.size;
        }
        t
    }
}

/// Scans a stopped process whose outstanding blocks are `blocks`.
pub fn scan(stopped: &Stopped, blocks: &[Block], opts: &ScanOptions) -> Result<Outcome, ScanError> {
    let started = Instant::now();
    let pid = stopped.pid;
    let mut maps = match crate::procmaps::read_maps(pid) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ScanError::Gone(pid)),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(ScanError::Permission(format!(
                "cannot read /proc/{pid}/maps: {}",
                memleak_trace::describe_io(&e)
            )))
        }
        Err(e) => {
            return Err(ScanError::Os(format!(
                "/proc/{pid}/maps: {}",
                memleak_trace::describe_io(&e)
            )))
        }
    };
    if maps.is_empty() {
        return Err(ScanError::Gone(pid));
    }
    maps.sort_by_key(|m| m.start);
    let mut mem = ProcessMemory::new(pid);
    let out = scan_with(
        &mut mem,
        &maps,
        &stopped.threads,
        &stopped.exited,
        blocks,
        opts,
    )?;
    let mut out = out;
    out.stats.threads = stopped.threads.len() as u32;
    out.stats.unreadable_pages = mem.unreadable_pages;
    out.stats.read_calls = mem.calls;
    out.stats.scan_ns = started.elapsed().as_nanos() as u64;
    Ok(out)
}

fn scan_with(
    mem: &mut dyn Memory,
    maps: &[crate::procmaps::Mapping],
    threads: &[StoppedThread],
    exited: &[ExitedThread],
    blocks: &[Block],
    opts: &ScanOptions,
) -> Result<Outcome, ScanError> {
    let mut order: Vec<u32> = (0..blocks.len() as u32).collect();
    order.sort_unstable_by_key(|&i| (blocks[i as usize].addr, !blocks[i as usize].is_mapping));
    let sorted: Vec<Block> = order.iter().map(|&i| blocks[i as usize]).collect();
    let roots = roots::find_roots(maps, threads, exited, &sorted, mem)?;
    // An mmap block that is a thread's stack or the allocator's heap is
    // in use.
    let reachable: Vec<usize> = sorted
        .iter()
        .enumerate()
        .filter(|(_, b)| {
            b.is_mapping
                && roots
                    .in_use
                    .iter()
                    .any(|&(s, e)| b.addr < e && b.addr + b.size > s)
        })
        .map(|(i, _)| i)
        .collect();
    let segments: Vec<Segment> = maps
        .iter()
        .filter(|m| m.perms.starts_with('r'))
        .map(|m| Segment {
            start: m.start,
            end: m.end,
            file: m.is_file(),
            exec: m.perms.as_bytes().get(2) == Some(&b'x'),
        })
        .collect();
    let marked = Marker::new(mem, &sorted, &segments, opts.heuristics).run(&MarkInput {
        roots: &roots.ranges,
        root_words: &roots.words,
        reachable: &reachable,
    })?;
    let mut verdicts = vec![Verdict::Reachable; blocks.len()];
    for (k, &i) in order.iter().enumerate() {
        verdicts[i as usize] = marked.verdicts[k];
    }
    let contents = if opts.contents > 0 {
        read_contents(mem, blocks, &verdicts, opts.contents.min(MAX_CONTENTS))?
    } else {
        Vec::new()
    };
    Ok(Outcome {
        verdicts,
        contents,
        stats: ScanStats {
            threads_without_registers: roots.threads_without_registers,
            roots_bytes: marked.roots_bytes,
            heap_bytes: marked.heap_bytes,
            heuristic_reachable: marked.heuristic_reachable,
            ..ScanStats::default()
        },
    })
}

/// The first `n` bytes of each lost block, in batches.
fn read_contents(
    mem: &mut dyn Memory,
    blocks: &[Block],
    verdicts: &[Verdict],
    n: usize,
) -> Result<Vec<Option<Vec<u8>>>, ScanError> {
    let mut out: Vec<Option<Vec<u8>>> = vec![None; blocks.len()];
    let lost: Vec<usize> = (0..blocks.len())
        .filter(|&i| verdicts[i].is_lost())
        .collect();
    let mut buf = Vec::new();
    for chunk in lost.chunks(1024) {
        let ranges: Vec<(u64, u64)> = chunk
            .iter()
            .map(|&i| (blocks[i].addr, blocks[i].size.min(n as u64)))
            .collect();
        mem.read(&ranges, &mut buf)?;
        let mut off = 0;
        for (&i, r) in chunk.iter().zip(&ranges) {
            out[i] = Some(buf[off..off + r.1 as usize].to_vec());
            off += r.1 as usize;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
