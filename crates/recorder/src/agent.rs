//! The recorder's side of the in-process agent (`record --capture
//! preload`): the shared memory it writes events into, the unwind tables
//! it walks stacks with, and the drain of its ring.
//!
//! The layout is `agent/agent.h`'s; every offset is asserted there and
//! here. The agent writes the same `struct memleak_event` records as the
//! probe, so a drained record goes to [`crate::Recorder::handle`] as a BPF
//! ring record does.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::event::{offsets, UnwindEnd, FLAG_KERNEL_STACK};
use crate::procmaps::gone;
use crate::unwind::{ProcTable, Row, UnwindSink};

/// `MLA_MAGIC`: "MLAGENT1".
pub const MAGIC: u64 = 0x3154_4e45_4741_4c4d;
/// `MLA_VERSION`.
pub const VERSION: u32 = 2;
/// `MLA_MAX_PIDS`.
pub const MAX_PIDS: usize = 4096;
/// `MLA_SLOT_BYTES`: a slot's header (16) and a whole event.
pub const SLOT_BYTES: usize = 1088;
/// `MLA_HEADER_BYTES`.
const HEADER_BYTES: usize = 20480;
/// Unwind tables kept: processes recorded at once.
const TABLES: u32 = 64;
/// Rows of unwind tables: the probe's row array holds as many.
const ROWS: u32 = 4 << 20;

/// `struct mla_header`.
#[repr(C)]
struct Header {
    magic: u64,
    version: u32,
    recorder_pid: u32,
    total_bytes: u64,
    ring_off: u64,
    nslots: u32,
    slot_bytes: u32,
    rows_off: u64,
    row_capacity: u32,
    ntables: u32,
    tables_off: u64,
    min_size: u64,
    max_size: u64,
    max_frames: u32,
    unwind_mode: u32,
    _reserved0: u32,
    npids: AtomicU32,
    tables_gen: AtomicU64,
    stop: AtomicU32,
    wake_seq: AtomicU32,
    sleeping: AtomicU32,
    room_seq: AtomicU32,
    room_waiting: AtomicU32,
    _pad0: [u8; 132],
    head: AtomicU64,
    _pad1: [u8; 56],
    tail: AtomicU64,
    _pad2: [u8; 56],
    lost: [AtomicU64; 8],
    agents: AtomicU64,
    sample_mean: u64,
    _pad3: [u8; 48],
    pids: [AtomicU32; MAX_PIDS],
}

const _: () = assert!(std::mem::offset_of!(Header, tables_gen) == 96);
const _: () = assert!(std::mem::offset_of!(Header, stop) == 104);
const _: () = assert!(std::mem::offset_of!(Header, room_seq) == 116);
const _: () = assert!(std::mem::offset_of!(Header, room_waiting) == 120);
const _: () = assert!(std::mem::offset_of!(Header, head) == 256);
const _: () = assert!(std::mem::offset_of!(Header, tail) == 320);
const _: () = assert!(std::mem::offset_of!(Header, lost) == 384);
const _: () = assert!(std::mem::offset_of!(Header, agents) == 448);
const _: () = assert!(std::mem::offset_of!(Header, sample_mean) == 456);
const _: () = assert!(std::mem::offset_of!(Header, pids) == 512);
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);

/// `struct mla_table`.
#[repr(C)]
struct Table {
    pid: AtomicU32,
    seq: AtomicU32,
    _reserved: u64,
    proc: ProcTable,
}

const _: () = assert!(std::mem::size_of::<Table>() == 16 + 16 + 32 * 256);

/// What the agent is told at start.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Ring size in bytes (rounded down to a power of two of slots).
    pub ring_bytes: u64,
    /// `--min-size`.
    pub min_size: u64,
    /// `--max-size`.
    pub max_size: u64,
    /// `--stack-depth`.
    pub max_frames: u32,
    /// `enum memleak_unwind_mode`.
    pub unwind_mode: u32,
    /// `--sample`: the mean bytes between sample points; 0 records every
    /// call.
    pub sample_mean: u64,
}

/// `MLA_LOST_SAMPLE_SET`: the agent's `lost` index of the sampled
/// allocations not recorded because its set of sampled addresses had no
/// room.
pub const LOST_SAMPLE_SET: usize = 5;

/// The shared mapping.
struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping lives as long as this struct; what is written
// through it is synchronized by the atomics of the layout.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `Shared::create`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

