//! The reference unwinder: the algorithm the BPF probe will run, in plain
//! Rust, to prove the rows right on real processes.
//!
//! Kept BPF-shaped on purpose: a bounded loop over frames, binary searches
//! with constant bounds, no allocation besides the output, and only three
//! registers (rip, rsp, rbp) of state plus one flag.
//!
//! For each frame, with `pc`, `rsp`, `rbp`:
//!
//! 1. Record `pc`. The lookup address is `pc`, or `pc - 1` when `pc` is a
//!    return address (every frame but the first, and but the frame a
//!    signal interrupted): a call may be the last instruction of a
//!    function, so its return address can belong to the next function.
//! 2. Find the executable mapping containing the lookup address (unmapped:
//!    stop, truncated). Without rows, take a frame-pointer step: the
//!    return address is at `rbp + 8`, the caller's rbp at `rbp`, its rsp
//!    is `rbp + 16` (`rbp == 0`: stop).
//! 3. Otherwise find the row for `lookup - bias`:
//!    - `Invalid` (or no row): stop, truncated.
//!    - `End`: stop, the stack is complete.
//!    - `Signal`: the interrupted rip, rsp and rbp are read from the
//!      ucontext at rsp; the next pc is exact (not a return address).
//!    - `CfaRsp`/`CfaRbp`/`Plt`: `CFA = rsp|rbp + off` (PLT: `+ 8` when
//!      `(pc & 15) >= 11`), the return address is read at `CFA - 8`, rbp
//!      at `CFA + 8 * slot` when saved, and the caller's rsp is the CFA.
//! 4. Stop (truncated) when a read fails, the return address is 0, or the
//!    stack did not grow (rsp must increase, except across a signal
//!    frame, which may come from an alternate signal stack); after
//!    `max_depth` frames stop with [`End::MaxDepth`].

use std::sync::Arc;

use super::row::{lookup, Kind, Row, PLT_PUSHED_FROM, SIGNAL_RBP, SIGNAL_RIP, SIGNAL_RSP};

/// The registers an unwind starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    /// Instruction pointer.
    pub rip: u64,
    /// Stack pointer.
    pub rsp: u64,
    /// Frame pointer (or whatever the code keeps in rbp).
    pub rbp: u64,
}

/// An executable mapping of the process.
#[derive(Clone, Debug)]
pub struct ObjectMap {
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Load bias: runtime address − object vaddr.
    pub bias: u64,
    /// The object's table; `None` walks this code by frame pointer.
    pub rows: Option<Arc<[Row]>>,
}

/// Read access to the target's memory.
pub trait Memory {
    /// The 8 bytes at `addr`, or `None` when they cannot be read.
    fn read_u64(&self, addr: u64) -> Option<u64>;
}

/// How frames are stepped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Rows where the object has them, frame pointers elsewhere.
    Auto,
    /// Frame pointers only (what the probe does today).
    FramePointer,
}

/// Why an unwind stopped before the outermost frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Truncation {
    /// The pc is in no executable mapping.
    Unmapped,
    /// The pc is below the object's first row or above 4 GiB of vaddr.
    NoRow,
    /// The row says there is no usable rule here.
    InvalidRow,
    /// Reading the stack failed.
    ReadFailed,
    /// The return address is 0.
    NullReturnAddress,
    /// The caller's rsp is not above this frame's.
    NotProgressing,
    /// A frame-pointer step met `rbp == 0`: by convention the outermost
    /// frame, but unverified.
    NullFramePointer,
}

/// How an unwind ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// An `End` row: the outermost frame was reached.
    Complete,
    /// The stack is cut short.
    Truncated(Truncation),
    /// `max_depth` frames were recorded.
    MaxDepth,
}

/// One frame of an unwind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The frame's pc.
    pub pc: u64,
    /// True when `pc` is where execution stopped (the first frame, or one a
    /// signal interrupted) rather than a return address; a symbolizer
    /// should look up `pc` itself then, and `pc - 1` otherwise.
    pub exact: bool,
}

/// The result of an unwind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwound {
    /// The frames, innermost first.
    pub frames: Vec<Frame>,
    /// Why the walk ended.
    pub end: End,
}

/// Upper bound on the halvings of the mapping search (2^16 executable
/// mappings is far beyond any process).
const MAP_SEARCH_STEPS: u32 = 16;

