//! Where to put a uprobe inside an allocator function.
//!
//! A uprobe on an instruction the kernel cannot emulate is executed by
//! single-stepping a copy of the instruction out of line, which costs an extra
//! trap, many times the cost of an emulated probe (docs/placement.md).
//! glibc's `free` starts with `test %rdi,%rdi`,
//! which is single-stepped; the `je` right after it is emulated. Moving the
//! probe a few bytes into the function therefore makes every `free` many
//! times cheaper to trace.
//!
//! Moving a probe is only correct when the program state the probe looks at is
//! the same as at the entry and when every execution of the function still
//! hits the probe exactly once. [`choose`] decides this from the function's
//! machine code alone; [`resolve`] adds the ELF symbol lookup. The rules and
//! the measurements behind them are described in `docs/placement.md`.
//!
//! Everything here is pure (no kernel interaction); the only I/O is reading
//! the ELF file in [`resolve`].

use std::fmt;
use std::path::Path;

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic,
    OpAccess, OpKind, Register,
};

use crate::elf::{ElfError, ElfFile, SymbolKind};

/// At most this many instructions are skipped before the probe.
pub const MAX_SKIP_INSNS: usize = 8;
/// The probe is never placed further than this many bytes from the entry.
pub const MAX_SKIP_BYTES: u64 = 32;

/// What the probe at this function is used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    /// Only the entry probe matters (e.g. `free`): the arguments are read,
    /// the stack pointer may have moved.
    EntryOnly,
    /// The entry probe also installs a return probe (uretprobe /
    /// uprobe_multi session). The kernel does this by replacing the return
    /// address at `[rsp]` when the entry probe fires, so `rsp` must still point
    /// at the return address at the probe.
    EntryAndReturn,
}

/// `--probe-placement=auto|entry`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Move the probe past non-emulated instructions when it is provably safe.
    #[default]
    Auto,
    /// Always probe the first instruction of the function.
    Entry,
}

impl std::str::FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Policy::Auto),
            "entry" => Ok(Policy::Entry),
            other => Err(format!(
                "unknown probe placement {other:?} (expected auto or entry)"
            )),
        }
    }
}

/// The decision for one function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Probe the first instruction of the function.
    Entry {
        /// Why the probe was not moved (human readable).
        reason: String,
    },
    /// Probe the instruction `offset` bytes after the entry.
    Offset {
        /// Distance from the function's first byte, always > 0 and on an
        /// instruction boundary.
        offset: u64,
        /// The skipped instructions, one line each (`+off: bytes  asm`).
        skipped: Vec<String>,
        /// True when no skipped instruction writes `rsp`, i.e. `[rsp]` at the
        /// probe is still the return address. Always true for
        /// [`ProbeKind::EntryAndReturn`]. A recorder that captures user stacks
        /// can use it to add the caller frame itself (the kernel only does that
        /// for probes on `push %rbp` / `endbr64`).
        rsp_preserved: bool,
    },
}

impl Placement {
    /// Offset of the probe from the function's first byte (0 for [`Placement::Entry`]).
    pub fn offset(&self) -> u64 {
        match self {
            Placement::Entry { .. } => 0,
            Placement::Offset { offset, .. } => *offset,
        }
    }

    /// True when `[rsp]` at the probe is the function's return address.
    pub fn rsp_preserved(&self) -> bool {
        match self {
            Placement::Entry { .. } => true,
            Placement::Offset { rsp_preserved, .. } => *rsp_preserved,
        }
    }

    fn entry(reason: impl Into<String>) -> Self {
        Placement::Entry {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Entry { reason } => write!(f, "entry ({reason})"),
            Placement::Offset {
                offset, skipped, ..
            } => {
                write!(f, "+{offset} (skipping ")?;
                for (i, s) in skipped.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    f.write_str(s)?;
                }
                f.write_str(")")
            }
        }
    }
}

