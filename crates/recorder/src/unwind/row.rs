//! The compact unwind row shared with the BPF probe (x86-64 only).
//!
//! A table is a slice of [`Row`]s sorted by `pc`; a row applies from its
//! `pc` up to the next row's `pc`. The last row of a table is always
//! [`Kind::Invalid`], so an address past the last function has no rule.
//!
//! # Layout (mirrored in `bpf/memleak.h`)
//!
//! ```text
//! struct unwind_row {        // 8 bytes, little-endian
//!     __u32 pc;              // object vaddr (runtime pc - load bias)
//!     __u32 info;
//! };
//!
//! info bit  31 ............ 11 10 ........ 3 2 .. 0
//!           | cfa_off: s21     | rbp: s8     | kind |
//! ```
//!
//! - `kind` (bits 0–2, [`KIND_MASK`]): a [`Kind`]. 0 is `Invalid`, so a
//!   zeroed row means "no rule".
//! - `rbp` (bits 3–10, signed): the caller's rbp is saved at
//!   `CFA + 8 * rbp`; 0 means rbp is unchanged by this frame (CFA + 0 is
//!   the caller's frame, never a save slot, so 0 is free to mean that).
//! - `cfa_off` (bits 11–31, signed, bytes): decoded with an arithmetic
//!   shift, `(__s32)info >> 11`.
//!
//! The return address is always at `CFA - 8` (rows whose DWARF says
//! otherwise are `Invalid`), and the caller's rsp is the CFA.

/// Bits of `info` holding the [`Kind`].
pub const KIND_MASK: u32 = 0x7;
/// Shift of the saved-rbp slot (signed, in 8-byte units from the CFA).
pub const RBP_SHIFT: u32 = 3;
/// Mask of the saved-rbp slot after shifting.
pub const RBP_MASK: u32 = 0xff;
/// Shift of the signed CFA offset.
pub const CFA_SHIFT: u32 = 11;
/// Smallest CFA offset a row can hold.
pub const CFA_OFF_MIN: i32 = -(1 << (31 - CFA_SHIFT));
/// Largest CFA offset a row can hold.
pub const CFA_OFF_MAX: i32 = (1 << (31 - CFA_SHIFT)) - 1;

/// No rule: the stack ends here, truncated.
pub const KIND_INVALID: u32 = 0;
/// `CFA = rsp + cfa_off`.
pub const KIND_CFA_RSP: u32 = 1;
/// `CFA = rbp + cfa_off`.
pub const KIND_CFA_RBP: u32 = 2;
/// Lazy-binding PLT entry: `CFA = rsp + cfa_off + ((rip & 15) >= 11 ? 8 : 0)`.
pub const KIND_PLT: u32 = 3;
/// Signal-return trampoline: the caller's registers are in the ucontext at
/// rsp ([`SIGNAL_RIP`], [`SIGNAL_RSP`], [`SIGNAL_RBP`]).
pub const KIND_SIGNAL: u32 = 4;
/// The return address is undefined: the outermost frame, stack complete.
pub const KIND_END: u32 = 5;

/// Where the interrupted rip is, from rsp, in a signal-return trampoline.
///
/// x86-64 Linux pushes `struct rt_sigframe { char *pretcode; struct
/// ucontext uc; struct siginfo info; }`; the handler's `ret` pops
/// `pretcode` (the trampoline's address), so when the trampoline
/// (`__restore_rt`) runs, rsp points at `uc`. In `struct ucontext`,
/// `uc_mcontext` (a `struct sigcontext`) is at 40: after `uc_flags` (8),
/// `uc_link` (8) and `uc_stack` (24). In `struct sigcontext`, r8–r15 take
/// 0–63, then rdi 64, rsi 72, rbp 80, rbx 88, rdx 96, rax 104, rcx 112,
/// rsp 120, rip 128. glibc's CFI for `__restore_rt` says the same
/// (`DW_OP_breg7 (rsp): 168` for rip, 160 for rsp, 120 for rbp).
pub const SIGNAL_RIP: u64 = 40 + 128;
/// Where the interrupted rsp is, from rsp, in a signal-return trampoline.
pub const SIGNAL_RSP: u64 = 40 + 120;
/// Where the interrupted rbp is, from rsp, in a signal-return trampoline.
pub const SIGNAL_RBP: u64 = 40 + 80;

/// The PLT rule's threshold: a lazy PLT entry is `jmp *GOT(%rip)` (6
/// bytes), `push $n` (5), `jmp PLT0` (5); from offset 11 on, `$n` is on the
/// stack, 8 bytes more.
pub const PLT_PUSHED_FROM: u64 = 11;

/// The CFA rule of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// No unwind information, or a rule rows cannot express: the stack
    /// ends here, truncated.
    Invalid,
    /// `CFA = rsp + cfa_off`.
    CfaRsp,
    /// `CFA = rbp + cfa_off`.
    CfaRbp,
    /// Lazy-binding PLT entry ([`KIND_PLT`]).
    Plt,
    /// Signal-return trampoline ([`KIND_SIGNAL`]).
    Signal,
    /// Outermost frame: the stack is complete.
    End,
}

impl Kind {
    fn bits(self) -> u32 {
        match self {
            Kind::Invalid => KIND_INVALID,
            Kind::CfaRsp => KIND_CFA_RSP,
            Kind::CfaRbp => KIND_CFA_RBP,
            Kind::Plt => KIND_PLT,
            Kind::Signal => KIND_SIGNAL,
            Kind::End => KIND_END,
        }
    }
}

