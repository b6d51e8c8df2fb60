//! Unwind tables from an object's `.eh_frame` and `.debug_frame` (see
//! [`build`]): every FDE's DWARF CFI program is run by gimli, and each
//! resulting DWARF row is reduced to a [`Row`] or, when rows cannot say
//! it, to an `Invalid` row, counted by reason in [`BuildStats`].
//!
//! A malformed section yields an error or fewer rows, never a panic: an
//! entry that does not parse ends the walk (its length cannot be trusted),
//! an FDE whose program fails is dropped whole (its range becomes a gap,
//! which is `Invalid`).

use std::collections::{BTreeMap, HashMap};

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, CommonInformationEntry, DebugFrame, EhFrame, EndianSlice,
    LittleEndian, Register, RegisterRule, UnwindContext, UnwindExpression, UnwindOffset,
    UnwindSection, UnwindTableRow, X86_64,
};

use super::row::{pack, Kind, Row, INVALID, MAX_ROWS, SIGNAL_RBP, SIGNAL_RIP, SIGNAL_RSP};
use crate::elf::{ElfError, ElfFile};

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// Why an object has no table.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The ELF file could not be read.
    #[error(transparent)]
    Elf(#[from] ElfError),
    /// Neither `.eh_frame` nor an uncompressed `.debug_frame`.
    #[error("no .eh_frame or .debug_frame")]
    NoUnwindInfo,
    /// A row's address does not fit the row's 32-bit `pc`.
    #[error("code at vaddr {0:#x}, above 4 GiB, is not supported")]
    HighAddress(u64),
    /// More rows than a table may hold.
    #[error("{0} rows, more than a table may hold")]
    TooManyRows(usize),
}

/// Which section a table came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Source {
    /// `.eh_frame`
    #[default]
    EhFrame,
    /// `.debug_frame`
    DebugFrame,
    /// Both (see [`build`]).
    Both,
}

/// Why a DWARF row became an `Invalid` row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unsupported {
    /// The CFA is computed from a register other than rsp and rbp (DWARF
    /// register number), e.g. r10 around stack realignment, rdi in
    /// `setcontext`.
    CfaRegister(u16),
    /// A CFA expression that is neither the PLT nor the signal-frame one.
    CfaExpression,
    /// The CFA offset does not fit the row's 21-bit field.
    CfaOffset,
    /// The return address is not at CFA − 8, e.g. kept in a register at
    /// the end of `longjmp`.
    ReturnAddress,
    /// The caller's rbp is not unchanged nor saved at an 8-byte slot
    /// within ±1 KiB of the CFA (e.g. kept in another register).
    RbpRule,
    /// A signal trampoline whose CFI is not the x86-64 Linux
    /// `rt_sigframe` layout.
    SignalLayout,
}

/// What happened while building a table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BuildStats {
    /// The section the rows come from.
    pub source: Source,
    /// FDEs turned into rows.
    pub fdes: usize,
    /// FDEs dropped: unparsable, failing CFI program, empty, or at
    /// address 0 (discarded by the linker).
    pub skipped_fdes: usize,
    /// The walk stopped early at an entry that did not parse.
    pub truncated: bool,
    /// Rows of the DWARF tables, before reduction and merging.
    pub dwarf_rows: usize,
    /// DWARF rows that became `Invalid`, by reason.
    pub unsupported: BTreeMap<Unsupported, usize>,
    /// Code bytes covered by those rows.
    pub unsupported_bytes: u64,
}

/// A built table: sorted, merged rows ending with an `Invalid` row.
#[derive(Clone, Debug, Default)]
pub struct Table {
    /// The rows.
    pub rows: Vec<Row>,
    /// How they came about.
    pub stats: BuildStats,
}

/// Builds the table of an object from its `.eh_frame` and `.debug_frame`.
///
/// Both are read when both exist: code built with
/// `-fno-asynchronous-unwind-tables -g` has its own functions only in
/// `.debug_frame`, while the C runtime's startup objects still bring an
/// `.eh_frame` (for `_start`). Where both describe the same function,
/// `.eh_frame` wins.
pub fn build(elf: &ElfFile) -> Result<Table, BuildError> {
    let eh = elf.section(".eh_frame");
    let debug = elf.section(".debug_frame");
    let mut stats = BuildStats {
        source: match (&eh, &debug) {
            (Some(_), Some(_)) => Source::Both,
            (Some(_), None) => Source::EhFrame,
            (None, Some(_)) => Source::DebugFrame,
            (None, None) => return Err(BuildError::NoUnwindInfo),
        },
        ..BuildStats::default()
    };
    let mut spans = Vec::new();
    // `.debug_frame` first: at equal starts the later span wins.
    if let Some(debug) = debug {
        let (section, bases) = debug_frame(debug.bytes);
        collect(&section, &bases, &mut stats, &mut spans)?;
    }
    if let Some(eh) = eh {
        let text = elf.section(".text").map(|s| s.vaddr);
        let got = elf.section(".got").map(|s| s.vaddr);
        let (section, bases) = eh_frame(eh.bytes, eh.vaddr, text, got);
        collect(&section, &bases, &mut stats, &mut spans)?;
    }
    end_at_entry(elf.entry(), &mut spans);
    finish(spans, stats)
}

