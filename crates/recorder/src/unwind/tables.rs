//! The tables the probe unwinds with, kept in step with the traced
//! processes.
//!
//! Two BPF maps (`bpf/memleak.h`): one array of [`Row`]s shared by every
//! object, where each object's rows are loaded once, at a range allocated
//! here (a bump allocator: rows are never moved or freed, so an object
//! dlopened again reuses its range), and a hash map from process id to
//! that process's executable mappings, sorted by start, each with its load
//! bias and range of rows ([`ProcTable`]). [`UnwindTables`] decides what to
//! write; an [`UnwindSink`] (libbpf, in the memleak binary) writes it.
//!
//! A process's table is rebuilt from `/proc/PID/maps` whenever it may have
//! changed (start, exec, ld.so's notifications, a stack that ended at an
//! unknown address) and written only when it differs.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use super::cache::{Key, UnwindCache, UnwindObject};
use super::row::{Row, MAX_ROWS};
use crate::event::UnwindEnd;
use crate::procmaps::{read_maps, resolve_in_process, Mapping};

/// How the probe walks user stacks (`--unwind`; `enum memleak_unwind_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkMode {
    /// Frame pointers only.
    FramePointer,
    /// Rows where the object has them, frame pointers in objects without.
    Auto,
    /// Rows only.
    Dwarf,
}

impl WalkMode {
    /// The probe's code for the mode.
    pub fn code(self) -> u32 {
        match self {
            WalkMode::FramePointer => 0,
            WalkMode::Auto => 1,
            WalkMode::Dwarf => 2,
        }
    }

    /// Its name on the command line and in meta.json.
    pub fn name(self) -> &'static str {
        match self {
            WalkMode::FramePointer => "fp",
            WalkMode::Auto => "auto",
            WalkMode::Dwarf => "dwarf",
        }
    }

    /// Whether the probe needs tables.
    pub fn uses_rows(self) -> bool {
        self != WalkMode::FramePointer
    }
}

/// Most mappings a process's table holds (`UNWIND_MAX_MAPS`).
pub const MAX_MAPS: usize = 256;
/// [`ProcTable::flags`]: mappings past [`MAX_MAPS`] were left out.
pub const MAPS_FULL: u32 = 1;

/// One executable mapping, as the probe reads it (`struct unwind_map`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapEntry {
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Load bias: runtime address − object vaddr.
    pub bias: u64,
    /// Index of the object's first row in the row array; when `nrows` is
    /// 0, the [`UnwindEnd`] code of why there are none.
    pub first_row: u32,
    /// Rows of the object; 0 when it has none.
    pub nrows: u32,
}

/// A process's executable mappings, sorted by start (`struct unwind_proc`).
#[repr(C)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcTable {
    /// Mappings used.
    pub nmaps: u32,
    /// [`MAPS_FULL`].
    pub flags: u32,
    /// Unique per table written: the probe caches rules by it.
    pub gen: u32,
    /// Zero.
    pub reserved: u32,
    /// The mappings; the first `nmaps` are used.
    pub maps: [MapEntry; MAX_MAPS],
}

const _: () = assert!(std::mem::size_of::<MapEntry>() == 32);
const _: () = assert!(std::mem::size_of::<ProcTable>() == 16 + 32 * MAX_MAPS);

impl Default for ProcTable {
    fn default() -> Self {
        ProcTable {
            nmaps: 0,
            flags: 0,
            gen: 0,
            reserved: 0,
            maps: [MapEntry::default(); MAX_MAPS],
        }
    }
}

impl ProcTable {
    /// The used mappings.
    pub fn entries(&self) -> &[MapEntry] {
        &self.maps[..(self.nmaps as usize).min(MAX_MAPS)]
    }

    /// The bytes of the table, as the BPF map stores it.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: a repr(C) struct of integers with no padding (checked by
        // the size assertions above), so every byte is initialized.
        unsafe {
            std::slice::from_raw_parts(
                (self as *const ProcTable).cast::<u8>(),
                std::mem::size_of::<ProcTable>(),
            )
        }
    }
}

/// Where the tables go: the probe's maps.
pub trait UnwindSink {
    /// Rows the row array holds.
    fn row_capacity(&self) -> u32;
    /// Writes `rows` at index `first` of the row array.
    fn write_rows(&mut self, first: u32, rows: &[Row]) -> io::Result<()>;
    /// Sets the table of process `pid`.
    fn set_process(&mut self, pid: u32, table: &ProcTable) -> io::Result<()>;
    /// Deletes the table of process `pid` (absent is fine).
    fn remove_process(&mut self, pid: u32) -> io::Result<()>;
}

