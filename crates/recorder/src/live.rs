//! What is outstanding right now, by stack, kept from the events as they
//! pass through [`Recorder`](crate::Recorder): the status line's total and
//! `record --interval`'s live reports. Nothing here reads or changes the
//! trace; it costs two hash-map updates per allocation or free, and only
//! when the caller asked for it.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use memleak_trace::schema::KindClass;
use memleak_trace::{EventKind, FrameRecord};

/// Bytes and blocks outstanding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Requested bytes of the blocks.
    pub bytes: u64,
    /// Blocks.
    pub count: u64,
}

impl Totals {
    fn add(&mut self, bytes: u64, count: u64) {
        self.bytes += bytes;
        self.count += count;
    }

    fn sub(&mut self, bytes: u64, count: u64) {
        self.bytes = self.bytes.saturating_sub(bytes);
        self.count = self.count.saturating_sub(count);
    }
}

/// One stack's share of what is outstanding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackTotals {
    /// The trace's stack id (0: allocations without a stack).
    pub stack_id: u64,
    /// What it holds.
    pub totals: Totals,
    /// Where it allocated: its innermost frame (an inlined function
    /// included) and the caller, `function (file:line) < caller
    /// (file:line)`, once the frames are symbolized.
    pub site: Option<String>,
}

/// A multiply-rotate hasher for the integer keys here: SipHash, the
/// default, cost ~25 ns of the ~50 the two map updates per event took.
/// Heap addresses are 16-byte aligned, so the well-mixed high bits of the
/// product are rotated down to where the table takes its bucket index.
#[derive(Default)]
struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

#[derive(Clone, Copy)]
struct Block {
    /// What the block adds to the totals: its size and 1, or in a sampled
    /// recording the bytes and blocks it stands for.
    bytes: u64,
    count: u64,
    stack_id: u64,
}

/// Outstanding blocks by (pid, address), and their totals by stack.
#[derive(Default)]
pub struct Outstanding {
    blocks: IntMap<(u32, u64), Block>,
    by_stack: IntMap<u64, Totals>,
    total: Totals,
    /// The first two frames of each stack, to name it.
    sites: HashMap<u64, (u32, Vec<u64>)>,
    /// The frames in `sites`, which are worth a label.
    site_frames: HashSet<(u32, u64)>,
    /// `function (file:line)` of each symbolized frame of a site.
    labels: HashMap<(u32, u64), String>,
    /// `record --sample`: heap blocks count for what they stand for.
    sampling: Option<memleak_trace::Sampling>,
}

impl Outstanding {
    /// Scales what sampled heap blocks stand for (`record --sample`).
    pub fn set_sampling(&mut self, sampling: Option<memleak_trace::Sampling>) {
        self.sampling = sampling;
    }

    /// Everything outstanding.
    pub fn total(&self) -> Totals {
        self.total
    }

    /// Applies one event. `pid` is 0 for kernel events (their blocks are
    /// the kernel's, whichever task freed them).
    pub(crate) fn apply(
        &mut self,
        kind: EventKind,
        pid: u32,
        addr: u64,
        size: u64,
        old_addr: u64,
        stack_id: u64,
    ) {
        // Mappings and kernel blocks are never sampled.
        let scale = match self.sampling {
            Some(s) if kind.class() != KindClass::MapRange && pid != 0 => Some(s),
            _ => None,
        };
        let block = |size: u64| {
            let (bytes, count) = scale.map_or((size, 1), |s| s.scaled(size, addr, 0));
            Block {
                bytes,
                count,
                stack_id,
            }
        };
        match kind.class() {
            KindClass::Alloc | KindClass::MapRange => self.insert(pid, addr, block(size)),
            KindClass::Free | KindClass::UnmapRange => self.remove(pid, addr),
            KindClass::Realloc | KindClass::RemapRange => {
                if old_addr != 0 {
                    self.remove(pid, old_addr);
                }
                if addr != 0 {
                    self.insert(pid, addr, block(size));
                }
            }
            KindClass::Process => {}
        }
    }

    fn insert(&mut self, pid: u32, addr: u64, b: Block) {
        if let Some(old) = self.blocks.insert((pid, addr), b) {
            self.take(old);
        }
        self.total.add(b.bytes, b.count);
        self.by_stack
            .entry(b.stack_id)
            .or_default()
            .add(b.bytes, b.count);
    }

    fn remove(&mut self, pid: u32, addr: u64) {
        if let Some(old) = self.blocks.remove(&(pid, addr)) {
            self.take(old);
        }
    }

    fn take(&mut self, b: Block) {
        self.total.sub(b.bytes, b.count);
        if let Some(t) = self.by_stack.get_mut(&b.stack_id) {
            t.sub(b.bytes, b.count);
            if t.count == 0 {
                self.by_stack.remove(&b.stack_id);
            }
        }
    }

