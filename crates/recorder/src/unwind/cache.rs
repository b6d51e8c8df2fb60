//! Unwind tables by object, so the libc of every traced process is read
//! once.
//!
//! Two levels: a file identity (device, inode, size, mtime) found with one
//! `stat` leads to a [`Key`] without opening the file; the key (the GNU
//! build id, or path + size + mtime without one) leads to the table. So a
//! second process using the same file costs a `stat`, and the same build
//! in another mount namespace (another path, another inode) costs reading
//! its build id. Failures are cached too: an object without unwind
//! information is not re-read for each process.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::build::{build, BuildStats};
use super::reference::ObjectMap;
use super::row::Row;
use crate::elf::ElfFile;
use crate::procmaps::{resolve_in_process, Mapping};

/// What identifies an object's table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// The GNU build id.
    BuildId(Vec<u8>),
    /// No build id: the file as it was when read.
    File {
        /// Path as opened.
        path: PathBuf,
        /// Size in bytes.
        size: u64,
        /// Modification time, ns since the epoch.
        mtime_ns: i128,
    },
}

/// An object's table and what is needed to place it in a process.
#[derive(Debug)]
pub struct UnwindObject {
    /// The key the table is cached under.
    pub key: Key,
    /// The rows.
    pub rows: Arc<[Row]>,
    /// How the rows were built.
    pub stats: BuildStats,
    /// `(p_vaddr, p_offset, p_filesz)` of the `PT_LOAD` segments.
    segments: Vec<(u64, u64, u64)>,
}

impl UnwindObject {
    /// The vaddr loaded from file offset `offset` (the page-aligned offset
    /// of a `/proc/PID/maps` line). A mapping may start just before its
    /// segment's `p_offset` (rounded down to a page); `p_vaddr` and
    /// `p_offset` are congruent modulo the page size, so the difference
    /// still gives the exact address. The load bias of the mapping is
    /// `start - vaddr_of_offset(offset)`.
    ///
    /// Two segments can share a file page (lld puts the text segment in
    /// the page where the read-only one ends, at a vaddr one page further
    /// on): the mapping belongs to the later one, whose rounded-down
    /// offset the kernel mapped it from.
    pub fn vaddr_of_offset(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .filter(|&&(_, off, filesz)| {
                offset >= off & !0xfff && offset < off.saturating_add(filesz)
            })
            .max_by_key(|&&(_, off, _)| off)
            .map(|&(vaddr, off, _)| vaddr.wrapping_add(offset).wrapping_sub(off))
    }
}

/// Why an object has no table (kept as text: it is cached and shared).
pub type Failure = Arc<str>;

/// (device, inode, size, mtime ns) of a file.
type FileId = (u64, u64, u64, i128);

/// Counters, to check that the cache does its job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Tables built (or failures recorded).
    pub builds: usize,
    /// Lookups answered from the file identity alone.
    pub file_hits: usize,
    /// Lookups answered by key after reading the build id.
    pub key_hits: usize,
}

/// The cache.
#[derive(Default)]
pub struct UnwindCache {
    by_file: HashMap<FileId, Key>,
    tables: HashMap<Key, Result<Arc<UnwindObject>, Failure>>,
    stats: CacheStats,
}

fn mtime_ns(m: &std::fs::Metadata) -> i128 {
    i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec())
}

impl UnwindCache {
    /// The table of the object at `path`, built on first use.
    pub fn get(&mut self, path: &Path) -> Result<Arc<UnwindObject>, Failure> {
        let meta = std::fs::metadata(path)
            .map_err(|e| format!("{}: {}", path.display(), memleak_trace::describe_io(&e)))?;
        let id: FileId = (meta.dev(), meta.ino(), meta.size(), mtime_ns(&meta));
        if let Some(hit) = self.by_file.get(&id).and_then(|k| self.tables.get(k)) {
            self.stats.file_hits += 1;
            return hit.clone();
        }
        let elf = match ElfFile::open(path) {
            Ok(elf) => elf,
            Err(e) => {
                // Not cached by key: without the file there is no key.
                return Err(e.to_string().into());
            }
        };
        let key = match elf.build_id() {
            Some(b) if !b.is_empty() => Key::BuildId(b.to_vec()),
            _ => Key::File {
                path: path.to_path_buf(),
                size: id.2,
                mtime_ns: id.3,
            },
        };
        self.by_file.insert(id, key.clone());
        if let Some(hit) = self.tables.get(&key) {
            self.stats.key_hits += 1;
            return hit.clone();
        }
        self.stats.builds += 1;
        let entry = match build(&elf) {
            Ok(table) => Ok(Arc::new(UnwindObject {
                key: key.clone(),
                rows: table.rows.into(),
                stats: table.stats,
                segments: elf.load_segments().collect(),
            })),
            Err(e) => Err(Failure::from(format!("{}: {e}", path.display()))),
        };
        self.tables.insert(key, entry.clone());
        entry
    }

    /// Counters since creation.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// The executable mappings of a process (from
    /// [`crate::procmaps::read_maps`]), each with its table when its
    /// object has one. Mappings without a table (anonymous code such as
    /// JIT output, `[vdso]`, objects without unwind information) get
    /// `rows: None`, which the unwinder walks by frame pointer.
    pub fn object_maps(&mut self, pid: u32, maps: &[Mapping]) -> Vec<ObjectMap> {
        let mut out: Vec<ObjectMap> = maps
            .iter()
            .filter(|m| m.perms.contains('x'))
            .map(|m| {
                let placed = m
                    .is_file()
                    .then(|| {
                        let path = resolve_in_process(pid, m.path.as_deref()?);
                        let obj = self.get(&path).ok()?;
                        let bias = m.start.wrapping_sub(obj.vaddr_of_offset(m.offset)?);
                        Some((bias, obj.rows.clone()))
                    })
                    .flatten();
                ObjectMap {
                    start: m.start,
                    end: m.end,
                    bias: placed.as_ref().map_or(0, |p| p.0),
                    rows: placed.map(|p| p.1),
                }
            })
            .collect();
        out.sort_by_key(|m| m.start);
        out
    }
}
