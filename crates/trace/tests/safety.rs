//! What the writer does for the programs and files around it: the lock
//! that keeps a second writer off a trace being written, the early first
//! checkpoint, and a full disk that leaves no temporary file behind.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use memleak_trace::lock::{holder, LOCK_FILE};
use memleak_trace::writer::remove_trace;
use memleak_trace::{Error, Trace, TraceWriter, WriterOptions};

fn force() -> WriterOptions {
    WriterOptions {
        force: true,
        ..WriterOptions::default()
    }
}

/// The error of a create that must fail.
fn create_err(root: &Path, meta: memleak_trace::Meta, opts: WriterOptions) -> Error {
    match TraceWriter::create(root, meta, opts) {
        Ok(_) => panic!("{}: create must fail", root.display()),
        Err(e) => e,
    }
}

/// Asserts `err` is the one-line refusal of a locked trace naming `pid`.
fn assert_locked(err: Error, root: &Path, pid: u32) {
    let msg = err.to_string();
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
    assert_eq!(
        msg,
        format!(
            "{}: another memleak (pid {pid}) is recording to it; not touching it",
            root.display()
        )
    );
}

/// A trace that a writer is writing: a second writer, with or without
/// `force`, and `remove_trace` are refused naming the holder, and the
/// first writer goes on to a complete trace.
#[test]
fn a_trace_being_written_is_refused_to_other_writers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    let mut w = TraceWriter::create(&root, meta(), WriterOptions::default()).unwrap();
    let events = synthetic_events(100);
    for e in &events[..50] {
        w.push_event(e).unwrap();
    }
    w.rotate().unwrap();
    let me = std::process::id();
    assert_eq!(holder(&root), Some(Some(me)));
    let lock = root.join(LOCK_FILE);
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), format!("{me}\n"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&lock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // OFD locks of two opens conflict within one process too.
    let err = create_err(&root, meta(), force());
    assert_locked(err, &root, me);
    let err = create_err(&root, meta(), WriterOptions::default());
    assert_locked(err, &root, me);
    assert_locked(remove_trace(&root).expect_err("must be refused"), &root, me);

    // Readers neither wait nor mind the lock file.
    let live = Trace::open(&root).unwrap();
    assert_eq!(read_events(&live), events[..50]);
    assert!(
        live.warnings().iter().all(|w| !w.contains(LOCK_FILE)),
        "{:?}",
        live.warnings()
    );

    for e in &events[50..] {
        w.push_event(e).unwrap();
    }
    w.finish().unwrap();
    let t = Trace::open(&root).unwrap();
    assert!(t.meta().complete);
    assert_eq!(read_events(&t), events);
    // A complete trace has no lock file, and can be replaced.
    assert!(!lock.exists());
    assert_eq!(holder(&root), None);
    TraceWriter::create(&root, meta(), force())
        .unwrap()
        .finish()
        .unwrap();
}

/// A writer that ended without finishing (a killed recorder: its lock is
/// gone with its file descriptor) leaves its lock file, which locks
/// nothing: the trace exists (no `force`), and `force` replaces it.
#[test]
fn a_lock_file_left_by_a_dead_writer_locks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    let mut w = TraceWriter::create(&root, meta(), WriterOptions::default()).unwrap();
    for e in synthetic_events(10) {
        w.push_event(&e).unwrap();
    }
    w.rotate().unwrap();
    drop(w);
    assert!(root.join(LOCK_FILE).exists());
    assert_eq!(holder(&root), None);
    let err = create_err(&root, meta(), WriterOptions::default());
    assert!(matches!(err, Error::Exists(_)), "{err:?}");
    let w = TraceWriter::create(&root, meta(), force()).expect("a stale lock file is replaced");
    assert_eq!(holder(&root), Some(Some(std::process::id())));
    w.finish().unwrap();
    assert_eq!(Trace::open(&root).unwrap().event_count(), 0);

    // A directory holding nothing but a lock file is as good as empty.
    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    std::fs::write(bare.join(LOCK_FILE), "1\n").unwrap();
    TraceWriter::create(&bare, meta(), force())
        .unwrap()
        .finish()
        .unwrap();
    assert!(!bare.join(LOCK_FILE).exists());
}

/// The writer's lock, cloned, keeps the trace locked after the writer is
/// gone, and removes it without letting go: how `record` removes a trace
/// it recorded nothing into.
#[test]
fn a_clone_of_the_lock_outlives_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    let w = TraceWriter::create(&root, meta(), WriterOptions::default()).unwrap();
    let lock = w.lock();
    drop(w);
    assert_eq!(holder(&root), Some(Some(std::process::id())));
    let err = create_err(&root, meta(), force());
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
    lock.remove_trace().unwrap();
    assert!(!root.exists());
    drop(lock);
    TraceWriter::create(&root, meta(), WriterOptions::default())
        .unwrap()
        .finish()
        .unwrap();
}

