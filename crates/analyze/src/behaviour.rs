//! Allocation behaviour, beside what is outstanding: allocation sizes in
//! log2 buckets ([`SizeHistogram`]), allocation rates, and the rule for
//! temporary allocations (counted by replay, see
//! `replay/temporary.rs`; docs/analyzer.md says how it compares with
//! heaptrack's).
//!
//! The text and JSON reports show them (`report/text.rs`,
//! `report/json.rs`); the sizes are counted in [`crate::histogram`].
//!
//! Everything here describes the allocations *made* (freed or not) that
//! the filters select, over the evaluated interval
//! ([`rate_interval`]), not only the outstanding ones.

use crate::filter::Filter;
pub use crate::histogram::{
    size_bounds, size_bucket, SizeBucket, SizeCount, SizeHistogram, SIZE_BUCKETS,
};
pub use crate::replay::DEFAULT_TEMPORARY_NS;

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
