//! Private copies of the allocator libraries for a command memleak starts.
//!
//! A uprobe belongs to a file (its inode) and an offset, and every
//! recording that probes the same function of the same file adds its
//! consumer to the same uprobe. The kernel (6.18) filters a `uprobe_multi`
//! link by pid only *after* its session consumer has asked for the return
//! of the call: another recording of another process, probing the same
//! libc, asks for the returns of this command's calls too. That is
//! harmless until a signal handler runs on a signal stack above the
//! interrupted call and calls a probed function: the new return request
//! makes the kernel drop the interrupted call's pending return as
//! abandoned, and the thread dies of SIGILL when that call returns
//! (docs/accuracy.md, the `sigalt` fixture). No BPF program can stop
//! another consumer from asking.
//!
//! So a command memleak starts runs with its own libc and libstdc++: in
//! the child, before exec, a private mount namespace (host mounts still
//! propagate in) bind-mounts a copy of each library over its own path.
//! The copy is an unnamed file (`O_TMPFILE`) in the library's own
//! directory, read-only once mounted. The program, its children and every tool
//! looking at its maps see the same paths and bytes (build-id and all),
//! but the inode is this recording's alone: no other recording's or
//! tool's probe on the system's libc fires in it, and none of ours fires
//! in anyone else. The copies live as long as the processes that map
//! them and have no name, so nothing is left behind whatever happens to
//! memleak. Where a copy cannot be made (a read-only /usr, no
//! `O_TMPFILE`), the system's files are probed and a note says so.
//! `record --shared-libraries` turns this off.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The libraries to copy, prepared before the fork: the child must not
/// allocate.
pub struct Plan {
    /// Canonical paths (a bind mount needs the real file, not a symlink).
    paths: Vec<PathBuf>,
    cpaths: Vec<CString>,
    /// Their directories, where the copies are made.
    dirs: Vec<CString>,
    /// The copies' temporary names, NUL-terminated, with ten digits for
    /// the pid at `pid_at`.
    names: Vec<Vec<u8>>,
    pid_at: Vec<usize>,
    /// "/proc/self/fd/" followed by room for the digits.
    fd_path: [u8; 32],
}

impl Plan {
    /// A plan for the libraries among `candidates` that exist.
    pub fn new(candidates: &[PathBuf]) -> Plan {
        let mut paths: Vec<PathBuf> = Vec::new();
        for c in candidates {
            if let Ok(p) = std::fs::canonicalize(c) {
                if p.is_file() && !paths.contains(&p) {
                    paths.push(p);
                }
            }
        }
        let cpaths = paths
            .iter()
            .filter_map(|p| CString::new(p.as_os_str().as_bytes()).ok())
            .collect();
        let dirs = paths
            .iter()
            .map(|p| {
                let dir = p.parent().unwrap_or(Path::new("/"));
                CString::new(dir.as_os_str().as_bytes()).unwrap_or_default()
            })
            .collect();
        let mut names = Vec::new();
        let mut pid_at = Vec::new();
        for p in &paths {
            let dir = p.parent().unwrap_or(Path::new("/")).as_os_str().as_bytes();
            let mut name = dir.to_vec();
            name.extend_from_slice(b"/.memleak-");
            pid_at.push(name.len());
            name.extend_from_slice(b"0000000000-");
            name.extend_from_slice(p.file_name().map(|n| n.as_bytes()).unwrap_or(b"lib"));
            name.push(0);
            names.push(name);
        }
        let mut fd_path = [0u8; 32];
        fd_path[..14].copy_from_slice(b"/proc/self/fd/");
        Plan {
            paths,
            cpaths,
            dirs,
            names,
            pid_at,
            fd_path,
        }
    }

