//! The recording pipeline: ring-buffer records in, trace tables out.
//!
//! [`Recorder::handle`] runs once per record on the consumer thread, so it
//! does the minimum: decode, intern the stack, normalize frames never seen
//! before (this must happen while the process is alive), append the row.
//! Symbolization, the slow part, is batched at segment boundaries and at
//! the end.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use memleak_trace::meta::clock_ns;
use memleak_trace::{Event, EventKind, Meta, StackRecord, TraceWriter};

use crate::event::{
    RawEvent, UnwindEnd, FLAG_KERNEL_STACK, FLAG_STACK_FULL, LOST_REASONS, UNWIND_ENDS,
};
use crate::functions::{FunctionIndexes, Lookup};
use crate::live::Outstanding;
use crate::procmaps::{resolve_in_process, MapsCache};
use crate::stacks::StackInterner;
use crate::symbolize::{FrameSymbolizer, PendingFrame};

/// Running totals, for the status line and the final summary.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Events written.
    pub events: u64,
    /// Distinct stacks.
    pub stacks: u64,
    /// Distinct stacks cut before an address that cannot be a return
    /// address (`cut_stacks` in meta.json).
    pub cut_stacks: u64,
    /// Distinct frames.
    pub frames: u64,
    /// Outstanding bytes (only tracked when live tracking is on).
    pub outstanding_bytes: u64,
    /// Records that could not be decoded.
    pub malformed: u64,
}

/// A change the probe's unwind tables must follow, seen in the events
/// ([`Recorder::take_table_updates`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TableUpdate {
    /// Re-read the process's maps: it exec'd, or a stack ended at an
    /// address its table does not know (a library mapped since).
    Refresh(u32),
    /// The process exited.
    Forget(u32),
}

/// Turns raw probe records into a trace.
pub struct Recorder {
    writer: TraceWriter,
    /// Stacks as the probes sent them.
    raw_stacks: StackInterner,
    /// The trace's stack id of each raw stack (raw id - 1 indexes it).
    trace_ids: Vec<u64>,
    /// Stacks as the trace holds them: cut before the first frame that
    /// is not a return address.
    stacks: StackInterner,
    maps: MapsCache,
    /// Function symbols of the objects the frames are in.
    functions: FunctionIndexes,
    /// Frames queued for symbolization: judged return addresses.
    seen_frames: HashSet<(u32, u64)>,
    /// Addresses judged not to be return addresses, with the generation
    /// of the process's maps they were judged with.
    not_frames: HashMap<(u32, u64), u64>,
    pending: Vec<PendingFrame>,
    symbolizer: FrameSymbolizer,
    last_snapshot: HashMap<u32, Instant>,
    /// New stacks, written once their frames are symbolized, with
    /// whether the walk knew if the stack is complete (otherwise
    /// [`looks_complete`] judges).
    pending_stacks: Vec<(StackRecord, bool)>,
    /// Whether the probe unwinds with tables that must follow the
    /// processes ([`Recorder::track_tables`]), and the updates seen.
    track_tables: bool,
    table_updates: Vec<TableUpdate>,
    /// Function and object of each symbolized user frame, to judge stack
    /// completeness.
    frame_functions: HashMap<(u32, u64), (Option<String>, Option<String>)>,
    /// What is outstanding, by stack, when the caller asked (the status
    /// line, live reports).
    live: Option<Outstanding>,
    /// `vmemmap_base` and `sizeof(struct page)`: page events then carry
    /// page frame numbers instead of struct page pointers.
    page_frames: Option<(u64, u64)>,
    stats: Stats,
    /// Time of the last row written (see [`Recorder::handle`]).
    last_ts: u64,
    /// Time of each process's last exec: the blocks allocated before it
    /// are not in its address space any more (a scan skips them).
    exec_ts: HashMap<u32, u64>,
}

/// Ends the frames of a cut stack when it is interned (never an address:
/// user space ends far below it).
const CUT_MARK: u64 = u64::MAX;

/// Whether an address missing from a process's maps re-reads them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reread {
    /// Yes: the address is certainly mapped (frame 0).
    Always,
    /// Unless the maps were read less than [`SNAPSHOT_MIN_INTERVAL`] ago.
    RateLimited,
    /// No: the address was missing before (data read as a frame).
    Never,
}

