//! `record --capture`: how a command's allocator calls are captured.
//!
//! - `bpf`: uprobes on the allocator functions, in the kernel (every
//!   target: `-p`, static and setuid programs, `--kernel`).
//! - `preload`: memleak's agent (`agent/agent.c`), preloaded into the
//!   command with `LD_PRELOAD`, writes the same records into memory shared
//!   with the recorder ([`memleak_recorder::agent`]). No trap per call: a
//!   malloc+free pair costs a fraction of what the probes cost.
//! - `inject`: the same agent, loaded into a running process (`-p`) with
//!   ptrace, which patches the process's call sites and puts them back at
//!   the end ([`memleak_recorder::inject`]). Never chosen by `auto`:
//!   nothing enters a running process unless asked.
//!
//! The rest of the recording is the same for both: the BPF program still
//! records the processes' lifecycle (exec, fork, exit) and stops them at
//! ld.so's notifications, and the recorder builds the unwind tables the
//! agent walks stacks with, as it builds them for the probe.

use std::collections::HashSet;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use memleak_recorder::agent::{self, Shared};
use memleak_recorder::elf::ElfFile;
use memleak_recorder::unwind::{ProcTable, Row, UnwindSink};

/// The agent, built by build.rs.
const AGENT_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libmemleak_agent.so"));

/// `--capture`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capture {
    /// `preload` for a command that can take it, `bpf` otherwise.
    Auto,
    /// Kernel uprobes on the allocator functions.
    Bpf,
    /// memleak's agent inside the command (LD_PRELOAD).
    Preload,
    /// memleak's agent loaded into a running process (-p), its call
    /// sites patched; taken out again at the end.
    Inject,
}

/// The capture that runs, and why when `auto` did not pick `preload`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chosen {
    Bpf(Option<String>),
    Preload,
    Inject,
}

impl Chosen {
    /// The name in meta.json.
    pub fn name(&self) -> &'static str {
        match self {
            Chosen::Bpf(_) => "bpf",
            Chosen::Preload => "preload",
            Chosen::Inject => "inject",
        }
    }

    /// Whether memleak's agent records the allocator calls.
    pub fn agent(&self) -> bool {
        !matches!(self, Chosen::Bpf(_))
    }
}

/// What decides the capture, from the other options.
pub struct Situation<'a> {
    pub argv: &'a [String],
    /// `-p` processes.
    pub pids: usize,
    pub kernel: bool,
    pub custom_allocator: bool,
    pub count_only: bool,
}

/// Picks the capture. `preload` asked for where it cannot work is an
/// error; `auto` says in a note why it fell back to `bpf`.
pub fn choose(asked: Capture, s: &Situation<'_>) -> Result<Chosen> {
    if asked == Capture::Inject {
        let why_not = if !s.argv.is_empty() {
            Some("it attaches to a running process (-p); a command memleak starts takes preload")
        } else if s.pids != 1 {
            Some("it takes exactly one -p PID")
        } else if s.kernel {
            Some("--kernel needs the probes")
        } else if s.custom_allocator {
            Some("--object and --symbols-prefix need the probes")
        } else if s.count_only {
            Some("--count-only measures the probes")
        } else {
            None
        };
        return match why_not {
            Some(why) => anyhow::bail!("--capture inject: {why}"),
            None => Ok(Chosen::Inject),
        };
    }
    let why_not = if s.argv.is_empty() {
        Some("only a command memleak starts can be preloaded (-p uses bpf)".to_string())
    } else if s.kernel {
        Some("--kernel needs the probes".to_string())
    } else if s.custom_allocator {
        Some("--object and --symbols-prefix need the probes".to_string())
    } else if s.count_only {
        Some("--count-only measures the probes".to_string())
    } else {
        match executable(&s.argv[0]) {
            None => None,
            Some(exe) => match inspect(&exe) {
                Ok(Kind::Dynamic(None)) => None,
                Ok(Kind::Dynamic(Some(ld))) => agent_cannot_load(&exe, &ld),
                Ok(Kind::Static) => Some(format!(
                    "{} is statically linked: nothing can be preloaded",
                    exe.display()
                )),
                Ok(Kind::SetId) => Some(format!(
                    "{} is setuid or setgid: ld.so ignores LD_PRELOAD",
                    exe.display()
                )),
                Err(_) => None,
            },
        }
    };
    Ok(match (asked, why_not) {
        (Capture::Bpf, _) => Chosen::Bpf(None),
        (Capture::Preload, Some(why)) => anyhow::bail!("--capture preload: {why}"),
        (Capture::Preload, None) => Chosen::Preload,
        (Capture::Auto, Some(why)) => Chosen::Bpf(Some(why)),
        (Capture::Auto, None) => Chosen::Preload,
        (Capture::Inject, _) => unreachable!("decided above"),
    })
}

