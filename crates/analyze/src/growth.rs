//! Growth over time: outstanding bytes sampled over a fixed number of
//! windows, per stack and in total, and a verdict per stack telling a
//! steady leak from a cache that stopped growing and from memory that was
//! freed late.
//!
//! The samples are taken during replay (`replay/samples.rs`): each
//! partition keeps every stack's outstanding bytes, among the allocations
//! the filters select, and copies them at each window's end. The windows
//! ([`WINDOWS`] of them) span the trace from its start to `--at`, else to
//! the last event; the last sample is the state the report shows.
//!
//! The verdict ([`Growth::classify`]), with `max` the highest sample and
//! `end` the last:
//! * [`Verdict::Transient`]: `end` ≤ [`TRANSIENT_END`] × `max`;
//! * [`Verdict::Unknown`]: all samples 0, or fewer than [`MIN_SAMPLES`]
//!   from the first nonzero one to the end;
//! * [`Verdict::Growing`]: the least-squares line through the last third
//!   of those samples rises across it by at least [`GROWING_RISE`] ×
//!   `max`, or by at least [`STEADY_RISE`] × `max` while at least
//!   [`STEADY_SLOPE`] times as steep as the line through all of them (a
//!   steady leak on top of a large base), and that rise is more than
//!   noise: at least [`MIN_GROWING_ALLOCATIONS`] of the stack's
//!   allocations (of their mean size), with at least as many outstanding
//!   ([`Held`]); else [`Verdict::Unknown`], too few samples (a
//!   per-request buffer caught live at the last window's end rises by
//!   one allocation);
//! * [`Verdict::Plateau`]: the rest.
//!
//! The slope is that line's (bytes per second: the current rate), and the
//! fit 1 − RMS residual / `max`, so a flat plateau fits perfectly. The
//! rise of the last third against `max` catches leaks that started late;
//! its slope against the whole span's tells a cache that filled (steep,
//! then flat) from a slow leak on a large base. docs/json.md has the same
//! rules.

use std::cmp::Ordering;

use rayon::prelude::*;
use serde::Serialize;

use crate::replay::{GrowthPlan, GrowthSamples};

/// How a stack's outstanding bytes evolved over the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Kept rising to the end: a leak.
    Growing,
    /// Rose, then stayed flat: a cache or a pool.
    Plateau,
    /// Returned to about zero: held for a while, then freed.
    Transient,
    /// Too little to tell (too few samples): nothing outstanding at any
    /// window's end, only in the last few windows, or a rise of fewer
    /// than [`MIN_GROWING_ALLOCATIONS`] allocations.
    Unknown,
}

impl Verdict {
    /// What the verdict says, for text and HTML: its name, and for
    /// `unknown` why.
    pub fn describe(self) -> &'static str {
        match self {
            Verdict::Unknown => "unknown (too few samples)",
            v => v.name(),
        }
    }

    /// Name in text and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Growing => "growing",
            Verdict::Plateau => "plateau",
            Verdict::Transient => "transient",
            Verdict::Unknown => "unknown",
        }
    }
}

/// The growth of one stack's outstanding bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Growth {
    /// The class.
    pub verdict: Verdict,
    /// Slope of the outstanding bytes, in bytes per second.
    pub slope_bytes_per_s: f64,
    /// Fit quality, 0..=1.
    pub fit: f64,
    /// Outstanding bytes of the stack at the end of each window.
    pub samples: Vec<u64>,
}

// The floats are computed, never NaN: equality is reflexive.
impl Eq for Growth {}

/// Outstanding bytes in total over the trace, at the end of each window.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Timeline {
    /// Trace-relative start of window 0, in ns.
    pub start_ns: u64,
    /// Length of a window, in ns.
    pub window_ns: u64,
    /// Outstanding bytes (after filters) at the end of each window.
    pub total_bytes: Vec<u64>,
}

/// Windows the time from the start of the trace to the evaluation time is
/// cut into.
pub const WINDOWS: usize = 64;

/// A verdict says "returned to about zero" when the last sample is at
/// most this fraction of the highest.
pub const TRANSIENT_END: f64 = 0.10;

/// A stack is still growing when the line fitted to the last third of
/// its samples rises by at least this fraction of its highest sample
/// across that third.
pub const GROWING_RISE: f64 = 0.10;

/// A stack is still growing, too, when that line rises by at least this
/// fraction of its highest sample and at least [`STEADY_SLOPE`] times as
/// steeply as the line through all its samples: a steady leak on top of
/// a large base.
pub const STEADY_RISE: f64 = 0.02;

/// See [`STEADY_RISE`].
pub const STEADY_SLOPE: f64 = 0.5;

/// Fewer samples than this from the first nonzero one to the end say too
/// little for a trend: [`Verdict::Unknown`].
pub const MIN_SAMPLES: usize = 4;

/// A rise of fewer allocations than this (of the stack's mean size), or a
/// stack holding fewer, is no trend: one block allocated and freed again
/// and again, caught live at the end, rises by one. [`Verdict::Unknown`].
pub const MIN_GROWING_ALLOCATIONS: u64 = 2;