/// An object's rows in the row array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placed {
    /// Loaded at `[first, first + n)`.
    Rows { first: u32, n: u32 },
    /// They did not fit.
    Full,
}

/// What the tables hold, for meta.json.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TablesStats {
    /// Objects whose rows were loaded.
    pub objects: u64,
    /// Rows loaded.
    pub rows: u64,
    /// Objects whose rows did not fit.
    pub objects_not_loaded: u64,
    /// Executable file mappings without unwind information (counted
    /// once per table written).
    pub mappings_without_rows: u64,
    /// Tables written (a process's table, each time it changed).
    pub tables_written: u64,
    /// Time spent building rows and tables, in nanoseconds.
    pub build_ns: u64,
}

/// The tables of every traced process.
#[derive(Default)]
pub struct UnwindTables {
    cache: UnwindCache,
    /// Where each object's rows are, and the object (its rows are
    /// written again to a new sink).
    placed: HashMap<Key, (Placed, Arc<UnwindObject>)>,
    next_row: u32,
    procs: HashMap<u32, Box<ProcTable>>,
    /// The last table generation given out.
    gen: u32,
    stats: TablesStats,
}

/// One executable mapping of a process, before placement.
struct Found {
    start: u64,
    end: u64,
    object: Result<(u64, Arc<UnwindObject>), UnwindEnd>,
}

impl UnwindTables {
    /// Counters since creation.
    pub fn stats(&self) -> TablesStats {
        self.stats
    }

    /// Builds (or finds in the cache) the rows of objects about to be
    /// mapped, so that tracking the process later finds them ready.
    /// Failures are ignored here: tracking meets them again.
    pub fn prefetch(&mut self, paths: &[std::path::PathBuf]) {
        let t0 = std::time::Instant::now();
        for p in paths {
            let _ = self.cache.get(p);
        }
        self.stats.build_ns += t0.elapsed().as_nanos() as u64;
    }

    /// Reads `pid`'s maps and writes its table if it changed. Returns
    /// whether it was written; an error when the maps cannot be read (the
    /// process is gone) or the sink fails.
    pub fn track(&mut self, pid: u32, sink: &mut dyn UnwindSink) -> io::Result<bool> {
        let maps = read_maps(pid)?;
        self.track_maps(pid, &maps, sink)
    }

    /// [`track`](Self::track) with maps already read.
    pub fn track_maps(
        &mut self,
        pid: u32,
        maps: &[Mapping],
        sink: &mut dyn UnwindSink,
    ) -> io::Result<bool> {
        let t0 = std::time::Instant::now();
        let mut table = self.table_of(pid, maps, sink)?;
        self.stats.build_ns += t0.elapsed().as_nanos() as u64;
        if let Some(old) = self.procs.get(&pid) {
            table.gen = old.gen;
            if **old == *table {
                return Ok(false);
            }
        }
        table.gen = self.next_gen();
        sink.set_process(pid, &table)?;
        self.stats.tables_written += 1;
        self.stats.mappings_without_rows += table
            .entries()
            .iter()
            .filter(|m| m.nrows == 0 && m.first_row == UnwindEnd::NoUnwindInfo as u32)
            .count() as u64;
        self.procs.insert(pid, table);
        Ok(true)
    }

    /// Gives `child` a copy of `parent`'s table (a fork: the address space
    /// is a copy). Returns false when the parent has none.
    pub fn copy(&mut self, parent: u32, child: u32, sink: &mut dyn UnwindSink) -> io::Result<bool> {
        let Some(mut table) = self.procs.get(&parent).cloned() else {
            return Ok(false);
        };
        table.gen = self.next_gen();
        sink.set_process(child, &table)?;
        self.stats.tables_written += 1;
        self.procs.insert(child, table);
        Ok(true)
    }

    /// Drops `pid`'s table (it exited).
    pub fn forget(&mut self, pid: u32, sink: &mut dyn UnwindSink) -> io::Result<()> {
        if self.procs.remove(&pid).is_some() {
            sink.remove_process(pid)?;
        }
        Ok(())
    }

    /// Writes everything written so far to another sink: every placed
    /// object's rows, then every process's table. For a sink that starts
    /// late (the probe's maps, once a process runs without the agent).
    pub fn rewrite(&self, sink: &mut dyn UnwindSink) -> io::Result<()> {
        for (placed, obj) in self.placed.values() {
            if let Placed::Rows { first, n } = *placed {
                sink.write_rows(first, &obj.rows[..n as usize])?;
            }
        }
        for (&pid, table) in &self.procs {
            sink.set_process(pid, table)?;
        }
        Ok(())
    }

    /// The table `pid` has now, if any.
    pub fn table(&self, pid: u32) -> Option<&ProcTable> {
        self.procs.get(&pid).map(|t| &**t)
    }

