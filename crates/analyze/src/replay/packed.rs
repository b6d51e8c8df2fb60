//! The form of a row group a single partition replays: [`Packed`]
//! operations, and the one pass over the decoded rows that writes them
//! and counts the rows' allocations ([`count_rows`]; without packing, for
//! several partitions, [`count_allocations`]).

use super::allocated::Allocated;
use super::ctx::{
    realloc_frees, Ctx, C_ALLOC_USER, C_FREE_PAGE, C_FREE_USER, C_REALLOC, C_SKIP, HEAP_ALLOC,
    HEAP_FREE, HEAP_REALLOC, MAP_ALLOC, NOT_ALLOC,
};
use super::temporary::TempScan;
use memleak_trace::events::Slices;

/// A row group as the single-partition replay reads it: one 32-byte
/// [`PackedOp`] per allocation or free to make, written by the decode
/// workers while the rows' pages are in the cache. Replay then streams
/// one array instead of seven columns and a code per row (which cost it
/// about a fifth of its time in memory traffic), and skips rows that do
/// nothing without reading them. A realloc becomes the free of its old
/// address then the allocation of its new one; what does not fit an
/// operation (mappings, exec, exit, fork, a size of 2^56 or more, a stack id
/// of 2^32 or more) is kept whole in `rows` and replayed from there.
#[derive(Default)]
pub(super) struct Packed {
    pub(super) ops: Vec<PackedOp>,
    pub(super) rows: Vec<Row>,
}

/// One operation of [`Packed`]: `size_code` holds the size in its low 56
/// bits and the operation in its top byte (one of [`C_ALLOC_USER`] …
/// [`C_FREE_PAGE`], or [`C_ROW`], for which `addr` is the index of the
/// row in [`Packed::rows`]).
#[derive(Clone, Copy)]
#[repr(C)]
pub(super) struct PackedOp {
    pub(super) addr: u64,
    pub(super) ts: u64,
    pub(super) size_code: u64,
    pub(super) stack: u32,
    pub(super) pid: u32,
}

/// A row replayed as it is.
#[derive(Clone, Copy)]
pub(super) struct Row {
    ts: u64,
    pid: u32,
    tid: u32,
    kind: u8,
    addr: u64,
    size: u64,
    old_addr: u64,
    stack_id: u64,
    old_size: u64,
}

impl Row {
    pub(super) fn slices(&self) -> Slices<'_> {
        use std::slice::from_ref;
        Slices {
            ts: from_ref(&self.ts),
            pid: from_ref(&self.pid),
            tid: from_ref(&self.tid),
            kind: from_ref(&self.kind),
            addr: from_ref(&self.addr),
            size: from_ref(&self.size),
            old_addr: from_ref(&self.old_addr),
            stack_id: from_ref(&self.stack_id),
            old_size: from_ref(&self.old_size),
        }
    }
}

/// [`PackedOp::size_code`]: the size bits, and the shift of the code.
pub(super) const SIZE_BITS: u64 = (1 << 56) - 1;
pub(super) const CODE_SHIFT: u32 = 56;
/// The code of an operation that is a whole [`Row`].
const C_ROW: u8 = 0x88;

/// How many rows ahead [`count_rows`] prefetches the per-stack totals.
const STACK_AHEAD: usize = 16;
/// How many rows ahead [`count_rows`] prefetches the old addresses.
const OLD_AHEAD: usize = 64;

/// Counts the allocations replay makes in these rows, which depend on
/// the row alone, not on the outstanding blocks: done while decoding, on
/// the threads that wait for the single replay thread otherwise, they
/// take a table lookup and an update of the per-stack totals off each
/// allocation replay makes. An allocation (of the heap, the kernel or
/// pages) or realloc counts if its address is not 0, a mapping if its
/// size is not 0 either, an mremap if its new address is not 0 (exactly
/// the rows whose replay allocates); its stack's totals count it if the
/// filter selects it.
pub(super) fn count_allocations(
    b: Slices<'_>,
    ctx: &Ctx<'_>,
    kinds: &mut [u64; 256],
    acc: &mut Allocated,
    temps: &mut TempScan,
) {
    let f = ctx.filter;
    let n = b.kind.len();
    // Rows are in time order: when the filter selects every size and the
    // whole time span of these rows, the timestamps need not be read.
    let every = n == 0 || f.selects_every_allocation(b.ts[0], b.ts[n - 1]);
    let none = &mut Packed::default();
    match (f.has_pids(), every) {
        (false, true) => count_rows::<false, false, false, true>(b, ctx, kinds, acc, temps, none),
        (false, false) => count_rows::<false, true, false, true>(b, ctx, kinds, acc, temps, none),
        (true, true) => count_rows::<true, false, false, true>(b, ctx, kinds, acc, temps, none),
        (true, false) => count_rows::<true, true, false, true>(b, ctx, kinds, acc, temps, none),
    }
}

