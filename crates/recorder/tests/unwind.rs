//! Unwind tables on the machine's real objects (checked row by row against
//! binutils' own CFI interpreter), on corrupt input, and the reference
//! unwinder on real stopped processes built from `tests/unwind_fixtures/`.

#[path = "../../../tests/common/skip.rs"]
mod skip;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blazesym::symbolize::source::{Process, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use memleak_recorder::elf::ElfFile;
use memleak_recorder::procmaps::read_maps;
use memleak_recorder::unwind::build::{self as unwind_build, from_eh_frame, Table};
use memleak_recorder::unwind::row::{lookup, CFA_OFF_MAX, CFA_OFF_MIN};
use memleak_recorder::unwind::{
    build, unwind, End, Kind, Memory, Mode, Regs, Row, UnwindCache, Unwound,
};

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const LD_SO: &str = "/lib64/ld-linux-x86-64.so.2";
const SYSTEM_OBJECTS: &[&str] = &[
    LIBC,
    "/lib/x86_64-linux-gnu/libstdc++.so.6",
    "/usr/bin/python3.11",
    LD_SO,
];

fn installed(path: &str) -> bool {
    let there = Path::new(path).exists();
    if !there {
        skip::skip(format_args!("{path} is not installed"));
    }
    there
}

/// Sorted, unique pcs, merged rules, and a final `Invalid` row.
#[track_caller]
fn assert_well_formed(rows: &[Row], what: &str) {
    assert!(
        rows.windows(2).all(|w| w[0].pc < w[1].pc),
        "{what}: sorted, unique"
    );
    assert!(
        rows.windows(2).all(|w| w[0].info != w[1].info),
        "{what}: merged"
    );
    if let Some(last) = rows.last() {
        assert_eq!(last.kind(), Kind::Invalid, "{what}: ends invalid");
    }
}

// ---------------------------------------------------------------------
// Tables of system objects.

#[test]
fn builds_tables_of_system_objects() {
    for &path in SYSTEM_OBJECTS {
        if !installed(path) {
            continue;
        }
        // Median of 5: the machine is shared, single timings are noisy.
        let mut opens = Vec::new();
        let mut builds = Vec::new();
        let mut table = None;
        for _ in 0..5 {
            let t0 = Instant::now();
            let elf = ElfFile::open(Path::new(path)).unwrap();
            opens.push(t0.elapsed());
            let t1 = Instant::now();
            table = Some(build(&elf).unwrap());
            builds.push(t1.elapsed());
        }
        opens.sort();
        builds.sort();
        let (opened, built) = (opens[2], builds[2]);
        let table = table.unwrap();
        assert_well_formed(&table.rows, path);
        assert!(table.rows.len() > 1000, "{path}: {} rows", table.rows.len());
        assert!(
            !table.stats.truncated && table.stats.skipped_fdes == 0,
            "{path}"
        );
        let mut kinds = BTreeMap::new();
        for r in &table.rows {
            *kinds.entry(format!("{:?}", r.kind())).or_insert(0usize) += 1;
        }
        eprintln!(
            "{path}: {} rows, {} bytes; open {opened:?}, build {built:?}; {} FDEs, \
             {} DWARF rows, unsupported {:?} ({} code bytes); rows by kind {kinds:?}",
            table.rows.len(),
            table.rows.len() * 8,
            table.stats.fdes,
            table.stats.dwarf_rows,
            table.stats.unsupported,
            table.stats.unsupported_bytes,
        );
    }
    // glibc's own special frames are recognised.
    if installed(LIBC) {
        let t = build(&ElfFile::open(Path::new(LIBC)).unwrap()).unwrap();
        let count = |k| t.rows.iter().filter(|r| r.kind() == k).count();
        assert_eq!(count(Kind::Signal), 1, "__restore_rt");
        assert_eq!(count(Kind::End), 2, "clone and clone3");
    }
}

#[test]
fn cache_builds_each_object_once() {
    let mut cache = UnwindCache::default();
    for &path in SYSTEM_OBJECTS {
        if !installed(path) {
            continue;
        }
        let t0 = Instant::now();
        let first = cache.get(Path::new(path)).unwrap();
        let cold = t0.elapsed();
        let t1 = Instant::now();
        let second = cache.get(Path::new(path)).unwrap();
        let warm = t1.elapsed();
        assert!(std::sync::Arc::ptr_eq(&first.rows, &second.rows));
        eprintln!("{path}: cache miss {cold:?}, hit {warm:?}");
    }
    let s = cache.stats();
    assert_eq!(s.builds, s.file_hits, "{s:?}");
    // Another path to the same file (a symlink here, /proc/PID/root/… in
    // the recorder) is found through the file identity or the build id.
    if installed(LIBC) {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("libc.so.6");
        std::os::unix::fs::symlink(LIBC, &link).unwrap();
        let builds = cache.stats().builds;
        cache.get(&link).unwrap();
        assert_eq!(cache.stats().builds, builds);
    }
}

// ---------------------------------------------------------------------
// Row by row against `readelf --debug-dump=frames-interp`.

/// One row of readelf's interpreted CFI table: the cells we read.
#[derive(Clone, Debug)]
struct Cells {
    cfa: String,
    ra: String,
    rbp: Option<String>,
}

/// Readelf's rows of one entry: `(loc, cells)`, `None` cells when the
/// line could not be split into columns.
type ReadelfRows = Vec<(u64, Option<Cells>)>;

/// An FDE as readelf interprets it: `[lo, hi)` and its rows.
type ReadelfFde = (u64, u64, ReadelfRows);

/// The entry whose rows are being read.
enum Entry {
    /// A CIE, by offset.
    Cie(String),
    /// An FDE: `[lo, hi)` and its CIE's offset.
    Fde(u64, u64, String),
}

fn readelf_fdes(path: &str) -> Option<Vec<ReadelfFde>> {
    let out = Command::new("readelf")
        .args(["--debug-dump=frames-interp", path])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    let mut cies: HashMap<String, ReadelfRows> = HashMap::new();
    let mut fdes = Vec::new();
    let mut cur: Option<Entry> = None;
    let mut header: Vec<String> = Vec::new();
    let mut rows: ReadelfRows = Vec::new();
    let mut finish = |cur: Option<Entry>, rows: ReadelfRows| match cur {
        Some(Entry::Cie(off)) => {
            cies.insert(off, rows);
        }
        Some(Entry::Fde(lo, hi, cie)) => {
            // No table printed: the CIE's initial rules apply.
            let rows = if rows.is_empty() {
                let init = cies.get(&cie).and_then(|r| r.first()).cloned();
                init.map(|(_, c)| vec![(lo, c)]).unwrap_or_default()
            } else {
                rows
            };
            fdes.push((lo, hi, rows));
        }
        None => {}
    };
    for line in text.lines() {
        // A register cell is printed `r9 (r9)`: one cell, two words.
        let mut t: Vec<&str> = Vec::new();
        for word in line.split_whitespace() {
            if word.starts_with('(') && !t.is_empty() {
                continue;
            }
            t.push(word);
        }
        if t.len() >= 4 && (t[3] == "CIE" || t[3] == "FDE") {
            finish(cur.take(), std::mem::take(&mut rows));
            header.clear();
            if t[3] == "CIE" {
                cur = Some(Entry::Cie(t[0].to_string()));
            } else {
                let cie = t[4].strip_prefix("cie=")?.to_string();
                let (lo, hi) = t[5].strip_prefix("pc=")?.split_once("..")?;
                cur = Some(Entry::Fde(hex(lo)?, hex(hi)?, cie));
            }
        } else if t.first() == Some(&"LOC") {
            header = t.iter().map(|s| s.to_string()).collect();
        } else if !header.is_empty() && t.first().is_some_and(|s| s.len() == 16) {
            let Some(loc) = hex(t[0]) else { continue };
            let cells = (t.len() == header.len()).then(|| {
                let col = |name: &str| {
                    let i = header.iter().position(|h| h == name)?;
                    Some(t[i].to_string())
                };
                Cells {
                    cfa: col("CFA").unwrap_or_default(),
                    ra: col("ra").unwrap_or_default(),
                    rbp: col("rbp"),
                }
            });
            rows.push((loc, cells));
        }
    }
    finish(cur.take(), rows);
    Some(fdes)
}

/// What a row must hold for readelf's cells: `Some((kind, cfa, rbp))`, or
/// `None` for a CFA expression (PLT, signal frame, or unsupported: checked
/// loosely).
fn expected(c: &Cells) -> Option<(Kind, i64, i64)> {
    const INVALID: Option<(Kind, i64, i64)> = Some((Kind::Invalid, 0, 0));
    if c.ra == "u" {
        return Some((Kind::End, 0, 0));
    }
    if c.cfa == "exp" {
        return None;
    }
    let (kind, off) = match c.cfa.split_once('+') {
        Some(("rsp", off)) => (Kind::CfaRsp, off.parse::<i64>().ok()?),
        Some(("rbp", off)) => (Kind::CfaRbp, off.parse::<i64>().ok()?),
        _ => return INVALID,
    };
    if c.ra != "c-8" || !(i64::from(CFA_OFF_MIN)..=i64::from(CFA_OFF_MAX)).contains(&off) {
        return INVALID;
    }
    let slot = match c.rbp.as_deref() {
        None | Some("u") | Some("s") => 0,
        Some(cell) => match cell.strip_prefix('c').and_then(|o| o.parse::<i64>().ok()) {
            Some(o) if o != 0 && o % 8 == 0 && (-128..=127).contains(&(o / 8)) => o / 8,
            _ => return INVALID,
        },
    };
    Some((kind, off, slot))
}

#[test]
fn rows_match_readelf_interpretation() {
    if Command::new("readelf").arg("--version").output().is_err() {
        skip::skip("readelf is not installed");
        return;
    }
    for &path in SYSTEM_OBJECTS {
        if !installed(path) {
            continue;
        }
        let table = build(&ElfFile::open(Path::new(path)).unwrap()).unwrap();
        let fdes = readelf_fdes(path).expect("readelf output parses");
        let starts: HashSet<u64> = fdes.iter().map(|f| f.0).collect();
        let (mut checked, mut loose, mut unparsed) = (0usize, 0usize, 0usize);
        let mut mismatches = Vec::new();
        for (lo, hi, rows) in &fdes {
            if *lo == 0 || hi <= lo {
                continue;
            }
            for (i, (loc, cells)) in rows.iter().enumerate() {
                let end = rows.get(i + 1).map_or(*hi, |r| r.0);
                if end <= *loc {
                    continue; // superseded by a row at the same address
                }
                let Some(cells) = cells else {
                    unparsed += 1;
                    continue;
                };
                for pc in [*loc, end - 1] {
                    let got = lookup(&table.rows, pc as u32).unwrap_or_default();
                    let ok = match expected(cells) {
                        Some((Kind::Invalid, ..)) => got.kind() == Kind::Invalid,
                        Some(want) => (got.kind(), got.cfa_off(), got.rbp_slot()) == want,
                        None => {
                            loose += 1;
                            matches!(got.kind(), Kind::Plt | Kind::Signal | Kind::Invalid)
                        }
                    };
                    checked += 1;
                    if !ok {
                        mismatches.push(format!("{pc:#x}: readelf {cells:?}, row {got:?}"));
                    }
                }
            }
            // The byte after an FDE, unless another FDE starts there, has
            // no rule: it must not inherit this function's.
            if !starts.contains(hi) {
                let got = lookup(&table.rows, *hi as u32).unwrap_or_default();
                checked += 1;
                if got.kind() != Kind::Invalid {
                    mismatches.push(format!("{hi:#x}: gap after FDE, row {got:?}"));
                }
            }
        }
        eprintln!(
            "{path}: {} FDEs, {checked} addresses checked ({loose} CFA expressions), \
             {unparsed} readelf rows not parsed, {} mismatches",
            fdes.len(),
            mismatches.len()
        );
        assert!(checked > 1000, "{path}: {checked}");
        assert_eq!(unparsed, 0, "{path}");
        assert!(
            mismatches.is_empty(),
            "{path}:\n{}",
            mismatches[..mismatches.len().min(20)].join("\n")
        );
    }
}

// ---------------------------------------------------------------------
// Corrupt input.

/// xorshift64*: a seeded, dependency-free generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn mutate(rng: &mut Rng, original: &[u8]) -> Vec<u8> {
    let mut b = original.to_vec();
    for _ in 0..1 + rng.below(4) {
        let i = rng.below(b.len());
        match rng.below(6) {
            0 => b[i] ^= 1 << rng.below(8),
            1 => b[i] = rng.next() as u8,
            2 => b[i] = 0xff,
            // A 4-byte field (lengths, CIE pointers, addresses) made wild.
            3 => {
                let v = (rng.next() as u32).to_le_bytes();
                let n = v.len().min(b.len() - i);
                b[i..i + n].copy_from_slice(&v[..n]);
            }
            4 => b.truncate(i),
            // An instruction byte region replaced by a run of one opcode
            // (e.g. remember_state over and over).
            _ => {
                let op = rng.next() as u8;
                let end = (i + 1 + rng.below(64)).min(b.len());
                b[i..end].fill(op);
            }
        }
        if b.is_empty() {
            break;
        }
    }
    b
}