/// `force` checks a path is a trace before it creates its lock file there.
#[test]
fn force_writes_no_lock_file_into_what_it_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let precious = dir.path().join("precious");
    std::fs::create_dir(&precious).unwrap();
    std::fs::write(precious.join("thesis.tex"), "years of work").unwrap();
    let err = create_err(&precious, meta(), force());
    assert!(matches!(err, Error::NotReplaced { .. }), "{err:?}");
    let names: Vec<_> = std::fs::read_dir(&precious)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["thesis.tex"]);

    // Someone else's lock file in a directory that is no trace is not
    // taken for a recording.
    std::fs::write(precious.join(LOCK_FILE), "1\n").unwrap();
    let held = std::fs::File::open(precious.join(LOCK_FILE)).unwrap();
    // SAFETY: flock is plain old data; fcntl on a descriptor we own.
    unsafe {
        use std::os::fd::AsRawFd;
        let mut fl: libc::flock = std::mem::zeroed();
        fl.l_type = libc::F_RDLCK as libc::c_short;
        assert_eq!(libc::fcntl(held.as_raw_fd(), libc::F_OFD_SETLK, &mut fl), 0);
    }
    assert!(holder(&precious).is_some());
    let err = create_err(&precious, meta(), WriterOptions::default());
    assert!(matches!(err, Error::Exists(_)), "{err:?}");
    drop(held);
}

/// The first checkpoint comes `first_checkpoint` after the first events,
/// not a whole `segment_duration` after the start; the later ones keep to
/// `segment_duration`.
#[test]
fn the_first_events_are_listed_early() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    let opts = WriterOptions {
        segment_duration: Duration::from_secs(3600),
        ..WriterOptions::default()
    };
    let first = opts.first_checkpoint;
    assert!(first <= Duration::from_millis(200), "{first:?}");
    let mut w = TraceWriter::create(&root, meta(), opts).unwrap();
    let events = synthetic_events(20);
    w.tick().unwrap();
    for e in &events[..10] {
        w.push_event(e).unwrap();
    }
    w.tick().unwrap();
    std::thread::sleep(first);
    w.tick().unwrap();
    let live = Trace::open(&root).unwrap();
    assert_eq!(
        read_events(&live),
        events[..10],
        "the first events are listed"
    );

    // Only the first checkpoint is early.
    for e in &events[10..] {
        w.push_event(e).unwrap();
    }
    w.tick().unwrap();
    std::thread::sleep(first * 2);
    w.tick().unwrap();
    assert_eq!(Trace::open(&root).unwrap().event_count(), 10);
    w.finish().unwrap();
    assert_eq!(read_events(&Trace::open(&root).unwrap()), events);
}

/// A tmpfs of `size`, unmounted when dropped; `None` (the test skips,
/// `common::skip::skip`) when this process cannot mount one.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            common::skip::skip("mounting a tmpfs needs root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            common::skip::skip("cannot mount a tmpfs");
            return None;
        }
        Some(Tmpfs(dir))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// Fills the file system up: every write after this fails.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.path().join("fill");
        let mut f = std::fs::File::create(&path).unwrap();
        let block = vec![0u8; 4096];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// Names of the files under `dir`, recursively, relative to it.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.strip_prefix(dir).unwrap().display().to_string();
        if p.is_dir() {
            out.extend(tree(&p).into_iter().map(|n| format!("{name}/{n}")));
        }
        out.push(name);
    }
    out.sort();
    out
}

/// A full disk: creating a trace fails with one line and leaves nothing;
/// a checkpoint that cannot write meta.json leaves the last one in place
/// and no temporary file beside it.
#[test]
fn a_full_disk_leaves_no_temporary_file() {
    let Some(fs) = Tmpfs::mount("256k") else {
        return;
    };
    // Space for a trace's start, then none.
    let root = fs.path().join("t.parquet");
    let mut w = TraceWriter::create(&root, meta(), WriterOptions::default()).unwrap();
    let fill = fs.fill();
    w.meta_mut().notes.push("changed".into());
    let err = w.rotate().expect_err("a full disk fails");
    assert!(matches!(err, Error::DiskFull(_)), "{err:?}");
    assert!(!err.to_string().contains('\n'), "{err}");
    assert_eq!(
        tree(&root),
        [LOCK_FILE, "meta.json"],
        "nothing but the trace's own files"
    );
    assert!(Trace::open(&root).unwrap().meta().notes.is_empty());
    drop(w);

    // Creating a trace on the full disk: an error, and nothing left.
    let other = fs.path().join("u.parquet");
    let err = create_err(&other, meta(), WriterOptions::default());
    assert!(matches!(err, Error::DiskFull(_)), "{err:?}");
    assert!(!other.exists(), "{:?}", tree(&other));
    std::fs::remove_file(fill).unwrap();
}
