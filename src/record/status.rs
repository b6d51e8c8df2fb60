//! The status line on stderr while recording: elapsed time (of
//! `--duration`), events and their rate, what is outstanding, losses.
//!
//! Redrawn in place every second when the terminal is memleak's alone.
//! When a target writes to the same terminal, a line redrawn in place
//! would run into its output (`…0 lostRESULT…`, or the line erased under
//! it), so the status is then a whole line of its own every few seconds,
//! started on a fresh line: after output that did not end its line, the
//! status (and the summary at the end) go to the next one ([`fresh_line`]).

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use memleak_recorder::Recorder;

use crate::units::{format_duration, human_size};

/// How often the line is redrawn in place.
const REDRAW: Duration = Duration::from_secs(1);
/// How often a whole status line is written when the terminal is shared.
const SHARED_EVERY: Duration = Duration::from_secs(5);
/// What the probes cost the traced threads per event: a uprobe trap on
/// the allocator's entry and one on its return, 2.6 us of thread CPU per
/// malloc+free pair here (docs/benchmarks.md, "Recording overhead").
const PROBE_NS_PER_EVENT: f64 = 1300.0;
/// The share of a CPU from which the status line names the cheaper
/// captures.
const COSTLY_SHARE: f64 = 0.10;

/// The probes' estimated cost at `rate` events per second, as a share of
/// one CPU, said when it is large: with the captures that avoid it.
pub(super) fn probe_cost_hint(rate: f64) -> Option<String> {
    let share = rate * PROBE_NS_PER_EVENT / 1e9;
    (share >= COSTLY_SHARE).then(|| {
        format!(
            "probes ~{:.0}% of a CPU in the target: --capture inject (and --sample) cost less",
            share * 100.0
        )
    })
}

/// The live status line.
pub(super) struct Status {
    enabled: bool,
    /// A target writes to our terminal: whole lines, never redrawn.
    shared: bool,
    /// Something is drawn on the current line.
    drawn: bool,
    started: Instant,
    duration: Option<Duration>,
    last: Instant,
    last_events: u64,
    /// The capture is the probes: their cost is estimated.
    probes: bool,
}

impl Status {
    pub(super) fn new(
        enabled: bool,
        duration: Option<Duration>,
        pids: &[u32],
        probes: bool,
    ) -> Self {
        Status {
            enabled,
            shared: enabled && pids.iter().any(|&p| writes_to_our_terminal(p)),
            drawn: false,
            started: Instant::now(),
            duration,
            last: Instant::now(),
            last_events: 0,
            probes,
        }
    }

    pub(super) fn update(&mut self, rec: &Recorder, lost: u64) {
        let every = if self.shared { SHARED_EVERY } else { REDRAW };
        if !self.enabled || self.last.elapsed() < every {
            return;
        }
        let s = rec.stats();
        let rate = (s.events - self.last_events) as f64 / self.last.elapsed().as_secs_f64();
        let elapsed = self.started.elapsed().as_secs();
        let of = self
            .duration
            .map(|d| format!(" of {}", format_duration(d)))
            .unwrap_or_default();
        let mut line = format!(
            "memleak: {elapsed}s{of}: {} events ({:.0}/s), {} outstanding, {lost} lost",
            s.events,
            rate,
            human_size(s.outstanding_bytes),
        );
        if let Some(hint) = self.probes.then(|| probe_cost_hint(rate)).flatten() {
            line = format!("{line}; {hint}");
        }
        if self.shared {
            fresh_line();
            say!("{line}");
        } else {
            say_inline!("\r\x1b[K{line}");
            let _ = std::io::stderr().flush();
            self.drawn = true;
        }
        self.last = Instant::now();
        self.last_events = s.events;
    }

    /// Before the closing lines: the status line taken off, or on a
    /// shared terminal, a fresh line to start on.
    pub(super) fn finish(&mut self) {
        if self.shared {
            fresh_line();
        }
        self.clear();
    }

    /// Takes the line off the terminal before something else is printed.
    pub(super) fn clear(&mut self) {
        if self.drawn {
            say_inline!("\r\x1b[K");
            let _ = std::io::stderr().flush();
            self.drawn = false;
        }
    }
}

/// Moves to the start of a fresh line unless the cursor is at the start
/// of one already, without knowing which (zsh's PROMPT_SP): a line's
/// width of spaces, then a carriage return. At column 0 they fill the
/// line and the cursor stays on it (terminals wrap only at the next
/// character), and the return and erase leave it as it was; after a
/// partial line they wrap to the next line, which is erased.
fn fresh_line() {
    // SAFETY: TIOCGWINSZ fills the winsize struct.
    let cols = unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        if libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) == 0 {
            ws.ws_col as usize
        } else {
            0
        }
    };
    if cols == 0 {
        say_inline!("\n");
    } else {
        say_inline!("{}\r\x1b[K", " ".repeat(cols));
    }
    let _ = std::io::stderr().flush();
}

/// Whether process `pid`'s stdout or stderr is the terminal our stderr is.
fn writes_to_our_terminal(pid: u32) -> bool {
    let Ok(ours) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    [1, 2].iter().any(|fd| {
        std::fs::metadata(format!("/proc/{pid}/fd/{fd}")).is_ok_and(|m| {
            m.rdev() == ours.rdev() && m.dev() == ours.dev() && m.ino() == ours.ino()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::probe_cost_hint;

    #[test]
    fn the_probes_cost_is_said_from_a_tenth_of_a_cpu() {
        // 50,000 events/s: 6.5 % of a CPU, not said.
        assert_eq!(probe_cost_hint(50_000.0), None);
        // 400,000 events/s: 52 %.
        let hint = probe_cost_hint(400_000.0).unwrap();
        assert!(hint.starts_with("probes ~52% of a CPU"), "{hint}");
        assert!(hint.contains("--capture inject") && hint.contains("--sample"));
    }
}
