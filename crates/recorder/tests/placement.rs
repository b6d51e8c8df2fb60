//! Probe placement: crafted code for every rule, then the real glibc and
//! libstdc++ of the machine running the tests.

#[path = "../../../tests/common/skip.rs"]
mod skip;

use std::path::Path;

use iced_x86::{Decoder, DecoderOptions};
use memleak_recorder::elf::ElfFile;
use memleak_recorder::placement::{
    choose, choose_with_entry_points, resolve, Placement, Policy, ProbeKind, ResolvedProbe,
    MAX_SKIP_INSNS,
};

const BASE: u64 = 0x40_0000;
const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const LIBSTDCXX: &str = "/lib/x86_64-linux-gnu/libstdc++.so.6";

const TEST_RDI: [u8; 3] = [0x48, 0x85, 0xff];
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

fn code(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn auto(code: &[u8], kind: ProbeKind) -> Placement {
    choose(code, BASE, code.len() as u64, kind, Policy::Auto)
}

fn both_kinds(code: &[u8]) -> [Placement; 2] {
    [
        auto(code, ProbeKind::EntryOnly),
        auto(code, ProbeKind::EntryAndReturn),
    ]
}

#[track_caller]
fn assert_entry(p: &Placement, reason_contains: &str) {
    match p {
        Placement::Entry { reason } => assert!(
            reason.contains(reason_contains),
            "reason {reason:?} lacks {reason_contains:?}"
        ),
        other => panic!("expected entry ({reason_contains}), got {other}"),
    }
}

#[track_caller]
fn assert_offset(p: &Placement, offset: u64) {
    match p {
        Placement::Offset { offset: o, .. } => assert_eq!(*o, offset, "{p}"),
        other => panic!("expected +{offset}, got {other}"),
    }
}

// Rule 1 and 2: the free pattern.
#[test]
fn test_then_je_probes_the_je() {
    let c = code(&[&TEST_RDI, &[0x74, 0x01, 0x55, 0xc3]]);
    for p in both_kinds(&c) {
        assert_offset(&p, 3);
        let Placement::Offset {
            skipped,
            rsp_preserved,
            ..
        } = &p
        else {
            unreachable!()
        };
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].contains("test rdi, rdi"), "{skipped:?}");
        assert!(rsp_preserved);
    }
}

#[test]
fn emulated_first_instruction_stays_at_entry() {
    let cases: &[&[u8]] = &[
        &[0x41, 0x54, 0xc3],                   // push r12 (malloc)
        &[0x55, 0xc3],                         // push rbp
        &[0x90, 0xc3],                         // nop
        &[0x66, 0x90, 0xc3],                   // xchg ax,ax
        &[0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3], // nop5
        &[0xe9, 0, 0, 0, 0, 0xc3],             // jmp rel32
        &[0x75, 0x00, 0xc3],                   // jne rel8
        &[0xe8, 0, 0, 0, 0, 0xc3],             // call rel32
    ];
    for c in cases {
        for p in both_kinds(c) {
            assert_entry(&p, "is emulated");
        }
    }
}

#[test]
fn rip_relative_compare_is_skipped() {
    // posix_memalign: cmpb $0x0,0x140201(%rip); push %r12
    let c = code(&[
        &[0x80, 0x3d, 0x01, 0x02, 0x14, 0x00, 0x00],
        &[0x41, 0x54, 0xc3],
    ]);
    for p in both_kinds(&c) {
        assert_offset(&p, 7);
    }
}

#[test]
fn mmap_pattern_skips_non_argument_write() {
    // mov %ecx,%r10d ; test $0xfff,%r9d ; jne +0 ; ret
    let c = code(&[
        &[0x41, 0x89, 0xca],
        &[0x41, 0xf7, 0xc1, 0xff, 0x0f, 0x00, 0x00],
        &[0x75, 0x00, 0xc3],
    ]);
    for p in both_kinds(&c) {
        assert_offset(&p, 10);
    }
}