/// Re-reading maps on a miss is rate-limited per process: a JIT or a
/// corrupt frame pointer can produce endless unmapped addresses.
const SNAPSHOT_MIN_INTERVAL: Duration = Duration::from_millis(20);

impl Recorder {
    /// Wraps a writer. With `track_live`, what is outstanding is kept up
    /// to date by stack ([`Recorder::outstanding`]: the status line, live
    /// reports; two hash map updates per event). The trace is the same
    /// either way.
    pub fn new(writer: TraceWriter, track_live: bool) -> Self {
        Recorder {
            writer,
            raw_stacks: StackInterner::default(),
            trace_ids: Vec::new(),
            stacks: StackInterner::default(),
            maps: MapsCache::default(),
            functions: FunctionIndexes::default(),
            seen_frames: HashSet::new(),
            not_frames: HashMap::new(),
            pending: Vec::new(),
            symbolizer: FrameSymbolizer::default(),
            last_snapshot: HashMap::new(),
            pending_stacks: Vec::new(),
            track_tables: false,
            table_updates: Vec::new(),
            frame_functions: HashMap::new(),
            live: track_live.then(Outstanding::default),
            page_frames: None,
            stats: Stats::default(),
            last_ts: 0,
            exec_ts: HashMap::new(),
        }
    }

    /// Records page events by page frame number, given the kernel's
    /// `vmemmap_base` and `sizeof(struct page)`.
    pub fn set_page_frames(&mut self, base: u64, struct_size: u64) {
        if struct_size > 0 {
            self.page_frames = Some((base, struct_size));
        }
    }

    /// Makes the running totals ([`Recorder::outstanding`]) scale each
    /// sampled heap block by what it stands for (`record --sample`).
    pub fn set_sampling(&mut self, sampling: Option<memleak_trace::Sampling>) {
        if let Some(live) = &mut self.live {
            live.set_sampling(sampling);
        }
    }

    /// What is outstanding now, by stack, if `track_live` was asked for.
    pub fn outstanding(&self) -> Option<&Outstanding> {
        self.live.as_ref()
    }

    /// Current totals.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The metadata that will be written.
    pub fn meta_mut(&mut self) -> &mut Meta {
        self.writer.meta_mut()
    }

    /// Says the probe walks user stacks with unwind tables (`--unwind auto`
    /// or `dwarf`), which must follow the processes: the [`TableUpdate`]s
    /// the events call for are collected (off by default: nothing collects
    /// them), and the frames of such walks are taken as they are (a frame
    /// a signal interrupted follows no call).
    pub fn track_tables(&mut self, on: bool) {
        self.track_tables = on;
    }

    /// The table updates seen since the last call, each once.
    pub fn take_table_updates(&mut self) -> Vec<TableUpdate> {
        std::mem::take(&mut self.table_updates)
    }

    fn table_update(&mut self, u: TableUpdate) {
        if self.track_tables && !self.table_updates.contains(&u) {
            self.table_updates.push(u);
        }
    }

    /// Stores how user stacks were walked: the probe's counts of walks by
    /// [`UnwindEnd`] code, and what the tables hold.
    pub fn set_unwind(
        &mut self,
        mode: crate::unwind::WalkMode,
        ends: &[u64],
        tables: crate::unwind::TablesStats,
    ) {
        let mut info = memleak_trace::UnwindInfo {
            mode: mode.name().to_string(),
            objects: tables.objects,
            rows: tables.rows,
            ..Default::default()
        };
        for (end, &n) in UNWIND_ENDS.iter().zip(ends).filter(|(_, &n)| n > 0) {
            match end.truncated() {
                Some(false) => info.complete += n,
                Some(true) => {
                    info.truncated.insert(end.name().to_string(), n);
                }
                None if *end == UnwindEnd::FramePointer => info.frame_pointer += n,
                None => {}
            }
        }
        self.writer.meta_mut().unwind = Some(info);
    }

    /// Snapshots a process's maps into the `maps` table and the cache.
    pub fn snapshot_maps(&mut self, pid: u32) -> memleak_trace::Result<()> {
        let now = clock_ns(libc::CLOCK_MONOTONIC);
        self.last_snapshot.insert(pid, Instant::now());
        for rec in self.maps.snapshot(pid, now) {
            self.writer.push_map(&rec)?;
        }
        Ok(())
    }

