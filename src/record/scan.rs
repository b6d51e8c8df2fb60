//! The leak scan of a recording: which blocks a stopped target still
//! outstands (the trace so far, replayed), the scan itself
//! (`memleak_recorder::scan`), and its rows and figures written into the
//! trace (`scan` table, `meta.json` `scans`). A scan that fails is
//! recorded with its reason; the recording is kept either way.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::Relaxed};
use std::sync::mpsc::{channel, sync_channel, Sender, SyncSender, TrySendError};
use std::sync::Arc;

use anyhow::Result;
use memleak_analyze::replay::{replay, LiveReplay, OutstandingBlock, ReplayOptions};
use memleak_analyze::Filter;
use memleak_recorder::scan::{self, Block, ScanOptions, Stopped, Totals, Verdict};
use memleak_recorder::Recorder;
use memleak_trace::events::Columns;
use memleak_trace::{ScanInfo, ScanRecord, ScanVerdict, Trace};

use crate::units::human_size;

/// The outstanding blocks of `pid` in the trace at `path` (heap blocks,
/// and the pieces of its mappings), without those its exec at
/// `exec_ts` left behind, with when each was allocated.
pub fn outstanding_blocks(path: &Path, pid: u32, exec_ts: Option<u64>) -> Result<Vec<Block>> {
    let trace = Trace::open(path)?;
    // Every process: a forked child's heap starts as its parent's.
    let opts = ReplayOptions {
        filter: Filter::default().resolve(0),
        ..ReplayOptions::default()
    };
    let replayed = replay(&trace, &opts)?;
    let parts = replayed.fold_outstanding(Vec::new, |v, o| v.extend(scanned(o, pid, exec_ts)));
    Ok(parts.into_iter().flatten().collect())
}

/// `o` as a block of the scan of `pid`: none if it is another process's,
/// or its image's before its exec at `exec_ts`.
fn scanned(o: &OutstandingBlock, pid: u32, exec_ts: Option<u64>) -> Option<Block> {
    (o.pid == Some(pid) && exec_ts.is_none_or(|e| o.ts >= e)).then_some(Block {
        addr: o.addr,
        size: o.size,
        is_mapping: o.mapping.is_some(),
    })
}

/// The outstanding blocks, followed while the recording goes: a replay
/// on its own thread ([`LiveReplay`]), fed every batch of events as the
/// writer writes it ([`Recorder::tap_events`]). A scan then asks it
/// instead of replaying the trace so far, which held the stopped process
/// for about 15 ms per million events (4 M events: 60 of the 70 ms of the
/// pause at exit, and a seventh of the whole recording's wall time).
/// The replay is the analyzer's, fed the same rows in the same order, so
/// its blocks are the ones a replay of the trace would find. It holds
/// the outstanding blocks of every process (about 40 bytes each) for the
/// recording's length.
///
/// The replay runs at a low priority ([`FOLLOWER_NICE`]): the recorder's
/// own thread and the traced program come first. The recorder never
/// waits for it: when [`BACKLOG`] batches wait, it stops sending them,
/// and the next scan has the replay catch up from the trace's files, at
/// normal priority, as the scan used to do from the start.
pub struct Follower {
    tx: SyncSender<Msg>,
    /// Batches are not sent: the replay will catch up from the files.
    behind: Arc<AtomicBool>,
    /// The replay thread's id, for its priority.
    tid: Arc<AtomicI32>,
}

/// Batches of events (64 Ki rows, about 4 MiB each) that may wait for the
/// replay.
const BACKLOG: usize = 8;

enum Msg {
    Rows(Columns),
    Blocks {
        pid: u32,
        exec_ts: Option<u64>,
        /// First the rows of this trace up to this row, from the files.
        catch_up: Option<(PathBuf, u64)>,
        reply: Sender<Result<Vec<Block>>>,
    },
}