/// Decides where to probe a function, from its code alone.
///
/// `code` holds the function's bytes starting at its first instruction (at
/// least `func_size` bytes are needed for [`Policy::Auto`] to move the probe),
/// `func_addr` is the function's address in the same address space as the
/// branch targets encoded in `code` (e.g. the ELF symbol value), `func_size`
/// the symbol size. Equivalent to [`choose_with_entry_points`] with no extra
/// entry points.
pub fn choose(
    code: &[u8],
    func_addr: u64,
    func_size: u64,
    kind: ProbeKind,
    policy: Policy,
) -> Placement {
    choose_with_entry_points(code, func_addr, func_size, kind, policy, &[])
}

/// Like [`choose`], but also treats every address in `other_entry_points`
/// (typically other symbols that point inside this function) as a possible
/// way into the function that bypasses the entry: the probe is never moved to
/// or past one of them.
pub fn choose_with_entry_points(
    code: &[u8],
    func_addr: u64,
    func_size: u64,
    kind: ProbeKind,
    policy: Policy,
    other_entry_points: &[u64],
) -> Placement {
    if policy == Policy::Entry {
        return Placement::entry("probe placement policy is `entry`");
    }
    if func_size == 0 {
        return Placement::entry("function size unknown (symbol size 0)");
    }
    let Ok(size) = usize::try_from(func_size) else {
        return Placement::entry("function size too large");
    };
    if code.len() < size {
        return Placement::entry(format!(
            "only {} of the function's {func_size} bytes are available",
            code.len()
        ));
    }
    let code = &code[..size];
    let insns = match decode_all(code, func_addr) {
        Ok(insns) => insns,
        Err(at) => {
            return Placement::entry(format!(
                "undecodable bytes at +{}",
                at.wrapping_sub(func_addr)
            ))
        }
    };
    let bytes_of = |insn: &Instruction| -> &[u8] {
        let start = (insn.ip() - func_addr) as usize;
        &code[start..start + insn.len()]
    };

    let first = &insns[0];
    if kernel_emulates(first, bytes_of(first)) {
        return Placement::entry(format!(
            "first instruction `{}` is emulated by the kernel",
            describe(first)
        ));
    }

    // Rule 2: walk forward over skippable instructions to the first emulated one.
    let mut info_factory = InstructionInfoFactory::new();
    let mut skipped = Vec::new();
    let mut rsp_preserved = true;
    let mut target = None;
    for (i, insn) in insns.iter().enumerate() {
        let off = insn.ip() - func_addr;
        if i > 0 && kernel_emulates(insn, bytes_of(insn)) {
            target = Some(off);
            break;
        }
        if i >= MAX_SKIP_INSNS || off + insn.len() as u64 > MAX_SKIP_BYTES {
            return Placement::entry(format!(
                "no kernel-emulated instruction within the first {MAX_SKIP_INSNS} \
                 instructions / {MAX_SKIP_BYTES} bytes"
            ));
        }
        match check_skippable(insn, kind, &mut info_factory) {
            Ok(writes_rsp) => rsp_preserved &= !writes_rsp,
            Err(why) => {
                return Placement::entry(format!(
                    "cannot skip `{}` at +{off}: {why}",
                    describe(insn)
                ))
            }
        }
        skipped.push(format!(
            "+{off}: {}  {}",
            hex(bytes_of(insn)),
            describe(insn)
        ));
    }
    let Some(offset) = target else {
        return Placement::entry("no kernel-emulated instruction before the end of the function");
    };

    // Rule 3: nothing may reach (entry, probe] without passing the entry.
    let lo = func_addr;
    let hi = func_addr + offset;
    let in_skipped_range = |a: u64| a > lo && a <= hi;
    for insn in &insns {
        for t in near_branch_targets(insn) {
            if in_skipped_range(t) {
                return Placement::entry(format!(
                    "`{}` at +{} jumps to +{}, inside the skipped range",
                    describe(insn),
                    insn.ip() - func_addr,
                    t - func_addr
                ));
            }
        }
        if insn.flow_control() == FlowControl::IndirectBranch && !is_tail_call_through_got(insn) {
            return Placement::entry(format!(
                "indirect jump `{}` at +{} may be a jump table with unknown targets",
                describe(insn),
                insn.ip() - func_addr
            ));
        }
    }
    if let Some(&a) = other_entry_points.iter().find(|&&a| in_skipped_range(a)) {
        return Placement::entry(format!(
            "another entry point (symbol) at +{} lies inside the skipped range",
            a - func_addr
        ));
    }

    debug_assert!(kind == ProbeKind::EntryOnly || rsp_preserved);
    Placement::Offset {
        offset,
        skipped,
        rsp_preserved,
    }
}