    /// Handles one ring-buffer record.
    pub fn handle(&mut self, bytes: &[u8]) -> memleak_trace::Result<()> {
        let Some(raw) = RawEvent::decode(bytes) else {
            self.stats.malformed += 1;
            return Ok(());
        };
        let Some(kind) = EventKind::from_code(raw.kind) else {
            self.stats.malformed += 1;
            return Ok(());
        };
        let stack_id = if raw.frame_count() > 0 {
            Some(self.intern_stack(&raw)?)
        } else {
            None
        };
        match kind {
            EventKind::Exec => {
                // The old image is gone: its addresses mean nothing now.
                self.exec_ts.insert(raw.pid, raw.ts_ns);
                self.raw_stacks.forget_pid(raw.pid);
                self.stacks.forget_pid(raw.pid);
                self.maps.forget(raw.pid);
                self.seen_frames.retain(|&(p, _)| p != raw.pid);
                self.not_frames.retain(|&(p, _), _| p != raw.pid);
                if let Some(live) = &mut self.live {
                    live.forget_pid(raw.pid);
                }
                self.snapshot_maps(raw.pid)?;
                self.table_update(TableUpdate::Refresh(raw.pid));
            }
            EventKind::Exit => self.table_update(TableUpdate::Forget(raw.pid)),
            EventKind::Fork => {
                // The analyzer needs the lineage to give a child (and only
                // it) the heap it inherited. `addr` is the child pid.
                if let Ok(child) = u32::try_from(raw.addr) {
                    self.writer.meta_mut().parents.insert(child, raw.pid);
                }
                // Its maps are taken by whoever traces it (--follow-forks), while
                // the child is held stopped and certainly alive.
            }
            _ => {}
        }
        let mut raw = raw;
        if let (Some((base, size)), EventKind::PageAlloc | EventKind::PageFree) =
            (self.page_frames, kind)
        {
            raw.addr = page_frame(raw.addr, base, size);
        }
        if let Some(live) = &mut self.live {
            let pid = if kind.is_kernel() { 0 } else { raw.pid };
            let stack = stack_id.unwrap_or(0);
            live.apply(kind, pid, raw.addr, raw.size, raw.old_addr, stack);
            self.stats.outstanding_bytes = live.total().bytes;
        }
        // Ring order is causal: an allocation is submitted before its call
        // returns, so before any free of the block, on whatever CPU. Event
        // times are not quite in that order: a CPU reuses its clock
        // reading for up to 16 events of a tick, and any time is read
        // before the record is reserved. Raising each time to the last
        // row's keeps the rows in time order, and a free never before its
        // allocation; every time is still one read before the event was
        // submitted, so never after it.
        let mut ts_ns = raw.ts_ns.max(self.last_ts);
        if kind == EventKind::Fork && self.last_ts > 0 {
            // Strictly after everything before it: the analyzer tells a
            // child's inherited copies (allocated before it was born) from
            // what it allocates itself by time.
            ts_ns = ts_ns.max(self.last_ts + 1);
        }
        self.last_ts = ts_ns;
        let ev = Event {
            ts_ns,
            pid: raw.pid,
            tid: raw.tid,
            kind,
            addr: raw.addr,
            size: raw.size,
            old_addr: (raw.old_addr != 0).then_some(raw.old_addr),
            old_size: (raw.old_size != 0).then_some(raw.old_size),
            stack_id,
        };
        self.stats.events += 1;
        if self.writer.next_event_checkpoints() {
            // The stacks this segment's events refer to go first.
            self.flush_frames()?;
        }
        self.writer.push_event(&ev)
    }