/// Most bytes of start code without CFI at an entry point taken as the
/// outermost frame.
const ENTRY_CODE: u64 = 256;

/// An entry point no FDE covers is start code in assembler without CFI:
/// ld.so's `_start` and `_dl_start_user`, which calls `_dl_init` (the
/// library constructors) and then jumps to the program's entry. A return
/// address there is the outermost frame of the stack: an `End` row from
/// the entry point to the next FDE (at most [`ENTRY_CODE`] bytes), as the
/// `.cfi_undefined rip` of a C runtime's `_start` gives.
fn end_at_entry(entry: u64, spans: &mut Vec<Span>) {
    if entry == 0 || entry >= u32::MAX as u64 {
        return;
    }
    if spans.iter().any(|s| s.start <= entry && entry < s.end) {
        return;
    }
    let next = spans
        .iter()
        .map(|s| s.start)
        .filter(|&a| a > entry)
        .min()
        .unwrap_or(u64::MAX);
    spans.push(Span {
        start: entry,
        end: next.min(entry + ENTRY_CODE),
        info: pack(Kind::End, 0, 0).expect("fits"),
    });
}

/// Builds a table from `.eh_frame` bytes loaded at `vaddr`. `text` and
/// `got` are the bases of the rarely used `DW_EH_PE_textrel` and
/// `DW_EH_PE_datarel` pointer encodings.
pub fn from_eh_frame(
    bytes: &[u8],
    vaddr: u64,
    text: Option<u64>,
    got: Option<u64>,
) -> Result<Table, BuildError> {
    let (section, bases) = eh_frame(bytes, vaddr, text, got);
    let mut stats = BuildStats::default();
    let mut spans = Vec::new();
    collect(&section, &bases, &mut stats, &mut spans)?;
    finish(spans, stats)
}

/// Builds a table from `.debug_frame` bytes (absolute addresses).
pub fn from_debug_frame(bytes: &[u8]) -> Result<Table, BuildError> {
    let (section, bases) = debug_frame(bytes);
    let mut stats = BuildStats {
        source: Source::DebugFrame,
        ..BuildStats::default()
    };
    let mut spans = Vec::new();
    collect(&section, &bases, &mut stats, &mut spans)?;
    finish(spans, stats)
}

fn eh_frame(
    bytes: &[u8],
    vaddr: u64,
    text: Option<u64>,
    got: Option<u64>,
) -> (EhFrame<Slice<'_>>, BaseAddresses) {
    let mut section = EhFrame::new(bytes, LittleEndian);
    section.set_address_size(8);
    let mut bases = BaseAddresses::default().set_eh_frame(vaddr);
    if let Some(t) = text {
        bases = bases.set_text(t);
    }
    if let Some(g) = got {
        bases = bases.set_got(g);
    }
    (section, bases)
}

fn debug_frame(bytes: &[u8]) -> (DebugFrame<Slice<'_>>, BaseAddresses) {
    let mut section = DebugFrame::new(bytes, LittleEndian);
    section.set_address_size(8);
    (section, BaseAddresses::default())
}

fn finish(spans: Vec<Span>, stats: BuildStats) -> Result<Table, BuildError> {
    let rows = merge(spans);
    if rows.len() > MAX_ROWS {
        return Err(BuildError::TooManyRows(rows.len()));
    }
    Ok(Table { rows, stats })
}

/// One reduced DWARF row: `[start, end)` and its packed rule.
#[derive(Clone, Copy)]
struct Span {
    start: u64,
    end: u64,
    info: u32,
}