/// Does Linux (6.18, x86-64) emulate this instruction when a uprobe sits on it,
/// instead of single-stepping it out of line? `bytes` are the instruction's
/// raw bytes.
///
/// The set is the one measured on the development machines (see
/// `docs/placement.md`): relative `jmp`/`jcc`/`call rel32`, `push r64`
/// (`50+r` or `41 50+r` only), and the kernel's canonical NOPs of 1 to 8 bytes
/// plus `pause`. Instructions with an ES/CS/DS/SS segment or LOCK prefix are
/// rejected by the kernel altogether and never count as emulated.
pub fn kernel_emulates(insn: &Instruction, bytes: &[u8]) -> bool {
    if insn.is_invalid() || bytes.len() != insn.len() || has_prefix_rejected_by_kernel(bytes) {
        return false;
    }
    match insn.code() {
        Code::Jmp_rel8_64 | Code::Jmp_rel32_64 | Code::Call_rel32_64 => true,
        // `push r64`: the kernel decodes only the plain and REX.B (0x41) forms;
        // `48 53` (REX.W) and `66 50` (pushw) are single-stepped (measured).
        Code::Push_r64 => matches!(bytes, [0x50..=0x57] | [0x41, 0x50..=0x57]),
        Code::Nopw | Code::Nopd | Code::Nopq | Code::Pause | Code::Nop_rm16 | Code::Nop_rm32 => {
            CANONICAL_NOPS.contains(&bytes)
        }
        _ => insn.is_jcc_short_or_near() && insn.op0_kind() == OpKind::NearBranch64,
    }
}

