//! What a decode worker makes of one row group for replay ([`Decoded`]):
//! [`Packed`] operations for a single partition, or the columns and each
//! partition's list of rows for several, and what was counted on the way.

use std::sync::Mutex;

use memleak_trace::reader::RowGroupUnit;

use super::allocated::Allocated;
use super::ctx::{Ctx, Op};
use super::packed::{count_allocations, pack, Packed};
use super::temporary::{RowGroupTemps, TempScan};
use memleak_trace::events::{Columns, Decoder, Slices};

/// One decoded row group and what was counted while decoding it.
pub(super) struct Decoded {
    /// Its rows, as the replay engine in use reads them.
    pub(super) mode: Mode,
    /// Rows at or before the `at` cutoff, and all the rows.
    pub(super) rows: usize,
    pub(super) total: usize,
    /// Times of the first and last of `rows`.
    pub(super) first_ts: u64,
    pub(super) last_ts: u64,
    pub(super) kinds: Box<[u64; 256]>,
    /// What the scan for temporary allocations leaves for the next row
    /// groups.
    pub(super) temps: RowGroupTemps,
}

/// The rows of a [`Decoded`] row group, in the form one of the two replay
/// engines reads.
pub(super) enum Mode {
    /// With a single partition: the row group as [`Packed`] operations,
    /// the filter applied.
    Packed(Packed),
    /// With several partitions: the columns, and the rows each partition
    /// takes part in (the first `rows_len[p]` entries of `rows_of[p]`;
    /// the vectors are recycled and longer).
    Split {
        cols: Box<Columns>,
        rows_of: Vec<Vec<u32>>,
        rows_len: Vec<usize>,
    },
}

/// Row lists of spent [`Decoded`]s, for reuse.
pub(super) type RowsPool = Mutex<Vec<Vec<Vec<u32>>>>;

/// Operation lists of spent [`Decoded`]s, for reuse.
pub(super) type PackedPool = Mutex<Vec<Packed>>;

