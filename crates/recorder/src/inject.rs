//! Loading memleak's agent into a running process, and letting it go
//! (`record -p PID --capture inject`).
//!
//! No debugger: one thread of the process is stopped with ptrace
//! (`PTRACE_SEIZE` + `PTRACE_INTERRUPT`; the others keep running), at a
//! moment it is outside the allocator and the loader, and made to call
//! functions of its own libc, one at a time, as a debugger's `call`
//! would: its registers (general and extended) are saved, set to the
//! call's, with a return address of 0, and restored at the `SIGSEGV` that
//! return raises, which never reaches the process.
//!
//! The calls: `memfd_create` (the agent's code, written here through
//! /proc), `dlopen` of it, `close`; `memfd_create` again (the shared
//! memory, made here through /proc), and the agent's `memleak_attach`,
//! which patches the process's call sites (agent/agent.c, inject
//! section). At the end `memleak_detach` puts them back. A process that
//! already has the agent (an earlier recording) gets only the last calls.
//!
//! What can go wrong, and what is done about it:
//! - A thread stopped inside malloc, holding an arena lock, would
//!   deadlock in the dlopen's own allocations; one inside ld.so would
//!   re-enter it. The thread chosen is one whose registers and whose
//!   stack, walked frame by frame with the unwind rows (or, where a walk
//!   stops short, every word of 32 KiB of it), show no frame in the
//!   allocator's entry points, in ld.so, in an object that defines its own
//!   malloc, or in the agent;
//!   in libc it must be blocked in a waiting system call (read, poll,
//!   futex, nanosleep...), never one malloc makes with its lock held
//!   (mmap, brk, munmap). Stale words on the stack make this test err on
//!   the safe side: another try, later, on another thread.
//! - Processes that cannot take the agent are refused before anything is
//!   touched: statically linked, neither glibc nor musl, 32-bit, already
//!   traced, stopped, or running under a seccomp filter (a forbidden
//!   system call there kills the process).

use std::fs;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use crate::elf::ElfFile;
use crate::procmaps::{read_maps, resolve_in_process, status_field, Mapping};
use crate::unwind::{self as uw, ObjectMap, UnwindCache};

/// The name of the agent's memfd in an injected process (agent.c,
/// `INJECT_NAME`); its maps show `/memfd:memleak-inject.so (deleted)`.
pub const AGENT_NAME: &str = "memleak-inject.so";

/// Why a process cannot be injected, or why an injection failed: one
/// line.
#[derive(Debug)]
pub struct InjectError(pub String);

impl std::fmt::Display for InjectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InjectError {}

fn err<T>(msg: impl Into<String>) -> Result<T, InjectError> {
    Err(InjectError(msg.into()))
}

/// libc functions whose frames mean the thread is inside the allocator
/// or the loader's locks.
const ALLOCATOR_ENTRY_POINTS: &[&str] = &[
    "malloc",
    "free",
    "calloc",
    "realloc",
    "reallocarray",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "malloc_trim",
    "malloc_usable_size",
    "malloc_info",
    "malloc_stats",
    "mallinfo",
    "mallinfo2",
    "fork",
    "_Fork",
    "vfork",
    "dlopen",
    "dlclose",
    "dlsym",
    "dlvsym",
    "dladdr",
    "dladdr1",
    "dlinfo",
    "dlmopen",
    "dl_iterate_phdr",
    "__libc_dlopen_mode",
    "pthread_create",
    "pthread_exit",
    "exit",
];

/// System calls a thread may be blocked in, inside libc, for a call to
/// be made on it: waits, none made by malloc while it holds a lock.
const WAITING_SYSCALLS: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_recvmmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_select,
    libc::SYS_pselect6,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_futex,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_pause,
    libc::SYS_rt_sigsuspend,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_msgrcv,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_io_getevents,
    libc::SYS_io_uring_enter,
    libc::SYS_sched_yield,
];