impl Mapping {
    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a header, page aligned.
        unsafe { &*(self.base as *const Header) }
    }
}

/// Makes the ring's slots free for their first lap (slot i waits for
/// position i), then writes the magic: an agent that sees it sees the rest.
fn init_ring(map: &Mapping, ring_off: usize, nslots: u64) {
    let ring = map.base.wrapping_add(ring_off);
    for i in 0..nslots {
        // SAFETY: slot i is within the ring; its seq is its first word.
        let seq = unsafe { &*(ring.add(i as usize * SLOT_BYTES) as *const AtomicU64) };
        seq.store(i, Ordering::Relaxed);
    }
    std::sync::atomic::fence(Ordering::Release);
    // SAFETY: the header's first word; no agent reads it before this.
    unsafe { (*(map.base as *mut Header)).magic = MAGIC };
}

/// The memory shared with the agents of one recording, and the consumer
/// of its ring.
pub struct Shared {
    fd: OwnedFd,
    map: Arc<Mapping>,
    /// The ring's initialization, until [`Shared::ready`].
    init: Option<std::thread::JoinHandle<()>>,
    nslots: u64,
    ring: *mut u8,
    tail: u64,
    /// A slot that stays claimed but unpublished, and since when.
    stall: Option<(u64, Instant)>,
    /// Walks by how they ended, counted from the records drained.
    ends: Vec<u64>,
    /// Slots skipped because their writer died mid-write.
    unfinished: u64,
}

/// How long a claimed slot may stay unpublished, its writer's process
/// gone, before the ring moves past it. A live writer is always waited
/// for (it may be stopped: Ctrl-Z, a debugger).
const STALL_LIMIT: Duration = Duration::from_millis(200);

fn page_up(n: u64) -> u64 {
    n.next_multiple_of(4096)
}

impl Shared {
    /// Makes the memory: a memfd the command inherits (not close-on-exec:
    /// a program exec'd by the command finds it by number, or else by
    /// path through /proc).
    pub fn create(cfg: &Config) -> io::Result<Shared> {
        // SAFETY: a name and flags; the fd returned is ours.
        let fd = unsafe { libc::memfd_create(c"memleak-agent-ring".as_ptr(), 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd, owned from here.
        Shared::create_on(unsafe { OwnedFd::from_raw_fd(fd) }, cfg)
    }

    /// Makes the memory in `fd`, an empty memfd: one the recorder made,
    /// or one made in a running process for its injected agent, opened
    /// here through /proc.
    pub fn create_on(fd: OwnedFd, cfg: &Config) -> io::Result<Shared> {
        // The largest power of two of slots the ring size holds, at least
        // 1024.
        let fit = (cfg.ring_bytes / SLOT_BYTES as u64).max(1024);
        let nslots = 1u64 << fit.ilog2();
        let tables_off = HEADER_BYTES as u64;
        let rows_off =
            page_up(tables_off + u64::from(TABLES) * std::mem::size_of::<Table>() as u64);
        let ring_off = page_up(rows_off + u64::from(ROWS) * 8);
        let total = page_up(ring_off + nslots * SLOT_BYTES as u64);
        // SAFETY: our fd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), total as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a shared mapping of the whole memfd.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = Arc::new(Mapping {
            base: base.cast(),
            len: total as usize,
        });
        // SAFETY: the memfd is zeroed; nothing else maps it yet. Plain
        // fields are written before any agent exists.
        unsafe {
            let h = map.base as *mut Header;
            (*h).version = VERSION;
            // SAFETY: getpid has no preconditions.
            (*h).recorder_pid = libc::getpid() as u32;
            (*h).total_bytes = total;
            (*h).ring_off = ring_off;
            (*h).nslots = nslots as u32;
            (*h).slot_bytes = SLOT_BYTES as u32;
            (*h).rows_off = rows_off;
            (*h).row_capacity = ROWS;
            (*h).ntables = TABLES;
            (*h).tables_off = tables_off;
            (*h).min_size = cfg.min_size;
            (*h).max_size = cfg.max_size;
            (*h).max_frames = cfg.max_frames;
            (*h).unwind_mode = cfg.unwind_mode;
            (*h).sample_mean = cfg.sample_mean;
        }
        let ring = map.base.wrapping_add(ring_off as usize);
        // Writing every slot's sequence word makes the ring's pages (tens
        // of MiB, a page fault each): on a thread of its own, while the
        // caller loads the probes. [`Shared::ready`] waits for it.
        let init = {
            let map = map.clone();
            std::thread::Builder::new()
                .name("memleak-ring".into())
                .spawn(move || init_ring(&map, ring_off as usize, nslots))?
        };
        Ok(Shared {
            fd,
            map,
            init: Some(init),
            nslots,
            ring,
            tail: 0,
            stall: None,
            ends: vec![0; crate::event::UNWIND_ENDS.len()],
            unfinished: 0,
        })
    }