#[test]
fn mutated_eh_frame_never_panics() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // ld.so is small enough for many rounds; libc for a few.
    for (path, rounds) in [(LD_SO, 400), (LIBC, 40)] {
        if !installed(path) {
            continue;
        }
        let elf = ElfFile::open(Path::new(path)).unwrap();
        let eh = elf.section(".eh_frame").expect(".eh_frame");
        let clean: Table = from_eh_frame(eh.bytes, eh.vaddr, None, None).unwrap();
        let (mut ok, mut err, mut fewer) = (0, 0, 0);
        for _ in 0..rounds {
            let bytes = mutate(&mut rng, eh.bytes);
            match from_eh_frame(&bytes, eh.vaddr, None, None) {
                Ok(t) => {
                    assert_well_formed(&t.rows, path);
                    ok += 1;
                    if t.stats.fdes < clean.stats.fdes {
                        fewer += 1;
                    }
                }
                Err(_) => err += 1,
            }
            // The other section parser (CIE ids, absolute addresses) on
            // the same garbage.
            if let Ok(t) = unwind_build::from_debug_frame(&bytes) {
                assert_well_formed(&t.rows, path);
            }
        }
        eprintln!(
            "{path}: {rounds} mutations: {ok} tables ({fewer} with fewer FDEs), {err} errors"
        );
    }
}