enum Kind {
    /// With its program interpreter (`PT_INTERP`); `None` for a script or
    /// a file that is not ELF.
    Dynamic(Option<PathBuf>),
    Static,
    SetId,
}

/// The file a command name runs, as execvp finds it.
fn executable(cmd: &str) -> Option<PathBuf> {
    if cmd.contains('/') {
        return Some(PathBuf::from(cmd));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
}

/// Whether an executable can be preloaded: an ELF file with an
/// interpreter (`PT_INTERP`), not setuid or setgid. A script runs its
/// interpreter, which can.
fn inspect(exe: &Path) -> std::io::Result<Kind> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(exe)?;
    if meta.permissions().mode() & 0o6000 != 0 {
        return Ok(Kind::SetId);
    }
    let data = std::fs::read(exe)?;
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 {
        return Ok(Kind::Dynamic(None));
    }
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]) as usize;
    let u64_at = |o: usize| {
        data.get(o..o + 8).map_or(0, |b| {
            u64::from_le_bytes(b.try_into().unwrap_or_default()) as usize
        })
    };
    let (phoff, phentsize, phnum) = (u64_at(32), u16_at(54), u16_at(56));
    let interp = (0..phnum).find_map(|i| {
        let at = phoff + i * phentsize;
        let kind = data.get(at..at + 4)?;
        if u32::from_le_bytes(kind.try_into().unwrap_or_default()) != 3 {
            return None;
        }
        // p_offset and p_filesz: the path, NUL-terminated.
        let (offset, size) = (u64_at(at + 8), u64_at(at + 32));
        let path = data.get(offset..offset.checked_add(size)?)?;
        let path = path.split(|&b| b == 0).next().unwrap_or_default();
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(path)))
    });
    Ok(match interp {
        Some(ld) => Kind::Dynamic(Some(ld)),
        None => Kind::Static,
    })
}

/// Why memleak's agent cannot be loaded into a program that `ld`, its
/// program interpreter, runs; `None` if it can. The agent is built with
/// glibc and needs libc.so.6. glibc's ld.so is not the C library (it
/// defines no `__libc_start_main`): the agent's symbols are bound in
/// libc.so.6, which has them all. musl's ld.so is its libc, and answers
/// for libc.so.6 too, but lacks some of glibc's functions: with the agent
/// preloaded it would not start the program at all (`Error relocating
/// ...: symbol not found`, exit status 127). A program whose interpreter
/// cannot be read is left to preload.
fn agent_cannot_load(exe: &Path, ld: &Path) -> Option<String> {
    let (defined, _) = dynamic_names(&ElfFile::open(ld).ok()?);
    if !defined.contains("__libc_start_main") {
        return None;
    }
    let agent = ElfFile::parse(AGENT_SO.to_vec()).expect("build.rs built an ELF file");
    let (_, needed) = dynamic_names(&agent);
    let missing: Vec<&str> = needed
        .iter()
        .map(String::as_str)
        .filter(|n| !defined.contains(*n))
        .collect();
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "{} runs with {}, a C library that is not glibc: memleak's agent needs {} from glibc, \
         which it lacks",
        exe.display(),
        ld.display(),
        missing.join(", ")
    ))
}