impl Decoded {
    /// Decodes `unit`, up to the `at` cutoff and the first `limit` rows,
    /// in the form the replay of
    /// `ctx.nparts` partitions reads; counts its rows by kind, and its
    /// allocations in one of the accumulators of `allocated`.
    pub(super) fn read(
        decoder: &Decoder<'_>,
        unit: &RowGroupUnit,
        (at, limit): (Option<u64>, usize),
        ctx: &Ctx<'_>,
        pool: &RowsPool,
        packed_pool: &PackedPool,
        allocated: &Mutex<Vec<Allocated>>,
    ) -> memleak_trace::Result<Decoded> {
        let mut kinds = Box::new([0u64; 256]);
        let mut acc = crate::pool::lock_pool(allocated)
            .pop()
            .unwrap_or_else(|| Allocated::new(0));
        let total = unit.rows as usize;
        let mut temps = TempScan::new(ctx.temporary_ns, RowGroupTemps::default());
        let mut d = if ctx.nparts == 1 {
            let mut packed = crate::pool::lock_pool(packed_pool)
                .pop()
                .unwrap_or_default();
            packed.ops.clear();
            packed.rows.clear();
            // Room for the whole row group at once (a realloc makes two
            // operations): grown a piece at a time, the vector was copied
            // on every doubling until the pool's vectors were all large.
            packed.ops.reserve(2 * total);
            let (mut rows, mut first_ts, mut last_ts) = (0usize, None, 0u64);
            let r = decoder.stream(unit, &mut |b: Slices<'_>| {
                let all = b.ts.len();
                let n = match at {
                    Some(at) => b.ts.partition_point(|&t| t <= at),
                    None => all,
                }
                .min(limit.saturating_sub(rows));
                if n > 0 {
                    first_ts.get_or_insert(b.ts[0]);
                    last_ts = b.ts[n - 1];
                    pack(
                        b.range(0, n),
                        ctx,
                        &mut kinds,
                        &mut acc,
                        &mut temps,
                        &mut packed,
                    );
                }
                rows += n;
                n == all
            });
            if let Err(e) = r {
                crate::pool::lock_pool(allocated).push(acc);
                return Err(e);
            }
            Decoded {
                mode: Mode::Packed(packed),
                rows,
                total,
                first_ts: first_ts.unwrap_or(0),
                last_ts,
                kinds,
                temps: RowGroupTemps::default(),
            }
        } else {
            let cols = match decoder.read(unit) {
                Ok(c) => c,
                Err(e) => {
                    crate::pool::lock_pool(allocated).push(acc);
                    return Err(e);
                }
            };
            let all = cols.slices(cols.len());
            let rows = match at {
                Some(at) => all.ts.partition_point(|&t| t <= at),
                None => cols.len(),
            }
            .min(limit);
            let b = cols.slices(rows);
            count_allocations(b, ctx, &mut kinds, &mut acc, &mut temps);
            let mut rows_len = vec![0; ctx.nparts];
            let mut out = crate::pool::lock_pool(pool).pop().unwrap_or_default();
            split_rows(b, ctx, &mut out, &mut rows_len);
            let (first_ts, last_ts) = match rows {
                0 => (0, 0),
                _ => (b.ts[0], b.ts[rows - 1]),
            };
            Decoded {
                total: cols.len(),
                mode: Mode::Split {
                    cols: Box::new(cols),
                    rows_of: out,
                    rows_len,
                },
                rows,
                first_ts,
                last_ts,
                kinds,
                temps: RowGroupTemps::default(),
            }
        };
        crate::pool::lock_pool(allocated).push(acc);
        d.temps = temps.finish();
        d.total = d.total.max(d.rows);
        Ok(d)
    }

    /// Gives the buffers of a replayed row group back for reuse.
    pub(super) fn recycle(
        self,
        decoder: &Decoder<'_>,
        rows_pool: &RowsPool,
        packed_pool: &PackedPool,
    ) {
        match self.mode {
            Mode::Packed(p) => crate::pool::lock_pool(packed_pool).push(p),
            Mode::Split { cols, rows_of, .. } => {
                decoder.recycle(*cols);
                crate::pool::lock_pool(rows_pool).push(rows_of);
            }
        }
    }
}

/// Lists, for each partition, the rows it takes part in: the owner of the
/// address (both owners for a realloc), partition 0 for mappings, every
/// partition for exec, exit and fork. Done while decoding, in parallel, so
/// each replay worker reads only its own rows. `out[p]` gets its rows in its
/// first `len[p]` entries: the vectors are sized to the row group once
/// and written by index, without a capacity check per row.
fn split_rows(b: Slices<'_>, ctx: &Ctx<'_>, out: &mut Vec<Vec<u32>>, len: &mut [usize]) {
    let n = b.kind.len();
    out.resize_with(ctx.nparts, Vec::new);
    for o in out.iter_mut() {
        if o.len() < n {
            o.resize(n, 0);
        }
    }
    len.fill(0);
    for i in 0..n {
        let kind = b.kind[i] as usize;
        if ctx.by_addr[kind] {
            // Allocations and frees: the owner of the address.
            let p = ctx.owner(b.addr[i]);
            out[p][len[p]] = i as u32;
            len[p] += 1;
            continue;
        }
        let mut put = |p: usize| {
            out[p][len[p]] = i as u32;
            len[p] += 1;
        };
        match ctx.ops[kind] {
            Op::Realloc => {
                let (new, old) = (b.addr[i], b.old_addr[i]);
                let p = if new != 0 {
                    ctx.owner(new)
                } else {
                    ctx.owner(old)
                };
                put(p);
                if old != 0 && new != 0 && ctx.owner(old) != p {
                    put(ctx.owner(old));
                }
            }
            Op::Map | Op::Unmap | Op::Remap => put(0),
            Op::Exec | Op::Exit | Op::Fork => (0..ctx.nparts).for_each(put),
            _ => {}
        }
    }
}