#[test]
fn argument_register_write_blocks_the_move() {
    let cases: &[(&[u8], &str)] = &[
        (&[0x48, 0x89, 0xf7], "rdi"),         // mov %rsi,%rdi
        (&[0x31, 0xc9], "ecx"),               // xor %ecx,%ecx (sub-register of rcx)
        (&[0x41, 0xb0, 0x01], "r8l"),         // mov $1,%r8b
        (&[0x48, 0x8d, 0x77, 0xf0], "rsi"),   // lea -0x10(%rdi),%rsi
        (&[0x0f, 0xa2], "argument register"), // cpuid writes ecx/edx
        (&[0x66, 0x0f, 0xef, 0xc0], "xmm0"),  // pxor %xmm0,%xmm0 (vector argument)
    ];
    for (first, reg) in cases {
        let c = code(&[first, &[0x53, 0x5b, 0xc3]]);
        for p in both_kinds(&c) {
            assert_entry(&p, "writes argument register");
            assert_entry(&p, reg);
        }
    }
    // A write to a scratch register is fine.
    let c = code(&[&[0x48, 0x89, 0xf8], &[0x53, 0x5b, 0xc3]]); // mov %rdi,%rax
    for p in both_kinds(&c) {
        assert_offset(&p, 3);
    }
}

#[test]
fn rsp_write_only_allowed_for_entry_only_probes() {
    let cases: &[&[u8]] = &[
        &[0x48, 0x83, 0xec, 0x58],       // sub $0x58,%rsp (mremap)
        &[0x48, 0x8d, 0x64, 0x24, 0xf8], // lea -8(%rsp),%rsp
        &[0x48, 0x89, 0xc4],             // mov %rax,%rsp
    ];
    for first in cases {
        let c = code(&[first, &[0x74, 0x00, 0xc3]]);
        assert_entry(&auto(&c, ProbeKind::EntryAndReturn), "rsp");
        let p = auto(&c, ProbeKind::EntryOnly);
        assert_offset(&p, first.len() as u64);
        assert!(!p.rsp_preserved());
    }
    // `pop` writes rsp too, and is not emulated.
    let c = [0x5b, 0x74, 0x00, 0xc3];
    assert_entry(&auto(&c, ProbeKind::EntryAndReturn), "rsp");
    assert_offset(&auto(&c, ProbeKind::EntryOnly), 1);
}

#[test]
fn stores_and_argument_dependent_loads_are_not_skipped() {
    let c = code(&[&[0x48, 0x89, 0x3c, 0x24], &[0x74, 0x00, 0xc3]]); // mov %rdi,(%rsp)
    for p in both_kinds(&c) {
        assert_entry(&p, "writes memory");
    }
    let c = code(&[&[0x48, 0x8b, 0x47, 0xf8], &[0x74, 0x00, 0xc3]]); // mov -8(%rdi),%rax
    for p in both_kinds(&c) {
        assert_entry(&p, "reads memory through a register");
    }
    let c = code(&[&[0x48, 0x8b, 0x44, 0x24, 0x08], &[0x74, 0x00, 0xc3]]); // mov 8(%rsp),%rax
    for p in both_kinds(&c) {
        assert_offset(&p, 5);
    }
}

#[test]
fn control_flow_is_never_skipped() {
    // munmap: mov $0xb,%eax ; syscall ; ret
    let c = [0xb8, 0x0b, 0, 0, 0, 0x0f, 0x05, 0x74, 0x00, 0xc3];
    for p in both_kinds(&c) {
        assert_entry(&p, "cannot skip `syscall`");
    }
    let cases: &[&[u8]] = &[
        &[0xc3],             // ret
        &[0xff, 0xd0],       // call *%rax
        &[0xcc],             // int3
        &[0x0f, 0x0b],       // ud2
        &[0x0f, 0x01, 0xd5], // xend
    ];
    for first in cases {
        let c = code(&[&TEST_RDI, first, &[0x74, 0x00, 0xc3]]);
        for p in both_kinds(&c) {
            assert_entry(&p, "control flow");
        }
    }
}