/// The names `.dynsym` defines, and those it needs (undefined and not
/// weak: ld.so refuses to start a program without them).
fn dynamic_names(elf: &ElfFile) -> (HashSet<String>, Vec<String>) {
    const STB_WEAK: u8 = 2;
    let (mut defined, mut needed) = (HashSet::new(), Vec::new());
    let (Some(symbols), Some(strings)) = (elf.section(".dynsym"), elf.section(".dynstr")) else {
        return (defined, needed);
    };
    // Elf64_Sym: st_name (4 bytes), st_info, st_other, st_shndx (2), ...;
    // 24 bytes. The first is the null symbol.
    for sym in symbols.bytes.chunks_exact(24).skip(1) {
        let at = u32::from_le_bytes(sym[..4].try_into().expect("4 bytes")) as usize;
        let Some(name) = strings.bytes.get(at..) else {
            continue;
        };
        let name = name.split(|&b| b == 0).next().unwrap_or_default();
        let name = String::from_utf8_lossy(name).into_owned();
        let shndx = u16::from_le_bytes([sym[6], sym[7]]);
        if shndx != 0 {
            defined.insert(name);
        } else if sym[4] >> 4 != STB_WEAK && !name.is_empty() {
            needed.push(name);
        }
    }
    (defined, needed)
}

/// Writes unwind tables to the agent and to the probe: a process that
/// runs without the agent after an exec is recorded by the probes, which
/// walk its stacks with the same tables.
pub struct BothTables<A, B>(pub A, pub B);

impl<A: UnwindSink, B: UnwindSink> UnwindSink for BothTables<A, B> {
    fn row_capacity(&self) -> u32 {
        self.0.row_capacity().min(self.1.row_capacity())
    }

    fn write_rows(&mut self, first: u32, rows: &[Row]) -> std::io::Result<()> {
        self.0.write_rows(first, rows)?;
        self.1.write_rows(first, rows)
    }

    fn set_process(&mut self, pid: u32, table: &ProcTable) -> std::io::Result<()> {
        self.0.set_process(pid, table)?;
        self.1.set_process(pid, table)
    }

    fn remove_process(&mut self, pid: u32) -> std::io::Result<()> {
        self.0.remove_process(pid)?;
        self.1.remove_process(pid)
    }
}

/// Whether `pid`, its objects loaded, runs without the agent: it is
/// statically linked, or ld.so loaded its initial objects and the agent
/// is not among them (after an exec that dropped it from LD_PRELOAD).
/// False while ld.so has not finished loading them.
pub fn runs_without_agent(pid: u32) -> bool {
    use memleak_recorder::providers::{search_order, SearchOrder};
    match search_order(pid) {
        Ok(SearchOrder::Static(_)) => true,
        Ok(SearchOrder::Dynamic(_)) => !agent_mapped(pid),
        _ => false,
    }
}

/// Whether `pid`, a dynamically linked program just executed (ld.so has
/// not loaded its objects yet), will run without the agent: LD_PRELOAD in
/// the environment it was given does not name the agent's `entry` (a raw
/// execve system call, which the agent does not see, dropped it), or it
/// runs in secure-execution mode (setuid), where ld.so ignores it.
pub fn agent_left_out(pid: u32, entry: &str) -> bool {
    use memleak_recorder::providers::{search_order, secure_exec, SearchOrder};
    let loading = matches!(
        search_order(pid),
        Ok(SearchOrder::Loading { .. } | SearchOrder::NotReady)
    );
    if !loading || agent_mapped(pid) {
        return false;
    }
    if secure_exec(pid) {
        return true;
    }
    // The environment as executed (the agent edits it in place once it
    // runs; it is not mapped yet).
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    !env.split(|&b| b == 0)
        .filter_map(|v| v.strip_prefix(b"LD_PRELOAD="))
        .flat_map(|v| v.split(|&b| b == b':' || b == b' '))
        .any(|e| e == entry.as_bytes())
}

fn agent_mapped(pid: u32) -> bool {
    memleak_recorder::procmaps::read_maps(pid).is_ok_and(|maps| {
        maps.iter()
            .any(|m| m.path.as_deref().is_some_and(|p| p.contains(AGENT_NAME)))
    })
}

/// The name of the agent's memfd, as the maps show it.
const AGENT_NAME: &str = "/memfd:memleak-agent.so";

/// The agent of one recording: its code and the shared memory.
pub struct Agent {
    /// The agent's code, for LD_PRELOAD; None once injected.
    so: Option<OwnedFd>,
    pub shared: Shared,
}