/// [`count_allocations`], which also appends the rows' operations for a
/// single-partition replay to `out`.
pub(super) fn pack(
    b: Slices<'_>,
    ctx: &Ctx<'_>,
    kinds: &mut [u64; 256],
    acc: &mut Allocated,
    temps: &mut TempScan,
    out: &mut Packed,
) {
    let f = ctx.filter;
    let n = b.kind.len();
    let every = n == 0 || f.selects_every_allocation(b.ts[0], b.ts[n - 1]);
    // A realloc makes two operations.
    out.ops.reserve(2 * n);
    match (f.has_pids(), every) {
        (false, true) => count_rows::<false, false, true, true>(b, ctx, kinds, acc, temps, out),
        (false, false) => count_rows::<false, true, true, true>(b, ctx, kinds, acc, temps, out),
        (true, true) => count_rows::<true, false, true, true>(b, ctx, kinds, acc, temps, out),
        (true, false) => count_rows::<true, true, true, true>(b, ctx, kinds, acc, temps, out),
    }
}

/// [`pack`] without the counting: the operations alone, for a replay
/// that wants only the outstanding blocks
/// ([`LiveReplay`](super::LiveReplay)).
pub(super) fn pack_only(b: Slices<'_>, ctx: &Ctx<'_>, out: &mut Packed) {
    let mut kinds = [0u64; 256];
    let mut acc = Allocated::new(0);
    let mut temps = TempScan::new(0, Default::default());
    out.ops.reserve(2 * b.kind.len());
    match ctx.filter.has_pids() {
        false => {
            count_rows::<false, false, true, false>(b, ctx, &mut kinds, &mut acc, &mut temps, out)
        }
        true => {
            count_rows::<true, false, true, false>(b, ctx, &mut kinds, &mut acc, &mut temps, out)
        }
    }
}