    /// The trace's stack id for an event's stack. A stack seen for the
    /// first time is judged frame by frame: the frame-pointer walk reads
    /// whatever the stack holds where a frame record would be, so in code
    /// without frame pointers it reads data (pointers into tables, text,
    /// ASCII). The stack ends before the first address that cannot be a
    /// return address (see [`Recorder::judge_frame`]) and is marked
    /// truncated: a wrong frame is worse than a missing one. Frame 0 is
    /// the instruction pointer at the allocator's return, not read from
    /// the stack, and always stays.
    fn intern_stack(&mut self, raw: &RawEvent<'_>) -> memleak_trace::Result<u64> {
        let kernel = raw.flags & FLAG_KERNEL_STACK != 0;
        let pid = if kernel { 0 } else { raw.pid };
        let end = raw.unwind_end();
        if !kernel && matches!(end, UnwindEnd::NoMapping | UnwindEnd::NoTable) {
            self.table_update(TableUpdate::Refresh(raw.pid));
        }
        let seen = self.raw_stacks.intern(pid, kernel, raw.frames());
        if !seen.new {
            return Ok(self.trace_ids[(seen.id - 1) as usize]);
        }
        // A walk with unwind rows finds the program's frames: only a
        // frame-pointer walk (or step) reads data as frames. A frame a
        // signal interrupted follows no call, and is a frame all the same.
        let vouched = self.track_tables
            && !kernel
            && !matches!(end, UnwindEnd::None | UnwindEnd::FramePointer);
        let mut frames: Vec<u64> = raw.frames().collect();
        let mut keep = frames.len();
        for (i, &addr) in frames.iter().enumerate() {
            if self.seen_frames.contains(&(pid, addr)) {
                continue;
            }
            let generation = self.maps.generation(pid);
            if i > 0 && !vouched && self.not_frames.get(&(pid, addr)) == Some(&generation) {
                keep = i;
                break;
            }
            // Frame 0 is code: missing from the maps, they are out of date
            // (a library mapped since), whatever the rate limit says. An
            // address judged before is judged again with newer maps, but
            // does not make the maps be read again.
            let reread = if i == 0 {
                Reread::Always
            } else if self.not_frames.contains_key(&(pid, addr)) {
                Reread::Never
            } else {
                Reread::RateLimited
            };
            let (frame, is_frame) = self.judge_frame(pid, addr, reread)?;
            if i > 0 && !is_frame && !vouched {
                self.not_frames
                    .insert((pid, addr), self.maps.generation(pid));
                keep = i;
                break;
            }
            self.seen_frames.insert((pid, addr));
            self.stats.frames += 1;
            self.pending.push(frame);
        }
        let cut = keep < frames.len();
        frames.truncate(keep);
        // A cut stack is interned apart from a walk that ended by itself
        // at the same frame, which need not be truncated.
        if cut {
            frames.push(CUT_MARK);
        }
        let interned = self.stacks.intern(pid, kernel, frames.iter().copied());
        if cut {
            frames.pop();
        }
        debug_assert_eq!(self.trace_ids.len() as u64, seen.id - 1);
        self.trace_ids.push(interned.id);
        if interned.new {
            if let Some(live) = &mut self.live {
                live.new_stack(interned.id, pid, &frames);
            }
            self.stats.stacks += 1;
            self.stats.cut_stacks += u64::from(cut);
            // How the walk ended says whether the stack is complete,
            // unless it followed frame pointers to their end (or this is
            // a kernel stack): then its outermost frame is judged.
            let known = if kernel { None } else { end.truncated() };
            self.pending_stacks.push((
                StackRecord {
                    stack_id: interned.id,
                    pid,
                    kernel,
                    truncated: cut || raw.flags & FLAG_STACK_FULL != 0 || known == Some(true),
                    frames,
                },
                cut || known.is_some(),
            ));
        }
        Ok(interned.id)
    }

