//! `memleak record`'s arguments: what `session` runs and `targets` reads,
//! apart from both so neither imports the other.

use std::path::PathBuf;
use std::time::Duration;

use memleak_recorder::unwind::WalkMode;

use super::capture::Capture;
use crate::units::{format_size, parse_duration, parse_positive_duration, parse_size};

/// Arguments of `memleak record`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  memleak record -p 1234 -o trace.parquet\n  memleak record -o trace.parquet -- ./server --port 80\n  memleak record -c \"./a.out arg\" -o trace.parquet"
)]
pub struct RecordArgs {
    /// How allocator calls are captured: memleak's agent inside a
    /// command it starts (preload: LD_PRELOAD, no kernel trap per call, a
    /// twentieth of the probes' cost), kernel uprobes (bpf: any process,
    /// -p, static and setuid programs, --kernel), or preload wherever it
    /// can work and bpf elsewhere (auto).
    #[arg(long, value_enum, default_value = "auto")]
    pub capture: Capture,
    /// Trace processes by pid (comma-separated or repeated).
    #[arg(short, long, value_delimiter = ',')]
    pub pid: Vec<u32>,
    /// Run this command line under the probes (bcc style; split on spaces).
    #[arg(short, long, conflicts_with = "pid")]
    pub command: Option<String>,
    /// Output trace directory.
    #[arg(short, long, default_value = "trace.parquet")]
    pub output: PathBuf,
    /// Replace an existing output.
    #[arg(long)]
    pub force: bool,
    /// With a command: probe the system's libc and libstdc++ files
    /// themselves, shared with every other tool's probes, instead of
    /// private copies that only the command maps (see docs/accuracy.md:
    /// another recording's probes on the same file can crash a program
    /// that handles signals on a signal stack above its stack).
    #[arg(long)]
    pub shared_libraries: bool,
    /// Stop after this long (e.g. 10s, 500ms, 2m, 1.5h; a bare number is
    /// seconds). A command is sent SIGTERM then, and recorded until it exits
    /// (see --kill-after, --detach).
    #[arg(short, long, value_name = "TIME", value_parser = parse_positive_duration)]
    pub duration: Option<Duration>,
    /// With a command: SIGKILL it if it is still running this long after
    /// memleak sent it SIGTERM (--duration) or passed on a SIGINT or
    /// SIGTERM [default: 5s]. A second SIGINT or SIGTERM kills it at once.
    #[arg(long, value_name = "TIME", value_parser = parse_duration, conflicts_with = "detach")]
    pub kill_after: Option<Duration>,
    /// With a command: when recording stops early (--duration, SIGINT,
    /// SIGTERM), detach and leave the command running untraced instead of
    /// stopping it. It runs in its own process group, so Ctrl-C (and
    /// Ctrl-Z) in the terminal reach only memleak.
    #[arg(long)]
    pub detach: bool,
    /// Record only allocations of at least this size (bytes; k, M, G
    /// suffixes, binary: 1k = 1024).
    #[arg(short = 'z', long, value_name = "SIZE", default_value = "0", value_parser = parse_size)]
    pub min_size: u64,
    /// Record only allocations of at most this size (bytes; k, M, G
    /// suffixes; at least --min-size) [default: no limit].
    #[arg(short = 'Z', long, value_name = "SIZE", default_value_t = u64::MAX, hide_default_value = true, value_parser = parse_size)]
    pub max_size: u64,
    /// Allocator library to probe instead of the target's libc.
    #[arg(short = 'O', long)]
    pub object: Option<PathBuf>,
    /// Prefix of the allocator symbols (e.g. je_ for jemalloc).
    #[arg(long, default_value = "")]
    pub symbols_prefix: String,
    /// How user stacks are walked: with the objects' unwind tables
    /// (.eh_frame) and frame pointers in objects without them (auto),
    /// frame pointers only (fp: cheapest, but code built without them,
    /// such as most distribution libraries, ends the stack), or unwind
    /// tables only (dwarf).
    #[arg(long, value_enum, default_value = "auto")]
    pub unwind: Unwind,
    /// Frames captured per allocation stack, 1 to 127.
    #[arg(long, value_name = "N", default_value_t = memleak_recorder::event::MAX_FRAMES, value_parser = clap::value_parser!(u32).range(1..=i64::from(memleak_recorder::event::MAX_FRAMES)))]
    pub stack_depth: u32,
    /// Ring buffer size, 4 KiB to 1 GiB (k, M, G suffixes), rounded up to
    /// a power of two and to at least 64 KiB.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_ring_size)]
    pub ring_size: u32,
    /// Where to put entry probes: after single-stepped first instructions
    /// (auto) or always at the function entry.
    #[arg(long, value_enum, default_value = "auto")]
    pub probe_placement: Placement,
    /// Also record kernel allocations (kmalloc, kmem_cache, pages), system-wide.
    #[arg(long)]
    pub kernel: bool,
    /// Record kernel allocations triggered by this process only.
    #[arg(long)]
    pub kernel_pid: Option<u32>,
    /// With --kernel: also per-CPU allocations.
    #[arg(long)]
    pub percpu: bool,
    /// Kernel stacks off (cheaper kernel recording).
    #[arg(long)]
    pub no_kernel_stacks: bool,
    /// How often the ring buffer is drained, in milliseconds, 1 to 1000.
    #[arg(long, value_name = "MS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub poll_ms: u64,
    /// With a command: also trace the processes it forks, each under its
    /// own pid (every child is stopped until its probes are in place).
    #[arg(long)]
    pub follow_forks: bool,
    /// Benchmark floor: attach the same probes at the same places but only
    /// count hits; no events are recorded.
    #[arg(long, hide = true)]
    pub count_only: bool,
    /// With a command: no leak scan at its exit. By default the command is
    /// held at its exit while memleak reads its memory for pointers to the
    /// outstanding blocks, and each block gets a verdict like valgrind's
    /// leak check (definitely, indirectly, possibly lost, still reachable).
    #[arg(long)]
    pub no_scan: bool,
    /// With -p: scan each process for leak verdicts when the recording
    /// ends (every thread is stopped for the scan, then let go).
    #[arg(long, conflicts_with = "no_scan")]
    pub scan: bool,
    /// Keep the first N bytes (at most 4096) of each lost block in the
    /// trace: a leaked block's bytes often name its owner.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=4096))]
    pub scan_contents: u64,
    /// No status line and no summary.
    #[arg(short, long)]
    pub quiet: bool,
    /// Show probe placements and skipped functions.
    #[arg(short, long)]
    pub verbose: bool,
    /// The command to run, after `--`.
    #[arg(last = true)]
    pub argv: Vec<String>,
}

/// `--unwind`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unwind {
    Auto,
    Fp,
    Dwarf,
}

impl Unwind {
    pub fn mode(self) -> WalkMode {
        match self {
            Unwind::Auto => WalkMode::Auto,
            Unwind::Fp => WalkMode::FramePointer,
            Unwind::Dwarf => WalkMode::Dwarf,
        }
    }
}

/// Probe placement policy.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Auto,
    Entry,
}

/// Parses `--ring-size`: a size from 4 KiB to 1 GiB.
pub(crate) fn parse_ring_size(text: &str) -> Result<u32, String> {
    const MIN: u64 = 4 << 10;
    const MAX: u64 = 1 << 30;
    let n = parse_size(text)?;
    if !(MIN..=MAX).contains(&n) {
        return Err(format!(
            "{} is not in {} to {}",
            format_size(n),
            format_size(MIN),
            format_size(MAX)
        ));
    }
    Ok(n as u32)
}