const RTLD_NOW: u64 = 2;
const MFD_CLOEXEC: u64 = 1;
/// NT_X86_XSTATE: the extended registers (SSE, AVX...), which a call
/// clobbers as freely as the general ones.
const NT_X86_XSTATE: libc::c_int = 0x202;
/// How long a call may take before it is given up (a deadlock).
const CALL_LIMIT: Duration = Duration::from_secs(10);
/// How long to look for a thread at a safe point.
const SAFE_POINT_LIMIT: Duration = Duration::from_secs(5);
/// The stack words looked at above the stack pointer.
const STACK_SCAN: usize = 32 << 10;

/// What is known of a process before any of it is stopped.
pub struct Process {
    pid: u32,
    dlopen: u64,
    memfd_create: u64,
    close: u64,
    /// Code where a thread must not be stopped for a call, sorted.
    forbidden: Vec<(u64, u64)>,
    /// libc's and the vDSO's code: a thread there must be in a waiting
    /// system call.
    libc_text: Vec<(u64, u64)>,
    /// The agent's load address, when an earlier recording loaded it.
    agent: Option<u64>,
    /// The executable mappings with their unwind rows, to walk a stopped
    /// thread's stack frame by frame.
    objects: Vec<ObjectMap>,
}

fn in_ranges(ranges: &[(u64, u64)], a: u64) -> bool {
    ranges.iter().any(|&(lo, hi)| a >= lo && a < hi)
}

/// An object's load address: where its first byte is mapped.
fn base_of(maps: &[Mapping], path: &str) -> Option<u64> {
    maps.iter()
        .find(|m| m.path.as_deref() == Some(path) && m.offset == 0)
        .map(|m| m.start)
}

fn text_of(maps: &[Mapping], path: &str) -> Vec<(u64, u64)> {
    maps.iter()
        .filter(|m| m.path.as_deref() == Some(path) && m.perms.contains('x'))
        .map(|m| (m.start, m.end))
        .collect()
}

