//! The mark phase, memcheck's design: words that equal a block's start
//! (or, with an interior pointer, fall inside it) reach it; a block is
//! scanned when it is first reached, and again when it is upgraded from
//! possibly to definitely reachable. Then the blocks nothing reached are
//! grouped into cliques: in address order, each block still unreached
//! leads one, and every unreached block its words reach (through start
//! or interior pointers) joins it as indirectly lost.
//!
//! Memory is read in batches of blocks (many ranges per system call);
//! the work list is an explicit stack, and the state is one byte per
//! block.

use super::mem::Memory;
use super::types::{Block, ScanError, Verdict};

/// Bytes read per batch.
const WINDOW: u64 = 4 << 20;
/// Ranges per batch.
const BATCH: usize = 4096;
/// Small blocks are read through a cache of aligned windows of the
/// heap: a linked list is marked one block at a time, and one read per
/// block would cost a system call each; its neighbours are likely in the
/// same window.
const CACHE_WINDOW: u64 = 64 << 10;
/// Windows kept (64 MiB).
const CACHE_WINDOWS: usize = 1024;
/// Blocks up to this size go through the cache.
const CACHED_BLOCK: u64 = 4096;
/// Words of a vtable looked at by the multiple-inheritance heuristic.
const VTABLE_WORDS: u64 = 20;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Unreached,
    Possible,
    Reachable,
    Indirect,
}

/// A readable mapping, for the vtable test of the heuristics.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment {
    pub start: u64,
    pub end: u64,
    pub file: bool,
    pub exec: bool,
}

/// What the marking needs besides the blocks.
pub(crate) struct MarkInput<'a> {
    pub roots: &'a [(u64, u64)],
    pub root_words: &'a [u64],
    /// Blocks (sorted indices) reachable from the start: live stacks.
    pub reachable: &'a [usize],
}

/// What the marking found.
#[derive(Debug, Default)]
pub(crate) struct MarkOutput {
    /// By sorted index.
    pub verdicts: Vec<Verdict>,
    pub roots_bytes: u64,
    pub heap_bytes: u64,
    /// Blocks reachable only thanks to a heuristic.
    pub heuristic_reachable: u64,
}

pub(crate) struct Marker<'a, M: Memory + ?Sized> {
    mem: &'a mut M,
    /// Sorted by start.
    blocks: &'a [Block],
    /// Their starts, dense for the binary search.
    starts: Vec<u64>,
    lo: u64,
    hi: u64,
    state: Vec<State>,
    heuristic: Vec<bool>,
    stack: Vec<u32>,
    segments: &'a [Segment],
    heuristics: bool,
    heap_bytes: u64,
    buf: Vec<u8>,
    small: Vec<u8>,
    cache: WindowCache,
}

/// Windows of memory read, by window number: (start, bytes).
#[derive(Default)]
struct WindowCache {
    map: std::collections::HashMap<u64, (u64, Vec<u8>)>,
    order: std::collections::VecDeque<u64>,
}

impl WindowCache {
    fn get(&self, addr: u64, len: u64) -> Option<&[u8]> {
        let (start, bytes) = self.map.get(&(addr / CACHE_WINDOW))?;
        let off = (addr - start) as usize;
        bytes.get(off..off + len as usize)
    }

    fn insert(&mut self, key: u64, start: u64, bytes: Vec<u8>) {
        while self.map.len() >= CACHE_WINDOWS {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.map.remove(&old);
        }
        self.map.insert(key, (start, bytes));
        self.order.push_back(key);
    }
}

#[inline]
fn word(b: &[u8], i: usize) -> u64 {
    u64::from_ne_bytes(b[i..i + 8].try_into().unwrap())
}

impl<'a, M: Memory + ?Sized> Marker<'a, M> {
    pub fn new(
        mem: &'a mut M,
        blocks: &'a [Block],
        segments: &'a [Segment],
        heuristics: bool,
    ) -> Self {
        debug_assert!(blocks.windows(2).all(|w| w[0].addr <= w[1].addr));
        let lo = blocks.first().map_or(1, |b| b.addr);
        let hi = blocks
            .iter()
            .map(|b| b.addr + b.size.max(1))
            .max()
            .unwrap_or(0);
        Marker {
            mem,
            blocks,
            starts: blocks.iter().map(|b| b.addr).collect(),
            lo,
            hi,
            state: vec![State::Unreached; blocks.len()],
            heuristic: vec![false; blocks.len()],
            stack: Vec::new(),
            segments,
            heuristics,
            heap_bytes: 0,
            buf: Vec::new(),
            small: Vec::new(),
            cache: WindowCache::default(),
        }
    }