#[test]
fn branch_into_the_skipped_range_falls_back() {
    // +0 test ; +3 je +7 ; +5 jmp +3 ; +7 ret   — the jmp reaches the probe
    // without passing the entry.
    let c = code(&[&TEST_RDI, &[0x74, 0x02, 0xeb, 0xfc, 0xc3]]);
    for p in both_kinds(&c) {
        assert_entry(&p, "jumps to +3");
    }
    // Jump to +1 (mid-instruction, still inside the range).
    let c = code(&[&TEST_RDI, &[0x74, 0x02, 0xeb, 0xfa, 0xc3]]);
    for p in both_kinds(&c) {
        assert_entry(&p, "jumps to +1");
    }
    // A call into the range counts too.
    let c = code(&[&TEST_RDI, &[0x74, 0x05, 0xe8, 0xf9, 0xff, 0xff, 0xff, 0xc3]]);
    for p in both_kinds(&c) {
        assert_entry(&p, "inside the skipped range");
    }
    // Jumping back to the entry itself is fine: the probe sees it as a new call,
    // exactly as an entry probe would.
    let c = code(&[&TEST_RDI, &[0x74, 0x02, 0xeb, 0xf9, 0xc3]]);
    for p in both_kinds(&c) {
        assert_offset(&p, 3);
    }
    // Jumps past the probe are fine.
    let c = code(&[&TEST_RDI, &[0x74, 0x02, 0xeb, 0x00, 0xc3]]);
    for p in both_kinds(&c) {
        assert_offset(&p, 3);
    }
}

#[test]
fn other_entry_points_inside_the_range_fall_back() {
    let c = code(&[&TEST_RDI, &[0x74, 0x00, 0xc3]]);
    let p = choose_with_entry_points(
        &c,
        BASE,
        c.len() as u64,
        ProbeKind::EntryOnly,
        Policy::Auto,
        &[BASE + 3],
    );
    assert_entry(&p, "another entry point");
    let p = choose_with_entry_points(
        &c,
        BASE,
        c.len() as u64,
        ProbeKind::EntryOnly,
        Policy::Auto,
        &[BASE, BASE + 5],
    );
    assert_offset(&p, 3);
}

#[test]
fn indirect_jumps() {
    // Register jump (possible jump table) anywhere in the function: fall back.
    let c = code(&[&TEST_RDI, &[0x74, 0x02, 0xff, 0xe0, 0xc3]]);
    for p in both_kinds(&c) {
        assert_entry(&p, "jump table");
    }
    // notrack jmp *%rax: same.
    let c = code(&[&TEST_RDI, &[0x74, 0x03, 0x3e, 0xff, 0xe0, 0xc3]]);
    for p in both_kinds(&c) {
        assert_entry(&p, "jump table");
    }
    // Indexed memory jump (non-PIC jump table).
    let c = code(&[&TEST_RDI, &[0x74, 0x07, 0xff, 0x24, 0xc5, 0, 0, 0, 0, 0xc3]]);
    for p in both_kinds(&c) {
        assert_entry(&p, "jump table");
    }
    // jmp *sym@GOTPCREL(%rip): a tail call, fine.
    let c = code(&[&TEST_RDI, &[0x74, 0x06, 0xff, 0x25, 0, 0x10, 0, 0, 0xc3]]);
    for p in both_kinds(&c) {
        assert_offset(&p, 3);
    }
}

#[test]
fn endbr64_is_skipped() {
    // endbr64 ; push %rbp  → +4 (endbr64 measured as single-stepped)
    let c = code(&[&ENDBR64, &[0x55, 0x5d, 0xc3]]);
    for p in both_kinds(&c) {
        assert_offset(&p, 4);
    }
    // endbr64 ; jmp free@plt  (operator delete)
    let c = code(&[&ENDBR64, &[0xe9, 0, 0, 0, 0]]);
    for p in both_kinds(&c) {
        assert_offset(&p, 4);
    }
    // operator new: endbr64 ; test %rdi,%rdi ; mov $1,%eax ; push %rbx
    let c = code(&[
        &ENDBR64,
        &TEST_RDI,
        &[0xb8, 0x01, 0, 0, 0],
        &[0x53, 0x5b, 0xc3],
    ]);
    for p in both_kinds(&c) {
        assert_offset(&p, 12);
        let Placement::Offset { skipped, .. } = &p else {
            unreachable!()
        };
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert!(skipped[0].contains("endbr64"), "{skipped:?}");
    }
}

#[test]
fn only_kernel_probeable_nops_are_targets() {
    // 66 2e 0f 1f 84 … (cs nopw) cannot be probed at all; 66 0f 1f 84 … (9-byte nop)
    // is single-stepped. Neither is a target; both can be skipped.
    let c = code(&[
        &TEST_RDI,
        &[0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0],
        &[0x66, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0],
        &[0x90, 0xc3],
    ]);
    for p in both_kinds(&c) {
        assert_offset(&p, 22);
    }
}

