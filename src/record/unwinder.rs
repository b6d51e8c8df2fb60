//! The probe's unwind tables, built and written on a thread of their own.
//!
//! Building an object's rows takes milliseconds (python3's ~10 ms, cold),
//! too long for the thread that drains the ring buffer. Where a process
//! must have its table before it runs on (the command at its exec stop,
//! at ld.so's stops, a followed fork held stopped) the caller waits for
//! the answer; refreshes asked for by the events (a stack that ended at
//! an address the table does not know, an exec) are queued, merged and
//! rate-limited per process.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memleak_recorder::procmaps::gone;
use memleak_recorder::unwind::{TablesStats, UnwindSink, UnwindTables};

/// Where tables are written: the probe's maps, or the agent's memory.
pub type Sink = Box<dyn UnwindSink + Send>;

/// A process's table is refreshed at most this often on the events'
/// account: a JIT or a corrupt stack can end walks at unknown addresses
/// without end.
const REFRESH_MIN_INTERVAL: Duration = Duration::from_millis(20);
/// How long a caller waits for a table it needs before the process runs.
const WAIT_LIMIT: Duration = Duration::from_secs(10);

enum Request {
    /// Build the rows of objects about to be mapped (before the probes
    /// exist, while the BPF program loads).
    Prefetch(Vec<PathBuf>),
    /// Where tables are written from now on; what was written to the
    /// previous sink is written to this one first.
    Sink(Sink),
    /// Rebuild a process's table; answer when done if asked to.
    Track(u32, Option<SyncSender<()>>),
    /// Rebuild it soon (rate-limited).
    Refresh(u32),
    /// The process exited.
    Forget(u32),
}

/// The table-building thread.
pub struct Unwinder {
    tx: Option<Sender<Request>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Mutex<Shared>>,
}

#[derive(Default)]
struct Shared {
    stats: TablesStats,
    /// The first failure to write a table, for the summary.
    error: Option<String>,
}

impl Unwinder {
    /// Starts the thread.
    pub fn start() -> Unwinder {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("memleak-unwind".into())
            .spawn(move || serve(rx, s))
            .expect("spawning the unwind-table thread");
        Unwinder {
            tx: Some(tx),
            thread: Some(thread),
            shared,
        }
    }

    fn send(&self, r: Request) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(r);
        }
    }

    /// Builds the rows of these objects ahead of need.
    pub fn prefetch(&self, paths: Vec<PathBuf>) {
        self.send(Request::Prefetch(paths));
    }

    /// Hands over where tables are written (see [`Request::Sink`]).
    pub fn set_sink(&self, sink: Sink) {
        self.send(Request::Sink(sink));
    }

    /// Rebuilds `pid`'s table now, and returns once it is written.
    pub fn track(&self, pid: u32) {
        let (done, wait) = mpsc::sync_channel(1);
        self.send(Request::Track(pid, Some(done)));
        let _ = wait.recv_timeout(WAIT_LIMIT);
    }

    /// Rebuilds `pid`'s table soon.
    pub fn refresh(&self, pid: u32) {
        self.send(Request::Refresh(pid));
    }

    /// Drops an exited process's table.
    pub fn forget(&self, pid: u32) {
        self.send(Request::Forget(pid));
    }

    /// What the tables hold so far.
    pub fn stats(&self) -> TablesStats {
        self.shared.lock().map(|s| s.stats).unwrap_or_default()
    }

    /// Stops the thread; returns the first error it met, if any.
    pub fn finish(mut self) -> Option<String> {
        self.stop();
        self.shared.lock().ok().and_then(|s| s.error.clone())
    }

    fn stop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Unwinder {
    fn drop(&mut self) {
        self.stop();
    }
}

struct State {
    tables: UnwindTables,
    sink: Option<Sink>,
    /// When each process's table was last rebuilt.
    last: HashMap<u32, Instant>,
    /// Refreshes waiting for their turn.
    due: HashMap<u32, Instant>,
    error: Option<String>,
}

impl State {
    fn track(&mut self, pid: u32) {
        self.last.insert(pid, Instant::now());
        self.due.remove(&pid);
        let Some(sink) = self.sink.as_mut() else {
            return;
        };
        if let Err(e) = self.tables.track(pid, &mut **sink) {
            // A process that is gone has no table to keep.
            if !gone(pid) && self.error.is_none() {
                self.error = Some(format!("unwind table of process {pid}: {e}"));
            }
        }
    }

    fn handle(&mut self, req: Request) {
        match req {
            Request::Prefetch(paths) => self.tables.prefetch(&paths),
            Request::Sink(mut s) => {
                // A sink that replaces another starts with what it had.
                if let Err(e) = self.tables.rewrite(&mut *s) {
                    self.error
                        .get_or_insert_with(|| format!("unwind tables: {e}"));
                }
                self.sink = Some(s);
            }
            Request::Track(pid, done) => {
                self.track(pid);
                if let Some(done) = done {
                    let _ = done.send(());
                }
            }
            Request::Refresh(pid) => {
                let at = self
                    .last
                    .get(&pid)
                    .map_or_else(Instant::now, |t| *t + REFRESH_MIN_INTERVAL);
                self.due.entry(pid).or_insert(at);
            }
            Request::Forget(pid) => {
                // Only if it is really gone: the pid may already be a new
                // traced process's.
                self.due.remove(&pid);
                self.last.remove(&pid);
                if let (true, Some(sink)) = (gone(pid), self.sink.as_mut()) {
                    let _ = self.tables.forget(pid, &mut **sink);
                }
            }
        }
    }

    fn run_due(&mut self) {
        let now = Instant::now();
        let ready: Vec<u32> = self
            .due
            .iter()
            .filter(|(_, &at)| at <= now)
            .map(|(&p, _)| p)
            .collect();
        for pid in ready {
            self.track(pid);
        }
    }
}

fn serve(rx: Receiver<Request>, shared: Arc<Mutex<Shared>>) {
    let mut st = State {
        tables: UnwindTables::default(),
        sink: None,
        last: HashMap::new(),
        due: HashMap::new(),
        error: None,
    };
    loop {
        let req = match st.due.values().min().copied() {
            Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(r) => Some(r),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            },
            None => match rx.recv() {
                Ok(r) => Some(r),
                Err(_) => break,
            },
        };
        if let Some(req) = req {
            st.handle(req);
        }
        st.run_due();
        if let Ok(mut s) = shared.lock() {
            s.stats = st.tables.stats();
            if s.error.is_none() {
                s.error = st.error.clone();
            }
        }
    }
}