/// What a stack holds and allocates, which a rise must be more than the
/// noise of to say [`Verdict::Growing`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Allocations outstanding at the evaluation time.
    pub count: u64,
    /// Mean size of the stack's allocations, bytes.
    pub mean_size: u64,
}

impl Growth {
    /// Classifies `samples`, taken at the end of windows of `window_ns`,
    /// without what the stack holds (no rise is too small to count).
    pub fn classify(samples: Vec<u64>, window_ns: u64) -> Growth {
        Growth::classify_held(samples, window_ns, None)
    }

    /// [`Growth::classify`], for a stack that `held` what it says: a
    /// rise of fewer than [`MIN_GROWING_ALLOCATIONS`] of its allocations
    /// is too few samples.
    pub fn classify_held(samples: Vec<u64>, window_ns: u64, held: Option<Held>) -> Growth {
        let n = samples.len();
        let max = samples.iter().copied().max().unwrap_or(0);
        let Some(first) = samples.iter().position(|&v| v > 0) else {
            return Growth {
                verdict: Verdict::Unknown,
                slope_bytes_per_s: 0.0,
                fit: 0.0,
                samples,
            };
        };
        let span = n - first;
        // The last third of the span, at least two samples.
        let tail = (span / 3).max(2).min(span);
        let (slope, fit) = fit_line(&samples[n - tail..], window_ns, max);
        let (span_slope, _) = fit_line(&samples[first..], window_ns, max);
        let end = samples[n - 1] as f64;
        let max_f = max as f64;
        let rise = slope * (tail - 1) as f64 * window_ns as f64 / 1e9;
        let too_few = held.is_some_and(|h| {
            h.count < MIN_GROWING_ALLOCATIONS
                || rise < (MIN_GROWING_ALLOCATIONS * h.mean_size) as f64
        });
        let verdict = if end <= TRANSIENT_END * max_f {
            Verdict::Transient
        } else if span < MIN_SAMPLES {
            Verdict::Unknown
        } else if rise >= GROWING_RISE * max_f
            || (rise >= STEADY_RISE * max_f && slope >= STEADY_SLOPE * span_slope)
        {
            if too_few {
                Verdict::Unknown
            } else {
                Verdict::Growing
            }
        } else {
            Verdict::Plateau
        };
        Growth {
            verdict,
            slope_bytes_per_s: slope,
            fit,
            samples,
        }
    }
}

/// The least-squares line through `ys` taken `window_ns` apart: its slope
/// in bytes per second, and how well it fits (1 − the RMS residual over
/// `max`, in 0..=1).
fn fit_line(ys: &[u64], window_ns: u64, max: u64) -> (f64, f64) {
    let n = ys.len() as f64;
    let dt = window_ns as f64 / 1e9;
    let xs = || (0..ys.len()).map(|i| i as f64 * dt);
    let mx = xs().sum::<f64>() / n;
    let my = ys.iter().map(|&y| y as f64).sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (x, &y) in xs().zip(ys) {
        sxy += (x - mx) * (y as f64 - my);
        sxx += (x - mx) * (x - mx);
    }
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let intercept = my - slope * mx;
    let sse: f64 = xs()
        .zip(ys)
        .map(|(x, &y)| {
            let r = y as f64 - (intercept + slope * x);
            r * r
        })
        .sum();
    let fit = if max == 0 {
        0.0
    } else {
        (1.0 - (sse / n).sqrt() / max as f64).clamp(0.0, 1.0)
    };
    (slope, fit)
}

/// The verdict of each stack of `stack_ids` (in that order) from the
/// replay's `samples`, and the timeline of the total. Without `classify`
/// each stack gets its samples alone, with an unknown verdict: for a
/// merger, which classifies the samples it adds up.
pub(crate) fn classify_stacks(
    stacks: &[(u64, Held)],
    mut samples: GrowthSamples,
    plan: &GrowthPlan,
    start_ts: u64,
    classify: bool,
) -> (Vec<Growth>, Timeline) {
    let rows: Vec<(Option<Box<[u64]>>, Held)> = stacks
        .iter()
        .map(|(id, held)| (samples.rows.remove(id), *held))
        .collect();
    let growths = rows
        .into_par_iter()
        .map(|(row, held)| {
            let row = match row {
                Some(r) => r.into_vec(),
                None => vec![0; plan.windows],
            };
            if !classify {
                return Growth {
                    verdict: Verdict::Unknown,
                    slope_bytes_per_s: 0.0,
                    fit: 0.0,
                    samples: row,
                };
            }
            Growth::classify_held(row, plan.window_ns, Some(held))
        })
        .collect();
    let timeline = Timeline {
        start_ns: plan.start_ts - start_ts,
        window_ns: plan.window_ns,
        total_bytes: samples.totals,
    };
    (growths, timeline)
}

