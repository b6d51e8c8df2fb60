//! Histograms in log2 buckets, as bcc prints latencies: the ages of
//! outstanding allocations ([`AgeHistogram`]) and the sizes of
//! allocations ([`SizeHistogram`], [`size_bucket`]).

use serde::Serialize;

/// Number of buckets: enough for any `u64` of microseconds.
pub const BUCKETS: usize = 65;

/// How old outstanding allocations are, in log2 buckets of age in
/// microseconds. Bucket 0 holds ages under 1 µs; bucket `i > 0` holds ages
/// in `[2^(i-1), 2^i - 1]` µs. Microseconds keep the bucket bounds exact
/// integers people can read, and leaks younger than 1 µs are not a
/// question anyone asks.
///
/// The buckets are made at the first allocation recorded: most stacks of
/// a report hold no outstanding block, and a report moves its stacks
/// around (inline, the buckets made each stack 1 KiB larger; on the
/// 200-host fleet benchmark, moving and merging them was a tenth of the
/// CPU).
#[derive(Debug, Clone, Default)]
pub struct AgeHistogram {
    buckets: Option<Box<AgeBuckets>>,
}

#[derive(Debug, Clone)]
struct AgeBuckets {
    counts: [u64; BUCKETS],
    bytes: [u64; BUCKETS],
}

impl AgeBuckets {
    const EMPTY: AgeBuckets = AgeBuckets {
        counts: [0; BUCKETS],
        bytes: [0; BUCKETS],
    };
}

impl PartialEq for AgeHistogram {
    /// Equal when every bucket is: made or not, an empty histogram is one.
    fn eq(&self, other: &AgeHistogram) -> bool {
        let (a, b) = (self.get(), other.get());
        a.counts == b.counts && a.bytes == b.bytes
    }
}

impl Eq for AgeHistogram {}

/// One non-empty-range bucket, as written to JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// Lowest age in the bucket, µs, inclusive.
    pub low_us: u64,
    /// Highest age in the bucket, µs, inclusive.
    pub high_us: u64,
    /// Allocations in the bucket.
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Bucket index of an age in nanoseconds.
#[inline]
pub fn bucket_of(age_ns: u64) -> usize {
    let us = age_ns / 1000;
    (64 - us.leading_zeros()) as usize
}

/// Inclusive bounds in µs of bucket `i`.
pub fn bucket_bounds(i: usize) -> (u64, u64) {
    match i {
        0 => (0, 0),
        64 => (1 << 63, u64::MAX),
        _ => (1 << (i - 1), (1u64 << i) - 1),
    }
}

impl AgeHistogram {
    /// The buckets, all zero when none was made.
    fn get(&self) -> &AgeBuckets {
        self.buckets.as_deref().unwrap_or(&AgeBuckets::EMPTY)
    }

    /// Records `count` allocations of `bytes` total at age `age_ns`.
    #[inline]
    pub fn add(&mut self, age_ns: u64, count: u64, bytes: u64) {
        let h = self
            .buckets
            .get_or_insert_with(|| Box::new(AgeBuckets::EMPTY));
        let b = bucket_of(age_ns);
        h.counts[b] += count;
        h.bytes[b] += bytes;
    }

    /// Adds every bucket of `other`.
    pub fn merge(&mut self, other: &AgeHistogram) {
        let Some(o) = other.buckets.as_deref() else {
            return;
        };
        match self.buckets.as_deref_mut() {
            None => self.buckets = Some(Box::new(o.clone())),
            Some(h) => {
                for i in 0..BUCKETS {
                    h.counts[i] += o.counts[i];
                    h.bytes[i] += o.bytes[i];
                }
            }
        }
    }

    /// Total allocations recorded.
    pub fn total_count(&self) -> u64 {
        self.get().counts.iter().sum()
    }

    /// The buckets from the first to the last non-empty one (inner empty
    /// buckets included, so the shape is visible); empty when nothing was
    /// recorded.
    pub fn buckets(&self) -> Vec<Bucket> {
        let h = self.get();
        let first = h.counts.iter().position(|&c| c > 0);
        let last = h.counts.iter().rposition(|&c| c > 0);
        match (first, last) {
            (Some(f), Some(l)) => (f..=l)
                .map(|i| {
                    let (low_us, high_us) = bucket_bounds(i);
                    Bucket {
                        low_us,
                        high_us,
                        count: h.counts[i],
                        bytes: h.bytes[i],
                    }
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Renders the histogram like bcc's `print_log2_hist`, with a bytes
    /// column, each line prefixed by `indent`.
    pub fn render(&self, indent: &str) -> String {
        let buckets = self.buckets();
        let mut out = String::new();
        if buckets.is_empty() {
            return out;
        }
        let max = buckets.iter().map(|b| b.count).max().unwrap_or(1).max(1);
        out.push_str(&format!(
            "{indent}{:>24} : count      bytes       distribution\n",
            "age (usecs)"
        ));
        for b in &buckets {
            let stars = ((b.count as u128 * 40).div_ceil(max as u128)) as usize;
            let stars = if b.count == 0 { 0 } else { stars.max(1) };
            out.push_str(&format!(
                "{indent}{:>10} -> {:<10} : {:<10} {:<11} |{:<40}|\n",
                b.low_us,
                b.high_us,
                b.count,
                b.bytes,
                "*".repeat(stars)
            ));
        }
        out
    }
}

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

    /// Counts `count` allocations of `size` bytes each, `bytes` in all
    /// (the blocks a sampled block stands for).
    #[inline]
    pub fn add_scaled(&mut self, size: u64, count: u64, bytes: u64) {
        let b = size_bucket(size);
        self.counts[b] += count;
        self.bytes[b] += bytes;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2_of_microseconds() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(999), 0);
        assert_eq!(bucket_of(1_000), 1);
        assert_eq!(bucket_of(1_999), 1);
        assert_eq!(bucket_of(2_000), 2);
        assert_eq!(bucket_of(3_999), 2);
        assert_eq!(bucket_of(4_000), 3);
        assert_eq!(bucket_of(1_000_000_000), 20); // 1 s = 10^6 us, 2^19 <= 10^6 < 2^20
        assert_eq!(bucket_of(u64::MAX), 55);
        for i in 1..54 {
            let (lo, hi) = bucket_bounds(i);
            assert_eq!(bucket_of(lo * 1000), i);
            assert_eq!(bucket_of(hi * 1000 + 999), i);
        }
    }

    #[test]
    fn buckets_span_first_to_last_non_empty() {
        let mut h = AgeHistogram::default();
        assert!(h.buckets().is_empty());
        h.add(5_000, 1, 10); // bucket 3: 4..7 us
        h.add(20_000, 2, 30); // bucket 5: 16..31 us
        let b = h.buckets();
        assert_eq!(b.len(), 3);
        assert_eq!(
            b[0],
            Bucket {
                low_us: 4,
                high_us: 7,
                count: 1,
                bytes: 10
            }
        );
        assert_eq!(b[1].count, 0);
        assert_eq!(
            b[2],
            Bucket {
                low_us: 16,
                high_us: 31,
                count: 2,
                bytes: 30
            }
        );
        assert_eq!(h.total_count(), 3);
        let text = h.render("");
        assert!(text.contains("age (usecs)"));
        assert!(text.contains("|********************                    |"));
        assert!(text.contains("|****************************************|"));
    }

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
}
