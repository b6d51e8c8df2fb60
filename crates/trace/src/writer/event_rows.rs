//! The `events` row buffer: one vector per column, handed to the Parquet
//! writer without a copy and recycled after it, so that pushing an event
//! costs a few stores and never reallocates.

use std::sync::Arc;

use arrow_array::builder::BooleanBufferBuilder;
use arrow_array::types::{ArrowPrimitiveType, Int8Type, UInt32Type, UInt64Type};
use arrow_array::{
    ArrayRef, DictionaryArray, Int8Array, PrimitiveArray, RecordBatch, StringArray, UInt32Array,
    UInt64Array,
};

use super::rows::Rows;
use crate::events::columns::Columns;
use crate::schema::{Event, EventKind, Table};

/// Where [`TraceWriter::tap_events`](super::TraceWriter::tap_events)
/// sends each batch: its rows as [`Columns`], which the tap may swap for
/// other (spare) columns to keep them.
pub type EventsTap = Box<dyn FnMut(&mut Columns) + Send>;

/// A nullable u64 column, kept sparse while rows arrive: only the
/// present values, with their row numbers. `old_addr` and `old_size` are
/// null in almost every row, so pushing costs one branch, and the dense
/// values and validity bitmap are built once per batch.
struct OptU64 {
    present: Vec<(u32, u64)>,
    /// The dense values of the last batch, recycled.
    values: Vec<u64>,
}

impl OptU64 {
    fn new() -> Self {
        OptU64 {
            present: Vec::new(),
            values: Vec::new(),
        }
    }

    #[inline]
    fn push(&mut self, row: usize, v: Option<u64>) {
        if let Some(v) = v {
            self.present.push((row as u32, v));
        }
    }

    fn take(&mut self, rows: usize) -> UInt64Array {
        let mut values = std::mem::take(&mut self.values);
        values.clear();
        values.resize(rows, 0);
        let nulls = if self.present.len() == rows {
            for (i, &(_, v)) in self.present.iter().enumerate() {
                values[i] = v;
            }
            None
        } else {
            let mut valid = BooleanBufferBuilder::new(rows);
            valid.append_n(rows, false);
            for &(row, v) in &self.present {
                values[row as usize] = v;
                valid.set_bit(row as usize, true);
            }
            Some(valid.finish().into())
        };
        self.present.clear();
        UInt64Array::new(values.into(), nulls)
    }
}

/// The events being buffered, one vector per column. Each batch's vectors
/// become the Arrow arrays without a copy, and the next batch starts with
/// vectors of full capacity, so pushing never reallocates.
pub(super) struct EventRows {
    capacity: usize,
    ts: Vec<u64>,
    pid: Vec<u32>,
    tid: Vec<u32>,
    kind: Vec<i8>,
    addr: Vec<u64>,
    size: Vec<u64>,
    old_addr: OptU64,
    old_size: OptU64,
    stack_id: OptU64,
    seq: Vec<u64>,
    /// The `seq` of the next event: rows written so far, in every segment.
    next_seq: u64,
    /// The tap, and the columns it is handed each batch in.
    tap: Option<(EventsTap, Columns)>,
}

impl EventRows {
    pub(super) fn new(capacity: usize) -> Self {
        EventRows {
            capacity,
            ts: Vec::with_capacity(capacity),
            pid: Vec::with_capacity(capacity),
            tid: Vec::with_capacity(capacity),
            kind: Vec::with_capacity(capacity),
            addr: Vec::with_capacity(capacity),
            size: Vec::with_capacity(capacity),
            old_addr: OptU64::new(),
            old_size: OptU64::new(),
            stack_id: OptU64::new(),
            seq: Vec::with_capacity(capacity),
            next_seq: 0,
            tap: None,
        }
    }

    pub(super) fn set_tap(&mut self, tap: EventsTap) {
        self.tap = Some((tap, Columns::default()));
    }

    /// Copies the buffered rows into `out`, dense: a null is 0, and the
    /// kind is its code.
    fn copy_to(&self, out: &mut Columns) {
        let rows = self.ts.len();
        fn dense(to: &mut Vec<u64>, from: &OptU64, rows: usize) {
            to.clear();
            to.resize(rows, 0);
            for &(row, v) in &from.present {
                to[row as usize] = v;
            }
        }
        fn copy<T: Copy>(to: &mut Vec<T>, from: &[T]) {
            to.clear();
            to.extend_from_slice(from);
        }
        out.rows = rows;
        copy(&mut out.ts, &self.ts);
        copy(&mut out.pid, &self.pid);
        copy(&mut out.tid, &self.tid);
        out.kind.clear();
        out.kind
            .extend(self.kind.iter().map(|&k| EventKind::ALL[k as usize] as u8));
        copy(&mut out.addr, &self.addr);
        copy(&mut out.size, &self.size);
        dense(&mut out.old_addr, &self.old_addr, rows);
        dense(&mut out.stack_id, &self.stack_id, rows);
        dense(&mut out.old_size, &self.old_size, rows);
    }

