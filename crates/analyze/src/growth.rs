//! Growth over time: outstanding bytes sampled over a fixed number of
//! windows, per stack and in total, and a verdict per stack telling a
//! steady leak from a cache that stopped growing and from memory that was
//! freed late.

use serde::Serialize;

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
}

impl Verdict {
    /// Name in text and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Growing => "growing",
            Verdict::Plateau => "plateau",
            Verdict::Transient => "transient",
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
