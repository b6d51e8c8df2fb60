//! The `frames` table column by column ([`FrameColumns`]): a reader that
//! looks at a few fields of many rows (the stack keys of a fleet) reads
//! them where the decoder left them, without a [`FrameRecord`] and its
//! strings per row.

use arrow_array::cast::AsArray;
use arrow_array::types::{ArrowPrimitiveType, Int32Type};
use arrow_array::{
    Array, ArrayRef, Int32Array, ListArray, PrimitiveArray, StringArray, UInt32Array, UInt64Array,
};

use crate::schema::{FrameRecord, InlinedFrame};

/// The `frames` table as decoded, in the order of its files and rows.
#[derive(Default)]
pub struct FrameColumns {
    batches: Vec<FrameBatch>,
    /// The first row of each batch.
    starts: Vec<usize>,
    len: usize,
}

/// A string column as its dictionary and each row's index into it (a
/// null index for a null string).
#[derive(Clone)]
pub struct DictColumn {
    keys: Int32Array,
    values: StringArray,
}

impl DictColumn {
    /// The column `a`: a dictionary as the reader gives it, or plain
    /// strings, each its own entry.
    fn new(a: &ArrayRef) -> Result<DictColumn, String> {
        if let Some(d) = a.as_dictionary_opt::<Int32Type>() {
            let values = d
                .values()
                .as_string_opt::<i32>()
                .ok_or_else(|| format!("a dictionary of {} for strings", d.values().data_type()))?;
            return Ok(DictColumn {
                keys: d.keys().clone(),
                values: values.clone(),
            });
        }
        let values = strings(a)?;
        let keys: Int32Array =
            PrimitiveArray::new((0..values.len() as i32).collect(), values.nulls().cloned());
        Ok(DictColumn { keys, values })
    }

    #[inline]
    fn get(&self, i: usize) -> Option<&str> {
        self.key(i).map(|k| self.values.value(k))
    }

    /// Row `i`'s index into the dictionary, if not null.
    #[inline]
    pub fn key(&self, i: usize) -> Option<usize> {
        self.keys.is_valid(i).then(|| self.keys.value(i) as usize)
    }

    /// Entries in the dictionary.
    pub fn entries(&self) -> usize {
        self.values.len()
    }

    /// The dictionary's entry `k`.
    pub fn value(&self, k: usize) -> &str {
        self.values.value(k)
    }
}

/// One record batch's columns, in schema order.
struct FrameBatch {
    pid: UInt32Array,
    addr: UInt64Array,
    build_id: DictColumn,
    path: DictColumn,
    file_offset: UInt64Array,
    function: DictColumn,
    func_offset: UInt64Array,
    file: DictColumn,
    line: UInt32Array,
    column: UInt32Array,
    inlined: ListArray,
    inl_function: StringArray,
    inl_file: StringArray,
    inl_line: UInt32Array,
    inl_column: UInt32Array,
}

impl FrameColumns {
    /// The top-level string columns the reader decodes as dictionaries.
    pub(crate) const DICTIONARY: &'static [&'static str] =
        &["build_id", "path", "function", "file"];

    /// Appends a record batch's columns, in the frames schema's order; an
    /// error names a column of another type.
    pub(crate) fn push(&mut self, c: &[ArrayRef]) -> Result<(), String> {
        let inlined = c[10]
            .as_list_opt::<i32>()
            .ok_or("inlined is not a list")?
            .clone();
        let st = inlined
            .values()
            .as_struct_opt()
            .ok_or("inlined is not a list of structs")?;
        let (s, inl) = (|i: usize| DictColumn::new(&c[i]), |i: usize| st.column(i));
        let b = FrameBatch {
            pid: primitive(&c[0])?,
            addr: primitive(&c[1])?,
            build_id: s(2)?,
            path: s(3)?,
            file_offset: primitive(&c[4])?,
            function: s(5)?,
            func_offset: primitive(&c[6])?,
            file: s(7)?,
            line: primitive(&c[8])?,
            column: primitive(&c[9])?,
            inl_function: strings(inl(0))?,
            inl_file: strings(inl(1))?,
            inl_line: primitive(inl(2))?,
            inl_column: primitive(inl(3))?,
            inlined,
        };
        self.starts.push(self.len);
        self.len += b.pid.len();
        self.batches.push(b);
        Ok(())
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

    /// The batches, in order, each with its rows and the dictionaries of
    /// its function, file and path columns.
    pub fn batches(&self) -> impl Iterator<Item = FrameBatchRef<'_>> {
        self.batches.iter().map(|b| FrameBatchRef { b })
    }

    /// Every row, in order.
    pub fn rows(&self) -> impl Iterator<Item = FrameRow<'_>> {
        self.batches
            .iter()
            .flat_map(|b| (0..b.pid.len()).map(move |i| FrameRow { b, i }))
    }
}

/// One batch of [`FrameColumns`], whose rows share their dictionaries.
#[derive(Clone, Copy)]
pub struct FrameBatchRef<'a> {
    b: &'a FrameBatch,
}

impl<'a> FrameBatchRef<'a> {
    /// The batch's rows.
    pub fn len(&self) -> usize {
        self.b.pid.len()
    }

    /// Whether the batch has no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its `i`-th row.
    pub fn row(&self, i: usize) -> FrameRow<'a> {
        FrameRow { b: self.b, i }
    }

    /// The function column.
    pub fn function(&self) -> &'a DictColumn {
        &self.b.function
    }

    /// The source file column.
    pub fn file(&self) -> &'a DictColumn {
        &self.b.file
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

/// Column `a` as strings; an error names its type.
fn strings(a: &ArrayRef) -> Result<StringArray, String> {
    a.as_string_opt::<i32>()
        .cloned()
        .ok_or_else(|| format!("{} for strings", a.data_type()))
}

/// Column `a` as integers of type `T`; an error names its type.
fn primitive<T: ArrowPrimitiveType>(a: &ArrayRef) -> Result<PrimitiveArray<T>, String> {
    a.as_primitive_opt::<T>()
        .cloned()
        .ok_or_else(|| format!("{} for integers", a.data_type()))
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
        self.b.build_id.get(self.i)
    }

    /// Path of the object.
    pub fn path(&self) -> Option<&'a str> {
        self.b.path.get(self.i)
    }

    /// Offset of the address in the object file.
    pub fn file_offset(&self) -> Option<u64> {
        opt_u64(&self.b.file_offset, self.i)
    }

    /// Function containing the address.
    pub fn function(&self) -> Option<&'a str> {
        self.b.function.get(self.i)
    }

    /// Offset of the address from the function start.
    pub fn func_offset(&self) -> Option<u64> {
        opt_u64(&self.b.func_offset, self.i)
    }

    /// Source file.
    pub fn file(&self) -> Option<&'a str> {
        self.b.file.get(self.i)
    }

    /// Source line.
    pub fn line(&self) -> Option<u32> {
        opt_u32(&self.b.line, self.i)
    }

    /// Source column.
    pub fn column(&self) -> Option<u32> {
        opt_u32(&self.b.column, self.i)
    }

    /// Whether functions are inlined at this address.
    pub fn has_inlined(&self) -> bool {
        let offsets = self.b.inlined.value_offsets();
        offsets[self.i + 1] > offsets[self.i]
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