    #[inline]
    pub(super) fn push(&mut self, e: &Event) {
        let row = self.ts.len();
        self.old_addr.push(row, e.old_addr);
        self.old_size.push(row, e.old_size);
        self.stack_id.push(row, e.stack_id);
        self.ts.push(e.ts_ns);
        self.pid.push(e.pid);
        self.tid.push(e.tid);
        self.kind.push(KIND_KEYS[e.kind as u8 as usize]);
        self.addr.push(e.addr);
        self.size.push(e.size);
        self.seq.push(self.next_seq);
        self.next_seq += 1;
    }
}

/// Index of each kind (by code) in the dictionary written with every
/// batch, which lists the kinds in the order of [`EventKind::ALL`].
const KIND_KEYS: [i8; 256] = {
    let mut keys = [-1i8; 256];
    let mut i = 0;
    while i < EventKind::ALL.len() {
        keys[EventKind::ALL[i] as u8 as usize] = i as i8;
        i += 1;
    }
    keys
};

fn kind_dictionary() -> Arc<StringArray> {
    Arc::new(StringArray::from_iter_values(
        EventKind::ALL.iter().map(|k| k.name()),
    ))
}

impl Rows for EventRows {
    fn len(&self) -> usize {
        self.ts.len()
    }

    fn take_batch(&mut self) -> RecordBatch {
        use std::mem::take;
        if let Some((mut tap, mut cols)) = self.tap.take() {
            self.copy_to(&mut cols);
            tap(&mut cols);
            self.tap = Some((tap, cols));
        }
        let rows = self.ts.len();
        let kinds = DictionaryArray::<Int8Type>::try_new(
            Int8Array::from(take(&mut self.kind)),
            kind_dictionary(),
        )
        .expect("kind keys are in range");
        let cols: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(take(&mut self.ts))),
            Arc::new(UInt32Array::from(take(&mut self.pid))),
            Arc::new(UInt32Array::from(take(&mut self.tid))),
            Arc::new(kinds),
            Arc::new(UInt64Array::from(take(&mut self.addr))),
            Arc::new(UInt64Array::from(take(&mut self.size))),
            Arc::new(self.old_addr.take(rows)),
            Arc::new(self.old_size.take(rows)),
            Arc::new(self.stack_id.take(rows)),
            Arc::new(UInt64Array::from(take(&mut self.seq))),
        ];
        RecordBatch::try_new(Table::Events.schema(), cols).expect("events batch matches schema")
    }

    fn recycle(&mut self, batch: RecordBatch) {
        let (_, cols, _) = batch.into_parts();
        fn prim<T: ArrowPrimitiveType>(col: &ArrayRef) -> Option<PrimitiveArray<T>> {
            col.as_any().downcast_ref::<PrimitiveArray<T>>().cloned()
        }
        let kind = cols[3]
            .as_any()
            .downcast_ref::<DictionaryArray<Int8Type>>()
            .map(|d| d.keys().clone());
        let u64s = |i: usize| prim::<UInt64Type>(&cols[i]);
        let u32s = |i: usize| prim::<UInt32Type>(&cols[i]);
        let (ts, pid, tid, addr, size) = (u64s(0), u32s(1), u32s(2), u64s(4), u64s(5));
        let (old_addr, old_size, stack_id, seq) = (u64s(6), u64s(7), u64s(8), u64s(9));
        // Our clones are the last references once the batch is gone.
        drop(cols);
        let cap = self.capacity;
        reuse(&mut self.ts, ts, cap);
        reuse(&mut self.pid, pid, cap);
        reuse(&mut self.tid, tid, cap);
        reuse(&mut self.kind, kind, cap);
        reuse(&mut self.addr, addr, cap);
        reuse(&mut self.size, size, cap);
        reuse(&mut self.old_addr.values, old_addr, cap);
        reuse(&mut self.old_size.values, old_size, cap);
        reuse(&mut self.stack_id.values, stack_id, cap);
        reuse(&mut self.seq, seq, cap);
    }

    fn reserve(&mut self) {
        let cap = self.capacity;
        for v in [&mut self.ts, &mut self.addr, &mut self.size, &mut self.seq] {
            v.reserve(cap);
        }
        self.pid.reserve(cap);
        self.tid.reserve(cap);
        self.kind.reserve(cap);
    }
}

/// Makes `v` (empty after `take_batch`) the vector behind `array` if
/// nothing else holds it, or else a new vector of `capacity`.
fn reuse<T: ArrowPrimitiveType>(
    v: &mut Vec<T::Native>,
    array: Option<PrimitiveArray<T>>,
    capacity: usize,
) {
    if !v.is_empty() {
        return;
    }
    let reclaimed = array.and_then(|a| a.into_parts().1.into_inner().into_vec().ok());
    match reclaimed {
        Some(mut old) if old.capacity() >= capacity => {
            old.clear();
            *v = old;
        }
        _ => v.reserve(capacity),
    }
}