/// One row of an unwind table; see the module documentation for `info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Row {
    /// First address (object vaddr) the rule applies to.
    pub pc: u32,
    /// Packed rule.
    pub info: u32,
}

const _: () = assert!(std::mem::size_of::<Row>() == 8);

/// The packed `info` of a rule; `None` when `cfa_off` or `rbp_slot` does
/// not fit its field.
pub fn pack(kind: Kind, cfa_off: i64, rbp_slot: i64) -> Option<u32> {
    let cfa = i32::try_from(cfa_off)
        .ok()
        .filter(|c| (CFA_OFF_MIN..=CFA_OFF_MAX).contains(c))?;
    let rbp = i8::try_from(rbp_slot).ok()?;
    Some(((cfa as u32) << CFA_SHIFT) | (u32::from(rbp as u8) << RBP_SHIFT) | kind.bits())
}

/// The `info` of an [`Kind::Invalid`] row.
pub const INVALID: u32 = KIND_INVALID;

impl Row {
    /// The rule's kind; unknown kind bits read as `Invalid`.
    pub fn kind(&self) -> Kind {
        match self.info & KIND_MASK {
            KIND_CFA_RSP => Kind::CfaRsp,
            KIND_CFA_RBP => Kind::CfaRbp,
            KIND_PLT => Kind::Plt,
            KIND_SIGNAL => Kind::Signal,
            KIND_END => Kind::End,
            _ => Kind::Invalid,
        }
    }

    /// The signed CFA offset in bytes.
    pub fn cfa_off(&self) -> i64 {
        i64::from((self.info as i32) >> CFA_SHIFT)
    }

    /// Where the caller's rbp is saved, in 8-byte slots from the CFA; 0
    /// when this frame leaves rbp unchanged.
    pub fn rbp_slot(&self) -> i64 {
        i64::from(((self.info >> RBP_SHIFT) & RBP_MASK) as u8 as i8)
    }
}

/// Upper bound on binary-search steps: tables hold fewer than 2^24 rows
/// (the largest seen, libstdc++, has ~10^5), so 24 halvings always land.
/// The BPF side needs a constant bound for its verifier.
pub const MAX_SEARCH_STEPS: u32 = 24;

/// Most rows a table may hold (see [`MAX_SEARCH_STEPS`]).
pub const MAX_ROWS: usize = 1 << MAX_SEARCH_STEPS;

/// The row covering `pc`: the last row whose `pc` is ≤ `pc`, or `None`
/// below the first row. Written as the BPF code will run it: a bounded
/// loop of halvings, no recursion, no allocation.
pub fn lookup(rows: &[Row], pc: u32) -> Option<Row> {
    // Invariant: rows[lo].pc <= pc < rows[hi].pc, with hi == len meaning
    // "past the end".
    let n = rows.len().min(MAX_ROWS);
    if n == 0 || rows[0].pc > pc {
        return None;
    }
    let (mut lo, mut hi) = (0usize, n);
    for _ in 0..MAX_SEARCH_STEPS + 1 {
        if hi - lo <= 1 {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        if rows[mid].pc <= pc {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(rows[lo])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_at_their_limits() {
        for kind in [
            Kind::Invalid,
            Kind::CfaRsp,
            Kind::CfaRbp,
            Kind::Plt,
            Kind::Signal,
            Kind::End,
        ] {
            for cfa in [0, 8, -8, 16, CFA_OFF_MIN as i64, CFA_OFF_MAX as i64] {
                for rbp in [0, -2, -128, 127, 1] {
                    let row = Row {
                        pc: 1,
                        info: pack(kind, cfa, rbp).unwrap(),
                    };
                    assert_eq!(
                        (row.kind(), row.cfa_off(), row.rbp_slot()),
                        (kind, cfa, rbp)
                    );
                }
            }
        }
        assert_eq!(pack(Kind::CfaRsp, CFA_OFF_MAX as i64 + 1, 0), None);
        assert_eq!(pack(Kind::CfaRsp, CFA_OFF_MIN as i64 - 1, 0), None);
        assert_eq!(pack(Kind::CfaRsp, 8, 128), None);
        assert_eq!(pack(Kind::CfaRsp, 8, -129), None);
        // The documented example: CFA = rsp + 16, rbp at CFA - 16.
        assert_eq!(pack(Kind::CfaRsp, 16, -2), Some(16 << 11 | 0xfe << 3 | 1));
    }

    #[test]
    fn lookup_finds_the_last_row_at_or_below() {
        let rows: Vec<Row> = [10u32, 20, 30, 40]
            .iter()
            .map(|&pc| Row { pc, info: pc })
            .collect();
        assert_eq!(lookup(&rows, 9), None);
        assert_eq!(lookup(&[], 9), None);
        for (pc, want) in [
            (10, 10),
            (19, 10),
            (20, 20),
            (39, 30),
            (40, 40),
            (u32::MAX, 40),
        ] {
            assert_eq!(lookup(&rows, pc).unwrap().pc, want, "pc {pc}");
        }
        for n in 1..70u32 {
            let rows: Vec<Row> = (0..n).map(|i| Row { pc: i * 4, info: i }).collect();
            for pc in 0..n * 4 + 3 {
                assert_eq!(lookup(&rows, pc).unwrap().info, (pc / 4).min(n - 1));
            }
        }
    }
}