impl Process {
    /// Looks at `pid` and says whether it can take the agent.
    pub fn inspect(pid: u32) -> Result<Process, InjectError> {
        let status = fs::read_to_string(format!("/proc/{pid}/status"))
            .or_else(|e| err(format!("process {pid}: {e}")))?;
        if let Some(tracer) = status_field(&status, "TracerPid:").filter(|&t| t != "0") {
            return err(format!(
                "process {pid} is already traced (by pid {tracer}): it cannot be injected"
            ));
        }
        if status_field(&status, "Seccomp:") == Some("2") {
            return err(format!(
                "process {pid} runs under a seccomp filter: a system call the agent \
                 needs could kill it"
            ));
        }
        if status_field(&status, "State:").is_some_and(|s| s.starts_with('T')) {
            return err(format!("process {pid} is stopped: continue it first"));
        }
        let mut ident = [0u8; 5];
        fs::File::open(format!("/proc/{pid}/exe"))
            .and_then(|f| f.read_exact_at(&mut ident, 0))
            .or_else(|e| err(format!("process {pid}: its executable: {e}")))?;
        if ident[4] != 2 {
            return err(format!("process {pid} is not a 64-bit program"));
        }
        let maps = read_maps(pid).or_else(|e| err(format!("process {pid}: its maps: {e}")))?;
        let path_ending = |suffix: &str| {
            maps.iter()
                .filter_map(|m| m.path.as_deref())
                .find(|p| p.ends_with(suffix))
                .map(str::to_string)
        };
        // The loader is the object the kernel mapped for the program's
        // interpreter (AT_BASE), whatever its file is called; by its
        // name when the program is ld.so itself (`ld.so ./prog`).
        let Some(ld) = crate::procmaps::loader(pid, &maps)
            .and_then(|m| m.path.clone())
            .or_else(|| path_ending("/ld-linux-x86-64.so.2"))
        else {
            return err(format!("process {pid} has no loader (statically linked)"));
        };
        // glibc's libc.so.6; or musl's, which is its loader too (it
        // defines __libc_start_main).
        let loader_is_libc = || {
            ElfFile::open(&resolve_in_process(pid, &ld))
                .is_ok_and(|e| e.lookup_function("__libc_start_main").is_some())
        };
        let Some(libc_path) =
            path_ending("/libc.so.6").or_else(|| loader_is_libc().then(|| ld.clone()))
        else {
            return err(format!("process {pid} runs neither glibc nor musl"));
        };
        let libc_base = base_of(&maps, &libc_path)
            .ok_or_else(|| InjectError(format!("process {pid}: libc's first page")))?;
        let libc = ElfFile::open(&resolve_in_process(pid, &libc_path))
            .or_else(|e| err(format!("process {pid}: reading {libc_path}: {e}")))?;
        let func = |name: &str| -> Result<u64, InjectError> {
            libc.lookup_function(name)
                .map(|s| libc_base + s.value)
                .ok_or_else(|| InjectError(format!("{libc_path} has no {name}")))
        };
        let dlopen = func("dlopen").or_else(|_| func("__libc_dlopen_mode"))?;
        // The loader's code, all of it; musl's is its libc too, whose
        // allocator and dl* entry points are forbidden below, as glibc's.
        let mut forbidden: Vec<(u64, u64)> = if ld == libc_path {
            Vec::new()
        } else {
            text_of(&maps, &ld)
        };
        for name in ALLOCATOR_ENTRY_POINTS {
            if let Some(s) = libc.lookup_function(name) {
                forbidden.push((libc_base + s.value, libc_base + s.value + s.size.max(1)));
            }
        }
        // Another allocator (jemalloc, tcmalloc: a preloaded or linked
        // object that defines malloc): all of its code.
        let mut seen = std::collections::HashSet::new();
        for m in maps.iter().filter(|m| m.perms.contains('x')) {
            let Some(p) = m.path.as_deref() else { continue };
            if p == libc_path || p == ld || !p.starts_with('/') || !seen.insert(p.to_string()) {
                continue;
            }
            let defines_malloc = ElfFile::open(&resolve_in_process(pid, p)).is_ok_and(|e| {
                e.function_symbols()
                    .any(|s| s.dynamic && s.name == "malloc")
            });
            if defines_malloc {
                forbidden.extend(text_of(&maps, p));
            }
        }
        let agent = maps
            .iter()
            .find(|m| m.offset == 0 && m.path.as_deref().is_some_and(|p| p.contains(AGENT_NAME)))
            .map(|m| m.start);
        if let Some(a) = agent {
            let path = maps
                .iter()
                .find(|m| m.start == a)
                .and_then(|m| m.path.clone());
            if let Some(p) = path {
                forbidden.extend(text_of(&maps, &p));
            }
        }
        let mut libc_text = text_of(&maps, &libc_path);
        libc_text.extend(
            maps.iter()
                .filter(|m| m.path.as_deref() == Some("[vdso]"))
                .map(|m| (m.start, m.end)),
        );
        forbidden.sort_unstable();
        let objects = UnwindCache::default().object_maps(pid, &maps);
        Ok(Process {
            pid,
            dlopen,
            memfd_create: func("memfd_create")?,
            close: func("close")?,
            forbidden,
            libc_text,
            agent,
            objects,
        })
    }

    /// Whether an earlier recording left the agent in the process.
    pub fn has_agent(&self) -> bool {
        self.agent.is_some()
    }

