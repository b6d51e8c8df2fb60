//! The recorder's side of the in-process agent (`record --capture
//! preload`): the shared memory it writes events into, the unwind tables
//! it walks stacks with, and the drain of its ring.
//!
//! The layout is `agent/agent.h`'s; every offset is asserted there and
//! here. The agent writes the same `struct memleak_event` records as the
//! probe, so a drained record goes to [`crate::Recorder::handle`] as a BPF
//! ring record does.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::event::{offsets, UnwindEnd, FLAG_KERNEL_STACK, MAX_FRAMES};
use crate::procmaps::{gone, status_field};
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
    sandboxed: AtomicU64,
    _pad3: [u8; 40],
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
const _: () = assert!(std::mem::offset_of!(Header, sandboxed) == 464);
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
    /// The processes that may write here, by the pid their agent writes
    /// (their own, in their pid namespace), to the pid here: the
    /// recorder's own list, never read back from the shared memory.
    writers: RefCell<HashMap<u32, u32>>,
    /// Threads seen in events, by (pid here, tid written): the thread's
    /// id here, or `None` for a thread of another process.
    threads: HashMap<(u32, u32), Option<u32>>,
    /// The (pid, tid) the last record accepted had, and what they are
    /// here: `writers` and `threads` looked up once per change of thread.
    last_thread: Cell<Option<(PidTid, PidTid)>>,
    /// Slots and counters rejected: what no agent writes (see
    /// `check_event`).
    corrupt: u64,
    /// `head` was seen out of its range, counted once.
    bad_head: bool,
    /// When the final drain first waited for a live writer.
    final_wait: Option<Instant>,
    /// The loss counters as last read within their bounds.
    lost_seen: Cell<[u64; 8]>,
    /// Counters found out of their bounds, each counted once.
    bad_counters: Cell<u8>,
    /// CLOCK_MONOTONIC when the memory was made: no event is older.
    created_ns: u64,
    /// The event being handed over, copied out of the ring first: the
    /// slot is the target's memory, and may change while it is read.
    copy: Box<[u8; SLOT_BYTES]>,
}

/// A (pid, tid) pair.
type PidTid = (u32, u32);

/// A loss counter larger than this was not counted by an agent: 2^40
/// calls is 12 days at a billion a second.
const COUNTER_LIMIT: u64 = 1 << 40;

/// Entries of `Shared::threads` kept at most: forged thread ids cannot
/// grow it without bound.
const THREADS_KEPT: usize = 1 << 16;

/// What an event may say of a block: an address and size within the
/// user address space (5-level paging: 57 bits).
const ADDRESS_LIMIT: u64 = 1 << 57;

/// How far past the recorder's clock an event's time may be: events are
/// read after they are written, and read the same clock.
const CLOCK_SLACK_NS: u64 = 1_000_000_000;

/// CLOCK_MONOTONIC, in ns.
fn monotonic_ns() -> u64 {
    memleak_trace::meta::clock_ns(libc::CLOCK_MONOTONIC)
}

/// The allocation kinds an agent writes (`enum memleak_kind`'s user-space
/// codes, 0..=16): never the kernel's, nor exec, exit or fork, which come
/// from the probes alone.
const LAST_USER_KIND: u8 = 16;
/// `MK_REALLOC`, `MK_REALLOCARRAY`, `MK_MUNMAP`, `MK_MREMAP`.
const KIND_REALLOC: u8 = 2;
const KIND_REALLOCARRAY: u8 = 3;
const KIND_MUNMAP: u8 = 11;
const KIND_MREMAP: u8 = 12;
/// The release kinds: free, munmap, delete, delete[].
const RELEASES: [u8; 4] = [4, 11, 15, 16];

