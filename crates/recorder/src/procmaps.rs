//! `/proc/PID/maps`: snapshots, and the normalization of an address to
//! (object path, file offset, build id) while the process is alive.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memleak_trace::MapRecord;

/// One mapping of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Permissions, e.g. `r-xp`.
    pub perms: String,
    /// File offset of `start`.
    pub offset: u64,
    /// Inode (0 for anonymous).
    pub inode: u64,
    /// Path or pseudo-name; `None` for anonymous memory.
    pub path: Option<String>,
}

impl Mapping {
    /// True for a mapping of a real file (not `[heap]`, `[vdso]`, anon).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.as_deref().is_some_and(|p| p.starts_with('/'))
    }
}

/// Parses the text of a maps file.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?;
    let offset = it.next()?;
    let _dev = it.next()?;
    let inode = it.next()?;
    let path = it.next().map(|p| p.trim_start()).filter(|p| !p.is_empty());
    let (s, e) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        perms: perms.to_string(),
        offset: u64::from_str_radix(offset, 16).ok()?,
        inode: inode.parse().ok()?,
        path: path.map(str::to_string),
    })
}

/// Whether process `pid` is gone: no such process, or a zombie (nothing
/// reaps orphans on some machines, so an exited one may linger).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                == Some("Z")
        }
        Err(_) => true,
    }
}

/// Reads `/proc/PID/maps`.
///
/// A file the kernel calls deleted but that the process still reaches
/// under the same name, as the same inode, is named without the
/// ` (deleted)` suffix: the private library copies of a recorded command
/// (`src/record/private_libs.rs`) are bind mounts of unnamed files, which the
/// kernel shows with the suffix although the path opens them. A deleted
/// file replaced by another one (an upgraded library) keeps its suffix.
pub fn read_maps(pid: u32) -> std::io::Result<Vec<Mapping>> {
    let mut maps = parse_maps(&std::fs::read_to_string(format!("/proc/{pid}/maps"))?);
    let mut reachable: HashMap<String, bool> = HashMap::new();
    for m in &mut maps {
        let Some(name) = m.path.as_deref().and_then(|p| p.strip_suffix(" (deleted)")) else {
            continue;
        };
        let same = *reachable.entry(name.to_string()).or_insert_with(|| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(format!("/proc/{pid}/root{name}")).is_ok_and(|md| md.ino() == m.inode)
        });
        if same {
            m.path = Some(name.to_string());
        }
    }
    Ok(maps)
}

/// Where an address lives, as the analyzer needs it offline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// Object path (or pseudo-name such as `[vdso]`).
    pub path: Option<String>,
    /// Offset in the object file; `None` for anonymous memory.
    pub file_offset: Option<u64>,
    /// Build id of the object, lowercase hex.
    pub build_id: Option<String>,
    /// The mapping may be executed (`x` in its permissions): only there
    /// can a return address point.
    pub executable: bool,
}

/// Snapshots of a process kept for addresses the latest one lacks.
const SNAPSHOTS_KEPT: usize = 4;

/// The latest maps of each traced process (and a few before them), plus
/// build ids by path.
#[derive(Default)]
pub struct MapsCache {
    /// Snapshots of each process, oldest first, sorted by start.
    by_pid: HashMap<u32, Vec<Vec<Mapping>>>,
    build_ids: HashMap<String, Option<String>>,
    /// Snapshots taken of each process so far.
    generations: HashMap<u32, u64>,
}

impl MapsCache {
    /// Re-reads a process's maps; returns the records to store in the
    /// `maps` table (empty if the process is gone).
    pub fn snapshot(&mut self, pid: u32, ts_ns: u64) -> Vec<MapRecord> {
        let Ok(mut maps) = read_maps(pid) else {
            return Vec::new();
        };
        maps.sort_by_key(|m| m.start);
        let records = maps
            .iter()
            .map(|m| MapRecord {
                ts_ns,
                pid,
                start: m.start,
                end: m.end,
                perms: m.perms.clone(),
                offset: m.offset,
                inode: m.inode,
                path: m.path.clone(),
                build_id: if m.is_file() {
                    self.build_id(m.path.as_deref().unwrap_or_default(), pid)
                } else {
                    None
                },
            })
            .collect();
        self.insert(pid, maps);
        records
    }