/// The order of [`SortKey::Growth`](crate::model::SortKey::Growth) between
/// two stacks, given as their verdicts and outstanding bytes: growing
/// stacks by slope (steepest first), then plateaus and unknown by
/// outstanding bytes, then transient ones by their highest sample, then
/// stacks without a verdict; `Equal` between stacks it does not tell
/// apart.
pub(crate) fn order(a: (Option<&Growth>, u64), b: (Option<&Growth>, u64)) -> Ordering {
    let rank = |g: Option<&Growth>| match g.map(|g| g.verdict) {
        Some(Verdict::Growing) => 0,
        Some(Verdict::Plateau) => 1,
        Some(Verdict::Unknown) => 2,
        Some(Verdict::Transient) => 3,
        None => 4,
    };
    let slope = |g: Option<&Growth>| g.map_or(0.0, |g| g.slope_bytes_per_s);
    let high = |g: Option<&Growth>| g.and_then(|g| g.samples.iter().copied().max()).unwrap_or(0);
    let ((ga, bytes_a), (gb, bytes_b)) = (a, b);
    rank(ga).cmp(&rank(gb)).then_with(|| match rank(ga) {
        0 => slope(gb).total_cmp(&slope(ga)).then(bytes_b.cmp(&bytes_a)),
        3 => high(gb).cmp(&high(ga)),
        _ => bytes_b.cmp(&bytes_a),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(samples: Vec<u64>) -> Growth {
        Growth::classify(samples, 10_000_000)
    }

    #[test]
    fn verdicts_follow_the_documented_rules() {
        let n = WINDOWS as u64;
        // A steady leak: 1000 bytes per 10 ms window, 100 kB/s.
        let g = verdict((1..=n).map(|i| i * 1000).collect());
        assert_eq!(g.verdict, Verdict::Growing);
        assert!((g.slope_bytes_per_s - 100_000.0).abs() < 1e-6, "{g:?}");
        assert!((g.fit - 1.0).abs() < 1e-9, "{g:?}");
        // A cache filled in the first quarter, then flat.
        let g = verdict((1..=n).map(|i| i.min(n / 4) * 1000).collect());
        assert_eq!(g.verdict, Verdict::Plateau);
        assert_eq!(g.slope_bytes_per_s, 0.0);
        // Held, then all freed: transient, and with a 5 % remainder too.
        let g = verdict((1..=n).map(|i| if i < n / 2 { 1000 } else { 0 }).collect());
        assert_eq!(g.verdict, Verdict::Transient);
        let g = verdict((1..=n).map(|i| if i < n / 2 { 1000 } else { 50 }).collect());
        assert_eq!(g.verdict, Verdict::Transient);
        // Still growing in the last third, slower: 10 % of the top rises
        // across it.
        let g = verdict((1..=n).map(|i| 10_000 + i * 60).collect());
        assert_eq!(g.verdict, Verdict::Growing, "{g:?}");
        // A slow steady leak on top of a large base: 2.5 % of the top
        // across the last third, as steep as ever.
        let g = verdict((1..=n).map(|i| 100_000 + i * 130).collect());
        assert_eq!(g.verdict, Verdict::Growing, "{g:?}");
        // A pool that filled, then moves by 1 % around its size.
        let g = verdict(
            (1..=n)
                .map(|i| i.min(8) * 1000 + if i > 8 { (i % 3) * 80 } else { 0 })
                .collect(),
        );
        assert_eq!(g.verdict, Verdict::Plateau, "{g:?}");
        // Too little to tell.
        assert_eq!(verdict(vec![0; WINDOWS]).verdict, Verdict::Unknown);
        // A per-request buffer of 518 bytes, live at a few windows' ends
        // and at the last one (as at the peak): a rise of one allocation.
        let mut buffer = vec![0; WINDOWS];
        for i in [3, 17, 30, 40, WINDOWS - 1] {
            buffer[i] = 518;
        }
        assert_eq!(verdict(buffer.clone()).verdict, Verdict::Growing);
        let one = Held {
            count: 1,
            mean_size: 518,
        };
        let g = Growth::classify_held(buffer.clone(), 10_000_000, Some(one));
        assert_eq!(g.verdict, Verdict::Unknown, "{g:?}");
        assert_eq!(g.verdict.describe(), "unknown (too few samples)");
        // Two live, still one allocation's rise.
        let two = Held { count: 2, ..one };
        let mut pair = buffer.clone();
        pair[WINDOWS - 1] = 1036;
        pair[WINDOWS - 2] = 518;
        assert_eq!(
            Growth::classify_held(pair, 10_000_000, Some(two)).verdict,
            Verdict::Unknown
        );
        // A leak of one 518-byte block per window is growing.
        let leak: Vec<u64> = (1..=n).map(|i| i * 518).collect();
        let held = Held { count: n, ..one };
        assert_eq!(
            Growth::classify_held(leak, 10_000_000, Some(held)).verdict,
            Verdict::Growing
        );
        let mut late = vec![0; WINDOWS];
        late[WINDOWS - 2] = 10;
        late[WINDOWS - 1] = 20;
        assert_eq!(verdict(late).verdict, Verdict::Unknown);
    }
}