// ---------------------------------------------------------------------
// Real processes.

/// Compiles a fixture, or says why not (no compiler).
fn compile(dir: &Path, src: &str, compiler: &str, flags: &[&str], name: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/unwind_fixtures")
        .join(src);
    let out = dir.join(name);
    let status = match Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
    {
        Ok(s) => s,
        Err(_) => {
            skip::skip(format_args!("{compiler} is not installed"));
            return None;
        }
    };
    assert!(status.success(), "{compiler} {flags:?} {}", src.display());
    Some(out)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    skip::skip("stopping and reading another process needs root");
    false
}

/// A fixture process, killed and reaped on drop.
struct Fixture {
    child: std::process::Child,
    /// The thread that reached `leak_c`.
    tid: i32,
    /// Its stdout, kept open so that a late write cannot die of SIGPIPE.
    _stdout: Option<std::process::ChildStdout>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        // A thread we still trace must be waited for by us before its
        // process can be reaped.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let mut st = 0;
            // SAFETY: plain waitpid on a thread of our child.
            let r = unsafe { libc::waitpid(self.tid, &mut st, libc::__WALL | libc::WNOHANG) };
            if r != 0 {
                break; // reaped, or not ours to wait for (ECHILD)
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.wait();
    }
}

/// `true` once `/proc/PID/stat` says zombie (or the process is gone).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state == "Z"),
        Err(_) => true,
    }
}

