//! The options that say what a replay considers (filters, `--at`), how
//! it runs (`-j`, `-q`) and what a trace with lost events makes of its
//! exit status (`--fail-on-loss`), shared by `analyze` and `diff` so that
//! both read a trace the same way, and the checks of their values.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::ValueEnum;
use memleak_analyze::{
    suppress, AnalyzeOptions, Filter, KindScope, SortKey, Suppression, VerdictSet,
};

use crate::units::{format_duration, parse_duration_ns, parse_size};

/// Event scopes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    /// User-space allocators.
    User,
    /// Kernel allocators.
    Kernel,
    /// Heap allocator calls of processes, without mmap: the blocks
    /// valgrind counts (its figures need --no-default-suppressions too:
    /// the default suppressions take the libstdc++ pool and ld.so's
    /// blocks out, and say so).
    Heap,
    /// Memory mappings of processes (mmap, munmap, mremap).
    Mmap,
    /// Everything: processes' and the kernel's.
    All,
}

/// The help's heading of the options that select what a report counts.
const FILTERS: &str = "Filters and evaluation time";

/// Filters, evaluation time and workers of a replay.
#[derive(clap::Args, Clone, Debug)]
pub struct SelectArgs {
    /// Evaluate the state and ages at this time since the recording
    /// started (e.g. 30s, 1.5m; a bare number is seconds) instead of at
    /// its end; at most the recording's length. `peak`: at the peak of
    /// the live total (with --pid, of the selected process).
    #[arg(help_heading = FILTERS, long, value_name = "TIME|peak", value_parser = parse_at)]
    pub at: Option<AtArg>,
    /// Only these processes (repeat or separate with commas).
    #[arg(help_heading = FILTERS, short = 'p', long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Only outstanding allocations at least this old (e.g. 5s, 500ms;
    /// a bare number is seconds, not bcc's milliseconds).
    #[arg(help_heading = FILTERS, long, value_name = "AGE", value_parser = parse_age)]
    pub older_than: Option<Age>,
    /// Only allocations of at least this size (bytes; k, M, G suffixes,
    /// binary: 1k = 1024).
    #[arg(help_heading = FILTERS, long, value_name = "SIZE", value_parser = parse_size)]
    pub min_size: Option<u64>,
    /// Only allocations of at most this size (bytes; k, M, G suffixes;
    /// at least --min-size).
    #[arg(help_heading = FILTERS, long, value_name = "SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// Only allocations made at or after this time since the start.
    #[arg(help_heading = FILTERS, long, value_name = "TIME", value_parser = parse_duration_ns)]
    pub from: Option<u64>,
    /// Only allocations made before this time since the start (after
    /// --from).
    #[arg(help_heading = FILTERS, long, value_name = "TIME", value_parser = parse_duration_ns)]
    pub to: Option<u64>,
    /// Which allocations: user (processes'), kernel, heap (processes'
    /// heap blocks, what valgrind counts), mmap (processes' mappings) or
    /// all.
    #[arg(help_heading = FILTERS, long, value_enum, default_value = "all")]
    pub kind: KindArg,
    /// Only blocks of these scan verdicts, comma-separated: definitely,
    /// indirectly, possibly, reachable, unscanned, or lost (the first
    /// three). Needs a trace with a scan.
    #[arg(help_heading = FILTERS, long, value_name = "LIST", value_parser = parse_verdicts)]
    pub verdict: Option<VerdictSet>,
    /// Leave out the stacks a suppression file matches and count them
    /// apart (repeatable; the syntax is in memleak's analyzer
    /// documentation, "Suppressions").
    #[arg(help_heading = "Suppressions", long, value_name = "FILE")]
    pub suppress: Vec<PathBuf>,
    /// Do not apply the built-in suppressions of runtime holders (the
    /// libstdc++ emergency pool, glibc's thread stacks, ld.so).
    #[arg(help_heading = "Suppressions", long)]
    pub no_default_suppressions: bool,
    /// Worker threads, at least 1 (default: one per core).
    #[arg(help_heading = "Running", short = 'j', long, value_name = "N", value_parser = parse_jobs)]
    pub jobs: Option<usize>,
    /// No progress bar.
    #[arg(help_heading = "Running", short = 'q', long)]
    pub quiet: bool,
    /// Exit with status 3, after writing the report, when the recorder
    /// lost events (ring buffer full, calls not traced, ...), which makes
    /// the outstanding figures uncertain; events kept without their stack
    /// do not count.
    #[arg(help_heading = "Running", long)]
    pub fail_on_loss: bool,
}