    /// A generation no table has had (0 is never given out: a zeroed
    /// rule-cache entry must not match).
    fn next_gen(&mut self) -> u32 {
        self.gen = self.gen.wrapping_add(1).max(1);
        self.gen
    }

    fn table_of(
        &mut self,
        pid: u32,
        maps: &[Mapping],
        sink: &mut dyn UnwindSink,
    ) -> io::Result<Box<ProcTable>> {
        let mut found: Vec<Found> = maps
            .iter()
            .filter(|m| m.perms.contains('x') && m.end > m.start)
            .map(|m| Found {
                start: m.start,
                end: m.end,
                object: self.object_of(pid, m),
            })
            .collect();
        let mut table = Box::<ProcTable>::default();
        if found.len() > MAX_MAPS {
            // Objects with rows first, then other files, then anonymous
            // code; lowest addresses first within each.
            let rank = |f: &Found| match &f.object {
                Ok(_) => 0,
                Err(UnwindEnd::Anonymous) => 2,
                Err(_) => 1,
            };
            found.sort_by_key(|f| (rank(f), f.start));
            found.truncate(MAX_MAPS);
            table.flags |= MAPS_FULL;
        }
        found.sort_by_key(|f| f.start);
        for (slot, f) in table.maps.iter_mut().zip(&found) {
            *slot = MapEntry {
                start: f.start,
                end: f.end,
                ..MapEntry::default()
            };
            match &f.object {
                Ok((bias, obj)) => {
                    slot.bias = *bias;
                    match self.place(obj, sink)? {
                        Placed::Rows { first, n } => {
                            slot.first_row = first;
                            slot.nrows = n;
                        }
                        Placed::Full => slot.first_row = UnwindEnd::RowsFull as u32,
                    }
                }
                Err(why) => slot.first_row = *why as u32,
            }
        }
        table.nmaps = found.len() as u32;
        Ok(table)
    }

    /// The object of an executable mapping and its load bias, or why the
    /// probe cannot unwind through it with rows.
    fn object_of(&mut self, pid: u32, m: &Mapping) -> Result<(u64, Arc<UnwindObject>), UnwindEnd> {
        if !m.is_file() {
            return Err(UnwindEnd::Anonymous);
        }
        let path = resolve_in_process(pid, m.path.as_deref().unwrap_or_default());
        let obj = self.cache.get(&path).map_err(|_| UnwindEnd::NoUnwindInfo)?;
        let vaddr = obj
            .vaddr_of_offset(m.offset)
            .ok_or(UnwindEnd::NoUnwindInfo)?;
        if obj.rows.is_empty() {
            return Err(UnwindEnd::NoUnwindInfo);
        }
        Ok((m.start.wrapping_sub(vaddr), obj))
    }