/// Starts a fixture and waits for the thread id it prints from `leak_c`.
fn start(bin: &Path, args: &[&str]) -> Fixture {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let mut out = child.stdout.take().unwrap();
    let pid = child.id();
    let mut fixture = Fixture {
        child,
        tid: 0,
        _stdout: None,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut line = Vec::new();
    while !line.ends_with(b"\n") {
        assert!(
            Instant::now() < deadline,
            "{}: no thread id in time",
            bin.display()
        );
        let mut pfd = libc::pollfd {
            fd: out.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 50) };
        if n > 0 {
            let mut buf = [0u8; 64];
            let got = out.read(&mut buf).unwrap();
            assert!(got > 0, "{}: exited before reaching leak_c", bin.display());
            line.extend_from_slice(&buf[..got]);
        } else {
            assert!(
                !exited(pid),
                "{}: exited before reaching leak_c",
                bin.display()
            );
        }
    }
    fixture.tid = String::from_utf8_lossy(&line).trim().parse().unwrap();
    fixture._stdout = Some(out);
    fixture
}

/// `/proc/PID/mem`.
struct ProcMem(std::fs::File);
impl Memory for ProcMem {
    fn read_u64(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.0.read_exact_at(&mut b, addr).ok()?;
        Some(u64::from_le_bytes(b))
    }
}

