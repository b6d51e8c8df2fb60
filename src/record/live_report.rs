//! `record --interval TIME` (bcc's `memleak -p PID INTERVAL [COUNT]`):
//! every TIME, the top outstanding stacks on stdout, with what changed
//! since the last report and the growth so far. The figures are the
//! recorder's own running totals ([`memleak_recorder::live`]), not a
//! replay of the trace, which is written the same with or without them.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use memleak_recorder::live::{Outstanding, Totals};

use crate::units::{human_change, human_size};

/// When the next report is due, and what the last one said.
pub(super) struct LiveReport {
    interval: Duration,
    top: usize,
    /// Reports still to print (COUNT), if limited.
    remaining: Option<u64>,
    next: Instant,
    /// The recording's start on the events' clock (CLOCK_MONOTONIC ns).
    start_ns: u64,
    last_total: Totals,
    last: HashMap<u64, Totals>,
    /// Reports printed so far.
    printed: u64,
    /// `--sample`'s mean: the figures are estimates.
    sample_mean: Option<u64>,
}

impl LiveReport {
    pub(super) fn new(interval: Duration, top: usize, count: Option<u64>, start_ns: u64) -> Self {
        LiveReport {
            interval,
            top,
            remaining: count,
            next: Instant::now() + interval,
            start_ns,
            last_total: Totals::default(),
            last: HashMap::new(),
            printed: 0,
            sample_mean: None,
        }
    }

    /// Says in each report that its figures are estimates of a sampled
    /// recording (the recorder's totals are scaled already).
    pub(super) fn sampled(mut self, mean: Option<u64>) -> Self {
        self.sample_mean = mean;
        self
    }

    /// Whether COUNT reports were printed: the recording ends.
    pub(super) fn done(&self) -> bool {
        self.remaining == Some(0)
    }

    /// Whether a report is due now.
    pub(super) fn due(&self) -> bool {
        !self.done() && Instant::now() >= self.next
    }

    /// Prints a report of `now` (what was handled up to this moment).
    pub(super) fn print(&mut self, now: &Outstanding) {
        let now_ns = memleak_trace::meta::clock_ns(libc::CLOCK_MONOTONIC);
        let text = self.render(now, now_ns.saturating_sub(self.start_ns));
        let mut out = std::io::stdout().lock();
        // A reader that went away must not end the recording.
        let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        self.next += self.interval;
        if self.next < Instant::now() {
            self.next = Instant::now() + self.interval;
        }
        if let Some(n) = &mut self.remaining {
            *n -= 1;
        }
    }

    fn render(&mut self, now: &Outstanding, elapsed_ns: u64) -> String {
        let total = now.total();
        let secs = elapsed_ns as f64 / 1e9;
        let rate = if secs > 0.0 {
            total.bytes as f64 / secs
        } else {
            0.0
        };
        let mut s = format!(
            "[{}] +{secs:.2}s: {} outstanding in {} blocks ({} since the {}); \
             growth so far {}, {}/s\n",
            wall_clock(),
            human_size(total.bytes),
            total.count,
            human_change(total.bytes as i64 - self.last_total.bytes as i64),
            if self.printed == 0 {
                "start"
            } else {
                "last report"
            },
            human_change(total.bytes as i64),
            human_size(rate as u64),
        );
        if let Some(mean) = self.sample_mean {
            s += &format!(
                "  estimates: a sample of one allocation per {} allocated (--sample)\n",
                human_size(mean)
            );
        }
        let top = now.top(self.top);
        if !top.is_empty() {
            s += &format!(
                "  {:>10}  {:>8}  {:>11}  {:>7}  stack\n",
                "bytes", "blocks", "change", "+blocks"
            );
        }
        for t in &top {
            let before = self.last.get(&t.stack_id).copied().unwrap_or_default();
            let site = t.site.clone().unwrap_or_else(|| match t.stack_id {
                0 => "(no stack)".to_string(),
                id => format!("stack {id} (not symbolized yet)"),
            });
            s += &format!(
                "  {:>10}  {:>8}  {:>11}  {:>+7}  {site}\n",
                human_size(t.totals.bytes),
                t.totals.count,
                human_change(t.totals.bytes as i64 - before.bytes as i64),
                t.totals.count as i64 - before.count as i64,
            );
        }
        self.last_total = total;
        self.last = now.stacks().collect();
        self.printed += 1;
        s
    }
}

/// The local time of day, `HH:MM:SS`, as bcc prints it.
fn wall_clock() -> String {
    // SAFETY: time and localtime_r write only into the locals given.
    let tm = unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        tm
    };
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}