    /// Why a thread stopped with `regs` and `stack` (words from its stack
    /// pointer up) must not make a call now, or None. With `Strict::PcOnly`
    /// the stack is not looked at.
    fn unsafe_because(
        &self,
        regs: &libc::user_regs_struct,
        stack: &[u8],
        strict: Strict,
    ) -> Option<String> {
        let pc = regs.rip;
        if in_ranges(&self.forbidden, pc) {
            return Some(format!("at {pc:#x}, in the allocator or the loader"));
        }
        if in_ranges(&self.libc_text, pc) {
            let nr = regs.orig_rax as i64;
            if nr < 0 || !WAITING_SYSCALLS.contains(&nr) {
                return Some(format!("at {pc:#x} in libc, not waiting in a system call"));
            }
        }
        if strict == Strict::PcOnly {
            return None;
        }
        // The stack, frame by frame, with the unwind rows: a complete walk
        // is the truth. Only when it stops short are all the words looked
        // at, stale ones included.
        let mem = StackMemory {
            pid: self.pid,
            base: regs.rsp,
            bytes: stack,
        };
        let walk = uw::unwind(
            uw::Regs {
                rip: regs.rip,
                rsp: regs.rsp,
                rbp: regs.rbp,
            },
            &self.objects,
            &mem,
            uw::Mode::Auto,
            512,
        );
        let inside = walk.frames.iter().skip(1).find(|f| {
            let at = if f.exact { f.pc } else { f.pc.wrapping_sub(1) };
            in_ranges(&self.forbidden, at)
        });
        if let Some(f) = inside {
            return Some(format!(
                "a frame at {:#x} in the allocator or the loader",
                f.pc
            ));
        }
        if walk.end == uw::End::Complete {
            return None;
        }
        stack
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .find(|&w| in_ranges(&self.forbidden, w))
            .map(|w| format!("a return address {w:#x} in the allocator or the loader"))
    }
}

/// A stopped thread's memory for the unwinder: its stack as read, and
/// the rest (a signal frame elsewhere) through /proc.
struct StackMemory<'a> {
    pid: u32,
    base: u64,
    bytes: &'a [u8],
}

impl uw::Memory for StackMemory<'_> {
    fn read_u64(&self, addr: u64) -> Option<u64> {
        let off = addr.checked_sub(self.base)? as usize;
        if let Some(w) = self.bytes.get(off..off + 8) {
            return Some(u64::from_le_bytes(w.try_into().ok()?));
        }
        let mut w = [0u8; 8];
        (read_mem(self.pid, addr, &mut w) == 8).then(|| u64::from_le_bytes(w))
    }
}

fn ptrace(req: libc::c_uint, tid: i32, addr: usize, data: usize) -> io::Result<libc::c_long> {
    // SAFETY: ptrace requests on a thread; the pointers passed (when any)
    // are to live buffers of the size the request expects.
    let r = unsafe { libc::ptrace(req, tid, addr, data) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// What a wait on a traced thread returned.
enum Waited {
    Stopped { sig: i32, event: i32 },
    Gone,
}

fn wait_thread(tid: i32, deadline: Instant) -> io::Result<Option<Waited>> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid on a thread we trace, with a status out-pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            if e.raw_os_error() == Some(libc::ECHILD) {
                return Ok(Some(Waited::Gone));
            }
            return Err(e);
        }
        if r == tid {
            if libc::WIFSTOPPED(status) {
                return Ok(Some(Waited::Stopped {
                    sig: libc::WSTOPSIG(status),
                    event: status >> 16,
                }));
            }
            return Ok(Some(Waited::Gone));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// How a safe point is judged.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Strict {
    /// The registers and the stack: for the attach, whose dlopen
    /// allocates and takes the loader's locks.
    Stack,
    /// The registers only: for the detach, which neither allocates nor
    /// loads, once the strict test found no moment (a thread blocked in
    /// read whose stack holds stale return addresses, beside threads that
    /// never leave the allocator).
    PcOnly,
}

/// One thread of the process, seized and stopped, its registers saved.
pub struct Stopped<'a> {
    process: &'a Process,
    tid: i32,
    regs: libc::user_regs_struct,
    xstate: Vec<u8>,
    /// Scratch space below the red zone, growing down.
    scratch: u64,
    /// A group stop (SIGSTOP, SIGTSTP...) that came during a call, to be
    /// given back once the thread is let go.
    group_stop: Option<i32>,
    detached: bool,
}