#[test]
fn search_is_bounded() {
    let mut c = Vec::new();
    for _ in 0..=MAX_SKIP_INSNS {
        c.extend_from_slice(&TEST_RDI);
    }
    c.extend_from_slice(&[0x74, 0x00, 0xc3]);
    for p in both_kinds(&c) {
        assert_entry(&p, "no kernel-emulated instruction within");
    }
    // Exactly MAX_SKIP_INSNS × test (24 bytes) is within both bounds.
    let c = code(&[&TEST_RDI.repeat(MAX_SKIP_INSNS), &[0x74, 0x00, 0xc3]]);
    assert_offset(&auto(&c, ProbeKind::EntryOnly), 24);
    // Two 10-byte instructions plus a 13-byte one exceed MAX_SKIP_BYTES.
    let movabs = [0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8]; // movabs $…,%rax
    let c = code(&[&movabs, &movabs, &movabs, &movabs, &[0x74, 0x00, 0xc3]]);
    assert_entry(&auto(&c, ProbeKind::EntryOnly), "32 bytes");
    // Function ends before anything emulated.
    assert_entry(
        &auto(&[0x48, 0x85, 0xff, 0xc3], ProbeKind::EntryOnly),
        "cannot skip `ret`",
    );
    assert_entry(&auto(&TEST_RDI, ProbeKind::EntryOnly), "before the end");
}

#[test]
fn incomplete_information_falls_back() {
    let c = code(&[&TEST_RDI, &[0x74, 0x00, 0xc3]]);
    let p = choose(&c, BASE, 0, ProbeKind::EntryOnly, Policy::Auto);
    assert_entry(&p, "size unknown");
    let p = choose(&c, BASE, 100, ProbeKind::EntryOnly, Policy::Auto);
    assert_entry(&p, "only 6 of the function's 100 bytes");
    let c = code(&[&TEST_RDI, &[0x74, 0x00, 0xc3, 0x06]]); // 0x06 is invalid in 64-bit mode
    assert_entry(&auto(&c, ProbeKind::EntryOnly), "undecodable bytes at +6");
    assert_entry(&auto(&[], ProbeKind::EntryOnly), "size unknown");
}

#[test]
fn entry_policy_always_probes_the_entry() {
    let c = code(&[&TEST_RDI, &[0x74, 0x00, 0xc3]]);
    for kind in [ProbeKind::EntryOnly, ProbeKind::EntryAndReturn] {
        let p = choose(&c, BASE, c.len() as u64, kind, Policy::Entry);
        assert_entry(&p, "policy");
        assert_eq!(p.offset(), 0);
    }
}

/// Cheap deterministic fuzzing: never panics, and every move lands on an
/// instruction boundary within the bounds.
#[test]
fn random_code_never_panics_and_moves_stay_on_boundaries() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let alphabet: &[&[u8]] = &[
        &TEST_RDI,
        &ENDBR64,
        &[0x74, 0x00],
        &[0x53],
        &[0x5b],
        &[0x48, 0x83, 0xec, 0x08],
        &[0x41, 0x89, 0xca],
        &[0x48, 0x89, 0xf7],
        &[0xeb, 0xfb],
        &[0x90],
        &[0x0f, 0x05],
        &[0xc3],
        &[0x80, 0x3d, 0, 0, 0, 0, 0],
    ];
    let mut moved = 0;
    for _ in 0..5000 {
        let n = (next() % 12) as usize;
        let mut c = Vec::new();
        for _ in 0..n {
            c.extend_from_slice(alphabet[(next() % alphabet.len() as u64) as usize]);
        }
        if next() % 5 == 0 && !c.is_empty() {
            let i = (next() % c.len() as u64) as usize;
            c[i] = next() as u8;
        }
        for kind in [ProbeKind::EntryOnly, ProbeKind::EntryAndReturn] {
            let p = auto(&c, kind);
            if let Placement::Offset { offset, .. } = p {
                moved += 1;
                assert!(offset > 0 && offset < 32);
                assert!(is_boundary(&c, BASE, offset), "{c:x?} +{offset}");
                if kind == ProbeKind::EntryAndReturn {
                    assert!(p.rsp_preserved());
                }
            }
        }
    }
    assert!(moved > 100, "fuzzer too weak: {moved}");
}