    /// Normalizes an address (while the process is alive) and says
    /// whether it can be a return address: it must be in an executable
    /// mapping; in an object that lists all its functions (a `.symtab`,
    /// its own or its debug file's), inside one of them; and in an object
    /// file, right after a call instruction. The entry of a signal-return
    /// trampoline, where a signal handler returns to, passes too. In
    /// memory without a file (JIT code, the vDSO) only the mapping is
    /// checked. A missing mapping re-reads the maps as `reread` says.
    fn judge_frame(
        &mut self,
        pid: u32,
        addr: u64,
        reread: Reread,
    ) -> memleak_trace::Result<(PendingFrame, bool)> {
        if pid == 0 {
            let frame = PendingFrame {
                pid,
                addr,
                normalized: None,
                open_path: None,
                function: None,
            };
            return Ok((frame, true));
        }
        let mut normalized = self.maps.normalize(pid, addr);
        if normalized.is_none() && reread != Reread::Never {
            let stale = self
                .last_snapshot
                .get(&pid)
                .is_none_or(|t| t.elapsed() >= SNAPSHOT_MIN_INTERVAL);
            if stale || !self.maps.has(pid) || reread == Reread::Always {
                self.snapshot_maps(pid)?;
                normalized = self.maps.normalize(pid, addr);
            }
        }
        let open_path = normalized
            .as_ref()
            .filter(|n| n.file_offset.is_some())
            .and_then(|n| n.path.as_deref())
            .map(|p| resolve_in_process(pid, p));
        let (lookup, after_call) = match (&normalized, &open_path) {
            (Some(n), Some(path)) => self
                .functions
                .get(n.build_id.as_deref(), path, || {
                    crate::procmaps::same_object_here(n)
                })
                .zip(n.file_offset)
                .map_or((None, None), |(idx, off)| {
                    (Some(idx.lookup(off)), idx.follows_call(off))
                }),
            _ => (None, None),
        };
        let is_frame = normalized.as_ref().is_some_and(|n| n.executable)
            && match &lookup {
                Some(Lookup::NotCode) => false,
                Some(Lookup::Function(f)) if f.trampoline => true,
                _ => after_call != Some(false),
            };
        let function = match lookup {
            Some(Lookup::Function(f)) => Some(f),
            _ => None,
        };
        let frame = PendingFrame {
            pid,
            addr,
            normalized,
            open_path,
            function,
        };
        Ok((frame, is_frame))
    }

    /// Symbolizes queued frames and appends them to the `frames` table,
    /// then writes the stacks that were waiting for them.
    pub fn flush_frames(&mut self) -> memleak_trace::Result<()> {
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            for rec in self.symbolizer.symbolize(pending) {
                if let Some(live) = &mut self.live {
                    live.symbolized(&rec);
                }
                if rec.pid != 0 {
                    let key = (rec.pid, rec.addr);
                    self.frame_functions
                        .insert(key, (rec.function.clone(), rec.path.clone()));
                }
                self.writer.push_frame(&rec)?;
            }
        }
        for (mut stack, known) in std::mem::take(&mut self.pending_stacks) {
            if !stack.kernel && !stack.truncated && !known {
                let outer = stack
                    .frames
                    .last()
                    .and_then(|&a| self.frame_functions.get(&(stack.pid, a)));
                stack.truncated = !looks_complete(outer);
            }
            self.writer.push_stack(&stack)?;
        }
        self.writer.meta_mut().cut_stacks = Some(self.stats.cut_stacks);
        Ok(())
    }

    /// A checkpoint now: every row handled so far is in a listed segment,
    /// readable by `Trace::open` on [`trace_path`](Self::trace_path)
    /// (the scan replays the trace so far to learn the outstanding blocks).
    pub fn checkpoint(&mut self) -> memleak_trace::Result<()> {
        self.flush_frames()?;
        self.writer.rotate()
    }

    /// Hands every batch of events to `tap` too, as they are written
    /// ([`TraceWriter::tap_events`]).
    pub fn tap_events(&mut self, tap: memleak_trace::writer::EventsTap) {
        self.writer.tap_events(tap);
    }

    /// Hands the events handled so far to the tap ([`tap_events`](Self::tap_events)).
    pub fn flush_events(&mut self) -> memleak_trace::Result<()> {
        self.writer.flush_events()
    }

    /// Events written so far: the row number the next one will have.
    pub fn events_written(&self) -> u64 {
        self.writer.events_written()
    }

    /// Symbolizes with `symbolizer` (one [`FrameSymbolizer::prewarm`]ed
    /// while the recording was set up).
    pub fn set_symbolizer(&mut self, symbolizer: FrameSymbolizer) {
        self.symbolizer = symbolizer;
    }

    /// The trace directory being written.
    pub fn trace_path(&self) -> &std::path::Path {
        self.writer.path()
    }

    /// Writes a leak scan's rows and figures (`scan` table, `meta.json`).
    pub fn write_scan(
        &mut self,
        info: memleak_trace::ScanInfo,
        rows: &[memleak_trace::ScanRecord],
    ) -> memleak_trace::Result<()> {
        self.writer.write_scan(info, rows)
    }

    /// When `pid` last exec'd, if it did during the recording.
    pub fn last_exec_ts(&self, pid: u32) -> Option<u64> {
        self.exec_ts.get(&pid).copied()
    }

    /// Timer work: closes segments when they are due, with their frames.
    pub fn tick(&mut self) -> memleak_trace::Result<()> {
        self.flush_frames()?;
        self.writer.tick()
    }

    /// Stores the BPF loss counters (indexed like [`LOST_REASONS`]).
    pub fn set_lost(&mut self, counts: &[u64]) {
        let malformed = self.stats.malformed;
        let meta = self.writer.meta_mut();
        if malformed > 0 {
            // Records the decoder rejected: lost too, and said so.
            meta.counters.lost.insert("malformed".into(), malformed);
        }
        for (name, &n) in LOST_REASONS.iter().zip(counts) {
            if *name == "failed_alloc" {
                // Not a loss: the program's allocation failed.
                meta.failed_allocations = Some(n);
                continue;
            }
            if *name == "unsafe_return" && n == 0 {
                // Newer than the others: present only when it happened,
                // so traces of programs without a signal stack above
                // their stack read as before.
                continue;
            }
            meta.counters.lost.insert((*name).to_string(), n);
        }
    }

    /// Flushes everything and closes the trace.
    pub fn finish(mut self) -> memleak_trace::Result<Meta> {
        self.flush_frames()?;
        self.writer.finish()
    }
}