impl<'a> Stopped<'a> {
    /// Seizes and stops one thread of the process at a safe point: the
    /// threads are tried in turn (those asleep first), again and again,
    /// for up to [`SAFE_POINT_LIMIT`].
    fn at_safe_point(
        process: &'a Process,
        relax_after: Option<Duration>,
    ) -> Result<Stopped<'a>, InjectError> {
        let pid = process.pid;
        let started = Instant::now();
        let mut last_why = String::new();
        let mut tries = 0u32;
        while started.elapsed() < SAFE_POINT_LIMIT {
            let strict = match relax_after {
                Some(after) if started.elapsed() >= after => Strict::PcOnly,
                _ => Strict::Stack,
            };
            for tid in threads(pid) {
                tries += 1;
                match Stopped::seize(process, tid) {
                    Ok(Some(s)) => match s.check(strict) {
                        None => return Ok(s),
                        Some(why) => last_why = why,
                    },
                    Ok(None) => {}
                    Err(e) => return Err(e),
                }
            }
            if crate::procmaps::gone(pid) {
                return err(format!("process {pid} exited"));
            }
            std::thread::sleep(Duration::from_millis(1 + u64::from(tries % 7)));
        }
        err(format!(
            "no thread of process {pid} came to a safe point in {tries} tries over {} s \
             (last: {last_why})",
            SAFE_POINT_LIMIT.as_secs()
        ))
    }

    /// Seizes and interrupts `tid`; None if it is gone.
    fn seize(process: &'a Process, tid: i32) -> Result<Option<Stopped<'a>>, InjectError> {
        if let Err(e) = ptrace(libc::PTRACE_SEIZE, tid, 0, 0) {
            return match e.raw_os_error() {
                Some(libc::ESRCH) => Ok(None),
                Some(libc::EPERM) => err(format!(
                    "ptrace of process {} was refused ({e}): memleak needs root or \
                     CAP_SYS_PTRACE, and kernel.yama.ptrace_scope below 3",
                    process.pid
                )),
                _ => err(format!("ptrace of thread {tid}: {e}")),
            };
        }
        let mut s = Stopped {
            process,
            tid,
            // SAFETY: all-zero registers are valid; GETREGS fills them.
            regs: unsafe { std::mem::zeroed() },
            xstate: vec![0; 16 << 10],
            scratch: 0,
            group_stop: None,
            detached: false,
        };
        if ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0).is_err() {
            s.detached = true;
            return Ok(None);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match wait_thread(tid, deadline) {
                Ok(Some(Waited::Stopped { event, .. })) if event == libc::PTRACE_EVENT_STOP => {
                    break
                }
                // A signal on its way: delivered; the interrupt stays
                // pending and comes next.
                Ok(Some(Waited::Stopped { sig, .. })) => {
                    let _ = ptrace(libc::PTRACE_CONT, tid, 0, sig as usize);
                }
                Ok(Some(Waited::Gone)) => {
                    s.detached = true;
                    return Ok(None);
                }
                Ok(None) | Err(_) => {
                    // Never stopped: let it go.
                    drop(s);
                    return Ok(None);
                }
            }
        }
        ptrace(libc::PTRACE_GETREGS, tid, 0, &mut s.regs as *mut _ as usize)
            .or_else(|e| err(format!("registers of thread {tid}: {e}")))?;
        let mut iov = libc::iovec {
            iov_base: s.xstate.as_mut_ptr().cast(),
            iov_len: s.xstate.len(),
        };
        ptrace(
            libc::PTRACE_GETREGSET,
            tid,
            NT_X86_XSTATE as usize,
            &mut iov as *mut _ as usize,
        )
        .or_else(|e| err(format!("extended registers of thread {tid}: {e}")))?;
        s.xstate.truncate(iov.iov_len);
        // Below the red zone, 16-aligned.
        s.scratch = (s.regs.rsp - 512) & !15;
        Ok(Some(s))
    }

    fn check(&self, strict: Strict) -> Option<String> {
        let mut stack = vec![0u8; STACK_SCAN];
        let n = read_mem(self.process.pid, self.regs.rsp, &mut stack);
        stack.truncate(n);
        self.process.unsafe_because(&self.regs, &stack, strict)
    }

    fn mem(&self) -> io::Result<fs::File> {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{}/mem", self.process.pid))
    }

    /// Writes a C string into the scratch space; its address.
    fn push_str(&mut self, s: &str) -> Result<u64, InjectError> {
        let mut bytes = s.as_bytes().to_vec();
        bytes.push(0);
        self.scratch = (self.scratch - bytes.len() as u64) & !15;
        self.mem()
            .and_then(|m| m.write_all_at(&bytes, self.scratch))
            .or_else(|e| err(format!("writing to process {}: {e}", self.process.pid)))?;
        Ok(self.scratch)
    }

    /// Calls `func(args...)` on the thread; its return value.
    fn call(&mut self, func: u64, args: &[u64]) -> Result<u64, InjectError> {
        let tid = self.tid;
        let mut regs = self.regs;
        // At the call's first instruction the stack pointer is 8 past a
        // 16-byte boundary, at a return address of 0.
        let sp = (self.scratch & !15) - 8;
        self.mem()
            .and_then(|m| m.write_all_at(&0u64.to_le_bytes(), sp))
            .or_else(|e| err(format!("writing to process {}: {e}", self.process.pid)))?;
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        regs.rdi = a[0];
        regs.rsi = a[1];
        regs.rdx = a[2];
        regs.rcx = a[3];
        regs.r8 = a[4];
        regs.r9 = a[5];
        regs.rax = 0;
        // Not in a system call: the kernel restarts none on our return.
        regs.orig_rax = u64::MAX;
        regs.rip = func;
        regs.rsp = sp;
        ptrace(libc::PTRACE_SETREGS, tid, 0, &regs as *const _ as usize)
            .or_else(|e| err(format!("setting the registers of thread {tid}: {e}")))?;
        ptrace(libc::PTRACE_CONT, tid, 0, 0)
            .or_else(|e| err(format!("resuming thread {tid}: {e}")))?;
        let deadline = Instant::now() + CALL_LIMIT;
        loop {
            match wait_thread(tid, deadline) {
                Ok(Some(Waited::Stopped { sig, event: 0 })) if FAULTS.contains(&sig) => {
                    let mut now: libc::user_regs_struct =
                        // SAFETY: all-zero registers are valid.
                        unsafe { std::mem::zeroed() };
                    ptrace(libc::PTRACE_GETREGS, tid, 0, &mut now as *mut _ as usize)
                        .or_else(|e| err(format!("registers of thread {tid}: {e}")))?;
                    if sig == libc::SIGSEGV && now.rip == 0 {
                        return Ok(now.rax);
                    }
                    if raised_by_the_kernel(tid) {
                        // A fault of the call itself: the process would
                        // die of it. It is never delivered; the thread
                        // goes back to where it was (release).
                        return err(format!(
                            "the call faulted in process {} ({}) at {:#x}; the process was \
                             put back as it was",
                            self.process.pid,
                            signal_name(sig),
                            now.rip
                        ));
                    }
                    // Sent by someone (kill, tgkill): the process's own.
                    let _ = ptrace(libc::PTRACE_CONT, tid, 0, sig as usize);
                }
                Ok(Some(Waited::Stopped { sig, event })) if event == libc::PTRACE_EVENT_STOP => {
                    if matches!(
                        sig,
                        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                    ) {
                        self.group_stop = Some(sig);
                    }
                    let _ = ptrace(libc::PTRACE_CONT, tid, 0, 0);
                }
                Ok(Some(Waited::Stopped { sig, .. })) => {
                    // The process's own signal: its handler runs on top of
                    // the call, as it would on top of any code.
                    let _ = ptrace(libc::PTRACE_CONT, tid, 0, sig as usize);
                }
                Ok(Some(Waited::Gone)) => {
                    self.detached = true;
                    return err(format!(
                        "process {} exited during the injection",
                        self.process.pid
                    ));
                }
                Ok(None) => {
                    let _ = ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
                    let _ = wait_thread(tid, Instant::now() + Duration::from_secs(1));
                    return err(format!(
                        "a call in process {} did not return in {} s",
                        self.process.pid,
                        CALL_LIMIT.as_secs()
                    ));
                }
                Err(e) => return err(format!("waiting for thread {tid}: {e}")),
            }
        }
    }

    /// Puts the registers back and lets the thread go.
    fn release(&mut self) {
        if self.detached {
            return;
        }
        self.detached = true;
        let tid = self.tid;
        let _ = ptrace(
            libc::PTRACE_SETREGS,
            tid,
            0,
            &self.regs as *const _ as usize,
        );
        let mut iov = libc::iovec {
            iov_base: self.xstate.as_mut_ptr().cast(),
            iov_len: self.xstate.len(),
        };
        let _ = ptrace(
            libc::PTRACE_SETREGSET,
            tid,
            NT_X86_XSTATE as usize,
            &mut iov as *mut _ as usize,
        );
        let _ = ptrace(libc::PTRACE_DETACH, tid, 0, 0);
        if let Some(sig) = self.group_stop {
            // SAFETY: kill(2) with a signal number.
            unsafe { libc::kill(self.process.pid as i32, sig) };
        }
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// The signals a faulting instruction raises. One of them during a
/// remote call is the call's own doing, unless someone sent it.
const FAULTS: [i32; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// Whether the signal the thread is stopped with was raised by the kernel
/// (a fault, a seccomp trap: `si_code` > 0), not sent by a process.
fn raised_by_the_kernel(tid: i32) -> bool {
    // SAFETY: all-zero is a valid siginfo_t.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    ptrace(
        libc::PTRACE_GETSIGINFO,
        tid,
        0,
        &mut info as *mut _ as usize,
    )
    .is_ok_and(|_| info.si_code > 0)
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGSYS => "SIGSYS",
        _ => "a signal",
    }
}