    /// Adds a snapshot (sorted by start) of `pid`.
    fn insert(&mut self, pid: u32, maps: Vec<Mapping>) {
        let kept = self.by_pid.entry(pid).or_default();
        if kept.len() == SNAPSHOTS_KEPT {
            kept.remove(0);
        }
        kept.push(maps);
        *self.generations.entry(pid).or_default() += 1;
    }

    /// How many snapshots of `pid` were taken: what was judged with an
    /// older one may be judged again.
    pub fn generation(&self, pid: u32) -> u64 {
        self.generations.get(&pid).copied().unwrap_or(0)
    }

    /// Whether a snapshot of `pid` exists.
    pub fn has(&self, pid: u32) -> bool {
        self.by_pid.contains_key(&pid)
    }

    /// Drops what is known about a process (after exec).
    pub fn forget(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
    }

    /// Normalizes an address with the latest snapshot that maps it;
    /// `None` when none does.
    ///
    /// The latest snapshot first; an address it lacks may have been
    /// mapped when its event happened and gone by the time the maps were
    /// read: the events of a process are handled a poll interval after
    /// the fact, and a process that execs in between shows the new
    /// image's maps to a re-read made for its old image's events, until
    /// its exec event is handled (which forgets the old snapshots).
    pub fn normalize(&mut self, pid: u32, addr: u64) -> Option<Normalized> {
        let m = self.by_pid.get(&pid)?.iter().rev().find_map(|maps| {
            let i = maps.partition_point(|m| m.start <= addr).checked_sub(1)?;
            let m = &maps[i];
            (addr < m.end).then(|| m.clone())
        })?;
        let executable = m.perms.as_bytes().get(2) == Some(&b'x');
        if m.is_file() {
            let path = m.path.clone().expect("file mapping has a path");
            Some(Normalized {
                build_id: self.build_id(&path, pid),
                file_offset: Some(addr - m.start + m.offset),
                path: Some(path),
                executable,
            })
        } else {
            Some(Normalized {
                path: m.path,
                file_offset: None,
                build_id: None,
                executable,
            })
        }
    }

    fn build_id(&mut self, path: &str, pid: u32) -> Option<String> {
        if let Some(b) = self.build_ids.get(path) {
            return b.clone();
        }
        let b = read_build_id(&resolve_in_process(pid, path));
        self.build_ids.insert(path.to_string(), b.clone());
        b
    }
}

/// The path through which our process can open a file of `pid`'s mount
/// namespace, falling back to the plain path. The plain path when the
/// process sees the files we see (same mount namespace, same root): a
/// path through `/proc/PID/root` dies with the process, and a frame of a
/// short-lived process (a forked child) symbolized a moment after it
/// exited lost its source lines.
///
/// A file deleted (or replaced) since the process mapped it, which its
/// maps name with ` (deleted)`, is opened through `/proc/PID/map_files`:
/// the process's own copy, still readable there.
pub fn resolve_in_process(pid: u32, path: &str) -> PathBuf {
    if path.ends_with(" (deleted)") {
        if let Some(file) = mapped_file(pid, path) {
            return file;
        }
    }
    if sees_our_files(pid) {
        return PathBuf::from(path);
    }
    let via_root = PathBuf::from(format!("/proc/{pid}/root{path}"));
    if via_root.exists() {
        via_root
    } else {
        PathBuf::from(path)
    }
}

/// Where a process's loader is mapped: `AT_BASE` of its auxiliary vector
/// (`None` for a static program, or one run as `ld.so ./prog`). It changes
/// only at an exec.
pub fn loader_base(pid: u32) -> Option<u64> {
    const AT_BASE: u64 = 7;
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    auxv.chunks_exact(16)
        .map(|e| {
            let word = |i: usize| u64::from_ne_bytes(e[i..i + 8].try_into().expect("8 bytes"));
            (word(0), word(8))
        })
        .find(|&(key, _)| key == AT_BASE)
        .map(|(_, v)| v)
        .filter(|&v| v != 0)
}

/// The mapping of a process's loader: the one at [`loader_base`],
/// whatever the file is called.
pub fn loader(pid: u32, maps: &[Mapping]) -> Option<&Mapping> {
    let base = loader_base(pid)?;
    maps.iter().find(|m| m.start == base)
}

/// A field of a `/proc/PID/status` file, trimmed (`Seccomp:` → `2`).
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
}

/// `/proc/PID/map_files/START-END` of the first mapping of `path` (as the
/// maps name it), if it opens.
fn mapped_file(pid: u32, path: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let m = parse_maps(&maps)
        .into_iter()
        .find(|m| m.path.as_deref() == Some(path))?;
    let file = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    std::fs::File::open(&file).is_ok().then_some(file)
}

