//! What replay does with each event kind ([`Op`]), and [`Ctx`]: that and
//! the rest of a replay's constants as tables by kind, which the decode
//! workers and the partitions share.

use memleak_trace::EventKind;

use super::process::{KERNEL_SLOT, PAGE_SLOT};
use crate::filter::ResolvedFilter;
use crate::hash::mix;

/// What replay does with an event kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Alloc,
    Free,
    KernelAlloc,
    KernelFree,
    PageAlloc,
    PageFree,
    Realloc,
    Map,
    Unmap,
    Remap,
    Exec,
    Exit,
    Fork,
    Nothing,
}

fn op_of(kind: EventKind) -> Op {
    use memleak_trace::schema::KindClass;
    match (kind, kind.class()) {
        (EventKind::PageAlloc, _) => Op::PageAlloc,
        (EventKind::PageFree, _) => Op::PageFree,
        (EventKind::Exec, _) => Op::Exec,
        (EventKind::Exit, _) => Op::Exit,
        (EventKind::Fork, _) => Op::Fork,
        (_, KindClass::Alloc) if kind.is_kernel() => Op::KernelAlloc,
        (_, KindClass::Free) if kind.is_kernel() => Op::KernelFree,
        (_, KindClass::Alloc) => Op::Alloc,
        (_, KindClass::Free) => Op::Free,
        (_, KindClass::Realloc) => Op::Realloc,
        (_, KindClass::MapRange) => Op::Map,
        (_, KindClass::UnmapRange) => Op::Unmap,
        (_, KindClass::RemapRange) => Op::Remap,
        (_, KindClass::Process) => Op::Nothing,
    }
}

/// Per-replay constants shared by the workers.
pub(super) struct Ctx<'a> {
    pub(super) nparts: usize,
    pub(super) ops: [Op; 256],
    /// Whether events of a kind take part, pid filter aside.
    pub(super) kind_ok: [bool; 256],
    /// The table a kind's rows use: [`KERNEL_SLOT`], [`PAGE_SLOT`], or
    /// [`USER_TABLE`] for the process's own.
    pub(super) table_of: [u8; 256],
    /// Kinds replayed by the owner of their address alone (allocations
    /// and frees).
    pub(super) by_addr: [bool; 256],
    /// How [`count_allocations`](super::decoded) counts rows of a kind.
    pub(super) alloc_class: [u8; 256],
    /// The code of a kind for a single-partition replay: one of
    /// [`C_SKIP`], [`C_ALLOC_USER`] … [`C_REALLOC`] for allocations, frees
    /// and reallocs (and kinds that do nothing), the kind itself for the
    /// rest.
    pub(super) code_of: [u8; 256],
    /// Whether a kind's rows take part in the scan for temporary
    /// allocations, whatever the filter: [`HEAP_ALLOC`], [`HEAP_FREE`],
    /// [`HEAP_REALLOC`], or 0.
    pub(super) heap: [u8; 256],
    /// The threshold of temporary allocations, ns.
    pub(super) temporary_ns: u64,
    pub(super) filter: &'a ResolvedFilter,
    /// A sampled trace's sampling: heap allocations count for what they
    /// stand for.
    pub(super) sampling: Option<memleak_trace::Sampling>,
}

/// Codes of [`Ctx::code_of`] (and of `packed.rs`'s operations), above every kind's: rows that do nothing,
/// allocations and frees of a process's, the kernel's or the pages'
/// table that replay makes, and reallocs.
pub(super) const C_SKIP: u8 = 0x80;
pub(super) const C_ALLOC_USER: u8 = 0x81;
pub(super) const C_ALLOC_KERNEL: u8 = 0x82;
pub(super) const C_ALLOC_PAGE: u8 = 0x83;
pub(super) const C_FREE_USER: u8 = 0x84;
pub(super) const C_FREE_KERNEL: u8 = 0x85;
pub(super) const C_FREE_PAGE: u8 = 0x86;
pub(super) const C_REALLOC: u8 = 0x87;

/// In [`Ctx::heap`]: a process's heap allocation, free, realloc.
pub(super) const HEAP_ALLOC: u8 = 1;
pub(super) const HEAP_FREE: u8 = 2;
pub(super) const HEAP_REALLOC: u8 = 3;

/// In [`Ctx::table_of`]: the event's process's table.
pub(super) const USER_TABLE: usize = 255;