    /// Waits until the ring is ready for the agents: call it before the
    /// command runs (an agent that finds no magic records nothing).
    pub fn ready(&mut self) -> io::Result<()> {
        match self.init.take().map(std::thread::JoinHandle::join) {
            Some(Err(_)) => Err(io::Error::other("the ring's initialization panicked")),
            _ => Ok(()),
        }
    }

    /// The memfd.
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    fn header(&self) -> &Header {
        self.map.header()
    }

    /// Lets the agent record in `pid` (before the process runs), in the
    /// place of an ended process if there is one.
    pub fn add_pid(&self, pid: u32) -> bool {
        let h = self.header();
        let n = h.npids.load(Ordering::Relaxed) as usize;
        let used = &h.pids[..n.min(MAX_PIDS)];
        if used.iter().any(|p| p.load(Ordering::Relaxed) == pid) {
            return true;
        }
        if let Some(free) = used.iter().find(|p| p.load(Ordering::Relaxed) == 0) {
            free.store(pid, Ordering::Release);
            return true;
        }
        if n >= MAX_PIDS {
            return false;
        }
        h.pids[n].store(pid, Ordering::Relaxed);
        h.npids.store(n as u32 + 1, Ordering::Release);
        true
    }

    /// A process that ended: its place goes to the next one (pid 0 is no
    /// process's).
    pub fn remove_pid(&self, pid: u32) {
        let h = self.header();
        let n = h.npids.load(Ordering::Relaxed) as usize;
        for p in &h.pids[..n.min(MAX_PIDS)] {
            if p.load(Ordering::Relaxed) == pid {
                p.store(0, Ordering::Release);
            }
        }
    }

    /// The agent's loss counters, by `enum memleak_lost`, with the slots
    /// whose writer died mid-write counted as `ring_full` is not: they
    /// are returned apart.
    pub fn lost(&self) -> [u64; 8] {
        std::array::from_fn(|i| self.header().lost[i].load(Ordering::Relaxed))
    }

    /// Records lost because the process that was writing them died.
    pub fn unfinished(&self) -> u64 {
        self.unfinished
    }