/// The process's threads, those asleep first.
fn threads(pid: u32) -> Vec<i32> {
    let mut tids: Vec<(bool, i32)> = crate::scan::stop::threads_of(pid)
        .into_iter()
        .map(|tid| {
            let asleep = fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
                .ok()
                .and_then(|s| {
                    let after = s.rfind(')')?;
                    s[after + 1..].split_whitespace().next().map(|st| st == "S")
                })
                .unwrap_or(false);
            (!asleep, tid as i32)
        })
        .collect();
    tids.sort_unstable();
    tids.into_iter().map(|(_, t)| t).collect()
}

/// Reads what it can of `buf.len()` bytes at `addr` in `pid`.
fn read_mem(pid: u32, addr: u64, buf: &mut [u8]) -> usize {
    let Ok(f) = fs::File::open(format!("/proc/{pid}/mem")) else {
        return 0;
    };
    let mut done = 0;
    // Page by page: the stack may end before the window does.
    while done < buf.len() {
        let at = addr + done as u64;
        let room = (4096 - (at % 4096) as usize).min(buf.len() - done);
        match f.read_at(&mut buf[done..done + room], at) {
            Ok(n) if n > 0 => done += n,
            _ => break,
        }
    }
    done
}

/// The symbol's address in the agent loaded at `base`.
fn agent_function(agent_so: &[u8], base: u64, name: &str) -> Result<u64, InjectError> {
    let elf =
        ElfFile::parse(agent_so.to_vec()).or_else(|e| err(format!("the agent's image: {e}")))?;
    elf.lookup_function(name)
        .map(|s| base + s.value)
        .ok_or_else(|| InjectError(format!("the agent has no {name}")))
}

