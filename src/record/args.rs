//! `memleak record`'s arguments: what `session` runs and `targets` reads,
//! apart from both so neither imports the other.

use std::path::PathBuf;
use std::time::Duration;

use memleak_recorder::unwind::WalkMode;

use super::capture::Capture;
use crate::units::{format_size, parse_duration, parse_positive_duration, parse_size};

/// Arguments of `memleak record`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  memleak record -o t.parquet -- ./server --port 80   # start it, trace it until it exits, scan it
  memleak record -p 1234 -d 30s -o t.parquet          # attach to a running process for 30 s
  memleak record -p 1234 5                            # bcc's habit: top stacks every 5 s (Ctrl-C to stop)
  memleak record -p 1234 --capture inject -d 30s     # from inside it: a twentieth of the probes' cost
  memleak analyze t.parquet                           # then: what is still allocated, by stack

Coming from bcc memleak: -o is the trace here; bcc's -o (older than) is `analyze --older-than`,
-T/--top limits the live reports, and the whole history is in the trace for `analyze`.")]
pub struct RecordArgs {
    /// How allocator calls are captured: memleak's agent inside a
    /// command it starts (preload: LD_PRELOAD, no kernel trap per call, a
    /// twentieth of the probes' cost), the agent loaded into a running
    /// process and taken out at the end (inject, with one -p), kernel
    /// uprobes (bpf: any process, -p, static and setuid programs,
    /// --kernel), or preload wherever it can work and bpf elsewhere (auto:
    /// -p stays bpf unless inject is asked for).
    #[arg(help_heading = "Target", long, value_enum, default_value = "auto")]
    pub capture: Capture,
    /// Trace processes by pid (comma-separated or repeated).
    #[arg(help_heading = "Target", short, long, value_delimiter = ',')]
    pub pid: Vec<u32>,
    /// Run this command line under the probes (bcc style; split on spaces).
    #[arg(help_heading = "Target", short, long, conflicts_with = "pid")]
    pub command: Option<String>,
    /// Stop after this long (e.g. 10s, 500ms, 2m, 1.5h; a bare number is
    /// seconds). A command is sent SIGTERM then, and recorded until it exits
    /// (see --kill-after, --detach).
    #[arg(help_heading = "Target", short, long, value_name = "TIME", value_parser = parse_positive_duration)]
    pub duration: Option<Duration>,
    /// With a command: SIGKILL it if it is still running this long after
    /// memleak sent it SIGTERM (--duration) or passed on a SIGINT or
    /// SIGTERM [default: 5s]. A second SIGINT or SIGTERM kills it at once.
    #[arg(help_heading = "Target", long, value_name = "TIME", value_parser = parse_duration, conflicts_with = "detach")]
    pub kill_after: Option<Duration>,
    /// With a command: when recording stops early (--duration, SIGINT,
    /// SIGTERM), detach and leave the command running untraced instead of
    /// stopping it. It runs in its own process group, so Ctrl-C (and
    /// Ctrl-Z) in the terminal reach only memleak.
    #[arg(long, help_heading = "Target")]
    pub detach: bool,
    /// With a command: also trace the processes it forks, each under its
    /// own pid (every child is stopped until its probes are in place).
    #[arg(long, help_heading = "Target")]
    pub follow_forks: bool,
    /// With a command: probe the system's libc and libstdc++ files
    /// themselves, shared with every other tool's probes, instead of
    /// private copies that only the command maps (another recording's
    /// probes on the same file can crash a program that handles signals
    /// on a signal stack above its stack).
    #[arg(long, help_heading = "What to record")]
    pub shared_libraries: bool,
    /// Record only allocations of at least this size (bytes; k, M, G
    /// suffixes, binary: 1k = 1024).
    #[arg(help_heading = "What to record", short = 'z', long, value_name = "SIZE", default_value = "0", value_parser = parse_size)]
    pub min_size: u64,
    /// Record only allocations of at most this size (bytes; k, M, G
    /// suffixes; at least --min-size) [default: no limit].
    #[arg(help_heading = "What to record", short = 'Z', long, value_name = "SIZE", default_value_t = u64::MAX, hide_default_value = true, value_parser = parse_size)]
    pub max_size: u64,
    /// Record a sample of the heap allocations instead of every one: on
    /// average one per SIZE bytes allocated, byte-weighted (an allocation
    /// of s bytes is recorded with probability 1-exp(-s/SIZE)), as
    /// tcmalloc's and jemalloc's heap profilers do. An allocation not
    /// sampled costs the agent a subtraction and a branch; the reports
    /// scale what was recorded into estimates and say so. Needs the agent
    /// (a command memleak starts: --capture preload or auto; -p with
    /// --capture inject), and leaves out the leak scan at exit. SIZE from 1k to 1G, e.g. `--sample 512k`.
    #[arg(help_heading = "What to record", long, value_name = "SIZE", value_parser = parse_sample)]
    pub sample: Option<u64>,
    /// Allocator library to probe instead of the target's libc.
    #[arg(help_heading = "What to record", short = 'O', long)]
    pub object: Option<PathBuf>,
    /// Prefix of the allocator symbols (e.g. je_ for jemalloc).
    #[arg(help_heading = "What to record", long, default_value = "")]
    pub symbols_prefix: String,
    /// Where to put entry probes: after single-stepped first instructions
    /// (auto) or always at the function entry.
    #[arg(
        help_heading = "What to record",
        long,
        value_enum,
        default_value = "auto"
    )]
    pub probe_placement: Placement,
    /// How user stacks are walked: with the objects' unwind tables
    /// (.eh_frame) and frame pointers in objects without them (auto),
    /// frame pointers only (fp: cheapest, but code built without them,
    /// such as most distribution libraries, ends the stack), or unwind
    /// tables only (dwarf).
    #[arg(help_heading = "Stacks", long, value_enum, default_value = "auto")]
    pub unwind: Unwind,
    /// Frames captured per allocation stack, 1 to 127.
    #[arg(help_heading = "Stacks", long, value_name = "N", default_value_t = memleak_recorder::event::MAX_FRAMES, value_parser = clap::value_parser!(u32).range(1..=i64::from(memleak_recorder::event::MAX_FRAMES)))]
    pub stack_depth: u32,
    /// Also record kernel allocations (kmalloc, kmem_cache, pages), system-wide.
    #[arg(long, help_heading = "Kernel")]
    pub kernel: bool,
    /// Record kernel allocations triggered by this process only.
    #[arg(long, help_heading = "Kernel")]
    pub kernel_pid: Option<u32>,
    /// With --kernel: also per-CPU allocations.
    #[arg(long, help_heading = "Kernel")]
    pub percpu: bool,
    /// Kernel stacks off (cheaper kernel recording).
    #[arg(long, help_heading = "Kernel")]
    pub no_kernel_stacks: bool,
    /// With a command: no leak scan at its exit. By default the command is
    /// held at its exit while memleak reads its memory for pointers to the
    /// outstanding blocks, and each block gets a verdict like valgrind's
    /// leak check (definitely, indirectly, possibly lost, still reachable).
    #[arg(long, help_heading = "Scan")]
    pub no_scan: bool,
    /// With -p: scan each process for leak verdicts when the recording
    /// ends (every thread is stopped for the scan, then let go).
    #[arg(help_heading = "Scan", long, conflicts_with = "no_scan")]
    pub scan: bool,
    /// Keep the first N bytes (at most 4096) of each lost block in the
    /// trace: a leaked block's bytes often name its owner.
    #[arg(help_heading = "Scan", long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=4096))]
    pub scan_contents: u64,
    /// Print the top outstanding stacks every TIME while recording
    /// (function, file:line, bytes, blocks, change since the last print)
    /// and the growth so far, as bcc memleak does; the trace is the same
    /// without it.
    #[arg(long, value_name = "TIME", value_parser = parse_positive_duration, help_heading = "Live reports")]
    pub interval: Option<Duration>,
    /// Stacks in each live report (0: all) [default: 10].
    #[arg(short = 'T', long, value_name = "N", help_heading = "Live reports")]
    pub top: Option<usize>,
    /// bcc's `memleak -p PID INTERVAL [COUNT]`: --interval INTERVAL.
    #[arg(value_name = "INTERVAL", value_parser = parse_positive_duration, conflicts_with = "interval", help_heading = "Live reports", display_order = 1000)]
    pub interval_arg: Option<Duration>,
    /// With INTERVAL: stop after COUNT reports.
    #[arg(value_name = "COUNT", requires = "interval_arg", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Live reports", display_order = 1001)]
    pub count: Option<u64>,
    /// Output trace directory.
    #[arg(help_heading = "Output", short, long, default_value = "trace.parquet")]
    pub output: PathBuf,
    /// Write the trace into a fleet dataset instead of -o: a new directory
    /// ROOT/host=HOST/trace=START-PID/, which `memleak analyze ROOT` and
    /// `memleak sql ROOT` read with every other host's.
    #[arg(
        long,
        help_heading = "Output",
        value_name = "ROOT",
        conflicts_with = "output"
    )]
    pub dataset: Option<PathBuf>,
    /// Replace an existing output.
    #[arg(long, help_heading = "Output")]
    pub force: bool,
    /// Ring buffer size, 4 KiB to 1 GiB (k, M, G suffixes), rounded up to
    /// a power of two and to at least 64 KiB.
    #[arg(help_heading = "Output", long, value_name = "SIZE", default_value = "64M", value_parser = parse_ring_size)]
    pub ring_size: u32,
    /// How often the ring buffer is drained, in milliseconds, 1 to 1000.
    #[arg(help_heading = "Output", long, value_name = "MS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub poll_ms: u64,
    /// No status line and no summary.
    #[arg(help_heading = "Output", short, long)]
    pub quiet: bool,
    /// Show probe placements and skipped functions.
    #[arg(help_heading = "Output", short, long)]
    pub verbose: bool,
    /// Benchmark floor: attach the same probes at the same places but only
    /// count hits; no events are recorded.
    #[arg(long, hide = true)]
    pub count_only: bool,
    /// The command to run, after `--`.
    #[arg(last = true)]
    pub argv: Vec<String>,
}

impl RecordArgs {
    /// How often a live report is printed: --interval, or bcc's
    /// positional INTERVAL.
    pub fn interval(&self) -> Option<Duration> {
        self.interval.or(self.interval_arg)
    }
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

/// Parses `--sample`: a mean from 1 KiB to 1 GiB.
pub(crate) fn parse_sample(text: &str) -> Result<u64, String> {
    size_within(text, 1 << 10, 1 << 30)
}

/// Parses `--ring-size`: a size from 4 KiB to 1 GiB.
pub(crate) fn parse_ring_size(text: &str) -> Result<u32, String> {
    size_within(text, 4 << 10, 1 << 30).map(|n| n as u32)
}

/// A size from `min` to `max`.
fn size_within(text: &str, min: u64, max: u64) -> Result<u64, String> {
    let n = parse_size(text)?;
    if !(min..=max).contains(&n) {
        return Err(format!(
            "{} is not in {} to {}",
            format_size(n),
            format_size(min),
            format_size(max)
        ));
    }
    Ok(n)
}