    /// Sleeps until an agent finds the ring half full, or `timeout`.
    pub fn wait(&self, timeout: Duration) {
        let h = self.header();
        let seq = h.wake_seq.load(Ordering::Acquire);
        h.sleeping.store(1, Ordering::SeqCst);
        let head = h.head.load(Ordering::SeqCst);
        if head.saturating_sub(self.tail) < self.nslots / 2 {
            let ts = libc::timespec {
                tv_sec: timeout.as_secs() as libc::time_t,
                tv_nsec: timeout.subsec_nanos() as libc::c_long,
            };
            // SAFETY: a futex word in the shared mapping (not private: the
            // agents wake it from other processes); the timeout is valid.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    h.wake_seq.as_ptr(),
                    libc::FUTEX_WAIT,
                    seq,
                    &ts as *const libc::timespec,
                    std::ptr::null::<u32>(),
                    0,
                )
            };
        }
        h.sleeping.store(0, Ordering::SeqCst);
    }

    /// Tells the agents the recording is over: they record nothing more
    /// (a command left running with --detach, a process the recorder
    /// lost), and none waits for room in the ring.
    pub fn stop(&self) {
        self.header().stop.store(1, Ordering::SeqCst);
        self.wake_writers(true);
    }

    /// Gives back the pages of everything but the header (the tables, the
    /// rows, the ring) once the recording is over and drained, for an
    /// agent that keeps the memory mapped: an injected one stays in the
    /// running process. A late write there gets a fresh zero page, never
    /// a fault.
    pub fn release_pages(&self) -> io::Result<()> {
        let start = HEADER_BYTES as i64;
        let len = self.map.len as i64 - start;
        // SAFETY: our fd; a range inside the file.
        let r = unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                start,
                len,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Wakes the writers waiting for room in the ring, once a quarter of
    /// it is free or, with `done`, at once (the drain caught up, or the
    /// recording stopped). Woken for every freed slot, a writer would fill
    /// it and sleep again, a system call on each side per event.
    fn wake_writers(&self, done: bool) {
        let h = self.header();
        // Against the writer's look-then-sleep (agent.c, wait_for_room):
        // the slots freed are visible before room_waiting is read.
        std::sync::atomic::fence(Ordering::SeqCst);
        if h.room_waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        if !done {
            let free = (self.tail + self.nslots).saturating_sub(h.head.load(Ordering::Relaxed));
            if free < self.nslots / 4 {
                return;
            }
        }
        if h.room_waiting.swap(0, Ordering::AcqRel) != 0 {
            h.room_seq.fetch_add(1, Ordering::Release);
            // SAFETY: a futex word in the shared mapping (not private: the
            // writers wait in other processes).
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    h.room_seq.as_ptr(),
                    libc::FUTEX_WAKE,
                    i32::MAX,
                    std::ptr::null::<libc::timespec>(),
                    std::ptr::null::<u32>(),
                    0,
                )
            };
        }
    }

    /// Processes whose agent started.
    pub fn agents(&self) -> u64 {
        self.header().agents.load(Ordering::Relaxed)
    }

    /// Walks by how they ended (by `UnwindEnd` code), from the records.
    pub fn unwind_ends(&self) -> &[u64] {
        &self.ends
    }

    /// The sink that writes unwind tables here.
    pub fn sink(&self) -> AgentTables {
        AgentTables {
            map: self.map.clone(),
        }
    }

    fn slot(&self, pos: u64) -> *mut u8 {
        self.ring
            .wrapping_add(((pos & (self.nslots - 1)) as usize) * SLOT_BYTES)
    }

    /// Hands every published record, in ring order, to `f` (which returns
    /// false to stop), and frees its slot. Stops at a slot still being
    /// written; one whose writer's process is gone is skipped (and
    /// counted) once it has stayed so for a while, or at once with
    /// `final_drain`. Stops too after a ring's worth of slots, all that
    /// was in it when called: writers faster than the recorder would
    /// otherwise keep it here, away from its other work.
    pub fn drain(&mut self, final_drain: bool, f: &mut dyn FnMut(&[u8]) -> bool) -> usize {
        let n = self.drain_some(final_drain, f);
        self.wake_writers(true);
        n
    }

    fn drain_some(&mut self, final_drain: bool, f: &mut dyn FnMut(&[u8]) -> bool) -> usize {
        let mut n = 0;
        let limit = self.tail + self.nslots;
        while self.tail < limit {
            if self.tail & 255 == 0 {
                self.wake_writers(false);
            }
            let slot = self.slot(self.tail);
            prefetch(self.slot(self.tail + PREFETCH_AHEAD));
            // SAFETY: the slot is within the mapping; its first word is
            // the sequence, the next two the writer and length.
            let (seq, pid, len) = unsafe {
                (
                    &*(slot as *const AtomicU64),
                    &*(slot.add(8) as *const AtomicU32),
                    &*(slot.add(12) as *const AtomicU32),
                )
            };
            let s = seq.load(Ordering::Acquire);
            if s == self.tail + 1 {
                self.stall = None;
                let len = (len.load(Ordering::Relaxed) as usize).min(SLOT_BYTES - 16);
                if len >= offsets::FRAMES {
                    // SAFETY: the event follows the slot header; published,
                    // so no longer written.
                    let ev = unsafe { std::slice::from_raw_parts(slot.add(16), len) };
                    self.count_end(ev);
                    if !f(ev) {
                        return n;
                    }
                }
                seq.store(self.tail + self.nslots, Ordering::Release);
                self.tail += 1;
                self.header().tail.store(self.tail, Ordering::Relaxed);
                n += 1;
                continue;
            }
            // Claimed and not published (or not claimed at all).
            if self.header().head.load(Ordering::Acquire) <= self.tail {
                return n;
            }
            let writer = pid.load(Ordering::Relaxed);
            let dead = writer == 0 || gone(writer);
            let since = match self.stall {
                Some((at, t)) if at == self.tail => t,
                _ => {
                    let now = Instant::now();
                    self.stall = Some((self.tail, now));
                    now
                }
            };
            if !(dead && (final_drain || since.elapsed() >= STALL_LIMIT)) {
                return n;
            }
            // Its writer can no longer publish it: skip it (the
            // compare-and-swap loses to a writer that just did).
            if seq
                .compare_exchange(
                    self.tail,
                    self.tail + self.nslots,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                self.unfinished += 1;
                self.tail += 1;
                self.header().tail.store(self.tail, Ordering::Relaxed);
                self.stall = None;
            }
        }
        n
    }

    /// Counts how the event's walk ended, from its flags and frame count
    /// alone: [`crate::Recorder::handle`] decodes the event after.
    fn count_end(&mut self, ev: &[u8]) {
        let flags = ev[offsets::FLAGS];
        let nframes = u16::from_ne_bytes([ev[offsets::NFRAMES], ev[offsets::NFRAMES + 1]]);
        if nframes > 0 && flags & FLAG_KERNEL_STACK == 0 {
            let end = UnwindEnd::from_flags(flags) as usize;
            if let Some(c) = self.ends.get_mut(end) {
                *c += 1;
            }
        }
    }
}

