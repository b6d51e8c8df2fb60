//! Decoding of the raw records the probes put in the ring buffer.
//!
//! The layout is `struct memleak_event` in `bpf/memleak.h`; the offsets
//! below are checked against the skeleton's generated type by a test in the
//! memleak binary, so the two cannot drift apart silently.

/// Byte offsets of `struct memleak_event` fields.
pub mod offsets {
    /// `ts_ns`.
    pub const TS_NS: usize = 0;
    /// `addr`.
    pub const ADDR: usize = 8;
    /// `size`.
    pub const SIZE: usize = 16;
    /// `old_addr`.
    pub const OLD_ADDR: usize = 24;
    /// `old_size`.
    pub const OLD_SIZE: usize = 32;
    /// `pid`.
    pub const PID: usize = 40;
    /// `tid`.
    pub const TID: usize = 44;
    /// `kind`.
    pub const KIND: usize = 48;
    /// `flags`.
    pub const FLAGS: usize = 49;
    /// `nframes`.
    pub const NFRAMES: usize = 50;
    /// `stack_err`.
    pub const STACK_ERR: usize = 52;
    /// First frame; also the header size.
    pub const FRAMES: usize = 56;
}

/// `flags` bit: the frames are a kernel stack.
pub const FLAG_KERNEL_STACK: u8 = 1;
/// `flags` bit: the stack filled the configured depth.
pub const FLAG_STACK_FULL: u8 = 2;

/// Indexes of the BPF `lost` counters, with their names in `meta.json`.
pub const LOST_REASONS: [&str; 4] = ["ring_full", "stack_failed", "inflight_full", "failed_alloc"];

/// One record from the ring buffer, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent<'a> {
    /// CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    /// Block address.
    pub addr: u64,
    /// Requested size.
    pub size: u64,
    /// Previous address (realloc, mremap), 0 if none.
    pub old_addr: u64,
    /// Previous size (mremap), 0 if none.
    pub old_size: u64,
    /// Process.
    pub pid: u32,
    /// Thread.
    pub tid: u32,
    /// Kind code (`memleak_trace::EventKind` code).
    pub kind: u8,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// Negative errno of the stack capture, or 0.
    pub stack_err: i32,
    frames: &'a [u8],
}

impl<'a> RawEvent<'a> {
    /// Decodes a record; `None` if it is shorter than its header says.
    #[inline]
    pub fn decode(b: &'a [u8]) -> Option<Self> {
        if b.len() < offsets::FRAMES {
            return None;
        }
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let nframes = u16::from_ne_bytes([b[offsets::NFRAMES], b[offsets::NFRAMES + 1]]) as usize;
        let end = offsets::FRAMES + nframes * 8;
        if b.len() < end {
            return None;
        }
        Some(RawEvent {
            ts_ns: u64_at(offsets::TS_NS),
            addr: u64_at(offsets::ADDR),
            size: u64_at(offsets::SIZE),
            old_addr: u64_at(offsets::OLD_ADDR),
            old_size: u64_at(offsets::OLD_SIZE),
            pid: u32_at(offsets::PID),
            tid: u32_at(offsets::TID),
            kind: b[offsets::KIND],
            flags: b[offsets::FLAGS],
            stack_err: u32_at(offsets::STACK_ERR) as i32,
            frames: &b[offsets::FRAMES..end],
        })
    }

    /// Number of captured frames.
    pub fn frame_count(&self) -> usize {
        self.frames.len() / 8
    }

    /// The captured frames, innermost first.
    #[inline]
    pub fn frames(&self) -> impl ExactSizeIterator<Item = u64> + Clone + 'a {
        self.frames
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
    }

    /// Encodes an event in the same layout (tests and benchmarks).
    pub fn encode(&self, frames: &[u64]) -> Vec<u8> {
        let mut b = vec![0u8; offsets::FRAMES + frames.len() * 8];
        b[offsets::TS_NS..][..8].copy_from_slice(&self.ts_ns.to_ne_bytes());
        b[offsets::ADDR..][..8].copy_from_slice(&self.addr.to_ne_bytes());
        b[offsets::SIZE..][..8].copy_from_slice(&self.size.to_ne_bytes());
        b[offsets::OLD_ADDR..][..8].copy_from_slice(&self.old_addr.to_ne_bytes());
        b[offsets::OLD_SIZE..][..8].copy_from_slice(&self.old_size.to_ne_bytes());
        b[offsets::PID..][..4].copy_from_slice(&self.pid.to_ne_bytes());
        b[offsets::TID..][..4].copy_from_slice(&self.tid.to_ne_bytes());
        b[offsets::KIND] = self.kind;
        b[offsets::FLAGS] = self.flags;
        b[offsets::NFRAMES..][..2].copy_from_slice(&(frames.len() as u16).to_ne_bytes());
        b[offsets::STACK_ERR..][..4].copy_from_slice(&self.stack_err.to_ne_bytes());
        for (i, f) in frames.iter().enumerate() {
            b[offsets::FRAMES + i * 8..][..8].copy_from_slice(&f.to_ne_bytes());
        }
        b
    }

    /// A header-only event for building test input.
    pub fn header(ts_ns: u64, pid: u32, kind: u8, addr: u64, size: u64) -> RawEvent<'static> {
        RawEvent {
            ts_ns,
            addr,
            size,
            old_addr: 0,
            old_size: 0,
            pid,
            tid: pid,
            kind,
            flags: 0,
            stack_err: 0,
            frames: &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_short_records() {
        let mut e = RawEvent::header(5, 7, 0, 0x1000, 32);
        e.old_addr = 0x2000;
        e.flags = FLAG_STACK_FULL;
        let bytes = e.encode(&[1, 2, 3]);
        let d = RawEvent::decode(&bytes).unwrap();
        assert_eq!(
            (d.ts_ns, d.pid, d.addr, d.size, d.old_addr, d.flags),
            (5, 7, 0x1000, 32, 0x2000, FLAG_STACK_FULL)
        );
        assert_eq!(d.frames().collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!(RawEvent::decode(&bytes[..bytes.len() - 1]).is_none());
        assert!(RawEvent::decode(&bytes[..10]).is_none());
    }
}