/// The mapping containing `addr`, if any; `maps` sorted by start.
fn find_map(maps: &[ObjectMap], addr: u64) -> Option<&ObjectMap> {
    let n = maps.len().min(1 << MAP_SEARCH_STEPS);
    if n == 0 || maps[0].start > addr {
        return None;
    }
    let (mut lo, mut hi) = (0usize, n);
    for _ in 0..MAP_SEARCH_STEPS + 1 {
        if hi - lo <= 1 {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        if maps[mid].start <= addr {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let m = &maps[lo];
    (addr < m.end).then_some(m)
}

/// One frame's step: the caller's state, or why there is none.
struct Caller {
    pc: u64,
    rsp: u64,
    rbp: u64,
    /// The caller's pc was interrupted, not a return address.
    exact: bool,
}

/// Unwinds from `regs`. `maps` must be sorted by start (as
/// [`super::UnwindCache::object_maps`] returns them).
pub fn unwind(
    regs: Regs,
    maps: &[ObjectMap],
    mem: &impl Memory,
    mode: Mode,
    max_depth: usize,
) -> Unwound {
    let mut frames = Vec::new();
    let (mut pc, mut rsp, mut rbp, mut exact) = (regs.rip, regs.rsp, regs.rbp, true);
    for _ in 0..max_depth {
        frames.push(Frame { pc, exact });
        match step(pc, rsp, rbp, exact, maps, mem, mode) {
            Ok(c) => (pc, rsp, rbp, exact) = (c.pc, c.rsp, c.rbp, c.exact),
            Err(end) => return Unwound { frames, end },
        }
    }
    Unwound {
        frames,
        end: End::MaxDepth,
    }
}

fn step(
    pc: u64,
    rsp: u64,
    rbp: u64,
    exact: bool,
    maps: &[ObjectMap],
    mem: &impl Memory,
    mode: Mode,
) -> Result<Caller, End> {
    use Truncation::*;
    let read = |addr: u64| mem.read_u64(addr).ok_or(End::Truncated(ReadFailed));
    let at = if exact { pc } else { pc.wrapping_sub(1) };
    let map = find_map(maps, at).ok_or(End::Truncated(Unmapped))?;
    let rows = match (&map.rows, mode) {
        (Some(rows), Mode::Auto) => rows,
        _ => {
            if rbp == 0 {
                return Err(End::Truncated(NullFramePointer));
            }
            if rbp < rsp {
                return Err(End::Truncated(NotProgressing));
            }
            let caller = Caller {
                pc: read(rbp.wrapping_add(8))?,
                rsp: rbp.wrapping_add(16),
                rbp: read(rbp)?,
                exact: false,
            };
            return checked(caller, rsp);
        }
    };
    let rel = u32::try_from(at.wrapping_sub(map.bias)).map_err(|_| End::Truncated(NoRow))?;
    let row = lookup(rows, rel).ok_or(End::Truncated(NoRow))?;
    let base = match row.kind() {
        Kind::Invalid => return Err(End::Truncated(InvalidRow)),
        Kind::End => return Err(End::Complete),
        Kind::Signal => {
            // No progress check: the handler may run on a sigaltstack
            // above or below the interrupted stack.
            let caller = Caller {
                pc: read(rsp.wrapping_add(SIGNAL_RIP))?,
                rsp: read(rsp.wrapping_add(SIGNAL_RSP))?,
                rbp: read(rsp.wrapping_add(SIGNAL_RBP))?,
                exact: true,
            };
            if caller.pc == 0 {
                return Err(End::Truncated(NullReturnAddress));
            }
            return Ok(caller);
        }
        Kind::CfaRsp => rsp,
        Kind::CfaRbp => rbp,
        // The expression reads the frame's real rip: in a PLT, only the
        // first frame or one a signal interrupted, so `pc` is exact.
        Kind::Plt if pc & 15 >= PLT_PUSHED_FROM => rsp.wrapping_add(8),
        Kind::Plt => rsp,
    };
    let cfa = base.wrapping_add_signed(row.cfa_off());
    let slot = row.rbp_slot();
    let caller = Caller {
        pc: read(cfa.wrapping_sub(8))?,
        rsp: cfa,
        rbp: if slot == 0 {
            rbp
        } else {
            read(cfa.wrapping_add_signed(slot * 8))?
        },
        exact: false,
    };
    checked(caller, rsp)
}

fn checked(caller: Caller, rsp: u64) -> Result<Caller, End> {
    if caller.pc == 0 {
        return Err(End::Truncated(Truncation::NullReturnAddress));
    }
    if caller.rsp <= rsp {
        return Err(End::Truncated(Truncation::NotProgressing));
    }
    Ok(caller)
}

#[cfg(test)]
mod tests {
    use super::super::row::pack;
    use super::*;
    use std::collections::HashMap;

    fn pcs(u: &Unwound) -> Vec<u64> {
        u.frames.iter().map(|f| f.pc).collect()
    }

    struct Stack(HashMap<u64, u64>);
    impl Memory for Stack {
        fn read_u64(&self, addr: u64) -> Option<u64> {
            self.0.get(&addr).copied()
        }
    }

    fn row(pc: u32, kind: Kind, cfa: i64, rbp: i64) -> Row {
        Row {
            pc,
            info: pack(kind, cfa, rbp).unwrap(),
        }
    }

    /// A synthetic object at bias 0x1000_0000: f (0x100..0x140) has pushed
    /// rbp and 8 more bytes, g (0x140..0x160) is the outermost frame,
    /// 0x160.. is a PLT, 0x180 a signal trampoline (from 0x17f, so its
    /// `pc - 1` lookup lands in it).
    fn object() -> Vec<ObjectMap> {
        let rows: Arc<[Row]> = vec![
            row(0x100, Kind::CfaRsp, 24, -2),
            row(0x140, Kind::End, 0, 0),
            row(0x160, Kind::Plt, 8, 0),
            row(0x17f, Kind::Signal, 0, 0),
            row(0x190, Kind::Invalid, 0, 0),
        ]
        .into();
        vec![ObjectMap {
            start: 0x1000_0000,
            end: 0x1000_1000,
            bias: 0x1000_0000,
            rows: Some(rows),
        }]
    }

    #[test]
    fn steps_each_kind() {
        let maps = object();
        let b = 0x1000_0000u64;
        // f at 0x110, rsp 0x7000: CFA 0x7018, RA at 0x7010 into g, rbp at
        // 0x7008.
        let mem = Stack(HashMap::from([(0x7010, b + 0x150), (0x7008, 0x9999)]));
        let regs = Regs {
            rip: b + 0x110,
            rsp: 0x7000,
            rbp: 1,
        };
        let u = unwind(regs, &maps, &mem, Mode::Auto, 10);
        assert_eq!(pcs(&u), vec![b + 0x110, b + 0x150]);
        assert_eq!(u.end, End::Complete);
        // Frame pointers only: rbp 1 is below rsp.
        let u = unwind(regs, &maps, &mem, Mode::FramePointer, 10);
        assert_eq!(u.end, End::Truncated(Truncation::NotProgressing));

        // PLT: before the push (offset 6 → rsp + 8), after it (offset 11
        // → rsp + 16).
        for (off, ra_at) in [(0x166u64, 0x7000u64), (0x16b, 0x7008)] {
            let mem = Stack(HashMap::from([(ra_at, b + 0x150)]));
            let regs = Regs {
                rip: b + off,
                rsp: 0x7000,
                rbp: 0,
            };
            let u = unwind(regs, &maps, &mem, Mode::Auto, 10);
            assert_eq!(pcs(&u), vec![b + off, b + 0x150], "{off:#x}");
        }

        // Signal: the handler returned into the trampoline at 0x180; the
        // interrupted pc 0x140 is exact, so it is looked up as 0x140 (g's
        // End row), not 0x13f (f).
        let mem = Stack(HashMap::from([
            (0x7000 + SIGNAL_RIP, b + 0x140),
            (0x7000 + SIGNAL_RSP, 0x8000),
            (0x7000 + SIGNAL_RBP, 0),
        ]));
        let regs = Regs {
            rip: b + 0x180,
            rsp: 0x7000,
            rbp: 0,
        };
        let u = unwind(regs, &maps, &mem, Mode::Auto, 10);
        assert_eq!(pcs(&u), vec![b + 0x180, b + 0x140]);
        assert!(u.frames[1].exact);
        assert_eq!(u.end, End::Complete);
    }

    #[test]
    fn stops_with_a_reason() {
        let maps = object();
        let b = 0x1000_0000u64;
        let at = |rip, mem: &Stack| {
            unwind(
                Regs {
                    rip,
                    rsp: 0x7000,
                    rbp: 0,
                },
                &maps,
                mem,
                Mode::Auto,
                10,
            )
            .end
        };
        let empty = Stack(HashMap::new());
        assert_eq!(
            at(b + 0x195, &empty),
            End::Truncated(Truncation::InvalidRow)
        );
        assert_eq!(at(b + 0x50, &empty), End::Truncated(Truncation::NoRow));
        assert_eq!(at(0x42, &empty), End::Truncated(Truncation::Unmapped));
        assert_eq!(
            at(b + 0x110, &empty),
            End::Truncated(Truncation::ReadFailed)
        );
        // f returning into f again never ends: depth bound.
        let u = unwind(
            Regs {
                rip: b + 0x110,
                rsp: 0x7000,
                rbp: 0,
            },
            &maps,
            &InfiniteF,
            Mode::Auto,
            5,
        );
        assert_eq!((u.frames.len(), u.end), (5, End::MaxDepth));
    }

    /// Memory where every frame of f returns into f.
    struct InfiniteF;
    impl Memory for InfiniteF {
        fn read_u64(&self, _addr: u64) -> Option<u64> {
            Some(0x1000_0000 + 0x111)
        }
    }
}