    /// The libraries the plan covers.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Runs in the forked child, before exec: only system calls, no
    /// allocation. Returns 0, or the errno of the first step that failed
    /// times 256 plus the step (so the parent can say which); the child
    /// then runs with the system's files, as with `--shared-libraries`.
    ///
    /// # Safety
    /// Only in a single-threaded child right after fork.
    pub unsafe fn apply_in_child(&mut self) -> i32 {
        let fail = |step: i32| *libc::__errno_location() * 256 + step;
        // Closes fds without losing the errno of the call that failed.
        let close = |fds: &[libc::c_int]| {
            let e = *libc::__errno_location();
            for &fd in fds {
                libc::close(fd);
            }
            *libc::__errno_location() = e;
        };
        if self.cpaths.is_empty() {
            return 0;
        }
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return fail(1);
        }
        // Host mounts keep propagating in; ours never propagate out.
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ) != 0
        {
            return fail(2);
        }
        for i in 0..self.cpaths.len() {
            let src = libc::open(self.cpaths[i].as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if src < 0 {
                return fail(3);
            }
            // An unnamed file beside the library: on a file system that
            // allows exec (a memfd cannot be bind-mounted: its mount is
            // the kernel's own), and never visible by name, so nothing is
            // left to clean up whatever happens to memleak.
            let copy = libc::open(
                self.dirs[i].as_ptr(),
                libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
                0o755,
            );
            if copy < 0 {
                close(&[src]);
                return fail(4);
            }
            loop {
                let n = libc::sendfile(copy, src, std::ptr::null_mut(), 1 << 30);
                if n == 0 {
                    break;
                }
                if n < 0 && *libc::__errno_location() != libc::EINTR {
                    close(&[src, copy]);
                    return fail(5);
                }
            }
            close(&[src]);
            libc::fchmod(copy, 0o755);
            // A bind mount needs a name: the copy gets one for the few
            // system calls it takes (`.memleak-PID-libc.so.6`, so that a
            // copy left by a kill in between says what it is).
            let len = self.write_fd_path(copy);
            fill_digits(
                &mut self.names[i][self.pid_at[i]..self.pid_at[i] + 10],
                libc::getpid(),
            );
            let named = libc::linkat(
                libc::AT_FDCWD,
                self.fd_path[..len].as_ptr().cast(),
                libc::AT_FDCWD,
                self.names[i].as_ptr().cast(),
                libc::AT_SYMLINK_FOLLOW,
            );
            close(&[copy]);
            if named != 0 {
                return fail(7);
            }
            let rc = libc::mount(
                self.names[i].as_ptr().cast(),
                self.cpaths[i].as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            );
            let e = *libc::__errno_location();
            libc::unlink(self.names[i].as_ptr().cast());
            *libc::__errno_location() = e;
            if rc != 0 {
                return fail(6);
            }
            // Read-only, like the file it stands for (uprobes write their
            // breakpoints into each process's own copy of the page).
            libc::mount(
                std::ptr::null(),
                self.cpaths[i].as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                std::ptr::null(),
            );
        }
        0
    }

    /// Writes the decimal `fd` after "/proc/self/fd/" and a NUL; returns
    /// the length with the NUL.
    fn write_fd_path(&mut self, fd: libc::c_int) -> usize {
        let mut digits = [0u8; 12];
        let mut n = 0;
        let mut v = fd.max(0) as u32;
        loop {
            digits[n] = b'0' + (v % 10) as u8;
            n += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        let mut at = 14;
        for d in digits[..n].iter().rev() {
            self.fd_path[at] = *d;
            at += 1;
        }
        self.fd_path[at] = 0;
        at + 1
    }
}

/// Writes `v` as zero-padded decimal digits over `out`.
fn fill_digits(out: &mut [u8], v: i32) {
    let mut v = v.max(0) as u32;
    for d in out.iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// What a failed [`Plan::apply_in_child`] code means, for a warning.
pub fn describe_failure(code: i32) -> String {
    let step = match code % 256 {
        1 => "unshare(CLONE_NEWNS)",
        2 => "making mounts private",
        3 => "opening a library",
        4 => "creating the copy",
        5 => "copying a library",
        6 => "bind-mounting the copy",
        7 => "naming the copy",
        _ => "setting up",
    };
    format!(
        "{step}: {}",
        crate::output::describe(&std::io::Error::from_raw_os_error(code / 256))
    )
}

/// The path under which the recorder sees `lib` as the child `pid` sees
/// it: through the child's root, hence its mount namespace and its
/// private copy.
pub fn as_seen_by(pid: u32, lib: &Path) -> PathBuf {
    let mut p = PathBuf::from(format!("/proc/{pid}/root"));
    p.push(lib.strip_prefix("/").unwrap_or(lib));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_paths_are_written_without_allocating() {
        let mut plan = Plan::new(&[]);
        let n = plan.write_fd_path(7);
        assert_eq!(&plan.fd_path[..n], b"/proc/self/fd/7\0");
        let n = plan.write_fd_path(1234);
        assert_eq!(&plan.fd_path[..n], b"/proc/self/fd/1234\0");
        let mut pid = *b"xx0000000000yy";
        fill_digits(&mut pid[2..12], 4321);
        assert_eq!(&pid, b"xx0000004321yy");
    }

    #[test]
    fn only_existing_libraries_are_planned_once() {
        let plan = Plan::new(&[
            PathBuf::from("/nonexistent/libc.so.6"),
            PathBuf::from("/proc/self/exe"),
            PathBuf::from("/proc/self/exe"),
        ]);
        assert_eq!(plan.paths().len(), 1);
        assert_eq!(
            as_seen_by(42, Path::new("/usr/lib/libc.so.6")),
            PathBuf::from("/proc/42/root/usr/lib/libc.so.6")
        );
    }
}
