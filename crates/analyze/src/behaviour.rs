//! Allocation behaviour, beside what is outstanding: allocation sizes in
//! log2 buckets ([`SizeHistogram`]), allocation rates, and the rule for
//! temporary allocations (counted by replay, see
//! `replay/temporary.rs`; docs/analyzer.md says how it compares with
//! heaptrack's).
//!
//! Everything here describes the allocations *made* (freed or not) that
//! the filters select, over the evaluated interval
//! ([`rate_interval`]), not only the outstanding ones.

use std::fmt::Write as _;

use serde::Serialize;

use crate::filter::Filter;
use crate::report::{StackReport, Summary};
use crate::time::{format_bytes, format_duration};

/// Default of `--temporary-threshold`: 1 ms.
pub const DEFAULT_TEMPORARY_NS: u64 = 1_000_000;

/// Number of size buckets: one for 0 and one per bit of a `u64`.
pub const SIZE_BUCKETS: usize = 65;

/// Bucket of a size: 0 for 0 bytes, `i > 0` for `[2^(i-1), 2^i - 1]`.
#[inline(always)]
pub fn size_bucket(size: u64) -> usize {
    (64 - size.leading_zeros()) as usize
}

/// Inclusive bounds in bytes of size bucket `i`.
pub fn size_bounds(i: usize) -> (u64, u64) {
    match i {
        0 => (0, 0),
        64 => (1 << 63, u64::MAX),
        _ => (1 << (i - 1), (1u64 << i) - 1),
    }
}

/// One non-empty size bucket, as reports show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SizeBucket {
    /// Smallest size in the bucket, bytes, inclusive.
    pub low: u64,
    /// Largest size in the bucket, bytes, inclusive.
    pub high: u64,
    /// Allocations in the bucket.
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl SizeBucket {
    /// The bucket of index `i` with these totals.
    pub fn new(i: usize, count: u64, bytes: u64) -> Self {
        let (low, high) = size_bounds(i);
        SizeBucket {
            low,
            high,
            count,
            bytes,
        }
    }
}

/// One non-empty size bucket of a stack: allocations only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SizeCount {
    /// Smallest size in the bucket, bytes, inclusive.
    pub low: u64,
    /// Largest size in the bucket, bytes, inclusive.
    pub high: u64,
    /// Allocations in the bucket.
    pub count: u64,
}

impl SizeCount {
    /// The bucket of index `i` with `count` allocations.
    pub fn new(i: usize, count: u64) -> Self {
        let (low, high) = size_bounds(i);
        SizeCount { low, high, count }
    }
}

/// Allocations by size, in log2 buckets (see [`size_bucket`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeHistogram {
    counts: [u64; SIZE_BUCKETS],
    bytes: [u64; SIZE_BUCKETS],
}

impl Default for SizeHistogram {
    fn default() -> Self {
        SizeHistogram {
            counts: [0; SIZE_BUCKETS],
            bytes: [0; SIZE_BUCKETS],
        }
    }
}

impl SizeHistogram {
    /// Counts `count` allocations (a mapping cut in pieces counts once)
    /// of `size` bytes in all.
    #[inline]
    pub fn add(&mut self, size: u64, count: u64) {
        let b = size_bucket(size);
        self.counts[b] += count;
        self.bytes[b] += size;
    }

    /// Counts an allocation of `size` bytes if `yes`, without a branch.
    #[inline(always)]
    pub fn add_if(&mut self, size: u64, yes: bool) {
        let b = size_bucket(size);
        self.counts[b] += yes as u64;
        self.bytes[b] += size & 0u64.wrapping_sub(yes as u64);
    }

    /// Adds every bucket of `o`.
    pub fn merge(&mut self, o: &SizeHistogram) {
        for i in 0..SIZE_BUCKETS {
            self.counts[i] += o.counts[i];
            self.bytes[i] += o.bytes[i];
        }
    }

    /// Allocations counted.
    pub fn total_count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Bytes of the allocations counted.
    pub fn total_bytes(&self) -> u64 {
        self.bytes.iter().sum()
    }

    /// The non-empty buckets, smallest sizes first.
    pub fn buckets(&self) -> Vec<SizeBucket> {
        (0..SIZE_BUCKETS)
            .filter(|&i| self.counts[i] > 0)
            .map(|i| SizeBucket::new(i, self.counts[i], self.bytes[i]))
            .collect()
    }
}

/// Renders non-empty size buckets like bcc's `print_log2_hist`, with a
/// bytes column, each line prefixed by `indent`.
pub fn render_sizes(buckets: &[SizeBucket], indent: &str) -> String {
    let mut out = String::new();
    let max = buckets.iter().map(|b| b.count).max().unwrap_or(1).max(1);
    if buckets.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "{indent}{:>24} : count      bytes       distribution",
        "size (bytes)"
    );
    for b in buckets {
        let stars = ((b.count as u128 * 40).div_ceil(max as u128)) as usize;
        let _ = writeln!(
            out,
            "{indent}{:>10} -> {:<10} : {:<10} {:<11} |{:<40}|",
            b.low,
            b.high,
            b.count,
            b.bytes,
            "*".repeat(stars.max(1))
        );
    }
    out
}

/// A rate for people: `12.5/s`, `3.2 k/s`, `1.1 M/s`.
fn rate(per_s: f64) -> String {
    match per_s {
        r if r >= 1e6 => format!("{:.1} M/s", r / 1e6),
        r if r >= 1e3 => format!("{:.1} k/s", r / 1e3),
        r => format!("{r:.1}/s"),
    }
}