/// Exit status of `--fail-on-loss` when events were lost.
pub const LOSS_EXIT_STATUS: u8 = 3;

/// Says on stderr, in one line, that `trace` lost events and its figures
/// are uncertain (and, as a note, how many events it kept without their
/// stack); `which` names the trace for a command that reads two. Returns
/// whether the figures are uncertain.
pub fn warn_of_losses(trace: &memleak_trace::Trace, which: Option<&str>) -> bool {
    let losses = trace.meta().counters.losses();
    let which = which.map(|w| format!("{w} trace: ")).unwrap_or_default();
    if let Some(note) = losses.stack_note() {
        say!("memleak: note: {which}{note}");
    }
    if let Some(w) = losses.warning() {
        say!("memleak: warning: {which}{w}");
    }
    losses.uncertain()
}

/// `--at`: a time, or the peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtArg {
    /// Nanoseconds since the recording started.
    Time(u64),
    /// When the live total (or the selected process's share) peaked.
    Peak,
}

fn parse_at(text: &str) -> Result<AtArg, String> {
    if text == "peak" {
        return Ok(AtArg::Peak);
    }
    parse_duration_ns(text).map(AtArg::Time)
}

/// `--older-than`: an age, as typed and in nanoseconds. A bare number is
/// seconds, where bcc's `-o` took milliseconds: the warning of an age
/// longer than the recording says which unit was assumed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Age {
    /// Nanoseconds.
    pub ns: u64,
    /// As typed.
    pub text: String,
}

impl Age {
    /// Typed as a bare number (seconds).
    fn bare(&self) -> bool {
        self.text.bytes().all(|c| c.is_ascii_digit() || c == b'.')
    }
}

fn parse_age(text: &str) -> Result<Age, String> {
    let ns = parse_duration_ns(text)?;
    Ok(Age {
        ns,
        text: text.trim().to_string(),
    })
}

fn parse_verdicts(text: &str) -> Result<VerdictSet, String> {
    VerdictSet::parse(text)
}