/// The object of a mapping at a path that outlives the process: its plain
/// path in our mount namespace, if the file there has the mapping's build
/// id (the same object, copy or not).
pub fn same_object_here(n: &Normalized) -> Option<PathBuf> {
    let id = n.build_id.as_deref()?;
    let plain = PathBuf::from(n.path.as_deref()?);
    (read_build_id(&plain).as_deref() == Some(id)).then_some(plain)
}

/// Whether `pid` has our mount namespace and our root directory.
fn sees_our_files(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    type Id = Option<(u64, u64)>;
    fn id(p: &str) -> Id {
        std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
    }
    // Ours do not change: read once.
    static OURS: std::sync::OnceLock<(Id, Id)> = std::sync::OnceLock::new();
    let ours = *OURS.get_or_init(|| (id("/proc/self/ns/mnt"), id("/")));
    let theirs = (
        id(&format!("/proc/{pid}/ns/mnt")),
        id(&format!("/proc/{pid}/root")),
    );
    theirs.0.is_some() && theirs.1.is_some() && theirs == ours
}

/// Reads the GNU build id of an ELF file, as lowercase hex.
pub fn read_build_id(path: &Path) -> Option<String> {
    let id = blazesym::helper::read_elf_build_id(&path).ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines_with_and_without_paths() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 1234   /usr/bin/prog with space
55d0c0a01000-55d0c0a02000 r-xp 00001000 fe:01 1234   /usr/bin/prog with space
7ffd1000-7ffd2000 rw-p 00000000 00:00 0 
7ffd3000-7ffd4000 r-xp 00000000 00:00 0                          [vdso]
";
        let m = parse_maps(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].start, 0x55d0c0a01000);
        assert_eq!(m[1].offset, 0x1000);
        assert_eq!(m[1].path.as_deref(), Some("/usr/bin/prog with space"));
        assert!(m[1].is_file());
        assert_eq!(m[2].path, None);
        assert_eq!(m[3].path.as_deref(), Some("[vdso]"));
        assert!(!m[3].is_file());
    }

    /// An address the latest snapshot lacks is found in the one before
    /// (the process exec'd before its old image's events were handled);
    /// a newer mapping at the address wins; exec forgets them all.
    #[test]
    fn an_address_missing_from_the_latest_snapshot_is_found_in_an_older_one() {
        let line = |start: u64, path: &str| Mapping {
            start,
            end: start + 0x1000,
            perms: "r-xp".into(),
            offset: 0x2000,
            inode: 0,
            path: Some(path.into()),
        };
        let mut cache = MapsCache::default();
        cache.insert(7, vec![line(0x10000, "[old]")]);
        cache.insert(7, vec![line(0x20000, "[new]")]);
        let at = |c: &mut MapsCache, a| c.normalize(7, a).and_then(|n| n.path);
        assert_eq!(at(&mut cache, 0x10010).as_deref(), Some("[old]"));
        assert_eq!(at(&mut cache, 0x20010).as_deref(), Some("[new]"));
        cache.insert(7, vec![line(0x10000, "[newer]")]);
        assert_eq!(at(&mut cache, 0x10010).as_deref(), Some("[newer]"));
        assert_eq!(at(&mut cache, 0x30000), None);
        for i in 0..SNAPSHOTS_KEPT as u64 {
            cache.insert(7, vec![line(0x40000 + i * 0x1000, "[later]")]);
        }
        assert_eq!(
            at(&mut cache, 0x20010),
            None,
            "only a few snapshots are kept"
        );
        cache.forget(7);
        assert_eq!(at(&mut cache, 0x40010), None);
        assert!(!cache.has(7));
    }

    #[test]
    fn normalizes_addresses_of_this_process() {
        let mut cache = MapsCache::default();
        let pid = std::process::id();
        assert!(!cache.snapshot(pid, 1).is_empty());
        let f = parses_maps_lines_with_and_without_paths as *const () as u64;
        let n = cache.normalize(pid, f).expect("own code is mapped");
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(n.path.as_deref(), exe.to_str());
        assert!(n.file_offset.is_some());
        assert!(n.executable);
        static DATA: [u8; 4] = [1, 2, 3, 4];
        let d = cache.normalize(pid, DATA.as_ptr() as u64).unwrap();
        assert!(!d.executable, "{d:?}");
        assert!(cache.normalize(pid, 8).is_none());
    }
}