    /// The object's rows in the row array, loading them the first time.
    fn place(&mut self, obj: &Arc<UnwindObject>, sink: &mut dyn UnwindSink) -> io::Result<Placed> {
        if let Some((p, _)) = self.placed.get(&obj.key) {
            return Ok(*p);
        }
        let n = obj.rows.len().min(MAX_ROWS);
        let capacity = sink.row_capacity() as usize;
        let placed = if self.next_row as usize + n > capacity {
            self.stats.objects_not_loaded += 1;
            Placed::Full
        } else {
            let first = self.next_row;
            sink.write_rows(first, &obj.rows[..n])?;
            self.next_row += n as u32;
            self.stats.objects += 1;
            self.stats.rows += n as u64;
            Placed::Rows { first, n: n as u32 }
        };
        self.placed.insert(obj.key.clone(), (placed, obj.clone()));
        Ok(placed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that keeps everything in memory.
    #[derive(Default)]
    struct Memory {
        rows: Vec<Row>,
        procs: HashMap<u32, ProcTable>,
        capacity: u32,
    }

    impl UnwindSink for Memory {
        fn row_capacity(&self) -> u32 {
            self.capacity
        }
        fn write_rows(&mut self, first: u32, rows: &[Row]) -> io::Result<()> {
            let end = first as usize + rows.len();
            if self.rows.len() < end {
                self.rows.resize(end, Row::default());
            }
            self.rows[first as usize..end].copy_from_slice(rows);
            Ok(())
        }
        fn set_process(&mut self, pid: u32, table: &ProcTable) -> io::Result<()> {
            self.procs.insert(pid, table.clone());
            Ok(())
        }
        fn remove_process(&mut self, pid: u32) -> io::Result<()> {
            self.procs.remove(&pid);
            Ok(())
        }
    }

    fn exe_mapping(start: u64, path: &str) -> Mapping {
        Mapping {
            start,
            end: start + 0x1000,
            perms: "r-xp".into(),
            offset: 0,
            inode: 1,
            path: Some(path.into()),
        }
    }

    #[test]
    fn this_process_gets_rows_for_each_object_once() {
        let mut tables = UnwindTables::default();
        let mut sink = Memory {
            capacity: 1 << 22,
            ..Default::default()
        };
        let pid = std::process::id();
        assert!(tables.track(pid, &mut sink).unwrap());
        // Nothing changed: not written again.
        assert!(!tables.track(pid, &mut sink).unwrap());
        let t = &sink.procs[&pid];
        assert!(t.nmaps > 0 && t.flags == 0);
        let entries = t.entries();
        assert!(entries.windows(2).all(|w| w[0].end <= w[1].start), "sorted");
        // Our own code is in a mapping with rows, and its row is found.
        let f = this_process_gets_rows_for_each_object_once as *const () as u64;
        let m = entries
            .iter()
            .find(|m| m.start <= f && f < m.end)
            .expect("own code mapped");
        assert!(m.nrows > 0, "{m:?}");
        let rows = &sink.rows[m.first_row as usize..][..m.nrows as usize];
        let row = super::super::row::lookup(rows, (f - m.bias) as u32).unwrap();
        assert_ne!(row.kind(), super::super::row::Kind::Invalid);
        // Anonymous code ([vdso]) is marked so.
        if let Some(v) = entries.iter().find(|m| m.nrows == 0) {
            assert!(
                v.first_row == UnwindEnd::Anonymous as u32
                    || v.first_row == UnwindEnd::NoUnwindInfo as u32
            );
        }
        let loaded = tables.stats().rows;
        assert_eq!(loaded as usize, sink.rows.len());
        // A fork's copy shares the rows, under a generation of its own;
        // exit drops the table.
        assert!(tables.copy(pid, 1_000_000, &mut sink).unwrap());
        let (a, b) = (&sink.procs[&1_000_000], &sink.procs[&pid]);
        assert_eq!(a.entries(), b.entries());
        assert_ne!(a.gen, b.gen);
        assert_eq!(tables.stats().rows, loaded);
        tables.forget(1_000_000, &mut sink).unwrap();
        assert!(!sink.procs.contains_key(&1_000_000));
        // A sink that starts late gets the same rows and tables.
        let mut late = Memory {
            capacity: 1 << 22,
            ..Default::default()
        };
        tables.rewrite(&mut late).unwrap();
        assert_eq!(late.rows, sink.rows);
        assert_eq!(late.procs, sink.procs);
    }

    #[test]
    fn objects_that_do_not_fit_are_marked() {
        let mut tables = UnwindTables::default();
        let mut sink = Memory {
            capacity: 10,
            ..Default::default()
        };
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let maps = [
            exe_mapping(0x10000, exe.to_str().unwrap()),
            Mapping {
                path: None,
                inode: 0,
                ..exe_mapping(0x20000, "")
            },
            exe_mapping(0x30000, "/nonexistent/lib.so"),
        ];
        tables.track_maps(7, &maps, &mut sink).unwrap();
        let t = tables.table(7).unwrap();
        let why: Vec<u32> = t.entries().iter().map(|m| m.first_row).collect();
        assert_eq!(
            why,
            [
                UnwindEnd::RowsFull as u32,
                UnwindEnd::Anonymous as u32,
                UnwindEnd::NoUnwindInfo as u32
            ]
        );
        assert!(t.entries().iter().all(|m| m.nrows == 0));
        assert_eq!(tables.stats().objects_not_loaded, 1);
    }

    #[test]
    fn a_full_table_keeps_objects_with_rows_first() {
        let mut tables = UnwindTables::default();
        let mut sink = Memory {
            capacity: 1 << 22,
            ..Default::default()
        };
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let mut maps: Vec<Mapping> = (0..MAX_MAPS as u64 + 10)
            .map(|i| Mapping {
                path: None,
                inode: 0,
                ..exe_mapping(0x1000_0000 + i * 0x10000, "")
            })
            .collect();
        maps.push(exe_mapping(0x9000_0000, exe.to_str().unwrap()));
        tables.track_maps(8, &maps, &mut sink).unwrap();
        let t = tables.table(8).unwrap();
        assert_eq!(t.nmaps as usize, MAX_MAPS);
        assert_eq!(t.flags, MAPS_FULL);
        assert!(t.entries().windows(2).all(|w| w[0].start < w[1].start));
        assert_eq!(t.entries().last().unwrap().start, 0x9000_0000);
        assert!(t.entries().last().unwrap().nrows > 0);
    }
}