/// Functions a complete user stack ends in: process and thread entry
/// points.
const STACK_ROOTS: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "thread_start",
];

/// Whether a user stack reached its root. The frame-pointer walk ends on
/// whatever %rbp holds when it leaves code with frame pointers, which also
/// happens at the bottom of every normal stack (glibc's start code keeps no
/// frame pointer), so how it ended says nothing; where it ended does. A
/// stack whose outermost frame is an ordinary function of the program was
/// cut short (code without frame pointers). Frames in the C runtime (libc,
/// ld.so) get the benefit of the doubt: without libc's debug symbols its
/// start functions have no names to check.
fn looks_complete(outermost: Option<&(Option<String>, Option<String>)>) -> bool {
    let Some((function, path)) = outermost else {
        return false;
    };
    let in_runtime = path.as_deref().is_some_and(|p| {
        let file = p.rsplit('/').next().unwrap_or(p);
        file.starts_with("libc.so") || file.starts_with("libc-") || file.starts_with("ld-linux")
    });
    let is_root = |f: &str| {
        STACK_ROOTS
            .iter()
            .any(|r| f == *r || f.starts_with(&format!("{r}@")))
    };
    in_runtime || function.as_deref().is_some_and(is_root)
}

/// The page frame number of the struct page at `addr` in the kernel's
/// vmemmap; addresses outside it are kept as they are.
fn page_frame(addr: u64, base: u64, struct_size: u64) -> u64 {
    if addr >= base && (addr - base).is_multiple_of(struct_size) {
        (addr - base) / struct_size
    } else {
        addr
    }
}

#[cfg(test)]
mod tests {
    use super::looks_complete;

    fn frame(f: &str, path: &str) -> (Option<String>, Option<String>) {
        (Some(f.to_string()), Some(path.to_string()))
    }

    #[test]
    fn stacks_end_at_an_entry_point_or_in_the_c_runtime() {
        assert!(looks_complete(Some(&frame(
            "__libc_start_call_main",
            "/usr/lib/x86_64-linux-gnu/libc.so.6"
        ))));
        assert!(looks_complete(Some(&frame(
            "start_thread",
            "/usr/lib/x86_64-linux-gnu/libc.so.6"
        ))));
        assert!(looks_complete(Some(&frame("_start", "/usr/bin/prog"))));
        // Without libc's debug symbols its start code has no right name.
        assert!(looks_complete(Some(&frame(
            "__libc_init_first",
            "/lib/x86_64-linux-gnu/libc.so.6"
        ))));
        // A walk that ended inside the program (no frame pointers) was cut.
        assert!(!looks_complete(Some(&frame("leaf", "/tmp/nofp"))));
        assert!(!looks_complete(Some(&frame(
            "??",
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30"
        ))));
        assert!(!looks_complete(None));
    }