/// What the test saw of a stopped thread: its unwinds and their names.
struct Seen {
    auto: Unwound,
    auto_names: Vec<String>,
    frame_pointer_names: Vec<String>,
    /// Object path of each `auto` frame.
    objects: Vec<String>,
}

/// Interrupts the fixture's `leak_c` thread wherever it is, reads its
/// registers, unwinds it both ways and symbolizes the frames.
fn capture(f: &Fixture) -> Seen {
    let pid = f.child.id();
    let tid = f.tid;
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: ptrace requests on a thread of our own child; `regs` is a
    // properly sized out-parameter for GETREGS.
    let regs = unsafe {
        assert_eq!(
            libc::ptrace(libc::PTRACE_SEIZE, tid, null, null),
            0,
            "seize"
        );
        assert_eq!(
            libc::ptrace(libc::PTRACE_INTERRUPT, tid, null, null),
            0,
            "interrupt"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut st = 0;
            let r = libc::waitpid(tid, &mut st, libc::__WALL | libc::WNOHANG);
            if r == tid {
                assert!(libc::WIFSTOPPED(st), "thread {tid} did not stop: {st:#x}");
                break;
            }
            assert!(
                r == 0 && Instant::now() < deadline,
                "waiting for {tid} to stop"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut regs: libc::user_regs_struct = std::mem::zeroed();
        let rc = libc::ptrace(
            libc::PTRACE_GETREGS,
            tid,
            null,
            &mut regs as *mut _ as *mut libc::c_void,
        );
        assert_eq!(rc, 0, "getregs");
        regs
    };
    let regs = Regs {
        rip: regs.rip,
        rsp: regs.rsp,
        rbp: regs.rbp,
    };
    let maps = read_maps(pid).unwrap();
    let mut cache = UnwindCache::default();
    let objects = cache.object_maps(pid, &maps);
    let mem = ProcMem(std::fs::File::open(format!("/proc/{pid}/mem")).unwrap());
    let auto = unwind(regs, &objects, &mem, Mode::Auto, 64);
    let fp = unwind(regs, &objects, &mem, Mode::FramePointer, 64);
    let auto_names = symbolize(pid, &auto);
    let frame_pointer_names = symbolize(pid, &fp);
    // SAFETY: the thread is in a ptrace stop; detaching resumes it.
    unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, null, null) };
    let objects = auto
        .frames
        .iter()
        .map(|fr| {
            maps.iter()
                .find(|m| m.start <= fr.pc && fr.pc < m.end)
                .and_then(|m| m.path.clone())
                .unwrap_or_default()
        })
        .collect();
    Seen {
        auto,
        auto_names,
        frame_pointer_names,
        objects,
    }
}

