//! The `frames` table column by column ([`FrameColumns`]): a reader that
//! looks at a few fields of many rows (the stack keys of a fleet) reads
//! them where the decoder left them, without a [`FrameRecord`] and its
//! strings per row.

use arrow_array::cast::AsArray;
use arrow_array::types::{UInt32Type, UInt64Type};
use arrow_array::{Array, ListArray, RecordBatch, StringArray, UInt32Array, UInt64Array};

use crate::schema::{FrameRecord, InlinedFrame};

/// The `frames` table as decoded, in the order of its files and rows.
#[derive(Default)]
pub struct FrameColumns {
    batches: Vec<FrameBatch>,
    /// The first row of each batch.
    starts: Vec<usize>,
    len: usize,
}

/// One record batch's columns, in schema order.
struct FrameBatch {
    pid: UInt32Array,
    addr: UInt64Array,
    build_id: StringArray,
    path: StringArray,
    file_offset: UInt64Array,
    function: StringArray,
    func_offset: UInt64Array,
    file: StringArray,
    line: UInt32Array,
    column: UInt32Array,
    inlined: ListArray,
    inl_function: StringArray,
    inl_file: StringArray,
    inl_line: UInt32Array,
    inl_column: UInt32Array,
}

impl FrameColumns {
    /// The table of `batches`, each with the frames schema's columns in
    /// its order.
    pub(crate) fn new(batches: &[RecordBatch]) -> FrameColumns {
        let mut out = FrameColumns::default();
        for b in batches {
            let s = |i: usize| b.column(i).as_string::<i32>().clone();
            let u64c = |i: usize| b.column(i).as_primitive::<UInt64Type>().clone();
            let u32c = |i: usize| b.column(i).as_primitive::<UInt32Type>().clone();
            let inlined = b.column(10).as_list::<i32>().clone();
            let st = inlined.values().as_struct();
            out.starts.push(out.len);
            out.len += b.num_rows();
            out.batches.push(FrameBatch {
                pid: u32c(0),
                addr: u64c(1),
                build_id: s(2),
                path: s(3),
                file_offset: u64c(4),
                function: s(5),
                func_offset: u64c(6),
                file: s(7),
                line: u32c(8),
                column: u32c(9),
                inl_function: st.column(0).as_string::<i32>().clone(),
                inl_file: st.column(1).as_string::<i32>().clone(),
                inl_line: st.column(2).as_primitive::<UInt32Type>().clone(),
                inl_column: st.column(3).as_primitive::<UInt32Type>().clone(),
                inlined,
            });
        }
        out
    }

    /// Rows in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table has no row.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `r`-th row (panics past the end).
    pub fn row(&self, r: usize) -> FrameRow<'_> {
        let b = self.starts.partition_point(|&s| s <= r) - 1;
        FrameRow {
            b: &self.batches[b],
            i: r - self.starts[b],
        }
    }

    /// Every row, in order.
    pub fn rows(&self) -> impl Iterator<Item = FrameRow<'_>> {
        self.batches
            .iter()
            .flat_map(|b| (0..b.pid.len()).map(move |i| FrameRow { b, i }))
    }
}

/// One row of [`FrameColumns`]: its fields as [`FrameRecord`] has them,
/// borrowed.
#[derive(Clone, Copy)]
pub struct FrameRow<'a> {
    b: &'a FrameBatch,
    i: usize,
}

/// A function inlined at a [`FrameRow`]'s address, borrowed.
#[derive(Clone, Copy)]
pub struct InlinedRow<'a> {
    /// Function name (demangled).
    pub function: &'a str,
    /// Source file.
    pub file: Option<&'a str>,
    /// Source line.
    pub line: Option<u32>,
    /// Source column.
    pub column: Option<u32>,
}

fn opt_str(a: &StringArray, i: usize) -> Option<&str> {
    a.is_valid(i).then(|| a.value(i))
}

fn opt_u32(a: &UInt32Array, i: usize) -> Option<u32> {
    a.is_valid(i).then(|| a.value(i))
}

fn opt_u64(a: &UInt64Array, i: usize) -> Option<u64> {
    a.is_valid(i).then(|| a.value(i))
}

impl<'a> FrameRow<'a> {
    /// Process (0 for kernel addresses).
    pub fn pid(&self) -> u32 {
        self.b.pid.value(self.i)
    }

    /// The raw address.
    pub fn addr(&self) -> u64 {
        self.b.addr.value(self.i)
    }

    /// Build id of the object.
    pub fn build_id(&self) -> Option<&'a str> {
        opt_str(&self.b.build_id, self.i)
    }

    /// Path of the object.
    pub fn path(&self) -> Option<&'a str> {
        opt_str(&self.b.path, self.i)
    }

    /// Offset of the address in the object file.
    pub fn file_offset(&self) -> Option<u64> {
        opt_u64(&self.b.file_offset, self.i)
    }

    /// Function containing the address.
    pub fn function(&self) -> Option<&'a str> {
        opt_str(&self.b.function, self.i)
    }

    /// Offset of the address from the function start.
    pub fn func_offset(&self) -> Option<u64> {
        opt_u64(&self.b.func_offset, self.i)
    }

    /// Source file.
    pub fn file(&self) -> Option<&'a str> {
        opt_str(&self.b.file, self.i)
    }

    /// Source line.
    pub fn line(&self) -> Option<u32> {
        opt_u32(&self.b.line, self.i)
    }

    /// Source column.
    pub fn column(&self) -> Option<u32> {
        opt_u32(&self.b.column, self.i)
    }

    /// Functions inlined at this address, innermost first.
    pub fn inlined(&self) -> impl Iterator<Item = InlinedRow<'a>> + 'a {
        let b = self.b;
        // The lists by their offsets into the child columns, not a slice
        // of them per row (which costs more than the row).
        let offsets = b.inlined.value_offsets();
        let (from, to) = (offsets[self.i] as usize, offsets[self.i + 1] as usize);
        (from..to).map(move |j| InlinedRow {
            function: b.inl_function.value(j),
            file: opt_str(&b.inl_file, j),
            line: opt_u32(&b.inl_line, j),
            column: opt_u32(&b.inl_column, j),
        })
    }

    /// The row as a record of its own.
    pub fn to_record(&self) -> FrameRecord {
        FrameRecord {
            pid: self.pid(),
            addr: self.addr(),
            build_id: self.build_id().map(str::to_string),
            path: self.path().map(str::to_string),
            file_offset: self.file_offset(),
            function: self.function().map(str::to_string),
            func_offset: self.func_offset(),
            file: self.file().map(str::to_string),
            line: self.line(),
            column: self.column(),
            inlined: self
                .inlined()
                .map(|x| InlinedFrame {
                    function: x.function.to_string(),
                    file: x.file.map(str::to_string),
                    line: x.line,
                    column: x.column,
                })
                .collect(),
        }
    }
}