    /// The block a word points into (a zero-sized block: at), and whether
    /// at its start.
    #[inline]
    fn find(&self, w: u64) -> Option<(usize, bool)> {
        if w < self.lo || w >= self.hi {
            return None;
        }
        let i = self.starts.partition_point(|&a| a <= w).checked_sub(1)?;
        let b = &self.blocks[i];
        if w == b.addr {
            return Some((i, true));
        }
        (w < b.addr + b.size).then_some((i, false))
    }

    fn segment(&self, a: u64) -> Option<&Segment> {
        let i = self
            .segments
            .partition_point(|s| s.start <= a)
            .checked_sub(1)?;
        let s = &self.segments[i];
        (a < s.end).then_some(s)
    }

    fn read_small(&mut self, addr: u64, len: u64) -> Result<Option<Vec<u64>>, ScanError> {
        let mut small = std::mem::take(&mut self.small);
        self.mem.read(&[(addr, len)], &mut small)?;
        let words = small.chunks_exact(8).map(|c| word(c, 0)).collect();
        self.small = small;
        Ok(Some(words))
    }

    /// memcheck's vtable test: in a file mapping, and among its first
    /// words, two nonzero ones before any that does not point into
    /// executable file code.
    fn is_vtable(&mut self, a: u64) -> Result<bool, ScanError> {
        let Some(seg) = self.segment(a).copied() else {
            return Ok(false);
        };
        if !seg.file || !a.is_multiple_of(8) {
            return Ok(false);
        }
        let n = ((seg.end - a) / 8).min(VTABLE_WORDS);
        let Some(words) = self.read_small(a, n * 8)? else {
            return Ok(false);
        };
        let mut fns = 0;
        for f in words {
            if f == 0 {
                continue;
            }
            match self.segment(f) {
                Some(s) if s.file && s.exec => fns += 1,
                _ => return Ok(false),
            }
            if fns == 2 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// memcheck's default heuristics for an interior pointer `w` into
    /// block `i`: std::string (old ABI), length64, new[] and multiple
    /// inheritance.
    fn heuristic_reach(&mut self, w: u64, i: usize) -> Result<bool, ScanError> {
        let b = self.blocks[i];
        if b.is_mapping {
            return Ok(false);
        }
        let off = w - b.addr;
        if off == 24 && b.size >= 24 {
            let h = self.read_small(b.addr, 16)?.unwrap_or_default();
            let (len, cap) = (h[0], h[1]);
            if cap.checked_add(25) == Some(b.size) && len <= cap {
                return Ok(true);
            }
        }
        if off == 8 && b.size >= 8 {
            let first = self.read_small(b.addr, 8)?.unwrap_or_default()[0];
            // length64, then new[]
            if first > 0 && b.size - 8 == first {
                return Ok(true);
            }
            if first > 0 && (b.size - 8).is_multiple_of(first) {
                return Ok(true);
            }
        }
        if w.is_multiple_of(8) && w + 8 <= b.addr + b.size {
            let inner = self.read_small(w, 8)?.unwrap_or_default()[0];
            if inner.is_multiple_of(8) && inner >= 4096 {
                let first = self.read_small(b.addr, 8)?.unwrap_or_default()[0];
                if first.is_multiple_of(8)
                    && first >= 4096
                    && self.is_vtable(inner)?
                    && self.is_vtable(first)?
                {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// A word found in a root (`definite`), or in a block being marked.
    fn push(&mut self, w: u64, definite: bool) -> Result<(), ScanError> {
        let Some((i, at_start)) = self.find(w) else {
            return Ok(());
        };
        if self.state[i] == State::Reachable {
            if at_start {
                self.heuristic[i] = false;
            }
            return Ok(());
        }
        let mut via_start = at_start;
        if !at_start && self.heuristics && self.heuristic_reach(w, i)? {
            via_start = true;
            self.heuristic[i] = true;
        }
        // A mapping's memory is read as a root already (or never, where
        // memcheck would not): it is marked, not scanned.
        let scan = !self.blocks[i].is_mapping;
        if via_start && definite {
            self.state[i] = State::Reachable;
            if scan {
                self.stack.push(i as u32);
            }
        } else if self.state[i] == State::Unreached {
            self.state[i] = State::Possible;
            if scan {
                self.stack.push(i as u32);
            }
        }
        Ok(())
    }

    /// A word in a block of the clique led by `leader`.
    #[inline]
    fn push_clique(&mut self, w: u64, leader: usize) {
        if let Some((i, _)) = self.find(w) {
            if self.state[i] == State::Unreached && i != leader {
                self.state[i] = State::Indirect;
                if !self.blocks[i].is_mapping {
                    self.stack.push(i as u32);
                }
            }
        }
    }

    /// The cache window a piece can be read through: (window number,
    /// start, length), the window clipped to the readable mapping.
    fn window_of(&self, addr: u64, len: u64) -> Option<(u64, u64, u64)> {
        if len > CACHED_BLOCK {
            return None;
        }
        let seg = self.segment(addr)?;
        let key = addr / CACHE_WINDOW;
        let start = (key * CACHE_WINDOW).max(seg.start);
        let end = (key * CACHE_WINDOW + CACHE_WINDOW).min(seg.end);
        (addr + len <= end).then_some((key, start, end - start))
    }

    /// Reads `pieces` (block index, address, length) and hands each one's
    /// bytes to `f`, in order: small pieces from the window cache (the
    /// missing windows read in one call), the others in one call too.
    fn fetch_pieces(
        &mut self,
        pieces: &[(usize, u64, u64)],
        mut f: impl FnMut(&mut Self, usize, &[u8]) -> Result<(), ScanError>,
    ) -> Result<(), ScanError> {
        let mut missing: Vec<(u64, u64, u64)> = Vec::new();
        let mut direct: Vec<(u64, u64)> = Vec::new();
        let mut cached = vec![false; pieces.len()];
        for (k, &(_, a, l)) in pieces.iter().enumerate() {
            match self.window_of(a, l) {
                Some(w)
                    if self.cache.map.contains_key(&w.0) || missing.iter().any(|m| m.0 == w.0) =>
                {
                    cached[k] = true
                }
                Some(w) if missing.len() < CACHE_WINDOWS / 2 => {
                    missing.push(w);
                    cached[k] = true;
                }
                _ => direct.push((a, l)),
            }
        }
        if !missing.is_empty() {
            let ranges: Vec<(u64, u64)> = missing.iter().map(|m| (m.1, m.2)).collect();
            let mut buf = Vec::new();
            self.mem.read(&ranges, &mut buf)?;
            let mut off = 0usize;
            for &(key, start, len) in &missing {
                self.cache
                    .insert(key, start, buf[off..off + len as usize].to_vec());
                off += len as usize;
            }
        }
        let mut buf = std::mem::take(&mut self.buf);
        if !direct.is_empty() {
            self.mem.read(&direct, &mut buf)?;
        }
        let mut off = 0usize;
        let mut one = Vec::new();
        let mut result = Ok(());
        for (k, &(i, a, l)) in pieces.iter().enumerate() {
            let r = if cached[k] {
                // A copy: the callback may mark further blocks, which
                // may load (and evict) windows.
                match self.cache.get(a, l) {
                    Some(bytes) => {
                        one.clear();
                        one.extend_from_slice(bytes);
                    }
                    None => self.mem.read(&[(a, l)], &mut one)?,
                }
                f(self, i, &one)
            } else {
                let r = f(self, i, &buf[off..off + l as usize]);
                off += l as usize;
                r
            };
            if r.is_err() {
                result = r;
                break;
            }
        }
        self.buf = buf;
        result
    }

    /// Pops blocks off the stack into batches, splitting a large block
    /// into windows, and scans them: in clique mode (`Some(leader)`) or
    /// not.
    fn drain(&mut self, clique: Option<usize>) -> Result<(), ScanError> {
        let mut pieces: Vec<(usize, u64, u64)> = Vec::new();
        while !self.stack.is_empty() {
            pieces.clear();
            let mut bytes = 0;
            while bytes < WINDOW && pieces.len() < BATCH {
                let Some(i) = self.stack.pop() else { break };
                let b = self.blocks[i as usize];
                let start = (b.addr + 7) & !7;
                let end = (b.addr + b.size) & !7;
                let mut a = start;
                while a < end {
                    let len = (end - a).min(WINDOW);
                    pieces.push((i as usize, a, len));
                    a += len;
                }
                bytes += end.saturating_sub(start);
            }
            for group in pieces.chunks(BATCH) {
                self.heap_bytes += group.iter().map(|p| p.2).sum::<u64>();
                let mut start = 0;
                while start < group.len() {
                    // At most WINDOW bytes per read, at least one piece.
                    let mut end = start + 1;
                    let mut sum = group[start].2;
                    while end < group.len() && sum + group[end].2 <= WINDOW {
                        sum += group[end].2;
                        end += 1;
                    }
                    self.fetch_pieces(&group[start..end], |m, i, bytes| {
                        match clique {
                            Some(leader) => {
                                for k in (0..bytes.len()).step_by(8) {
                                    m.push_clique(word(bytes, k), leader);
                                }
                            }
                            None => {
                                let definite = m.state[i] == State::Reachable;
                                for k in (0..bytes.len()).step_by(8) {
                                    m.push(word(bytes, k), definite)?;
                                }
                            }
                        }
                        Ok(())
                    })?;
                    start = end;
                }
            }
        }
        Ok(())
    }

    /// Marks everything and returns the verdicts, by sorted index.
    pub fn run(mut self, input: &MarkInput<'_>) -> Result<MarkOutput, ScanError> {
        for &i in input.reachable {
            self.state[i] = State::Reachable;
        }
        for &w in input.root_words {
            self.push(w, true)?;
        }
        let mut roots_bytes = 0;
        // The roots, in windows.
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for &(s, e) in input.roots {
            let mut a = (s + 7) & !7;
            let e = e & !7;
            while a < e {
                let len = (e - a).min(WINDOW);
                ranges.push((a, len));
                a += len;
            }
        }
        let mut k = 0;
        while k < ranges.len() {
            let mut end = k + 1;
            let mut sum = ranges[k].1;
            while end < ranges.len() && end - k < BATCH && sum + ranges[end].1 <= WINDOW {
                sum += ranges[end].1;
                end += 1;
            }
            roots_bytes += sum;
            let mut buf = std::mem::take(&mut self.buf);
            self.mem.read(&ranges[k..end], &mut buf)?;
            for off in (0..buf.len()).step_by(8) {
                self.push(word(&buf, off), true)?;
            }
            self.buf = buf;
            // Keep the stack short: mark what the window reached now.
            self.drain(None)?;
            k = end;
        }
        self.drain(None)?;
        // Cliques of the unreached, leaders in address order, read in
        // batches (a block a leader's clique takes in is skipped).
        let mut next = 0;
        let n = self.blocks.len();
        let mut batch: Vec<(usize, u64, u64)> = Vec::new();
        while next < n {
            batch.clear();
            let mut bytes = 0;
            while next < n && batch.len() < BATCH && bytes < WINDOW {
                if self.state[next] == State::Unreached && !self.blocks[next].is_mapping {
                    let b = self.blocks[next];
                    let start = (b.addr + 7) & !7;
                    let end = (b.addr + b.size) & !7;
                    let len = end.saturating_sub(start);
                    if len > WINDOW {
                        // A large one leads alone: read through the stack.
                        if batch.is_empty() {
                            next += 1;
                            self.stack.push((next - 1) as u32);
                            self.drain(Some(next - 1))?;
                            continue;
                        }
                        break;
                    }
                    batch.push((next, start, len));
                    bytes += len;
                }
                next += 1;
            }
            if batch.is_empty() {
                continue;
            }
            self.heap_bytes += bytes;
            let pieces = std::mem::take(&mut batch);
            self.fetch_pieces(&pieces, |m, leader, bytes| {
                if m.state[leader] != State::Unreached {
                    return Ok(()); // taken into an earlier clique
                }
                for k in (0..bytes.len()).step_by(8) {
                    m.push_clique(word(bytes, k), leader);
                }
                m.drain(Some(leader))
            })?;
            batch = pieces;
        }
        let verdicts = self
            .state
            .iter()
            .map(|s| match s {
                State::Unreached => Verdict::DefinitelyLost,
                State::Indirect => Verdict::IndirectlyLost,
                State::Possible => Verdict::PossiblyLost,
                State::Reachable => Verdict::Reachable,
            })
            .collect();
        let heuristic_reachable = self
            .heuristic
            .iter()
            .zip(&self.state)
            .filter(|(h, s)| **h && **s == State::Reachable)
            .count() as u64;
        Ok(MarkOutput {
            verdicts,
            roots_bytes,
            heap_bytes: self.heap_bytes,
            heuristic_reachable,
        })
    }
}