/// In [`Ctx::alloc_class`]: rows of the kind allocate nothing (or the
/// filter drops the kind), allocate if their address is not 0, or if
/// their size is not 0 either.
pub(super) const NOT_ALLOC: u8 = 0;
const ADDR_ALLOC: u8 = 1;
pub(super) const MAP_ALLOC: u8 = 2;

/// Whether a realloc row frees its old address: it has one, and the call
/// did not fail (realloc(p, n > 0) returning NULL leaves p alone).
#[inline(always)]
pub(super) fn realloc_frees(old: u64, new: u64, size: u64) -> bool {
    old != 0 && !(new == 0 && size > 0)
}

impl<'a> Ctx<'a> {
    pub(super) fn new(nparts: usize, filter: &'a ResolvedFilter, temporary_ns: u64) -> Self {
        let mut ops = [Op::Nothing; 256];
        let mut kind_ok = [false; 256];
        let mut table_of = [KERNEL_SLOT as u8; 256];
        let mut by_addr = [false; 256];
        let mut alloc_class = [NOT_ALLOC; 256];
        let mut code_of = [C_SKIP; 256];
        let mut heap = [0u8; 256];
        table_of[C_ALLOC_PAGE as usize] = PAGE_SLOT as u8;
        table_of[C_FREE_PAGE as usize] = PAGE_SLOT as u8;
        table_of[C_ALLOC_USER as usize] = USER_TABLE as u8;
        table_of[C_FREE_USER as usize] = USER_TABLE as u8;
        table_of[C_REALLOC as usize] = USER_TABLE as u8;
        for &k in EventKind::ALL {
            assert!((k as u8) < C_SKIP, "kind codes below the replay codes");
            code_of[k as usize] = match op_of(k) {
                _ if !filter.kind_selected(k) => C_SKIP,
                Op::Alloc => C_ALLOC_USER,
                Op::KernelAlloc => C_ALLOC_KERNEL,
                Op::PageAlloc => C_ALLOC_PAGE,
                Op::Free => C_FREE_USER,
                Op::KernelFree => C_FREE_KERNEL,
                Op::PageFree => C_FREE_PAGE,
                Op::Realloc => C_REALLOC,
                Op::Nothing => C_SKIP,
                _ => k as u8,
            };
            alloc_class[k as usize] = match op_of(k) {
                _ if !filter.kind_selected(k) => NOT_ALLOC,
                Op::Alloc | Op::KernelAlloc | Op::PageAlloc | Op::Realloc | Op::Remap => ADDR_ALLOC,
                Op::Map => MAP_ALLOC,
                _ => NOT_ALLOC,
            };
            heap[k as usize] = match op_of(k) {
                Op::Alloc => HEAP_ALLOC,
                Op::Free => HEAP_FREE,
                Op::Realloc => HEAP_REALLOC,
                _ => 0,
            };
            ops[k as usize] = op_of(k);
            kind_ok[k as usize] = filter.kind_selected(k);
            table_of[k as usize] = match op_of(k) {
                Op::PageAlloc | Op::PageFree => PAGE_SLOT as u8,
                Op::Alloc | Op::Free | Op::Realloc => USER_TABLE as u8,
                _ => KERNEL_SLOT as u8,
            };
            by_addr[k as usize] = matches!(
                op_of(k),
                Op::Alloc
                    | Op::Free
                    | Op::KernelAlloc
                    | Op::KernelFree
                    | Op::PageAlloc
                    | Op::PageFree
            );
        }
        Ctx {
            nparts,
            ops,
            kind_ok,
            table_of,
            by_addr,
            alloc_class,
            code_of,
            heap,
            temporary_ns,
            filter,
            sampling: None,
        }
    }

    #[inline(always)]
    pub(super) fn owner(&self, addr: u64) -> usize {
        if self.nparts == 1 {
            return 0;
        }
        // A different mix from the hash maps', so each partition's map
        // still sees well-spread hashes.
        (((mix(addr ^ 0x2545_F491_4F6C_DD1D) >> 32) * self.nparts as u64) >> 32) as usize
    }

    #[inline(always)]
    pub(super) fn selected(&self, kind: u8, pid: u32) -> bool {
        self.kind_ok[kind as usize] && (!self.filter.has_pids() || self.filter.pid_selected(pid))
    }
}