impl Agent {
    /// Makes the shared memory and a copy of the agent the command can
    /// load.
    pub fn new(cfg: &agent::Config) -> Result<Agent> {
        let shared = Shared::create(cfg).context("making the agent's shared memory")?;
        // Named after the shared memory's descriptor (agent/agent.h,
        // MLA_NAME): the agent finds it from the path it was loaded by,
        // and the command's environment gets no variable of ours.
        let name = std::ffi::CString::new(format!("memleak-agent.so.{}", shared.raw_fd()))
            .expect("no NUL in a number");
        // SAFETY: a name and flags; the fd returned is ours.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            anyhow::bail!(
                "memfd_create: {}",
                crate::output::describe(&std::io::Error::last_os_error())
            );
        }
        // SAFETY: a fresh fd, owned from here.
        let so = unsafe { OwnedFd::from_raw_fd(fd) };
        std::fs::File::from(so.try_clone()?)
            .write_all(AGENT_SO)
            .context("writing the agent")?;
        Ok(Agent {
            so: Some(so),
            shared,
        })
    }

    /// The agent injected into a running process, with this memory.
    pub fn injected(shared: Shared) -> Agent {
        Agent { so: None, shared }
    }

    /// The agent's image, for an injection.
    pub fn image() -> &'static [u8] {
        AGENT_SO
    }

    /// The environment the command gets: the agent first in LD_PRELOAD
    /// (before the user's: a preloaded allocator is then what the agent's
    /// calls reach). The agent takes itself out again at start.
    pub fn env(&self) -> Vec<(String, String)> {
        let Some(mut preload) = self.preload_entry() else {
            return Vec::new();
        };
        if let Some(user) = std::env::var_os("LD_PRELOAD") {
            let user = user.to_string_lossy();
            if !user.trim().is_empty() {
                preload = format!("{preload}:{user}");
            }
        }
        vec![("LD_PRELOAD".to_string(), preload)]
    }

    /// The agent's entry in LD_PRELOAD; None once injected.
    pub fn preload_entry(&self) -> Option<String> {
        let so = self.so.as_ref()?;
        Some(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            so.as_raw_fd()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::AGENT_SO;
    use memleak_recorder::elf::ElfFile;

    /// The agent needs no library but libc, which every process has:
    /// not libgcc_s, which a container or a musl system may lack (it
    /// failed to load there: `__gcc_personality_v0: symbol not found`).
    #[test]
    fn the_agent_needs_libc_alone() {
        let elf = ElfFile::parse(AGENT_SO.to_vec()).unwrap();
        let dynamic = elf.section(".dynamic").unwrap().bytes;
        let strings = elf.section(".dynstr").unwrap().bytes;
        let needed: Vec<String> = dynamic
            .chunks_exact(16)
            .map(|e| {
                let word = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().unwrap());
                (word(0), word(8) as usize)
            })
            .take_while(|&(tag, _)| tag != 0)
            .filter(|&(tag, _)| tag == 1) // DT_NEEDED
            .map(|(_, at)| {
                let end = strings[at..].iter().position(|&b| b == 0).unwrap();
                String::from_utf8_lossy(&strings[at..at + end]).into_owned()
            })
            .collect();
        assert_eq!(needed, ["libc.so.6"]);
    }

    /// The agent makes its system calls through agent/sys.h, whose
    /// functions take typed arguments: never through glibc's variadic
    /// syscall(), where an int argument leaves the upper half of a 64-bit
    /// register or stack slot undefined (an mmap offset of 0 mapped the
    /// ring past the end of its file, and killed two servers with SIGBUS).
    #[test]
    fn the_agent_makes_no_untyped_system_call() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("agent");
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n == "sys.h")
                || !path.extension().is_some_and(|e| e == "c" || e == "h")
            {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            for (i, line) in source.lines().enumerate() {
                let code = line.split("/*").next().unwrap_or("");
                assert!(
                    !code.contains("syscall(SYS_") && !code.contains("syscall(__NR"),
                    "{}:{}: a variadic syscall(): use agent/sys.h\n{line}",
                    path.display(),
                    i + 1
                );
            }
            checked += 1;
        }
        assert!(checked >= 2, "no agent sources in {}", dir.display());
    }
}