/// How many slots ahead of the one it reads the drain asks for: a slot
/// was written by another CPU, and reading its lines is the drain's main
/// cost when they are fetched one at a time.
const PREFETCH_AHEAD: u64 = 4;

/// Asks for a slot's first two cache lines: the slot's header and the
/// event's (the frames of a short stack are in the second).
#[inline(always)]
fn prefetch(slot: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch(slot.cast(), _MM_HINT_T0);
        _mm_prefetch(slot.wrapping_add(64).cast(), _MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = slot;
}

/// The agent's unwind tables: an [`UnwindSink`] into the shared memory.
pub struct AgentTables {
    map: Arc<Mapping>,
}

impl AgentTables {
    fn table(&self, i: u32) -> &Table {
        let h = self.map.header();
        let at = h.tables_off as usize + i as usize * std::mem::size_of::<Table>();
        // SAFETY: table i < ntables lies within the mapping.
        unsafe { &*(self.map.base.add(at) as *const Table) }
    }
}

impl UnwindSink for AgentTables {
    fn row_capacity(&self) -> u32 {
        self.map.header().row_capacity
    }

    fn write_rows(&mut self, first: u32, rows: &[Row]) -> io::Result<()> {
        let h = self.map.header();
        let end = first as usize + rows.len();
        if end > h.row_capacity as usize {
            return Err(io::Error::other("rows past the end of the array"));
        }
        // SAFETY: [first, end) is within the row array (checked above);
        // agents read only rows a table names, and tables are published
        // after this.
        unsafe {
            let dst = self.map.base.add(h.rows_off as usize).cast::<Row>();
            std::ptr::copy_nonoverlapping(rows.as_ptr(), dst.add(first as usize), rows.len());
        }
        Ok(())
    }

    fn set_process(&mut self, pid: u32, table: &ProcTable) -> io::Result<()> {
        let h = self.map.header();
        let slot = (0..h.ntables)
            .find(|&i| self.table(i).pid.load(Ordering::Relaxed) == pid)
            .or_else(|| (0..h.ntables).find(|&i| self.table(i).pid.load(Ordering::Relaxed) == 0))
            .ok_or_else(|| io::Error::other("no room for another process's unwind table"))?;
        let t = self.table(slot);
        // A sequence lock: odd while written; an agent that saw it change
        // walks again.
        let seq = t.seq.load(Ordering::Relaxed);
        t.seq.store(seq | 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        // SAFETY: the table's bytes, written while its sequence is odd;
        // readers check the sequence after reading.
        unsafe {
            let dst = std::ptr::addr_of!(t.proc) as *mut ProcTable;
            std::ptr::copy_nonoverlapping(table as *const ProcTable, dst, 1);
        }
        t.pid.store(pid, Ordering::Relaxed);
        t.seq.store((seq | 1) + 1, Ordering::Release);
        h.tables_gen.fetch_add(1, Ordering::Release);
        Ok(())
    }

    fn remove_process(&mut self, pid: u32) -> io::Result<()> {
        let h = self.map.header();
        if let Some(i) = (0..h.ntables).find(|&i| self.table(i).pid.load(Ordering::Relaxed) == pid)
        {
            self.table(i).pid.store(0, Ordering::Release);
            h.tables_gen.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }
}