/// NOPs the kernel emulates (exact bytes). `66 0f 1f 84 00 00 00 00 00`
/// (9 bytes) was measured *not* to be emulated; anything with a `2e` (cs)
/// prefix cannot be probed at all.
const CANONICAL_NOPS: &[&[u8]] = &[
    &[0x90],
    &[0x66, 0x90],
    &[0xf3, 0x90],
    &[0x0f, 0x1f, 0x00],
    &[0x0f, 0x1f, 0x40, 0x00],
    &[0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00],
    &[0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
];

/// The kernel refuses to probe instructions with ES/CS/DS/SS segment or LOCK
/// prefixes (registering succeeds, but the probe never fires — measured).
fn has_prefix_rejected_by_kernel(bytes: &[u8]) -> bool {
    for &b in bytes {
        match b {
            0x26 | 0x2e | 0x36 | 0x3e | 0xf0 => return true,
            0x64 | 0x65 | 0x66 | 0x67 | 0xf2 | 0xf3 => continue,
            _ => return false,
        }
    }
    false
}

/// Why an instruction may not execute before the probe. `Ok(true)` when it is
/// skippable but writes `rsp` (only possible for [`ProbeKind::EntryOnly`]).
fn check_skippable(
    insn: &Instruction,
    kind: ProbeKind,
    factory: &mut InstructionInfoFactory,
) -> Result<bool, String> {
    if insn.flow_control() != FlowControl::Next {
        return Err(format!("changes control flow ({:?})", insn.flow_control()));
    }
    if matches!(
        insn.mnemonic(),
        Mnemonic::Xend | Mnemonic::Xabort | Mnemonic::Xbegin
    ) {
        return Err("changes control flow (transactional memory)".into());
    }
    let info = factory.info(insn);
    for mem in info.used_memory() {
        if is_write(mem.access()) {
            return Err("writes memory".into());
        }
        // Reads through other registers (e.g. `mov -8(%rdi),%rax` in free)
        // may fault on a bad argument; the entry probe would still have seen
        // that call, so only reads that cannot depend on the arguments are
        // skipped.
        let base_ok = matches!(mem.base(), Register::None | Register::RIP | Register::RSP);
        if !base_ok || mem.index() != Register::None {
            return Err("reads memory through a register".into());
        }
    }
    let mut writes_rsp = false;
    for reg in info.used_registers() {
        if !is_write(reg.access()) {
            continue;
        }
        let full = reg.register().full_register();
        if ARGUMENT_REGISTERS.contains(&full) {
            return Err(format!(
                "writes argument register {}",
                reg_name(reg.register())
            ));
        }
        if full == Register::RSP {
            if kind == ProbeKind::EntryAndReturn {
                return Err("writes rsp (the return probe needs [rsp] = return address)".into());
            }
            writes_rsp = true;
        } else if !full.is_gpr() {
            return Err(format!("writes {}", reg_name(reg.register())));
        }
    }
    Ok(writes_rsp)
}

/// SysV x86-64 argument registers (integer and vector), as full registers.
const ARGUMENT_REGISTERS: &[Register] = &[
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
    Register::ZMM0,
    Register::ZMM1,
    Register::ZMM2,
    Register::ZMM3,
    Register::ZMM4,
    Register::ZMM5,
    Register::ZMM6,
    Register::ZMM7,
];

fn is_write(access: OpAccess) -> bool {
    matches!(
        access,
        OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

/// Decodes the whole function linearly; `Err(address)` on undecodable bytes.
fn decode_all(code: &[u8], func_addr: u64) -> Result<Vec<Instruction>, u64> {
    let mut decoder = Decoder::with_ip(64, code, func_addr, DecoderOptions::NONE);
    let mut out = Vec::new();
    let mut insn = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            return Err(insn.ip());
        }
        out.push(insn);
    }
    Ok(out)
}

/// Direct branch targets of an instruction (jmp, jcc, call, loop, xbegin, …).
fn near_branch_targets(insn: &Instruction) -> impl Iterator<Item = u64> + '_ {
    (0..insn.op_count()).filter_map(move |i| match insn.op_kind(i) {
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => {
            Some(insn.near_branch_target())
        }
        _ => None,
    })
}

/// `jmp *sym@GOTPCREL(%rip)`-style jumps go to another function; anything else
/// indirect (register, `[base+index*scale]`) may be a jump table.
fn is_tail_call_through_got(insn: &Instruction) -> bool {
    insn.op0_kind() == OpKind::Memory
        && insn.memory_base() == Register::RIP
        && insn.memory_index() == Register::None
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 3);
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn reg_name(r: Register) -> String {
    format!("{r:?}").to_ascii_lowercase()
}

/// A small Intel-syntax rendering (the crate is built without iced's
/// formatters): `test rdi, rdi`, `cmp byte [rip+0x140201], 0x0`, `je 0x98fb8`.
pub fn describe(insn: &Instruction) -> String {
    let mut s = format!("{:?}", insn.mnemonic()).to_ascii_lowercase();
    for i in 0..insn.op_count() {
        s.push_str(if i == 0 { " " } else { ", " });
        match insn.op_kind(i) {
            OpKind::Register => s.push_str(&reg_name(insn.op_register(i))),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => {
                s.push_str(&format!("{:#x}", insn.near_branch_target()))
            }
            OpKind::Memory => s.push_str(&describe_memory(insn)),
            OpKind::Immediate8
            | OpKind::Immediate8_2nd
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate64
            | OpKind::Immediate8to16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64 => {
                let v = insn.immediate(i) as i64;
                if v < 0 {
                    s.push_str(&format!("-{:#x}", v.unsigned_abs()))
                } else {
                    s.push_str(&format!("{v:#x}"))
                }
            }
            other => s.push_str(&format!("{other:?}")),
        }
    }
    s
}