fn open_remote_fd(pid: u32, fd: u64) -> Result<fs::File, InjectError> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .or_else(|e| err(format!("opening descriptor {fd} of process {pid}: {e}")))
}

/// What an attach did.
#[derive(Debug, Clone, Copy)]
pub struct Attached {
    /// The agent was loaded now (not left by an earlier recording).
    pub loaded: bool,
    /// Call sites patched.
    pub sites: u64,
}

/// Loads the agent into `process` (unless it is there already), makes the
/// shared memory in a memfd of the process, hands it to `setup` (which
/// must make it ready for the agent, and let it record in the process),
/// and attaches the agent to it.
pub fn attach<T>(
    process: &Process,
    agent_so: &[u8],
    setup: impl FnOnce(OwnedFd) -> io::Result<T>,
) -> Result<(T, Attached), InjectError> {
    let pid = process.pid;
    let mut t = Stopped::at_safe_point(process, None)?;
    let loaded = process.agent.is_none();
    // The handle of the agent's dlopen, for its lookups of its own
    // functions (musl's dlopen cannot find it again by the memfd's path,
    // closed by then); 0 when an earlier recording loaded it.
    let mut self_handle = 0;
    let base = match process.agent {
        Some(base) => base,
        None => {
            let name = t.push_str(AGENT_NAME)?;
            let fd = t.call(process.memfd_create, &[name, MFD_CLOEXEC])? as i64;
            if fd < 0 {
                return err(format!(
                    "memfd_create failed in process {pid}: {}",
                    io::Error::from_raw_os_error(-fd as i32)
                ));
            }
            let fd = fd as u64;
            open_remote_fd(pid, fd)?
                .write_all_at(agent_so, 0)
                .or_else(|e| err(format!("writing the agent into process {pid}: {e}")))?;
            let path = t.push_str(&format!("/proc/self/fd/{fd}"))?;
            let handle = t.call(process.dlopen, &[path, RTLD_NOW])?;
            self_handle = handle;
            t.call(process.close, &[fd])?;
            if handle == 0 {
                return err(format!(
                    "process {pid} could not load the agent (dlopen failed: a noexec \
                     memfd policy, or an old glibc)"
                ));
            }
            read_maps(pid)
                .ok()
                .and_then(|maps| {
                    maps.iter()
                        .find(|m| {
                            m.offset == 0
                                && m.path.as_deref().is_some_and(|p| p.contains(AGENT_NAME))
                        })
                        .map(|m| m.start)
                })
                .ok_or_else(|| InjectError(format!("the agent is not in process {pid}'s maps")))?
        }
    };
    let name = t.push_str("memleak-agent-ring")?;
    let ring_fd = t.call(process.memfd_create, &[name, MFD_CLOEXEC])? as i64;
    if ring_fd < 0 {
        return err(format!(
            "memfd_create failed in process {pid}: {}",
            io::Error::from_raw_os_error(-ring_fd as i32)
        ));
    }
    let file = open_remote_fd(pid, ring_fd as u64)?;
    // SAFETY: a descriptor we just opened, owned from here.
    let fd = unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(file)) };
    let value = match setup(fd) {
        Ok(v) => v,
        Err(e) => {
            let _ = t.call(process.close, &[ring_fd as u64]);
            return err(format!("making the shared memory: {e}"));
        }
    };
    let attach = agent_function(agent_so, base, "memleak_attach")?;
    let sites = t.call(attach, &[ring_fd as u64, self_handle])? as i64;
    if sites == -i64::from(libc::EBUSY) || sites == -i64::from(libc::EINVAL) {
        // Refused before it took the descriptor.
        let _ = t.call(process.close, &[ring_fd as u64]);
    }
    if sites == -i64::from(libc::EBUSY) {
        return err(format!("another recording is attached to process {pid}"));
    }
    if sites < 0 {
        return err(format!(
            "the agent could not attach in process {pid}: {}",
            io::Error::from_raw_os_error(-sites as i32)
        ));
    }
    t.release();
    Ok((
        value,
        Attached {
            loaded,
            sites: sites as u64,
        },
    ))
}

/// Puts the call sites of the agent in `pid` back: it records nothing
/// more, and costs nothing more. The number of sites restored, or None
/// when the agent is no longer in the process (it executed another
/// program, which the agent does not follow).
pub fn detach(pid: u32, agent_so: &[u8]) -> Result<Option<u64>, InjectError> {
    let process = Process::inspect(pid)?;
    let Some(base) = process.agent else {
        return Ok(None);
    };
    let mut t = Stopped::at_safe_point(&process, Some(Duration::from_secs(1)))?;
    let detach = agent_function(agent_so, base, "memleak_detach")?;
    let n = t.call(detach, &[])? as i64;
    t.release();
    if n < 0 {
        return err(format!(
            "the agent could not detach in process {pid}: {}",
            io::Error::from_raw_os_error(-n as i32)
        ));
    }
    Ok(Some(n as u64))
}