    /// A segment that fills up makes a checkpoint at once, between two
    /// timer ticks: the stacks its events use must be listed with it, not
    /// left waiting for their frames' symbolization.
    #[test]
    fn a_full_segment_lists_the_stacks_its_events_use() {
        use crate::event::RawEvent;
        use memleak_trace::{EventColumns, EventKind, Meta, Trace, TraceWriter, WriterOptions};

        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("t.parquet");
        let opts = WriterOptions {
            segment_rows: 8,
            segment_duration: std::time::Duration::from_secs(3600),
            merge_segments: 0,
            ..WriterOptions::default()
        };
        let writer = TraceWriter::create(&root, Meta::default(), opts).unwrap();
        let mut rec = super::Recorder::new(writer, false);
        let pid = std::process::id();
        // Frames in this test binary, a distinct stack per event.
        let code = a_full_segment_lists_the_stacks_its_events_use as *const () as usize as u64;
        for i in 0..8u64 {
            let raw =
                RawEvent::header(1000 + i, pid, EventKind::Malloc as u8, 0x10000 + 64 * i, 32);
            rec.handle(&raw.encode(&[code + i, code + 100])).unwrap();
        }
        // No tick: the eighth event filled the segment and checkpointed.
        let trace = Trace::open(&root).unwrap();
        assert_eq!(trace.event_count(), 8, "the full segment is listed");
        let stacks: std::collections::HashSet<u64> =
            trace.stacks().unwrap().iter().map(|s| s.stack_id).collect();
        let mut used = Vec::new();
        for unit in trace.event_units() {
            let batch = trace.read_unit(&unit, EventColumns::ALL).unwrap();
            used.extend((0..batch.len()).filter_map(|i| batch.event(i).stack_id));
        }
        assert_eq!(used.len(), 8);
        for id in used {
            assert!(
                stacks.contains(&id),
                "stack {id} of a listed event is not listed"
            );
        }
    }

    /// The address after the first call instruction of the function at
    /// `f` of this process: a return address.
    fn return_address_in(f: u64) -> u64 {
        use iced_x86::{Decoder, DecoderOptions, FlowControl};
        // SAFETY: the code of a function of this process, mapped and
        // readable; decoding stops at its first call.
        let code = unsafe { std::slice::from_raw_parts(f as *const u8, 4096) };
        Decoder::with_ip(64, code, f, DecoderOptions::NONE)
            .into_iter()
            .find(|i| i.flow_control() == FlowControl::Call)
            .expect("a call in the first 4 KiB")
            .next_ip()
    }