fn describe_memory(insn: &Instruction) -> String {
    let size = match insn.memory_size().size() {
        1 => "byte ",
        2 => "word ",
        4 => "dword ",
        8 => "qword ",
        _ => "",
    };
    let seg = match insn.segment_prefix() {
        Register::FS => "fs:",
        Register::GS => "gs:",
        _ => "",
    };
    let mut inner = String::new();
    let disp = insn.memory_displacement64() as i64;
    if insn.memory_base() == Register::RIP {
        let rel = insn.memory_displacement64().wrapping_sub(insn.next_ip()) as i64;
        inner.push_str("rip");
        push_disp(&mut inner, rel);
    } else {
        if insn.memory_base() != Register::None {
            inner.push_str(&reg_name(insn.memory_base()));
        }
        if insn.memory_index() != Register::None {
            if !inner.is_empty() {
                inner.push('+');
            }
            inner.push_str(&reg_name(insn.memory_index()));
            if insn.memory_index_scale() != 1 {
                inner.push_str(&format!("*{}", insn.memory_index_scale()));
            }
        }
        if inner.is_empty() {
            inner.push_str(&format!("{:#x}", insn.memory_displacement64()));
        } else {
            push_disp(&mut inner, disp);
        }
    }
    format!("{size}{seg}[{inner}]")
}

fn push_disp(s: &mut String, disp: i64) {
    match disp {
        0 => {}
        d if d < 0 => s.push_str(&format!("-{:#x}", d.unsigned_abs())),
        d => s.push_str(&format!("+{d:#x}")),
    }
}

/// One probe location, ready to attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedProbe {
    /// The name as requested (possibly versioned, e.g. `free@@GLIBC_2.2.5`).
    pub symbol: String,
    /// Other defined function symbols at the same address (e.g. `__libc_free`,
    /// `cfree`). Attaching to several of them would count every call twice.
    pub aliases: Vec<String>,
    /// The symbol value (virtual address in the ELF file).
    pub address: u64,
    /// File offset of the function's first byte (what uprobes attach to).
    pub file_offset: u64,
    /// Symbol size in bytes.
    pub func_size: u64,
    /// Where in the function to probe.
    pub placement: Placement,
}

impl ResolvedProbe {
    /// File offset to attach the uprobe at: `file_offset + placement.offset()`.
    pub fn probe_file_offset(&self) -> u64 {
        self.file_offset + self.placement.offset()
    }
}

/// Looks up `symbols` in the ELF file at `elf_path` and decides the placement
/// of each. The result has one entry per requested symbol, in order; `None`
/// means the file does not define that function.
///
/// Names may carry a version (`free@@GLIBC_2.2.5`, `free@GLIBC_2.2.5`);
/// without one, the default version is preferred. Both `.dynsym` and
/// `.symtab` are searched. Any other function symbol that points inside the
/// skipped range counts as an extra entry point (see
/// [`choose_with_entry_points`]). `STT_GNU_IFUNC` symbols resolve to the
/// resolver function; they are returned with an entry placement whose reason
/// says so, and should normally not be probed.
pub fn resolve(
    elf_path: &Path,
    symbols: &[&str],
    kind: ProbeKind,
    policy: Policy,
) -> Result<Vec<Option<ResolvedProbe>>, ElfError> {
    let elf = ElfFile::open(elf_path)?;
    Ok(symbols
        .iter()
        .map(|name| resolve_one(&elf, name, kind, policy))
        .collect())
}