    /// A process exec'd: its blocks are gone with its old image.
    pub(crate) fn forget_pid(&mut self, pid: u32) {
        let gone: Vec<(u64, Block)> = self
            .blocks
            .iter()
            .filter(|((p, _), _)| *p == pid)
            .map(|(&(_, addr), &b)| (addr, b))
            .collect();
        for (addr, b) in gone {
            self.blocks.remove(&(pid, addr));
            self.take(b);
        }
    }

    /// A new stack's frames, innermost first: its first two name it.
    pub(crate) fn new_stack(&mut self, stack_id: u64, pid: u32, frames: &[u64]) {
        let site: Vec<u64> = frames.iter().take(2).copied().collect();
        self.site_frames.extend(site.iter().map(|&a| (pid, a)));
        self.sites.insert(stack_id, (pid, site));
    }

    /// A symbolized frame: kept if it names a site.
    pub(crate) fn symbolized(&mut self, frame: &FrameRecord) {
        let key = (frame.pid, frame.addr);
        if self.site_frames.contains(&key) {
            self.labels.insert(key, frame_label(frame));
        }
    }

    /// The `n` stacks holding the most bytes (all with 0), largest first.
    pub fn top(&self, n: usize) -> Vec<StackTotals> {
        let mut all: Vec<(u64, Totals)> = self.by_stack.iter().map(|(&s, &t)| (s, t)).collect();
        all.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
        if n > 0 {
            all.truncate(n);
        }
        all.into_iter()
            .map(|(stack_id, totals)| StackTotals {
                stack_id,
                totals,
                site: self.site(stack_id),
            })
            .collect()
    }

    /// Every stack holding something, with what it holds.
    pub fn stacks(&self) -> impl Iterator<Item = (u64, Totals)> + '_ {
        self.by_stack.iter().map(|(&s, &t)| (s, t))
    }

    /// What a stack holds now (zero when nothing).
    pub fn of_stack(&self, stack_id: u64) -> Totals {
        self.by_stack.get(&stack_id).copied().unwrap_or_default()
    }

    fn site(&self, stack_id: u64) -> Option<String> {
        let (pid, frames) = self.sites.get(&stack_id)?;
        let names: Vec<&str> = frames
            .iter()
            .map_while(|&a| self.labels.get(&(*pid, a)).map(String::as_str))
            .collect();
        (!names.is_empty()).then(|| names.join(" < "))
    }
}

/// `function (file:line)` of a frame, the innermost inlined function when
/// there is one (the outer function is then in the caller's place).
fn frame_label(f: &FrameRecord) -> String {
    let (function, file, line) = match f.inlined.first() {
        Some(i) => (Some(i.function.as_str()), i.file.as_deref(), i.line),
        None => (f.function.as_deref(), f.file.as_deref(), f.line),
    };
    let function = function.map_or_else(|| format!("{:#x}", f.addr), str::to_string);
    match (file, line) {
        (Some(file), Some(line)) => {
            let base = file.rsplit('/').next().unwrap_or(file);
            format!("{function} ({base}:{line})")
        }
        _ => function,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frees_and_reallocs_move_bytes_between_stacks() {
        let mut o = Outstanding::default();
        o.apply(EventKind::Malloc, 1, 0x10, 100, 0, 7);
        o.apply(EventKind::Malloc, 1, 0x20, 50, 0, 7);
        o.apply(EventKind::Malloc, 2, 0x10, 10, 0, 8);
        assert_eq!(
            o.total(),
            Totals {
                bytes: 160,
                count: 3
            }
        );
        o.apply(EventKind::Realloc, 1, 0x30, 500, 0x20, 9);
        assert_eq!(
            o.of_stack(7),
            Totals {
                bytes: 100,
                count: 1
            }
        );
        assert_eq!(
            o.of_stack(9),
            Totals {
                bytes: 500,
                count: 1
            }
        );
        o.apply(EventKind::Free, 1, 0x10, 0, 0, 0);
        assert_eq!(o.of_stack(7), Totals::default());
        let top = o.top(1);
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].stack_id, 9);
        o.forget_pid(1);
        assert_eq!(
            o.total(),
            Totals {
                bytes: 10,
                count: 1
            }
        );
    }

    #[test]
    fn a_stack_is_named_by_its_innermost_frames() {
        let mut o = Outstanding::default();
        o.new_stack(3, 5, &[0x100, 0x200, 0x300]);
        o.apply(EventKind::Malloc, 5, 0x10, 8, 0, 3);
        assert_eq!(o.top(0)[0].site, None);
        let frame = |addr, function: &str, line| FrameRecord {
            pid: 5,
            addr,
            function: Some(function.to_string()),
            file: Some(format!("/src/{function}.c")),
            line: Some(line),
            ..Default::default()
        };
        o.symbolized(&frame(0x100, "leak_one", 9));
        o.symbolized(&frame(0x200, "main", 17));
        o.symbolized(&frame(0x300, "__libc_start_main", 1));
        assert_eq!(
            o.top(0)[0].site.as_deref(),
            Some("leak_one (leak_one.c:9) < main (main.c:17)")
        );
    }
}