/// [`count_allocations`], which also counts the rows of each kind,
/// for a filter with (`BY_PID`) or without a process filter, and with
/// (`BY_SIZE_TIME`) or without a size or time range to apply. With
/// `PACK` it also appends to `out` the operations a single-partition
/// replay makes for the rows (see [`Packed`]): none for a row of a kind
/// or process the filter drops, or an allocation or free of address 0.
/// `out.ops` must have room for two operations a row. Without `COUNT`
/// it packs only, and leaves `kinds`, `acc` and `temps` alone.
#[inline(always)]
fn count_rows<const BY_PID: bool, const BY_SIZE_TIME: bool, const PACK: bool, const COUNT: bool>(
    b: Slices<'_>,
    ctx: &Ctx<'_>,
    kinds: &mut [u64; 256],
    acc: &mut Allocated,
    temps: &mut TempScan,
    out: &mut Packed,
) {
    let f = ctx.filter;
    let n = b.kind.len();
    let base = out.ops.len();
    let spare = &mut out.ops.spare_capacity_mut()[..if PACK { 2 * n } else { 0 }];
    let mut len = 0usize;
    for i in 0..n {
        if let (true, Some(&s)) = (COUNT, b.stack_id.get(i + STACK_AHEAD)) {
            acc.totals.prefetch(s);
            temps.prefetch(b.pid[i + STACK_AHEAD], b.addr[i + STACK_AHEAD]);
        }
        // Only reallocs read their old address: too sparse for the
        // hardware to stream that column.
        crate::table::prefetch(b.old_addr.as_ptr().wrapping_add(i + OLD_AHEAD) as *const u8);
        let kind = b.kind[i] as usize;
        let class = ctx.alloc_class[kind];
        let (addr, size) = (b.addr[i], b.size[i]);
        let mut yes = (class != NOT_ALLOC) & (addr != 0) & ((class != MAP_ALLOC) | (size != 0));
        // Whether the process filter selects the row: looked up once, for
        // every row when packing, else for allocations alone.
        let sel = !(BY_PID && (PACK || yes)) || f.pid_selected(b.pid[i]);
        yes &= sel;
        let stack = b.stack_id[i];
        if COUNT {
            count_row::<BY_SIZE_TIME>(b, i, ctx, kinds, acc, temps, yes, stack);
        }
        if PACK {
            let c = ctx.code_of[kind];
            let (pid, ts) = (b.pid[i], b.ts[i]);
            let fits = (size <= SIZE_BITS) & (stack <= u32::MAX as u64);
            let op = |addr: u64, code: u8| PackedOp {
                addr,
                ts,
                // Masked for rows, whose sizes may not fit (they are
                // replayed from the row); the rest fit.
                size_code: (size & SIZE_BITS) | (code as u64) << CODE_SHIFT,
                stack: stack as u32,
                pid,
            };
            if (C_ALLOC_USER..=C_FREE_PAGE).contains(&c) & fits {
                // Written whatever happens, kept if the row does something:
                // no branch on the address or the process.
                spare[len].write(op(addr, c));
                len += ((addr != 0) & sel) as usize;
            } else if c != C_SKIP && (c < C_SKIP || sel) {
                let mut op = |addr: u64, code: u8| {
                    spare[len].write(op(addr, code));
                    len += 1;
                };
                if c == C_REALLOC && fits {
                    let old = b.old_addr[i];
                    // The free first: realloc in place reuses the address.
                    if realloc_frees(old, addr, size) {
                        op(old, C_FREE_USER);
                    }
                    if addr != 0 {
                        op(addr, C_ALLOC_USER);
                    }
                } else {
                    op(out.rows.len() as u64, C_ROW);
                    out.rows.push(Row {
                        ts,
                        pid,
                        tid: b.tid[i],
                        kind: kind as u8,
                        addr,
                        size,
                        old_addr: b.old_addr[i],
                        stack_id: stack,
                        old_size: b.old_size.get(i).copied().unwrap_or(0),
                    });
                }
            }
        }
    }
    if PACK {
        // SAFETY: the first `len` spare slots were written above.
        unsafe { out.ops.set_len(base + len) };
    }
}

/// The counting of row `i` by [`count_rows`]: its kind, the allocation
/// (`yes`: an allocation the process filter selects) in `acc`, and the
/// scan for temporary allocations.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn count_row<const BY_SIZE_TIME: bool>(
    b: Slices<'_>,
    i: usize,
    ctx: &Ctx<'_>,
    kinds: &mut [u64; 256],
    acc: &mut Allocated,
    temps: &mut TempScan,
    yes: bool,
    stack: u64,
) {
    let f = ctx.filter;
    let kind = b.kind[i] as usize;
    let (addr, size) = (b.addr[i], b.size[i]);
    kinds[kind] += 1;
    acc.allocations += yes as u64;
    acc.bytes += size & 0u64.wrapping_sub(yes as u64);
    let counted = if BY_SIZE_TIME {
        yes & f.alloc_selected(size, b.ts[i])
    } else {
        yes
    };
    acc.totals.add_if(stack, size, counted);
    acc.sizes.add_if(size, counted);
    let heap = ctx.heap[kind];
    if let (Some(s), true) = (
        ctx.sampling,
        yes & (heap == HEAP_ALLOC || heap == HEAP_REALLOC),
    ) {
        // What a sampled allocation stands for beyond itself.
        let (bytes, n) = s.scaled(size, addr, b.ts[i]);
        let (extra, more) = (n - 1, bytes - size);
        acc.allocations += extra;
        acc.bytes += more;
        if counted {
            acc.totals.add_scaled(stack, size, extra, more);
            acc.sizes.add_scaled(size, extra, more);
        }
    }
    if heap != 0 {
        let (tid, ts) = ((b.pid[i], b.tid[i]), b.ts[i]);
        if heap == HEAP_ALLOC {
            if addr != 0 {
                temps.alloc(tid, addr, ts, stack, counted);
            }
        } else if heap == HEAP_FREE {
            if addr != 0 {
                temps.free(tid, addr, ts, acc);
            }
        } else if heap == HEAP_REALLOC {
            let old = b.old_addr[i];
            if realloc_frees(old, addr, size) {
                temps.free(tid, old, ts, acc);
            }
            if addr != 0 {
                temps.alloc(tid, addr, ts, stack, counted);
            }
        }
    }
}