/// Appends the reduced rows of every FDE of `section` to `spans`.
fn collect<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    stats: &mut BuildStats,
    spans: &mut Vec<Span>,
) -> Result<(), BuildError>
where
    S: UnwindSection<Slice<'a>>,
{
    let patterns = Patterns::new();
    // CIEs are shared by many FDEs (libc has 3); parse each once.
    let mut cies: HashMap<usize, CommonInformationEntry<Slice<'a>>> = HashMap::new();
    let mut ctx = UnwindContext::new();
    let mut fde_spans: Vec<Span> = Vec::new();
    let mut entries = section.entries(bases);
    loop {
        let partial = match entries.next() {
            Ok(Some(CieOrFde::Fde(partial))) => partial,
            Ok(Some(CieOrFde::Cie(_))) => continue,
            Ok(None) => break,
            Err(_) => {
                stats.truncated = true;
                break;
            }
        };
        let fde = partial.parse(|section, bases, offset| {
            let key: usize = UnwindOffset::into(offset);
            if let Some(cie) = cies.get(&key) {
                return Ok(cie.clone());
            }
            let cie = section.cie_from_offset(bases, offset)?;
            cies.insert(key, cie.clone());
            Ok(cie)
        });
        let Ok(fde) = fde else {
            stats.skipped_fdes += 1;
            continue;
        };
        let (lo, hi) = (fde.initial_address(), fde.end_address());
        // Address 0 is where the linker leaves FDEs of discarded code (and
        // never code in a loadable object); `end <= lo` is an empty or
        // wrapping range.
        if lo == 0 || hi <= lo {
            stats.skipped_fdes += 1;
            continue;
        }
        if hi > u64::from(u32::MAX) {
            return Err(BuildError::HighAddress(hi));
        }
        let signal = fde.is_signal_trampoline();
        fde_spans.clear();
        let mut unsupported = Vec::new();
        let ok = (|| -> gimli::Result<()> {
            let mut table = fde.rows(section, bases, &mut ctx)?;
            while let Some(row) = table.next_row()? {
                // Clip: a corrupt program can advance past its FDE.
                let (start, end) = (row.start_address().max(lo), row.end_address().min(hi));
                if start >= end {
                    continue;
                }
                let info = match classify(row, section, signal, &patterns) {
                    Ok(info) => info,
                    Err(why) => {
                        unsupported.push((why, end - start));
                        INVALID
                    }
                };
                fde_spans.push(Span { start, end, info });
            }
            Ok(())
        })();
        if ok.is_err() {
            stats.skipped_fdes += 1;
            continue;
        }
        stats.fdes += 1;
        stats.dwarf_rows += fde_spans.len();
        for (why, bytes) in unsupported {
            *stats.unsupported.entry(why).or_default() += 1;
            stats.unsupported_bytes += bytes;
        }
        spans.extend_from_slice(&fde_spans);
        if spans.len() > MAX_ROWS {
            return Err(BuildError::TooManyRows(spans.len()));
        }
    }
    Ok(())
}

/// Sorts spans into rows: a gap between FDEs gets an `Invalid` row (so it
/// does not inherit the rule before it), rows with the same rule as the
/// one before are dropped, and the table ends with an `Invalid` row.
/// Overlapping FDEs (only in corrupt input) are resolved in favour of the
/// later start, and of the later FDE at the same start.
fn merge(mut spans: Vec<Span>) -> Vec<Row> {
    // Stable: at equal starts the later FDE stays later and wins below.
    spans.sort_by_key(|s| s.start);
    let mut rows: Vec<Row> = Vec::with_capacity(spans.len() / 2 + 1);
    let mut covered_to = None;
    for s in &spans {
        if let Some(end) = covered_to {
            if s.start > end {
                push(&mut rows, end, INVALID);
            }
        }
        push(&mut rows, s.start, s.info);
        covered_to = Some(s.end);
    }
    if let Some(end) = covered_to {
        push(&mut rows, end, INVALID);
    }
    rows
}

/// Appends a row, keeping the table sorted, unique by pc and merged.
/// Addresses were checked to fit in 32 bits.
fn push(rows: &mut Vec<Row>, pc: u64, info: u32) {
    let pc = pc as u32;
    if let Some(last) = rows.last_mut() {
        if last.pc == pc {
            last.info = info;
            // The replacement may now repeat the row before it.
            let n = rows.len();
            if n >= 2 && rows[n - 2].info == info {
                rows.pop();
            }
            return;
        }
        if last.info == info {
            return;
        }
    }
    rows.push(Row { pc, info });
}