fn symbolize(pid: u32, u: &Unwound) -> Vec<String> {
    let symbolizer = Symbolizer::new();
    let src = Source::Process(Process::new(pid.into()));
    let name = |addrs: &[u64]| -> Vec<Option<String>> {
        symbolizer
            .symbolize(&src, Input::AbsAddr(addrs))
            .unwrap()
            .into_iter()
            .map(|s| match s {
                Symbolized::Sym(sym) => Some(sym.name.to_string()),
                Symbolized::Unknown(_) => None,
            })
            .collect()
    };
    let at: Vec<u64> = u
        .frames
        .iter()
        .map(|f| if f.exact { f.pc } else { f.pc - 1 })
        .collect();
    let exact: Vec<u64> = u.frames.iter().map(|f| f.pc).collect();
    // A signal trampoline is entered by the handler's return, so its pc is
    // a return address, but glibc starts `__restore_rt`'s FDE one byte
    // early (a nop) for unwinders while its symbol starts at the pc: the
    // symbol of `pc - 1` is the function before it. Name such frames by
    // `pc` when `pc - 1` has no name.
    name(&at)
        .into_iter()
        .zip(name(&exact))
        .map(|(a, b)| a.or(b).unwrap_or_else(|| "?".to_string()))
        .collect()
}

/// Whether frame `i` is `want`: a name, a name prefix (`foo*`), or a
/// frame in an object (`@libstdc++`: libstdc++'s static functions have
/// no name without its debug symbols).
fn matches(seen: &Seen, i: usize, want: &str) -> bool {
    let name = &seen.auto_names[i];
    if let Some(object) = want.strip_prefix('@') {
        return seen.objects[i].contains(object);
    }
    match want.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == want,
    }
}

/// The frames from `leak_c` on are exactly `want`, and the walk ended at
/// the outermost frame.
#[track_caller]
fn assert_exact_chain(seen: &Seen, want: &[&str]) {
    let names = &seen.auto_names;
    let at = names.iter().position(|n| n == "leak_c");
    let at = at.unwrap_or_else(|| panic!("no leak_c in {names:?}"));
    assert!(
        names.len() - at == want.len()
            && want
                .iter()
                .enumerate()
                .all(|(k, w)| matches(seen, at + k, w)),
        "got {names:?} ({:?}), want …{want:?}",
        seen.auto.end
    );
    assert_eq!(seen.auto.end, End::Complete, "{names:?}");
    // Above leak_c: libc only (pause and the syscall wrapper).
    for (n, obj) in names[..at].iter().zip(&seen.objects) {
        assert!(obj.contains("libc.so"), "{n} in {obj}: {names:?}");
    }
}

/// `want` appears in order among the frames from `leak_c` on, the last
/// frame is `want`'s last, every frame is named and the walk is complete.
#[track_caller]
fn assert_chain_through(seen: &Seen, want: &[&str]) {
    let names = &seen.auto_names;
    let at = names.iter().position(|n| n == "leak_c");
    let at = at.unwrap_or_else(|| panic!("no leak_c in {names:?}"));
    let mut it = at..names.len();
    for w in want {
        assert!(
            it.any(|i| matches(seen, i, w)),
            "{w} not in order in {names:?}"
        );
    }
    let last = names.len() - 1;
    assert!(matches(seen, last, want.last().unwrap()), "{names:?}");
    for (i, n) in names.iter().enumerate() {
        assert!(
            n != "?" || seen.objects[i].contains("libstdc++"),
            "{names:?}"
        );
    }
    assert_eq!(seen.auto.end, End::Complete, "{names:?}");
}