impl Follower {
    /// Starts following the events `rec` writes from now on.
    pub fn start(rec: &mut Recorder) -> Result<Follower> {
        let (tx, rx) = sync_channel::<Msg>(BACKLOG);
        let (spare_tx, spare_rx) = channel::<Columns>();
        let tid = Arc::new(AtomicI32::new(0));
        let its_tid = tid.clone();
        std::thread::Builder::new()
            .name("memleak-replay".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                its_tid.store(unsafe { libc::gettid() }, Relaxed);
                set_nice(0, FOLLOWER_NICE);
                let filter = Filter::default().resolve(0);
                let mut live = LiveReplay::new(&filter);
                for m in rx {
                    match m {
                        Msg::Rows(c) => {
                            live.push(c.slices(c.len()));
                            let _ = spare_tx.send(c);
                        }
                        Msg::Blocks {
                            pid,
                            exec_ts,
                            catch_up,
                            reply,
                        } => {
                            let caught = match catch_up {
                                Some((path, upto)) => Trace::open(&path)
                                    .and_then(|t| live.catch_up(&t, upto))
                                    .map_err(anyhow::Error::from),
                                None => Ok(()),
                            };
                            let blocks = caught.map(|()| {
                                let parts = live.fold_outstanding(Vec::new, |v, o| {
                                    v.extend(scanned(o, pid, exec_ts))
                                });
                                parts.into_iter().flatten().collect()
                            });
                            let _ = reply.send(blocks);
                        }
                    }
                }
            })?;
        let rows = tx.clone();
        // Tests start it behind, to take the way of a replay that fell
        // behind under load.
        let behind = std::env::var_os("MEMLEAK_TEST_FOLLOW_BEHIND").is_some();
        let behind = Arc::new(AtomicBool::new(behind));
        let dropping = behind.clone();
        rec.tap_events(Box::new(move |cols: &mut Columns| {
            if dropping.load(Relaxed) {
                return;
            }
            let spare = spare_rx.try_recv().unwrap_or_default();
            let full = std::mem::replace(cols, spare);
            // A full backlog, or a replay thread that is gone (it
            // panicked): the scan catches up, or replays the trace.
            if let Err(TrySendError::Full(m) | TrySendError::Disconnected(m)) =
                rows.try_send(Msg::Rows(full))
            {
                dropping.store(true, Relaxed);
                if let Msg::Rows(c) = m {
                    *cols = c;
                }
            }
        }));
        Ok(Follower { tx, behind, tid })
    }

    /// The outstanding blocks of `pid`, as [`outstanding_blocks`] finds
    /// them, after every event `rec` handled so far. The replay works at
    /// normal priority meanwhile: the process is held for it.
    fn blocks(&self, rec: &mut Recorder, pid: u32, exec_ts: Option<u64>) -> Result<Vec<Block>> {
        rec.flush_events()?;
        // The tap runs on this thread, inside the writer: no batch can
        // be sent between the checkpoint and the end of `behind`.
        let catch_up = match self.behind.load(Relaxed) {
            true => {
                rec.checkpoint()?;
                Some((rec.trace_path().to_path_buf(), rec.events_written()))
            }
            false => None,
        };
        // 0 until the thread has started: it then takes the normal
        // priority from the start (and 0 would name this thread).
        let tid = self.tid.load(Relaxed);
        if tid != 0 {
            set_nice(tid, 0);
        }
        let (reply, answer) = channel();
        let asked = self.tx.send(Msg::Blocks {
            pid,
            exec_ts,
            catch_up,
            reply,
        });
        let blocks = match asked {
            Ok(()) => answer.recv().ok(),
            Err(_) => None,
        };
        if tid != 0 {
            set_nice(tid, FOLLOWER_NICE);
        }
        let blocks = blocks.ok_or_else(|| anyhow::anyhow!("the replay thread is gone"))?;
        // Caught up: batches go to it again. Else it catches up at the
        // next scan from where it stopped.
        if blocks.is_ok() {
            self.behind.store(false, Relaxed);
        }
        blocks
    }
}

/// The replay thread's nice value while it follows. At 10 it gets about
/// a tenth of a CPU that the program and the recorder keep busy, more
/// than the replay needs (about 15 ns an event against the recorder's
/// 100). On SCHED_IDLE it got nothing while a program's threads kept both
/// CPUs busy, and the scan at exit waited 15-60 ms for it to catch up.
const FOLLOWER_NICE: i32 = 10;