/// The text line of a stack's behaviour: allocations made, their rate,
/// the temporary ones.
pub fn stack_line(s: &StackReport, interval_ns: u64) -> String {
    format!(
        "allocated: {} ({}), {}, {}/s; temporary: {} ({:.1}%)",
        s.allocations,
        format_bytes(s.allocated_bytes),
        rate(per_second(s.allocations, interval_ns)),
        format_bytes(per_second(s.allocated_bytes, interval_ns) as u64),
        s.temporary,
        percent(s.temporary, s.allocations),
    )
}

/// The rows (name, value) of the summary's behaviour, and the size
/// histogram of every allocation.
pub fn summary_rows(s: &Summary) -> (Vec<(&'static str, String)>, String) {
    let rows = vec![
        (
            "temporary",
            format!(
                "{} of {} allocations ({:.1}%): freed within {} by the allocating thread, before it allocated again",
                s.temporary_allocations,
                s.allocation_sizes.total_count(),
                percent(s.temporary_allocations, s.allocation_sizes.total_count()),
                format_duration(s.temporary_threshold_ns)
            ),
        ),
        (
            "allocation rate",
            format!(
                "{}, {}/s over {}",
                rate(per_second(s.allocation_sizes.total_count(), s.rate_interval_ns)),
                format_bytes(per_second(s.allocation_sizes.total_bytes(), s.rate_interval_ns) as u64),
                format_duration(s.rate_interval_ns)
            ),
        ),
    ];
    (rows, render_sizes(&s.allocation_sizes.buckets(), "  "))
}

/// Rounds a rate to a thousandth, which is all a report needs.
fn rounded(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A stack's behaviour fields in the JSON report (docs/json.md).
#[derive(Serialize)]
pub(crate) struct StackJson {
    temporary: u64,
    allocations_per_s: f64,
    allocated_bytes_per_s: f64,
    allocation_sizes: Vec<SizeCount>,
}

pub(crate) fn stack_json(s: &StackReport, interval_ns: u64) -> StackJson {
    StackJson {
        temporary: s.temporary,
        allocations_per_s: rounded(per_second(s.allocations, interval_ns)),
        allocated_bytes_per_s: rounded(per_second(s.allocated_bytes, interval_ns)),
        allocation_sizes: s.allocation_sizes.clone(),
    }
}

/// The summary's behaviour fields in the JSON report (docs/json.md).
#[derive(Serialize)]
pub(crate) struct SummaryJson {
    temporary_allocations: u64,
    temporary_threshold_ns: u64,
    rate_interval_ns: u64,
    allocations_per_s: f64,
    allocated_bytes_per_s: f64,
    allocation_sizes: Vec<SizeBucket>,
    outstanding_sizes: Vec<SizeBucket>,
}

pub(crate) fn summary_json(s: &Summary) -> SummaryJson {
    SummaryJson {
        temporary_allocations: s.temporary_allocations,
        temporary_threshold_ns: s.temporary_threshold_ns,
        rate_interval_ns: s.rate_interval_ns,
        allocations_per_s: rounded(per_second(
            s.allocation_sizes.total_count(),
            s.rate_interval_ns,
        )),
        allocated_bytes_per_s: rounded(per_second(
            s.allocation_sizes.total_bytes(),
            s.rate_interval_ns,
        )),
        allocation_sizes: s.allocation_sizes.buckets(),
        outstanding_sizes: s.outstanding_sizes.buckets(),
    }
}

/// The interval allocation rates are measured over, in ns: from the
/// recording's start (or `--from`) to the evaluation time (or `--to`),
/// the span in which the filters count allocations.
pub fn rate_interval(start_ts: u64, eval_ts: u64, filter: &Filter) -> u64 {
    let end = eval_ts.saturating_sub(start_ts);
    let end = filter.to_ns.map_or(end, |t| t.min(end));
    let from = filter.from_ns.unwrap_or(0).min(end);
    end - from
}

/// `n` per second over `interval_ns` (0 for an empty interval).
pub fn per_second(n: u64, interval_ns: u64) -> f64 {
    if interval_ns == 0 {
        return 0.0;
    }
    n as f64 * 1e9 / interval_ns as f64
}

/// The share of `part` in `whole`, in percent (0 when `whole` is 0).
pub fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        return 0.0;
    }
    part as f64 * 100.0 / whole as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2_with_exact_bounds() {
        assert_eq!(size_bucket(0), 0);
        assert_eq!(size_bucket(1), 1);
        assert_eq!(size_bucket(2), 2);
        assert_eq!(size_bucket(3), 2);
        assert_eq!(size_bucket(4096), 13);
        assert_eq!(size_bounds(13), (4096, 8191));
        assert_eq!(size_bucket(u64::MAX), 64);
        for i in 1..64 {
            let (lo, hi) = size_bounds(i);
            assert_eq!((size_bucket(lo), size_bucket(hi)), (i, i));
        }
        let mut h = SizeHistogram::default();
        h.add_if(24, true);
        h.add_if(30, true);
        h.add_if(100, false);
        h.add_if(0, true);
        assert_eq!(
            h.buckets(),
            vec![SizeBucket::new(0, 1, 0), SizeBucket::new(5, 2, 54)]
        );
    }

    #[test]
    fn rates_cover_the_filtered_interval() {
        let f = Filter {
            from_ns: Some(1_000_000_000),
            to_ns: Some(3_000_000_000),
            ..Filter::default()
        };
        assert_eq!(rate_interval(100, 100 + 10_000_000_000, &f), 2_000_000_000);
        assert_eq!(rate_interval(100, 100 + 2_000_000_000, &f), 1_000_000_000);
        assert_eq!(rate_interval(100, 100, &Filter::default()), 0);
        assert_eq!(per_second(10, 2_000_000_000), 5.0);
        assert_eq!(per_second(10, 0), 0.0);
    }
}