    /// What the frame-pointer walk reads in code without frame pointers
    /// is data: a stack ends before it, is marked truncated and counted,
    /// and walks that differ only beyond the cut share one stack. A walk
    /// that ended by itself at the same frame is another stack.
    #[test]
    fn data_read_as_a_return_address_ends_the_stack() {
        use crate::event::RawEvent;
        use memleak_trace::{EventColumns, EventKind, Meta, Trace, TraceWriter, WriterOptions};

        static TABLE: &str = "a table in .rodata, as the walk may read a pointer to";
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("t.parquet");
        let writer = TraceWriter::create(&root, Meta::default(), WriterOptions::default()).unwrap();
        let mut rec = super::Recorder::new(writer, false);
        let pid = std::process::id();
        let code = data_read_as_a_return_address_ends_the_stack as *const () as u64;
        let ret = return_address_in(code);
        let data = TABLE.as_ptr() as u64;
        let stacks: [&[u64]; 7] = [
            &[code + 4, data + 8],
            &[code + 4, data + 16, ret],
            &[code + 4, 0x336e_6f68_7479_702f], // "/python3"
            &[code + 4, ret - 1],               // code, but after no call
            &[code + 4],
            &[code + 4, ret],
            &[code + 4, ret, data],
        ];
        for (i, frames) in stacks.iter().enumerate() {
            let i = i as u64;
            let raw = RawEvent::header(1000 + i, pid, EventKind::Malloc as u8, 0x10000 + 64 * i, 8);
            rec.handle(&raw.encode(frames)).unwrap();
        }
        let meta = rec.finish().unwrap();
        assert_eq!(meta.cut_stacks, Some(2));
        let trace = Trace::open(&root).unwrap();
        assert_eq!(trace.meta().cut_stacks, Some(2));
        let mut ids = Vec::new();
        for unit in trace.event_units() {
            let batch = trace.read_unit(&unit, EventColumns::ALL).unwrap();
            ids.extend((0..batch.len()).map(|i| batch.event(i).stack_id.unwrap()));
        }
        assert_eq!(ids[0], ids[1]);
        assert_eq!(ids[0], ids[2]);
        assert_eq!(ids[0], ids[3]);
        let distinct: std::collections::HashSet<u64> = ids.iter().copied().collect();
        assert_eq!(distinct.len(), 4, "{ids:?}");
        let table = trace.stacks().unwrap();
        let stack = |id: u64| table.iter().find(|s| s.stack_id == id).unwrap();
        assert_eq!(stack(ids[0]).frames, [code + 4]);
        assert!(stack(ids[0]).truncated);
        assert_eq!(stack(ids[4]).frames, [code + 4]);
        assert_eq!(stack(ids[5]).frames, [code + 4, ret]);
        assert_eq!(stack(ids[6]).frames, [code + 4, ret]);
        assert!(stack(ids[6]).truncated);
        // Only kept frames are symbolized, each named by this function.
        let frames = trace.frames().unwrap();
        assert_eq!(frames.len(), 2, "{frames:?}");
        for f in frames {
            let name = f.function.as_deref().unwrap_or("");
            assert!(name.contains("data_read_as_a_return_address"), "{f:?}");
            assert_eq!(f.func_offset, Some(f.addr - code));
        }
    }

    /// Frame 0 is code: an address missing from the maps means they are
    /// out of date (an object mapped since), and they are read again at
    /// once, not only 20 ms after the last read.
    #[test]
    fn frame_0_outside_the_maps_rereads_them() {
        use crate::event::RawEvent;
        use memleak_trace::{EventKind, Meta, Trace, TraceWriter, WriterOptions};
        use std::os::fd::AsRawFd;

        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("t.parquet");
        let writer = TraceWriter::create(&root, Meta::default(), WriterOptions::default()).unwrap();
        let mut rec = super::Recorder::new(writer, false);
        let pid = std::process::id();
        rec.snapshot_maps(pid).unwrap();
        // An object mapped after the snapshot, as dlopen would, at an
        // address the snapshot does not hold: the other tests' threads map
        // and unmap too, so the kernel may hand out an address the
        // snapshot saw in use; such mappings are kept until the end.
        let exe = std::fs::File::open("/proc/self/exe").unwrap();
        let mut maps = Vec::new();
        let base = loop {
            // SAFETY: a fresh private read-only mapping of a file we opened.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_EXEC,
                    libc::MAP_PRIVATE,
                    exe.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(base, libc::MAP_FAILED);
            maps.push(base);
            if rec.maps.normalize(pid, base as u64 + 0x100).is_none() || maps.len() == 16 {
                break base;
            }
        };
        let frame0 = base as u64 + 0x100;
        let raw = RawEvent::header(1000, pid, EventKind::Malloc as u8, 0x10000, 8);
        rec.handle(&raw.encode(&[frame0])).unwrap();
        rec.finish().unwrap();
        for m in maps {
            // SAFETY: the mappings made above, no longer used.
            unsafe { libc::munmap(m, 4096) };
        }
        let frames = Trace::open(&root).unwrap().frames().unwrap();
        assert_eq!(frames.len(), 1);
        assert!(
            frames[0].path.is_some() && frames[0].file_offset == Some(0x100),
            "{:?}",
            frames[0]
        );
    }

    #[test]
    fn page_frames_from_struct_page_pointers() {
        let base = 0xffff_ea00_0000_0000;
        assert_eq!(super::page_frame(base, base, 64), 0);
        assert_eq!(super::page_frame(base + 64 * 0x1234, base, 64), 0x1234);
        // Not a struct page of this vmemmap: kept as it is.
        assert_eq!(super::page_frame(base - 64, base, 64), base - 64);
        assert_eq!(super::page_frame(base + 65, base, 64), base + 65);
    }
}