/// The exact expression bytes this module recognises.
struct Patterns {
    /// Lazy PLT: `DW_OP_breg7 (rsp) 8; DW_OP_breg16 (rip) 0; DW_OP_lit15;
    /// DW_OP_and; DW_OP_lit11; DW_OP_ge; DW_OP_lit3; DW_OP_shl;
    /// DW_OP_plus`, as binutils' ld emits for `.plt`.
    plt: Vec<u8>,
    /// Signal frame CFA: `DW_OP_breg7 (rsp) 160; DW_OP_deref` (the saved
    /// rsp).
    signal_cfa: Vec<u8>,
    /// Signal frame register locations: `DW_OP_breg7 (rsp) N`.
    signal_rip: Vec<u8>,
    signal_rsp: Vec<u8>,
    signal_rbp: Vec<u8>,
}

const DW_OP_BREG0: u8 = 0x70;
const DW_OP_LIT0: u8 = 0x30;
const DW_OP_DEREF: u8 = 0x06;
const DW_OP_AND: u8 = 0x1a;
const DW_OP_GE: u8 = 0x2a;
const DW_OP_SHL: u8 = 0x24;
const DW_OP_PLUS: u8 = 0x22;

fn sleb128(mut v: i64, out: &mut Vec<u8>) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        let done = (v == 0 && byte & 0x40 == 0) || (v == -1 && byte & 0x40 != 0);
        out.push(if done { byte } else { byte | 0x80 });
        if done {
            return;
        }
    }
}

fn breg(reg: Register, off: i64) -> Vec<u8> {
    let mut v = vec![DW_OP_BREG0 + reg.0 as u8];
    sleb128(off, &mut v);
    v
}

impl Patterns {
    fn new() -> Self {
        let mut plt = breg(X86_64::RSP, 8);
        plt.extend(breg(X86_64::RA, 0));
        plt.extend([
            DW_OP_LIT0 + 15,
            DW_OP_AND,
            DW_OP_LIT0 + super::row::PLT_PUSHED_FROM as u8,
            DW_OP_GE,
            DW_OP_LIT0 + 3,
            DW_OP_SHL,
            DW_OP_PLUS,
        ]);
        let mut signal_cfa = breg(X86_64::RSP, SIGNAL_RSP as i64);
        signal_cfa.push(DW_OP_DEREF);
        Patterns {
            plt,
            signal_cfa,
            signal_rip: breg(X86_64::RSP, SIGNAL_RIP as i64),
            signal_rsp: breg(X86_64::RSP, SIGNAL_RSP as i64),
            signal_rbp: breg(X86_64::RSP, SIGNAL_RBP as i64),
        }
    }
}

fn expression<'a, S: UnwindSection<Slice<'a>>>(
    e: &UnwindExpression<usize>,
    section: &S,
) -> Option<&'a [u8]> {
    e.get(section).ok().map(|x| x.0.slice())
}

/// Reduces one DWARF row to a packed rule.
fn classify<'a, S: UnwindSection<Slice<'a>>>(
    row: &UnwindTableRow<usize>,
    section: &S,
    signal: bool,
    p: &Patterns,
) -> Result<u32, Unsupported> {
    let ra = row.register(X86_64::RA);
    // `_start` and the child side of `clone`/`clone3` mark themselves as
    // the outermost frame this way.
    if ra == Some(RegisterRule::Undefined) {
        return Ok(pack(Kind::End, 0, 0).expect("fits"));
    }
    let (kind, cfa_off) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RSP => {
            (Kind::CfaRsp, *offset)
        }
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RBP => {
            (Kind::CfaRbp, *offset)
        }
        CfaRule::RegisterAndOffset { register, .. } => {
            return Err(Unsupported::CfaRegister(register.0))
        }
        CfaRule::Expression(e) => {
            let bytes = expression(e, section).unwrap_or_default();
            if bytes == p.signal_cfa {
                return signal_rule(row, section, p);
            }
            if bytes != p.plt {
                return Err(Unsupported::CfaExpression);
            }
            (Kind::Plt, 8)
        }
    };
    // An 'S' FDE with an ordinary rule would need "the next pc is exact"
    // without the ucontext layout; rows cannot say that.
    if signal {
        return Err(Unsupported::SignalLayout);
    }
    if ra != Some(RegisterRule::Offset(-8)) {
        return Err(Unsupported::ReturnAddress);
    }
    let rbp_slot = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => 0,
        Some(RegisterRule::Offset(off)) if off % 8 == 0 && off != 0 => off / 8,
        Some(_) => return Err(Unsupported::RbpRule),
    };
    match pack(kind, cfa_off, rbp_slot) {
        Some(info) => Ok(info),
        None if i8::try_from(rbp_slot).is_err() => Err(Unsupported::RbpRule),
        None => Err(Unsupported::CfaOffset),
    }
}