fn parse_jobs(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("at least 1 worker thread is needed".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

impl SelectArgs {
    /// The exit status of a command whose report is written: 3 with
    /// `--fail-on-loss` when a trace's figures are uncertain.
    pub fn exit_status(&self, uncertain: bool) -> ExitCode {
        if self.fail_on_loss && uncertain {
            ExitCode::from(LOSS_EXIT_STATUS)
        } else {
            ExitCode::SUCCESS
        }
    }

    /// Sizes the worker pool and rejects filters no allocation can match.
    /// Call once, before opening a trace.
    pub fn check(&self) -> anyhow::Result<()> {
        crate::malloc_tuning::keep_freed_memory();
        if let Some(j) = self.jobs {
            // Only fails if the pool was already built, which cannot happen here.
            let _ = memleak_analyze::replay::set_threads(j);
        }
        if let (Some(a), Some(b)) = (self.min_size, self.max_size) {
            if a > b {
                bail!("--min-size ({a}) is larger than --max-size ({b})");
            }
        }
        if let (Some(from), Some(to)) = (self.from, self.to) {
            if from >= to {
                bail!(
                    "--from ({}) is not before --to ({}): no allocation can match",
                    format_duration(Duration::from_nanos(from)),
                    format_duration(Duration::from_nanos(to))
                );
            }
        }
        Ok(())
    }

    /// Rejects an `--at` past the end of `trace`'s recording, and
    /// `--verdict` on a trace without a scan before the evaluation time.
    pub fn check_trace(&self, trace: &memleak_trace::Trace) -> anyhow::Result<()> {
        if let Some(v) = self.verdict {
            if let Some(s) = trace.meta().sampling {
                bail!(
                    "--verdict {}: {} is a sampled recording (--sample {}): a pointer held in an \
                     unsampled block cannot be followed, so it has no verdicts",
                    v.describe(),
                    trace.path().display(),
                    crate::units::format_size(s.mean_bytes)
                );
            }
            let scans = &trace.meta().scans;
            let ok: Vec<_> = scans.iter().filter(|s| s.error.is_none()).collect();
            if ok.is_empty() {
                bail!(
                    "--verdict {}: {} has no scan to take verdicts from (record with a scan: \
                     at exit in -- CMD mode, or --scan with -p)",
                    v.describe(),
                    trace.path().display()
                );
            }
            if let Some(AtArg::Time(at)) = self.at {
                let start = trace.meta().start_ns;
                let first = ok.iter().map(|s| s.ts_ns).min().unwrap_or(0);
                if start.saturating_add(at) < first {
                    bail!(
                        "--verdict with --at {}: the first scan is at {}, after it; verdicts apply \
                         from the time of a scan",
                        format_duration(Duration::from_nanos(at)),
                        format_duration(Duration::from_nanos(first.saturating_sub(start)))
                    );
                }
            }
        }
        if matches!(self.at, Some(AtArg::Time(_))) || self.older_than.is_some() {
            if let Some(length) = recording_length(trace)? {
                self.check_length(trace, length)?;
            }
        }
        Ok(())
    }

    /// Refuses an `--at` past `length`, the recording's, and warns of an
    /// `--older-than` longer than it: no allocation can be that old, and a
    /// report that says "0 bytes" would read as "no leak".
    fn check_length(&self, trace: &memleak_trace::Trace, length: u64) -> anyhow::Result<()> {
        if let Some(AtArg::Time(at)) = self.at {
            if at > length {
                bail!(
                    "--at {} is past the end of the recording, which is {:.3}s long",
                    format_duration(Duration::from_nanos(at)),
                    length as f64 / 1e9
                );
            }
        }
        if let Some(age) = self.older_than.as_ref().filter(|a| a.ns > length) {
            let read_as = if age.bare() {
                format!(
                    "{} (read as {} seconds: a number without a unit is seconds; write {}ms for \
                     milliseconds)",
                    age.text, age.text, age.text
                )
            } else {
                age.text.clone()
            };
            say!(
                "memleak: warning: --older-than {read_as} is longer than the recording of {}, \
                 which is {:.3}s long: no allocation is that old",
                trace.path().display(),
                length as f64 / 1e9
            );
        }
        Ok(())
    }

    /// The analysis options these arguments give, for the processes
    /// `pids` (empty: all).
    pub fn options(
        &self,
        pids: Vec<u32>,
        top: usize,
        sort: SortKey,
    ) -> anyhow::Result<AnalyzeOptions> {
        Ok(AnalyzeOptions {
            filter: Filter {
                pids,
                kind: match self.kind {
                    KindArg::User => KindScope::User,
                    KindArg::Kernel => KindScope::Kernel,
                    KindArg::Heap => KindScope::Heap,
                    KindArg::Mmap => KindScope::Mmap,
                    KindArg::All => KindScope::All,
                },
                min_size: self.min_size,
                max_size: self.max_size,
                from_ns: self.from,
                to_ns: self.to,
                older_than_ns: self.older_than.as_ref().map(|a| a.ns),
            },
            at_ns: match self.at {
                Some(AtArg::Time(t)) => Some(t),
                _ => None,
            },
            at_peak: self.at == Some(AtArg::Peak),
            top,
            sort,
            group_by_verdict: false,
            partitions: 0,
            verdicts: self.verdict.unwrap_or_default(),
            temporary_threshold_ns: None,
            suppressions: self.suppressions()?,
        })
    }

    /// The default suppressions (unless turned off), then each file's.
    fn suppressions(&self) -> anyhow::Result<Vec<Suppression>> {
        let mut out = Vec::new();
        if !self.no_default_suppressions {
            out.extend(
                suppress::parse(suppress::DEFAULT_SUPPRESSIONS, "default suppressions")
                    .map_err(anyhow::Error::msg)?,
            );
        }
        for path in &self.suppress {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
            let origin = path.display().to_string();
            out.extend(suppress::parse(&text, &origin).map_err(anyhow::Error::msg)?);
        }
        Ok(out)
    }
}

/// How long the recording ran, in nanoseconds: from the meta's start to
/// its end, or to the last event of a trace that was never finished (its
/// end is 0). None if that is unknown.
fn recording_length(trace: &memleak_trace::Trace) -> anyhow::Result<Option<u64>> {
    let meta = trace.meta();
    if meta.start_ns == 0 {
        return Ok(None);
    }
    let end = if meta.end_ns != 0 {
        meta.end_ns
    } else {
        // Rows are in time order: the last row group ends the recording.
        match trace.event_units().last() {
            Some(unit) => trace.unit_ts_range(unit)?.map_or(0, |r| r.1),
            None => return Ok(None),
        }
    };
    Ok((end > meta.start_ns).then(|| end - meta.start_ns))
}