/// Whether an event is one an agent writes, in `len` bytes of its slot
/// (`pid` and `tid` are checked by the caller, against the processes
/// recorded): the reason it is not, if not.
pub fn check_event(ev: &[u8], oldest_ns: u64, newest_ns: u64) -> Result<(), &'static str> {
    if ev.len() < offsets::FRAMES {
        return Err("shorter than an event");
    }
    let u64_at = |o: usize| u64::from_ne_bytes(ev[o..o + 8].try_into().expect("8 bytes"));
    let nframes = u16::from_ne_bytes([ev[offsets::NFRAMES], ev[offsets::NFRAMES + 1]]);
    if u32::from(nframes) > MAX_FRAMES || ev.len() != offsets::FRAMES + usize::from(nframes) * 8 {
        return Err("frame count");
    }
    let kind = ev[offsets::KIND];
    if kind > LAST_USER_KIND {
        return Err("kind");
    }
    if ev[offsets::FLAGS] & FLAG_KERNEL_STACK != 0 {
        return Err("kernel stack");
    }
    let ts = u64_at(offsets::TS_NS);
    if ts < oldest_ns || ts > newest_ns {
        return Err("time");
    }
    let (addr, size) = (u64_at(offsets::ADDR), u64_at(offsets::SIZE));
    let (old, old_size) = (u64_at(offsets::OLD_ADDR), u64_at(offsets::OLD_SIZE));
    let moves = matches!(kind, KIND_REALLOC | KIND_REALLOCARRAY | KIND_MREMAP);
    if RELEASES.contains(&kind) {
        // A release names its block; munmap a length, which the program
        // chose (the call may fail).
        if addr == 0 || addr >= ADDRESS_LIMIT || (kind != KIND_MUNMAP && size != 0) {
            return Err("release");
        }
        return Ok(());
    }
    // An allocation (or a move's new block) lies in the address space.
    if addr >= ADDRESS_LIMIT || size > ADDRESS_LIMIT - addr {
        return Err("block");
    }
    if addr == 0 && !(moves && old != 0) {
        return Err("block");
    }
    if moves {
        if old >= ADDRESS_LIMIT || old_size > ADDRESS_LIMIT {
            return Err("old block");
        }
    } else if old != 0 || old_size != 0 {
        return Err("old block");
    }
    Ok(())
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
            writers: RefCell::default(),
            threads: HashMap::new(),
            last_thread: Cell::new(None),
            corrupt: 0,
            bad_head: false,
            final_wait: None,
            lost_seen: Cell::new([0; 8]),
            bad_counters: Cell::new(0),
            created_ns: monotonic_ns(),
            copy: Box::new([0; SLOT_BYTES]),
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
    /// place of an ended process if there is one. A process in another
    /// pid namespace (a container) is named to its agent by its pid there.
    pub fn add_pid(&self, pid: u32) -> bool {
        let own = innermost_pid(pid).unwrap_or(pid);
        self.writers.borrow_mut().insert(own, pid);
        // A pid of another namespace may name another process now.
        self.last_thread.set(None);
        let h = self.header();
        let n = h.npids.load(Ordering::Relaxed) as usize;
        let used = &h.pids[..n.min(MAX_PIDS)];
        if used.iter().any(|p| p.load(Ordering::Relaxed) == own) {
            return true;
        }
        if let Some(free) = used.iter().find(|p| p.load(Ordering::Relaxed) == 0) {
            free.store(own, Ordering::Release);
            return true;
        }
        if n >= MAX_PIDS {
            return false;
        }
        h.pids[n].store(own, Ordering::Relaxed);
        h.npids.store(n as u32 + 1, Ordering::Release);
        true
    }

    /// A process that ended: its place goes to the next one (pid 0 is no
    /// process's). What it wrote before it ended is still taken.
    pub fn remove_pid(&self, pid: u32) {
        let own = self
            .writers
            .borrow()
            .iter()
            .find(|&(_, &here)| here == pid)
            .map_or(pid, |(&own, _)| own);
        let h = self.header();
        let n = h.npids.load(Ordering::Relaxed) as usize;
        for p in &h.pids[..n.min(MAX_PIDS)] {
            if p.load(Ordering::Relaxed) == own {
                p.store(0, Ordering::Release);
            }
        }
    }

    /// The agent's loss counters, by `enum memleak_lost`, with the slots
    /// whose writer died mid-write counted as `ring_full` is not: they
    /// are returned apart. A counter out of its bounds (larger than any
    /// agent counts, or smaller than it was) keeps its last value and is
    /// counted as corrupt, once.
    pub fn lost(&self) -> [u64; 8] {
        let mut seen = self.lost_seen.get();
        let mut bad = self.bad_counters.get();
        for (i, v) in seen.iter_mut().enumerate() {
            let now = self.header().lost[i].load(Ordering::Relaxed);
            if now <= COUNTER_LIMIT && now >= *v {
                *v = now;
            } else {
                bad |= 1 << i;
            }
        }
        self.lost_seen.set(seen);
        self.bad_counters.set(bad);
        seen
    }

    /// Slots and counters rejected because no agent writes what they
    /// held: a process that wrote into the shared memory itself.
    pub fn corrupt(&self) -> u64 {
        self.corrupt + u64::from(self.bad_counters.get().count_ones())
    }

    /// Records lost because the process that was writing them died.
    pub fn unfinished(&self) -> u64 {
        self.unfinished
    }

    /// Sleeps until an agent finds the ring half full, or `timeout`: 1 ms
    /// at most while an agent runs under a seccomp filter, which wakes
    /// no one (it makes no system call) and gives events up after
    /// waiting about 1 ms for room.
    pub fn wait(&self, timeout: Duration) {
        let h = self.header();
        let timeout = if h.sandboxed.load(Ordering::Relaxed) > 0 {
            timeout.min(Duration::from_millis(1))
        } else {
            timeout
        };
        let seq = h.wake_seq.load(Ordering::Acquire);
        h.sleeping.store(1, Ordering::SeqCst);
        // Past a lap ahead (or behind), `head` was not moved by an agent:
        // the wait is not cut short on its word.
        let pending = h.head.load(Ordering::SeqCst).wrapping_sub(self.tail);
        if pending < self.nslots / 2 || pending > self.nslots {
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

    /// Processes whose agent saw a seccomp filter come, and makes no
    /// system call since (as the agent says: a count, bounded by the
    /// processes recorded).
    pub fn sandboxed(&self) -> u64 {
        let n = self.header().sandboxed.load(Ordering::Relaxed);
        n.min(self.writers.borrow().len() as u64)
    }

    /// Walks by how they ended (by `UnwindEnd` code), from the records.
    pub fn unwind_ends(&self) -> &[u64] {
        &self.ends
    }

    /// The sink that writes unwind tables here.
    pub fn sink(&self) -> AgentTables {
        AgentTables {
            map: self.map.clone(),
            own: HashMap::new(),
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
    ///
    /// The ring is the target's memory, and a target may write anything
    /// there. So every step is bounded (a ring's worth of slots, whatever
    /// the slots and `head` say), a record is copied out of its slot
    /// before it is checked, and one that no agent writes (`check_event`,
    /// a process or thread not recorded, a sequence no writer publishes)
    /// is skipped and counted in [`Shared::corrupt`], never handed on.
    pub fn drain(&mut self, final_drain: bool, f: &mut dyn FnMut(&[u8]) -> bool) -> usize {
        let n = self.drain_some(final_drain, f);
        self.wake_writers(true);
        n
    }

    fn drain_some(&mut self, final_drain: bool, f: &mut dyn FnMut(&[u8]) -> bool) -> usize {
        let mut n = 0;
        let newest_ns = monotonic_ns() + CLOCK_SLACK_NS;
        // Bounded, whatever the ring holds: a ring's worth of slots, and
        // as many steps again for slots that change under it.
        let limit = self.tail + self.nslots;
        for step in 0..2 * self.nslots {
            if self.tail >= limit {
                break;
            }
            if step & 255 == 0 {
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
                // SAFETY: the event follows the slot header, within the
                // slot; copied as bytes, whatever is written meanwhile.
                unsafe { std::ptr::copy_nonoverlapping(slot.add(16), self.copy.as_mut_ptr(), len) };
                self.free_slot(seq);
                n += 1;
                // len 0: a call that failed after claiming its slot.
                if len == 0 {
                    continue;
                }
                if !self.accept(len, newest_ns) {
                    self.corrupt += 1;
                    continue;
                }
                let (flags, nframes) = end_of(&self.copy[..len]);
                self.count_end(flags, nframes);
                if !f(&self.copy[..len]) {
                    return n;
                }
                continue;
            }
            let head = self.header().head.load(Ordering::Acquire);
            let pending = head.wrapping_sub(self.tail);
            if pending > self.nslots && !self.bad_head {
                // Beyond a lap ahead (or behind): `head` was not moved by
                // an agent.
                self.bad_head = true;
                self.corrupt += 1;
            }
            if s != self.tail {
                // No writer publishes this: a writer stores only p + 1 at
                // the position p it claimed when the slot held p. Claimed
                // (behind `head`), it is skipped; not yet, it is made free
                // for its position again, so that the writer that comes
                // to it can take it.
                let claimed = pending != 0 && pending <= self.nslots;
                let to = if claimed {
                    self.tail + self.nslots
                } else {
                    self.tail
                };
                if seq
                    .compare_exchange(s, to, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    self.corrupt += 1;
                    self.stall = None;
                    if claimed {
                        self.advance();
                    }
                }
                continue;
            }
            // Free for this lap: not claimed, or claimed and being
            // written.
            if pending == 0 || pending > self.nslots {
                return n;
            }
            let writer = pid.load(Ordering::Relaxed);
            let known = self.writers.borrow().get(&writer).copied();
            let dead = known.is_none_or(gone);
            let since = match self.stall {
                Some((at, t)) if at == self.tail => t,
                _ => {
                    let now = Instant::now();
                    self.stall = Some((self.tail, now));
                    now
                }
            };
            if final_drain && !dead {
                // The recording is over, and a live writer is mid-write
                // (a few hundred ns), or stopped, or never publishes: it
                // is waited for, up to STALL_LIMIT in all, then skipped.
                let first = *self.final_wait.get_or_insert_with(Instant::now);
                if first.elapsed() < STALL_LIMIT {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
            } else if !(dead && (final_drain || since.elapsed() >= STALL_LIMIT)) {
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
                if known.is_some() {
                    self.unfinished += 1;
                } else {
                    self.corrupt += 1;
                }
                self.advance();
                self.stall = None;
            }
        }
        n
    }

    /// Frees the slot at the tail for its next lap, and moves past it.
    fn free_slot(&mut self, seq: &AtomicU64) {
        seq.store(self.tail + self.nslots, Ordering::Release);
        self.advance();
    }

    fn advance(&mut self) {
        self.tail += 1;
        self.header().tail.store(self.tail, Ordering::Relaxed);
    }

    /// Whether the copied event of `len` bytes is one an agent of a
    /// process recorded could have written; its pid and tid are made the
    /// ones here.
    fn accept(&mut self, len: usize, newest_ns: u64) -> bool {
        if check_event(&self.copy[..len], self.created_ns, newest_ns).is_err() {
            return false;
        }
        let u32_at = |ev: &[u8], o: usize| u32::from_ne_bytes(ev[o..o + 4].try_into().unwrap());
        let written = (
            u32_at(&self.copy[..], offsets::PID),
            u32_at(&self.copy[..], offsets::TID),
        );
        // Most records are the same thread's as the one before: its
        // answer is kept, and the two lookups are made once per change.
        let here = match self.last_thread.get() {
            Some((w, here)) if w == written => here,
            _ => {
                let Some(pid) = self.writers.borrow().get(&written.0).copied() else {
                    return false;
                };
                let Some(tid) = self.thread(pid, written.0, written.1) else {
                    return false;
                };
                self.last_thread.set(Some((written, (pid, tid))));
                (pid, tid)
            }
        };
        let ev = &mut self.copy[..len];
        ev[offsets::PID..offsets::PID + 4].copy_from_slice(&here.0.to_ne_bytes());
        ev[offsets::TID..offsets::TID + 4].copy_from_slice(&here.1.to_ne_bytes());
        true
    }

    /// The id here of thread `tid` (as process `own` names it) of process
    /// `pid`, or `None` if it is another process's. A thread that ended
    /// before it was looked up keeps the id its process gave it.
    fn thread(&mut self, pid: u32, own: u32, tid: u32) -> Option<u32> {
        if tid == 0 {
            return None;
        }
        if let Some(&known) = self.threads.get(&(pid, tid)) {
            return known;
        }
        let found = if own == pid {
            // Same namespace: the thread is the process's, or, ended, no
            // process's now; never a live thread of another.
            let of = std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists();
            if of {
                Some(tid)
            } else {
                let tgid = std::fs::read_to_string(format!("/proc/{tid}/status"))
                    .ok()
                    .and_then(|st| status_field(&st, "Tgid:")?.parse::<u32>().ok());
                match tgid {
                    Some(other) if other != pid => None,
                    _ => Some(tid),
                }
            }
        } else {
            Some(thread_here(pid, tid).unwrap_or(tid))
        };
        if self.threads.len() >= THREADS_KEPT {
            self.threads.clear();
        }
        self.threads.insert((pid, tid), found);
        found
    }
    /// Counts how the event's walk ended, from its flags and frame count
    /// alone: [`crate::Recorder::handle`] decodes the event after.
    fn count_end(&mut self, flags: u8, nframes: u16) {
        if nframes > 0 && flags & FLAG_KERNEL_STACK == 0 {
            let end = UnwindEnd::from_flags(flags) as usize;
            if let Some(c) = self.ends.get_mut(end) {
                *c += 1;
            }
        }
    }
}

/// An event's flags and frame count.
fn end_of(ev: &[u8]) -> (u8, u16) {
    (
        ev[offsets::FLAGS],
        u16::from_ne_bytes([ev[offsets::NFRAMES], ev[offsets::NFRAMES + 1]]),
    )
}

/// The pids of a process, from the recorder's pid namespace to its own
/// (`NSpid`): one entry when both are the same.
fn ns_pids(status: &str) -> Vec<u32> {
    status_field(status, "NSpid:")
        .map(|v| {
            v.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The pid process `pid` has in its own pid namespace, which is the one
/// its agent writes.
pub fn innermost_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    ns_pids(&status).last().copied()
}

/// The id here of the thread of process `pid` whose id in its own
/// namespace is `tid`.
fn thread_here(pid: u32, tid: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks.filter_map(Result::ok).find_map(|t| {
        let here: u32 = t.file_name().to_str()?.parse().ok()?;
        let status = std::fs::read_to_string(t.path().join("status")).ok()?;
        (ns_pids(&status).last() == Some(&tid)).then_some(here)
    })
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
    /// The pid each process has in its own pid namespace, by the pid
    /// here: the one its agent looks its table up by.
    own: HashMap<u32, u32>,
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
        let pid = *self
            .own
            .entry(pid)
            .or_insert_with(|| innermost_pid(pid).unwrap_or(pid));
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
        let pid = self.own.remove(&pid).unwrap_or(pid);
        let h = self.map.header();
        if let Some(i) = (0..h.ntables).find(|&i| self.table(i).pid.load(Ordering::Relaxed) == pid)
        {
            self.table(i).pid.store(0, Ordering::Release);
            h.tables_gen.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }
}

/// Feeds the consumer a ring written by a hostile process, as `data`
/// says (a list of operations, below), and checks what it hands on: the
/// harness of `fuzz/fuzz_targets/ring_consumer.rs` and of the tests
/// here. Panics if the drain hands on an event no agent of this process
/// writes; a drain that does not return is a hang the fuzzer reports.
///
/// Each operation is a byte, then its arguments:
/// - 0 `off: u16, n: u8, bytes`: writes bytes into the ring;
/// - 1 `pid: u8, kind: u8, nframes: u8, ts: u8, size: u8`: publishes an
///   event at `head` (its fields near an agent's, or not);
/// - 2 `delta: u64`: adds to `head`;
/// - 3 `i: u8, v: u64`: sets a loss counter;
/// - 4: drains;
/// - 5 `pid: u8`: claims a slot and leaves it.
/// Returns the events handed on and the records rejected.
#[doc(hidden)]
pub fn fuzz_drain(data: &[u8]) -> (u64, u64) {
    let cfg = Config {
        ring_bytes: 0,
        min_size: 0,
        max_size: u64::MAX,
        max_frames: MAX_FRAMES,
        unwind_mode: 0,
        sample_mean: 0,
    };
    let mut shared = Shared::create(&cfg).expect("shared memory");
    shared.ready().expect("ring");
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() } as u32;
    shared.add_pid(me);
    let nslots = shared.nslots;
    let ring_len = (nslots as usize) * SLOT_BYTES;
    let ring = shared.ring;
    let mut input = data;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (a, b) = input.split_at_checked(n)?;
        input = b;
        Some(a)
    };
    let pick_pid = |b: u8| match b % 4 {
        0 | 1 => me,
        2 => 1,
        _ => u32::from(b) << 8,
    };
    let mut handed = 0u64;
    let mut check = |ev: &[u8]| {
        assert!(check_event(ev, 0, u64::MAX).is_ok(), "handed on: {ev:?}");
        let pid = u32::from_ne_bytes(ev[offsets::PID..offsets::PID + 4].try_into().unwrap());
        assert_eq!(pid, me, "an event of another process was handed on");
        handed += 1;
        true
    };
    while let Some(&[op]) = take(1) {
        // SAFETY (every block below): writes within the mapping, as a
        // process that maps it may make; the consumer reads it as bytes
        // and atomics.
        match op % 6 {
            0 => {
                let Some(a) = take(3) else { break };
                let off = usize::from(u16::from_le_bytes([a[0], a[1]])) * 17 % ring_len;
                let n = usize::from(a[2]).min(ring_len - off);
                let Some(bytes) = take(n) else { break };
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ring.add(off), n) };
            }
            1 => {
                let Some(a) = take(5) else { break };
                let h = shared.header();
                let pos = h.head.fetch_add(1, Ordering::AcqRel);
                let slot = shared.slot(pos);
                let nframes = usize::from(a[2]) % (MAX_FRAMES as usize + 8);
                let stored = nframes.min(MAX_FRAMES as usize);
                let now = monotonic_ns();
                let mut ev = crate::event::RawEvent::header(
                    match a[3] % 3 {
                        0 => now,
                        1 => now + u64::from(a[3]) * 1_000_000_000,
                        _ => u64::from(a[3]),
                    },
                    pick_pid(a[0]),
                    a[1] % 56,
                    0x7f00_0000_0000 + u64::from(a[4]) * 4096,
                    if a[4] > 250 { 1 << 60 } else { u64::from(a[4]) },
                );
                ev.tid = pick_pid(a[0] >> 2);
                let mut bytes = ev.encode(&vec![0x401000; stored]);
                bytes[offsets::NFRAMES..offsets::NFRAMES + 2]
                    .copy_from_slice(&(nframes as u16).to_ne_bytes());
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot.add(16), bytes.len());
                    (*(slot.add(8) as *const AtomicU32)).store(me, Ordering::Relaxed);
                    (*(slot.add(12) as *const AtomicU32))
                        .store(bytes.len() as u32, Ordering::Relaxed);
                    (*(slot as *const AtomicU64)).store(pos + 1, Ordering::Release);
                }
            }
            2 => {
                let Some(a) = take(8) else { break };
                let d = u64::from_le_bytes(a.try_into().unwrap());
                shared.header().head.fetch_add(d, Ordering::AcqRel);
            }
            3 => {
                let Some(a) = take(9) else { break };
                let v = u64::from_le_bytes(a[1..].try_into().unwrap());
                shared.header().lost[usize::from(a[0]) % 8].store(v, Ordering::Relaxed);
            }
            4 => {
                shared.drain(false, &mut check);
            }
            _ => {
                let Some(a) = take(1) else { break };
                let pos = shared.header().head.fetch_add(1, Ordering::AcqRel);
                let slot = shared.slot(pos);
                unsafe {
                    (*(slot.add(8) as *const AtomicU32)).store(pick_pid(a[0]), Ordering::Relaxed)
                };
            }
        }
    }
    shared.drain(true, &mut check);
    for v in shared.lost() {
        assert!(v <= COUNTER_LIMIT);
    }
    (handed, shared.corrupt())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: u8, addr: u64, size: u64, old: u64, nframes: usize) -> Vec<u8> {
        let mut e = crate::event::RawEvent::header(5_000, 7, kind, addr, size);
        e.old_addr = old;
        e.encode(&vec![0x401000; nframes])
    }

    #[test]
    fn events_an_agent_writes_pass() {
        let ok = |ev: &[u8]| check_event(ev, 1_000, 10_000);
        assert_eq!(ok(&event(0, 0x5555_0000_1000, 64, 0, 3)), Ok(()));
        assert_eq!(ok(&event(4, 0x5555_0000_1000, 0, 0, 0)), Ok(()));
        // munmap names a length the program chose; realloc to nothing.
        assert_eq!(ok(&event(11, 0x7f00_0000_0000, u64::MAX, 0, 0)), Ok(()));
        assert_eq!(ok(&event(2, 0, 0, 0x5555_0000_1000, 0)), Ok(()));
        assert_eq!(
            ok(&event(2, 0x5555_0000_2000, 128, 0x5555_0000_1000, 2)),
            Ok(())
        );
    }

    #[test]
    fn events_no_agent_writes_are_refused() {
        let no = |ev: &[u8]| check_event(ev, 1_000, 10_000).is_err();
        // Kernel kinds, exec/exit/fork, unknown kinds.
        for kind in [17, 32, 36, 48, 49, 50, 255] {
            assert!(no(&event(kind, 0x1000, 64, 0, 1)), "kind {kind}");
        }
        // A block beyond the address space, or wrapping it.
        assert!(no(&event(0, 0x1000, 1 << 60, 0, 1)));
        assert!(no(&event(0, u64::MAX - 8, 64, 0, 1)));
        // An allocation at 0, a release of 0, a free with a size.
        assert!(no(&event(0, 0, 64, 0, 1)));
        assert!(no(&event(4, 0, 0, 0, 0)));
        assert!(no(&event(4, 0x1000, 8, 0, 0)));
        // An old block on a malloc.
        assert!(no(&event(0, 0x1000, 64, 0x2000, 1)));
        // Too early, too late.
        assert!(check_event(&event(0, 0x1000, 64, 0, 1), 6_000, 10_000).is_err());
        assert!(check_event(&event(0, 0x1000, 64, 0, 1), 1_000, 4_000).is_err());
        // Frames: more than an event holds, or not as many as it says.
        let mut e = event(0, 0x1000, 64, 0, 2);
        e[offsets::NFRAMES] = 3;
        assert!(no(&e));
        e[offsets::NFRAMES] = 200;
        assert!(no(&e));
        assert!(no(&event(0, 0x1000, 64, 0, 2)[..60]));
        // A kernel stack.
        let mut e = event(0, 0x1000, 64, 0, 1);
        e[offsets::FLAGS] = FLAG_KERNEL_STACK;
        assert!(no(&e));
    }

    /// Random and adversarial rings, from a fixed generator: every drain
    /// returns, and nothing it hands on is another process's or malformed
    /// (fuzz_drain checks). The fuzz target explores further.
    #[test]
    fn hostile_rings_never_hang_the_drain_nor_get_through() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..64 {
            let len = 64 + round * 40;
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect();
            fuzz_drain(&data);
        }
    }

    #[test]
    fn well_framed_events_of_this_process_get_through() {
        // Publish five good events (op 1 with pid byte 0: this process,
        // kind 0, 1 frame, ts now, size 64), then drain.
        let mut data = Vec::new();
        for _ in 0..5 {
            data.extend_from_slice(&[1, 0, 0, 1, 0, 64]);
        }
        // And one of pid 1, one of a kernel kind.
        data.extend_from_slice(&[1, 2, 0, 1, 0, 64, 1, 0, 32, 1, 0, 64]);
        data.push(4);
        assert_eq!(fuzz_drain(&data), (5, 2));
    }
}