/// [`resolve`] on an already parsed file, for one symbol.
pub fn resolve_one(
    elf: &ElfFile,
    name: &str,
    kind: ProbeKind,
    policy: Policy,
) -> Option<ResolvedProbe> {
    let sym = elf.lookup_function(name)?;
    let file_offset = elf.vaddr_to_offset(sym.value)?;
    let mut aliases: Vec<String> = elf
        .function_symbols()
        .filter(|s| s.value == sym.value && s.name != sym.name)
        .map(|s| s.name.clone())
        .collect();
    aliases.sort();
    aliases.dedup();
    let placement = if sym.kind == SymbolKind::Ifunc {
        Placement::entry("STT_GNU_IFUNC: the symbol is the resolver, not the implementation")
    } else {
        let code = elf.bytes_at(sym.value, sym.size).unwrap_or(&[]);
        let end = sym.value.saturating_add(sym.size);
        let others: Vec<u64> = elf
            .function_symbols()
            .map(|s| s.value)
            .filter(|&v| v > sym.value && v < end)
            .collect();
        choose_with_entry_points(code, sym.value, sym.size, kind, policy, &others)
    };
    Some(ResolvedProbe {
        symbol: name.to_string(),
        aliases,
        address: sym.value,
        file_offset,
        func_size: sym.size,
        placement,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x1000;

    fn pad(mut v: Vec<u8>) -> Vec<u8> {
        v.push(0xc3);
        v
    }

    fn auto(code: &[u8], kind: ProbeKind) -> Placement {
        choose(code, BASE, code.len() as u64, kind, Policy::Auto)
    }

    #[test]
    fn test_then_je_moves_to_je() {
        let code = pad(vec![0x48, 0x85, 0xff, 0x74, 0x00]);
        let p = auto(&code, ProbeKind::EntryOnly);
        assert_eq!(p.offset(), 3, "{p}");
        match p {
            Placement::Offset {
                skipped,
                rsp_preserved,
                ..
            } => {
                assert_eq!(skipped, vec!["+0: 48 85 ff  test rdi, rdi".to_string()]);
                assert!(rsp_preserved);
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn emulated_first_instruction_is_entry() {
        for code in [
            vec![0x41, 0x54, 0xc3],             // push r12
            vec![0x55, 0xc3],                   // push rbp
            vec![0x90, 0xc3],                   // nop
            vec![0x0f, 0x1f, 0x44, 0, 0, 0xc3], // nop5
            vec![0xeb, 0x00, 0xc3],             // jmp rel8
            vec![0x74, 0x00, 0xc3],             // je rel8
        ] {
            let p = auto(&code, ProbeKind::EntryAndReturn);
            assert!(matches!(p, Placement::Entry { .. }), "{code:x?}: {p}");
        }
    }

    #[test]
    fn emulation_table() {
        let cases: &[(&[u8], bool)] = &[
            (&[0x53], true),
            (&[0x41, 0x57], true),
            (&[0x48, 0x53], false),             // REX.W push: single-stepped
            (&[0x66, 0x50], false),             // pushw
            (&[0x6a, 0x01], false),             // push imm
            (&[0x5b], false),                   // pop
            (&[0xc3], false),                   // ret
            (&[0xf3, 0x0f, 0x1e, 0xfa], false), // endbr64
            (&[0x66, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0], false),
            (&[0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0], false),
            (&[0x3e, 0x74, 0x00], false), // ds-prefixed jcc: unprobeable
            (&[0xf2, 0xe9, 0, 0, 0, 0], true), // bnd jmp
            (&[0x0f, 0x85, 0, 0, 0, 0], true),
            (&[0xe8, 0, 0, 0, 0], true),
            (&[0x66, 0x90], true),
        ];
        for (bytes, want) in cases {
            let mut d = Decoder::with_ip(64, bytes, BASE, DecoderOptions::NONE);
            let insn = d.decode();
            assert_eq!(insn.len(), bytes.len(), "{bytes:x?}");
            assert_eq!(kernel_emulates(&insn, bytes), *want, "{bytes:x?}");
        }
    }

    #[test]
    fn describe_renders_common_forms() {
        let mut d = Decoder::with_ip(
            64,
            &[0x80, 0x3d, 0x01, 0x02, 0x14, 0x00, 0x00],
            0x9a280,
            DecoderOptions::NONE,
        );
        assert_eq!(describe(&d.decode()), "cmp byte [rip+0x140201], 0x0");
        let mut d = Decoder::with_ip(64, &[0x48, 0x8d, 0x77, 0xf0], 0, DecoderOptions::NONE);
        assert_eq!(describe(&d.decode()), "lea rsi, [rdi-0x10]");
    }

    #[test]
    fn policy_parses() {
        assert_eq!("auto".parse::<Policy>(), Ok(Policy::Auto));
        assert_eq!("entry".parse::<Policy>(), Ok(Policy::Entry));
        assert!("middle".parse::<Policy>().is_err());
    }
}