/// Sets the nice value of thread `tid` (0: the calling one). A failure
/// (raising a thread's priority takes CAP_SYS_NICE) leaves it as it was:
/// only the speed differs.
fn set_nice(tid: i32, nice: i32) {
    // SAFETY: a system call on a thread id; a stale one fails with ESRCH.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
}

fn trace_verdict(v: Verdict) -> ScanVerdict {
    match v {
        Verdict::DefinitelyLost => ScanVerdict::DefinitelyLost,
        Verdict::IndirectlyLost => ScanVerdict::IndirectlyLost,
        Verdict::PossiblyLost => ScanVerdict::PossiblyLost,
        Verdict::Reachable => ScanVerdict::Reachable,
    }
}

/// The four verdicts as the summary line says them.
fn verdict_phrases(bytes: [u64; 4], blocks: [u64; 4]) -> String {
    Verdict::ALL
        .iter()
        .enumerate()
        .map(|(k, v)| {
            let name = match v {
                Verdict::Reachable => "still reachable".to_string(),
                v => format!("{} lost", v.name()),
            };
            format!("{name} {} in {} blocks", human_size(bytes[k]), blocks[k])
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What suppressions hid, as every summary says it: "N bytes in M blocks
/// suppressed (name, ...)"; `None` when they hid nothing.
pub fn suppressed_phrase(suppressed: &[memleak_analyze::SuppressedTotals]) -> Option<String> {
    let hidden: Vec<_> = suppressed.iter().filter(|s| s.allocations > 0).collect();
    if hidden.is_empty() {
        return None;
    }
    let bytes: u64 = hidden.iter().map(|s| s.bytes).sum();
    let blocks: u64 = hidden.iter().map(|s| s.allocations).sum();
    let names: Vec<&str> = hidden.iter().map(|s| s.name.as_str()).collect();
    Some(format!(
        "{} in {blocks} blocks suppressed ({})",
        human_size(bytes),
        names.join(", ")
    ))
}

/// The closing line of a scan, with the figures `memleak analyze` shows
/// by default for the same trace: every kind, the default suppressions
/// applied and said. `line` is the line of [`summary`]; it is returned as
/// it is when it is not one (a failed scan) or the trace cannot be read.
pub fn closing_line(trace: &Path, line: &str) -> String {
    let Some(rest) = line.strip_prefix("memleak: scan of pid ") else {
        return line.to_string();
    };
    let Some((pid, rest)) = rest.split_once(": ") else {
        return line.to_string();
    };
    let (Ok(pid), Some((_, tail))) = (pid.parse::<u32>(), rest.split_once("; paused")) else {
        return line.to_string();
    };
    let figures = || -> Result<String> {
        let mut opts = memleak_analyze::report::AnalyzeOptions::default();
        opts.filter.pids = vec![pid];
        opts.suppressions = memleak_analyze::suppress::parse(
            memleak_analyze::suppress::DEFAULT_SUPPRESSIONS,
            "default suppressions",
        )
        .map_err(anyhow::Error::msg)?;
        let report = memleak_analyze::report::analyze(trace, &opts)?;
        let leak = report
            .summary
            .leak
            .ok_or_else(|| anyhow::anyhow!("no scan applies"))?;
        let t = leak.totals;
        let all = [t.definitely, t.indirectly, t.possibly, t.reachable];
        let mut s = verdict_phrases(all.map(|c| c.bytes), all.map(|c| c.allocations));
        if let Some(hidden) = suppressed_phrase(&report.summary.suppressed) {
            s += &format!("; {hidden}");
        }
        Ok(s)
    };
    match figures() {
        Ok(f) => format!("memleak: scan of pid {pid}: {f}; paused{tail}"),
        Err(_) => line.to_string(),
    }
}

/// The summary line of a scan.
pub fn summary(
    pid: u32,
    blocks: &[Block],
    verdicts: &[Verdict],
    info: &ScanInfo,
    scan_ns: u64,
) -> String {
    let t = Totals::of(blocks, verdicts);
    let mib = (info.roots_bytes + info.heap_bytes) as f64 / (1 << 20) as f64;
    let ms = info.pause_ns as f64 / 1e6;
    format!(
        "memleak: scan of pid {pid}: {}; paused {ms:.1} ms (marking {:.1} ms) for {} roots + {} heap ({:.2} ms/MiB)",
        verdict_phrases(t.bytes, t.blocks),
        scan_ns as f64 / 1e6,
        human_size(info.roots_bytes),
        human_size(info.heap_bytes),
        if mib > 0.0 { ms / mib } else { 0.0 }
    )
}

/// Scans a stopped process and writes the result into the recording;
/// lets the process go on before writing. The outstanding blocks come
/// from `follower`, or else (or if it fails) from a replay of the trace
/// so far, checkpointed first so that the replay sees every event.
/// Returns the summary line, or the error (also recorded in the trace).
pub fn scan_into(
    rec: &mut Recorder,
    follower: Option<&Follower>,
    stopped: Stopped,
    contents: usize,
) -> Result<std::result::Result<String, String>> {
    let pid = stopped.pid;
    let ts_ns = stopped.ts_ns;
    let threads = stopped.threads.len() as u32;
    let found = (|| -> Result<(Vec<Block>, scan::Outcome)> {
        let exec_ts = rec.last_exec_ts(pid);
        let followed = follower.map(|f| f.blocks(rec, pid, exec_ts));
        let blocks = match followed {
            Some(Ok(blocks)) => blocks,
            _ => {
                rec.checkpoint()?;
                outstanding_blocks(rec.trace_path(), pid, exec_ts)?
            }
        };
        let opts = ScanOptions {
            contents,
            ..ScanOptions::default()
        };
        let out = scan::scan(&stopped, &blocks, &opts)?;
        Ok((blocks, out))
    })();
    let pause = stopped.resume();
    let mut info = ScanInfo {
        pid,
        ts_ns,
        pause_ns: pause.as_nanos() as u64,
        threads,
        roots_bytes: 0,
        heap_bytes: 0,
        blocks: 0,
        error: None,
    };
    match found {
        Ok((blocks, out)) => {
            info.roots_bytes = out.stats.roots_bytes;
            info.heap_bytes = out.stats.heap_bytes;
            info.blocks = blocks.len() as u64;
            let rows: Vec<ScanRecord> = blocks
                .iter()
                .enumerate()
                .map(|(i, b)| ScanRecord {
                    ts_ns,
                    pid,
                    addr: b.addr,
                    size: b.size,
                    verdict: trace_verdict(out.verdicts[i]),
                    contents: out.contents.get(i).cloned().flatten(),
                })
                .collect();
            let line = summary(pid, &blocks, &out.verdicts, &info, out.stats.scan_ns);
            let mut line = line;
            if out.stats.unreadable_pages > 0 {
                line += &format!("; {} unreadable pages skipped", out.stats.unreadable_pages);
            }
            rec.write_scan(info, &rows)?;
            Ok(Ok(line))
        }
        Err(e) => {
            let why = format!("{e:#}");
            info.error = Some(why.clone());
            rec.write_scan(info, &[])?;
            Ok(Err(why))
        }
    }
}

/// Records a scan that could not even stop the process.
pub fn record_failure(rec: &mut Recorder, pid: u32, why: String) -> Result<()> {
    let info = ScanInfo {
        pid,
        ts_ns: scan::monotonic_ns(),
        pause_ns: 0,
        threads: 0,
        roots_bytes: 0,
        heap_bytes: 0,
        blocks: 0,
        error: Some(why),
    };
    rec.write_scan(info, &[])?;
    Ok(())
}

/// Whether a process whose main thread is at its exit stop is exiting
/// as a whole: every other thread is gone, stopped by us, or has the
/// SIGKILL of `exit_group` pending. A main thread that calls
/// `pthread_exit` leaves the others running: no scan then.
pub fn whole_process_exiting(pid: u32) -> bool {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok());
    tasks.filter(|&t| t != pid).all(|tid| {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) else {
            return true;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .unwrap_or_default()
                .to_string()
        };
        let state = field("State:");
        let kill = |v: String| {
            u64::from_str_radix(&v, 16).is_ok_and(|m| m & (1 << (libc::SIGKILL - 1)) != 0)
        };
        state.starts_with('t')
            || state.starts_with('Z')
            || state.starts_with('X')
            || kill(field("SigPnd:"))
            || kill(field("ShdPnd:"))
    })
}