/// A signal trampoline's row, if its CFI is the one [`super::row`]
/// documents: the unwinder then reads rip, rsp and rbp from fixed offsets.
fn signal_rule<'a, S: UnwindSection<Slice<'a>>>(
    row: &UnwindTableRow<usize>,
    section: &S,
    p: &Patterns,
) -> Result<u32, Unsupported> {
    let at = |reg: Register, want: &[u8]| match row.register(reg) {
        Some(RegisterRule::Expression(e)) => expression(&e, section) == Some(want),
        _ => false,
    };
    if at(X86_64::RA, &p.signal_rip)
        && at(X86_64::RSP, &p.signal_rsp)
        && at(X86_64::RBP, &p.signal_rbp)
    {
        Ok(pack(Kind::Signal, 0, 0).expect("fits"))
    } else {
        Err(Unsupported::SignalLayout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: u64, end: u64, info: u32) -> Span {
        Span { start, end, info }
    }

    #[test]
    fn an_entry_point_without_cfi_ends_the_stack() {
        let a = pack(Kind::CfaRsp, 8, 0).unwrap();
        let end = pack(Kind::End, 0, 0).unwrap();
        // ld.so: `_start` at 0x1ab70 and the next FDE at 0x1abb0.
        let mut spans = vec![span(0x1a660, 0x1ab6f, a), span(0x1abb0, 0x1ac00, a)];
        end_at_entry(0x1ab70, &mut spans);
        let rows = merge(spans);
        let at = |pc: u32| super::super::row::lookup(&rows, pc).map(|r| r.kind());
        assert_eq!(at(0x1ab9f), Some(Kind::End), "_dl_start_user's call");
        assert_eq!(at(0x1ab6f), Some(Kind::Invalid));
        assert_eq!(at(0x1abb0), Some(Kind::CfaRsp));
        // An entry point with CFI keeps it; none adds nothing.
        let mut spans = vec![span(0x100, 0x200, a)];
        end_at_entry(0x120, &mut spans);
        end_at_entry(0, &mut spans);
        assert_eq!(spans.len(), 1);
        // No FDE after it: at most ENTRY_CODE bytes.
        let mut spans = vec![span(0x100, 0x200, a)];
        end_at_entry(0x300, &mut spans);
        assert_eq!(
            (spans[1].start, spans[1].end, spans[1].info),
            (0x300, 0x300 + ENTRY_CODE, end)
        );
    }

    fn rows(v: &[(u32, u32)]) -> Vec<Row> {
        v.iter().map(|&(pc, info)| Row { pc, info }).collect()
    }

    #[test]
    fn merge_fills_gaps_merges_repeats_and_ends_invalid() {
        let a = pack(Kind::CfaRsp, 8, 0).unwrap();
        let b = pack(Kind::CfaRsp, 16, -2).unwrap();
        let got = merge(vec![
            span(0x120, 0x130, a),
            span(0x100, 0x104, a),
            span(0x104, 0x110, b),
            span(0x110, 0x120, a), // next FDE starts right here: no gap
        ]);
        assert_eq!(
            got,
            rows(&[(0x100, a), (0x104, b), (0x110, a), (0x130, INVALID)])
        );
        // A gap after an FDE does not inherit its rule.
        let got = merge(vec![span(0x100, 0x108, a), span(0x110, 0x118, a)]);
        assert_eq!(
            got,
            rows(&[(0x100, a), (0x108, INVALID), (0x110, a), (0x118, INVALID)])
        );
        assert!(merge(Vec::new()).is_empty());
        // Overlap (corrupt input): the later start takes over.
        let got = merge(vec![span(0x100, 0x120, a), span(0x108, 0x110, b)]);
        assert_eq!(got, rows(&[(0x100, a), (0x108, b), (0x110, INVALID)]));
    }

    #[test]
    fn sleb128_matches_known_encodings() {
        for (v, want) in [
            (8i64, vec![0x08]),
            (120, vec![0xf8, 0x00]),
            (160, vec![0xa0, 0x01]),
            (-8, vec![0x78]),
            (-129, vec![0xff, 0x7e]),
        ] {
            let mut out = Vec::new();
            sleb128(v, &mut out);
            assert_eq!(out, want, "{v}");
        }
        assert_eq!(
            Patterns::new().plt,
            [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22]
        );
    }
}