const C_CHAIN: &[&str] = &[
    "leak_c",
    "leak_b",
    "leak_a",
    "main",
    "__libc_start_call_main",
    "__libc_start_main*",
    "_start",
];

fn c_chain(flags: &[&str], omit_fp: bool) {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = compile(dir.path(), "chain.c", "gcc", flags, "chain") else {
        return;
    };
    let f = start(&bin, &[]);
    let seen = capture(&f);
    eprintln!(
        "{flags:?}: auto {:?} ({:?}); frame pointers {:?}",
        seen.auto_names, seen.auto.end, seen.frame_pointer_names
    );
    assert_exact_chain(&seen, C_CHAIN);
    if omit_fp {
        // The reason for all this: frame pointers lose the chain.
        let fp = &seen.frame_pointer_names;
        assert!(
            !fp.windows(3).any(|w| w == ["leak_b", "leak_a", "main"]),
            "{fp:?}"
        );
    }
}

#[test]
fn unwinds_c_without_frame_pointers() {
    c_chain(&["-O2", "-g", "-fomit-frame-pointer"], true);
}

#[test]
fn unwinds_c_at_o2() {
    c_chain(&["-O2"], true);
}

#[test]
fn unwinds_c_with_frame_pointers() {
    // -O0 keeps rbp-based CFA rules (`CfaRbp` rows).
    c_chain(&["-O0", "-fno-omit-frame-pointer"], false);
}

#[test]
fn unwinds_c_described_only_in_debug_frame() {
    // Without asynchronous unwind tables, gcc -g describes the program's
    // functions in .debug_frame; only crt's _start is in .eh_frame.
    let flags = [
        "-O2",
        "-g",
        "-fno-asynchronous-unwind-tables",
        "-fomit-frame-pointer",
    ];
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = compile(dir.path(), "chain.c", "gcc", &flags, "chain") else {
        return;
    };
    let table = build(&ElfFile::open(&bin).unwrap()).unwrap();
    assert_eq!(table.stats.source, unwind_build::Source::Both);
    c_chain(&flags, true);
}

#[test]
fn unwinds_through_a_signal_handler() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let flags = ["-O2", "-g", "-fomit-frame-pointer", "-DVIA_SIGNAL"];
    let Some(bin) = compile(dir.path(), "chain.c", "gcc", &flags, "chain_signal") else {
        return;
    };
    let f = start(&bin, &[]);
    let seen = capture(&f);
    eprintln!("signal: {:?} ({:?})", seen.auto_names, seen.auto.end);
    let mut want = vec!["leak_c", "on_alarm", "__restore_rt"];
    want.extend_from_slice(&C_CHAIN[1..]);
    assert_exact_chain(&seen, &want);
    // leak_b was interrupted, not calling: its pc is exact.
    let at = seen.auto_names.iter().position(|n| n == "leak_b").unwrap();
    assert!(seen.auto.frames[at].exact);
}

fn cxx(mode: &str, want: &[&str]) {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = compile(
        dir.path(),
        "chain.cc",
        "g++",
        &["-O2", "-g", "-pthread"],
        "chain_cc",
    ) else {
        return;
    };
    let f = start(&bin, &[mode]);
    let seen = capture(&f);
    eprintln!("c++ {mode}: {:?} ({:?})", seen.auto_names, seen.auto.end);
    assert_chain_through(&seen, want);
}

#[test]
fn unwinds_cxx_through_libstdcxx_operator_new() {
    cxx(
        "main",
        &[
            "leak_c",
            "on_no_memory",
            "operator new*",
            "leak_b",
            "leak_a",
            "main",
            "__libc_start_call_main",
            "__libc_start_main*",
            "_start",
        ],
    );
}

#[test]
fn unwinds_cxx_thread_to_clone3() {
    cxx(
        "thread",
        &[
            "leak_c",
            "on_no_memory",
            "operator new*",
            "leak_b",
            "leak_a",
            "@libstdc++",
            "start_thread",
            "clone3",
        ],
    );
}
