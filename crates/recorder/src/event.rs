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

/// Frames a stack holds at most: `MEMLEAK_MAX_FRAMES` in `bpf/memleak.h`,
/// the length of `struct memleak_event`'s `frames` array. The limit of
/// `record --stack-depth` and of the probes' stack size; a test below
/// checks the header, and the memleak binary's layout test the
/// skeleton's type.
pub const MAX_FRAMES: u32 = 127;

/// `flags` bit: the frames are a kernel stack.
pub const FLAG_KERNEL_STACK: u8 = 1;
/// `flags` bit: the stack filled the configured depth.
pub const FLAG_STACK_FULL: u8 = 2;

/// Shift of the walk's end reason in `flags` (bits 2-5).
pub const FLAG_END_SHIFT: u8 = 2;
/// Mask of the walk's end reason after shifting.
pub const FLAG_END_MASK: u8 = 0xf;

/// Why the walk of a user stack ended: the codes of `enum
/// memleak_unwind_end` in `bpf/memleak.h`, which are also the indexes of
/// the BPF `unwind_ends` counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum UnwindEnd {
    /// No user stack was walked (kernel stacks, frees, older traces).
    None = 0,
    /// An `End` row: the outermost frame was reached.
    Complete = 1,
    /// The frame-pointer chain ended; whether the stack is complete is
    /// judged by its outermost function.
    FramePointer = 2,
    /// `--stack-depth` frames were recorded.
    MaxDepth = 3,
    /// The pc is in no executable mapping of the process's table
    /// (unmapped, or mapped after the table was written).
    NoMapping = 4,
    /// The process had no table (yet), with `--unwind dwarf`.
    NoTable = 5,
    /// The pc is in a mapping the full table left out.
    MapsFull = 6,
    /// The pc is in anonymous executable memory (JIT code, `[vdso]`).
    Anonymous = 7,
    /// An object without unwind information, with `--unwind dwarf`.
    NoUnwindInfo = 8,
    /// The object's rows did not fit the probe's row array.
    RowsFull = 9,
    /// No usable unwind rule at the pc.
    InvalidRow = 10,
    /// Reading the stack failed.
    ReadFailed = 11,
    /// The return address is 0.
    NullReturnAddress = 12,
    /// The caller's stack pointer is not above the frame's.
    NotProgressing = 13,
}

/// Every [`UnwindEnd`], by code.
pub const UNWIND_ENDS: [UnwindEnd; 14] = [
    UnwindEnd::None,
    UnwindEnd::Complete,
    UnwindEnd::FramePointer,
    UnwindEnd::MaxDepth,
    UnwindEnd::NoMapping,
    UnwindEnd::NoTable,
    UnwindEnd::MapsFull,
    UnwindEnd::Anonymous,
    UnwindEnd::NoUnwindInfo,
    UnwindEnd::RowsFull,
    UnwindEnd::InvalidRow,
    UnwindEnd::ReadFailed,
    UnwindEnd::NullReturnAddress,
    UnwindEnd::NotProgressing,
];

impl UnwindEnd {
    /// The reason with this code, if any.
    pub fn from_code(code: u8) -> Option<UnwindEnd> {
        UNWIND_ENDS.get(usize::from(code)).copied()
    }

    /// The reason in an event's `flags`.
    pub fn from_flags(flags: u8) -> UnwindEnd {
        Self::from_code((flags >> FLAG_END_SHIFT) & FLAG_END_MASK).unwrap_or(UnwindEnd::None)
    }

    /// Its name in `meta.json`.
    pub fn name(self) -> &'static str {
        match self {
            UnwindEnd::None => "none",
            UnwindEnd::Complete => "complete",
            UnwindEnd::FramePointer => "frame_pointer",
            UnwindEnd::MaxDepth => "max_depth",
            UnwindEnd::NoMapping => "no_mapping",
            UnwindEnd::NoTable => "no_table",
            UnwindEnd::MapsFull => "maps_full",
            UnwindEnd::Anonymous => "anonymous",
            UnwindEnd::NoUnwindInfo => "no_unwind_info",
            UnwindEnd::RowsFull => "rows_full",
            UnwindEnd::InvalidRow => "invalid_row",
            UnwindEnd::ReadFailed => "read_failed",
            UnwindEnd::NullReturnAddress => "null_return_address",
            UnwindEnd::NotProgressing => "not_progressing",
        }
    }

    /// Whether the stack is known complete (`Some(false)`), known cut
    /// short (`Some(true)`), or the walk cannot tell (`None`: a
    /// frame-pointer chain ends the same way at the root and in code
    /// without frame pointers).
    pub fn truncated(self) -> Option<bool> {
        match self {
            UnwindEnd::Complete => Some(false),
            UnwindEnd::None | UnwindEnd::FramePointer => None,
            _ => Some(true),
        }
    }
}

/// Indexes of the BPF `lost` counters, with their names in `meta.json`
/// (what each means for a report: `memleak_trace::losses`).
pub const LOST_REASONS: [&str; 5] = [
    "ring_full",
    "stack_failed",
    "inflight_full",
    "failed_alloc",
    "unsafe_return",
];

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

    /// Why the walk of the user stack ended.
    pub fn unwind_end(&self) -> UnwindEnd {
        UnwindEnd::from_flags(self.flags)
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

    #[test]
    fn unwind_ends_by_code_and_in_flags() {
        for (code, end) in UNWIND_ENDS.iter().enumerate() {
            assert_eq!(*end as usize, code);
            assert_eq!(UnwindEnd::from_code(code as u8), Some(*end));
            let flags = FLAG_STACK_FULL | (code as u8) << FLAG_END_SHIFT;
            assert_eq!(UnwindEnd::from_flags(flags), *end);
        }
        assert_eq!(UnwindEnd::from_code(14), None);
        assert_eq!(UnwindEnd::from_flags(15 << FLAG_END_SHIFT), UnwindEnd::None);
        assert_eq!(UnwindEnd::from_flags(FLAG_KERNEL_STACK), UnwindEnd::None);
    }

    #[test]
    fn frame_limit_matches_the_bpf_header() {
        let header = include_str!("../../../bpf/memleak.h");
        let defined: Vec<&str> = header
            .lines()
            .filter_map(|l| l.trim().strip_prefix("#define MEMLEAK_MAX_FRAMES"))
            .map(str::trim)
            .collect();
        assert_eq!(
            defined,
            [MAX_FRAMES.to_string()],
            "MEMLEAK_MAX_FRAMES in memleak.h"
        );
    }
}