fn is_boundary(code: &[u8], addr: u64, offset: u64) -> bool {
    let mut d = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    while d.can_decode() {
        let insn = d.decode();
        if insn.ip() - addr == offset {
            return true;
        }
        if insn.ip() - addr > offset {
            return false;
        }
    }
    false
}

// ---------------------------------------------------------------------------
// Real libraries.

const GLIBC_ALLOCATORS: &[(&str, ProbeKind)] = &[
    ("free", ProbeKind::EntryOnly),
    ("malloc", ProbeKind::EntryAndReturn),
    ("calloc", ProbeKind::EntryAndReturn),
    ("realloc", ProbeKind::EntryAndReturn),
    ("posix_memalign", ProbeKind::EntryAndReturn),
    ("aligned_alloc", ProbeKind::EntryAndReturn),
    ("memalign", ProbeKind::EntryAndReturn),
    ("valloc", ProbeKind::EntryAndReturn),
    ("pvalloc", ProbeKind::EntryAndReturn),
    ("mmap", ProbeKind::EntryAndReturn),
    ("munmap", ProbeKind::EntryOnly),
    ("mremap", ProbeKind::EntryAndReturn),
];

fn resolve_real(path: &str, syms: &[(&str, ProbeKind)]) -> Option<Vec<(ResolvedProbe, Vec<u8>)>> {
    if !Path::new(path).exists() {
        skip::skip(format_args!("{path} is not installed"));
        return None;
    }
    let elf = ElfFile::open(Path::new(path)).unwrap();
    let mut out = Vec::new();
    for &(name, kind) in syms {
        let r = resolve(Path::new(path), &[name], kind, Policy::Auto).unwrap();
        let Some(r) = r.into_iter().next().unwrap() else {
            eprintln!("{path}: {name} not defined");
            continue;
        };
        let code = elf.bytes_at(r.address, r.func_size).unwrap().to_vec();
        assert_eq!(code.len() as u64, r.func_size, "{name}");
        check_invariants(&r, &code, kind);
        eprintln!(
            "{path}: {name:16} {:?} @{:#x} size {:4} -> probe file offset {:#x}: {}",
            kind,
            r.address,
            r.func_size,
            r.probe_file_offset(),
            r.placement
        );
        out.push((r, code));
    }
    Some(out)
}

fn check_invariants(r: &ResolvedProbe, code: &[u8], kind: ProbeKind) {
    let off = r.placement.offset();
    assert!(off < r.func_size, "{}: {}", r.symbol, r.placement);
    assert!(
        is_boundary(code, r.address, off),
        "{}: {}",
        r.symbol,
        r.placement
    );
    if kind == ProbeKind::EntryAndReturn {
        assert!(r.placement.rsp_preserved(), "{}", r.symbol);
    }
}

fn find<'a>(v: &'a [(ResolvedProbe, Vec<u8>)], name: &str) -> Option<&'a (ResolvedProbe, Vec<u8>)> {
    v.iter().find(|(r, _)| r.symbol == name)
}

#[test]
fn glibc_allocators() {
    let Some(v) = resolve_real(LIBC, GLIBC_ALLOCATORS) else {
        return;
    };
    // The decision for each well-known prologue, guarded on the observed bytes
    // so the test stays meaningful on other glibc builds.
    let (free, code) = find(&v, "free").expect("libc defines free");
    if code.starts_with(&[0x48, 0x85, 0xff, 0x0f, 0x84])
        || code.starts_with(&[0x48, 0x85, 0xff, 0x74])
    {
        assert_offset(&free.placement, 3);
        let Placement::Offset { skipped, .. } = &free.placement else {
            unreachable!()
        };
        assert!(skipped[0].contains("test rdi, rdi"));
    }
    assert!(
        free.aliases.iter().any(|a| a == "__libc_free"),
        "{:?}",
        free.aliases
    );
    let (malloc, code) = find(&v, "malloc").unwrap();
    if code.starts_with(&[0x41, 0x54]) || code.starts_with(&[0x55]) {
        assert_entry(&malloc.placement, "is emulated");
    }
    for name in [
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
        "pvalloc",
    ] {
        let (r, code) = find(&v, name).unwrap();
        // cmpb $0x0,disp32(%rip) followed by push r64 or jcc
        if code.starts_with(&[0x80, 0x3d])
            && code[6] == 0
            && matches!(code[7], 0x50..=0x57 | 0x41 | 0x74 | 0x75)
        {
            assert_offset(&r.placement, 7);
        }
    }
    let (mmap, code) = find(&v, "mmap").unwrap();
    if code.starts_with(&[0x41, 0x89, 0xca, 0x41, 0xf7, 0xc1]) && code[10] == 0x75 {
        assert_offset(&mmap.placement, 10);
    }
    let (munmap, code) = find(&v, "munmap").unwrap();
    if code.starts_with(&[0xb8, 0x0b, 0, 0, 0, 0x0f, 0x05]) {
        assert_entry(&munmap.placement, "syscall");
    }
    let (mremap, code) = find(&v, "mremap").unwrap();
    if code.starts_with(&[0x48, 0x83, 0xec]) {
        assert_entry(&mremap.placement, "rsp");
    }
}

#[test]
fn glibc_symbol_lookup() {
    if !Path::new(LIBC).exists() {
        skip::skip(format_args!("{LIBC} is not installed"));
        return;
    }
    let r = resolve(
        Path::new(LIBC),
        &[
            "free",
            "free@@GLIBC_2.2.5",
            "__libc_free",
            "free@GLIBC_0.0",
            "no_such_function_xyz",
        ],
        ProbeKind::EntryOnly,
        Policy::Auto,
    )
    .unwrap();
    let free = r[0].as_ref().unwrap();
    let versioned = r[1].as_ref().expect("versioned name resolves");
    assert_eq!(free.address, versioned.address);
    assert_eq!(free.placement, versioned.placement);
    assert_eq!(r[2].as_ref().unwrap().address, free.address);
    assert!(r[3].is_none());
    assert!(r[4].is_none());
    // The entry policy: same symbol, offset 0.
    let e = resolve(
        Path::new(LIBC),
        &["free"],
        ProbeKind::EntryOnly,
        Policy::Entry,
    )
    .unwrap();
    let e = e[0].as_ref().unwrap();
    assert_eq!(e.probe_file_offset(), e.file_offset);
    assert_entry(&e.placement, "policy");
    // Text of shared libraries is usually mapped at offset == vaddr; the uprobe
    // offset must anyway be a file offset inside the file.
    let len = std::fs::metadata(LIBC).unwrap().len();
    assert!(free.probe_file_offset() < len);
    assert!(resolve(
        Path::new("/nonexistent/libc.so"),
        &["free"],
        ProbeKind::EntryOnly,
        Policy::Auto
    )
    .is_err());
}

#[test]
fn libstdcxx_operators() {
    let syms: &[(&str, ProbeKind)] = &[
        ("_Znwm", ProbeKind::EntryAndReturn),
        ("_Znam", ProbeKind::EntryAndReturn),
        ("_ZnwmRKSt9nothrow_t", ProbeKind::EntryAndReturn),
        ("_ZnamRKSt9nothrow_t", ProbeKind::EntryAndReturn),
        ("_ZnwmSt11align_val_t", ProbeKind::EntryAndReturn),
        ("_ZnamSt11align_val_t", ProbeKind::EntryAndReturn),
        ("_ZdlPv", ProbeKind::EntryOnly),
        ("_ZdlPvm", ProbeKind::EntryOnly),
        ("_ZdaPv", ProbeKind::EntryOnly),
        ("_ZdaPvm", ProbeKind::EntryOnly),
        ("_ZdlPvSt11align_val_t", ProbeKind::EntryOnly),
        ("_ZdaPvSt11align_val_t", ProbeKind::EntryOnly),
    ];
    let Some(v) = resolve_real(LIBSTDCXX, syms) else {
        return;
    };
    for (r, code) in &v {
        // endbr64 ; jmp rel32 (the delete and new[] thunks)
        if code.starts_with(&ENDBR64) && code[4] == 0xe9 {
            assert_offset(&r.placement, 4);
        }
    }
}
