//! Row buffers of the small tables (`stacks`, `frames`, `maps`, `scan`),
//! and what every table's buffer does ([`Rows`]): hold the rows pushed
//! since the last batch, and turn them into an Arrow batch of the table's
//! schema. The `events` buffer, which every event goes through, is
//! `event_rows`.

use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, ListBuilder, StringBuilder, StructBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray, UInt32Array, UInt64Array};

use crate::schema::{inlined_fields, FrameRecord, MapRecord, ScanRecord, StackRecord, Table};

/// Buffers rows of one table and turns them into Arrow batches.
pub(super) trait Rows {
    fn len(&self) -> usize;
    fn take_batch(&mut self) -> RecordBatch;
    /// Gets back the batch's memory once the Parquet writer is done with
    /// it, so the next batch reuses warm pages instead of faulting in
    /// fresh ones.
    fn recycle(&mut self, _batch: RecordBatch) {}
    /// The batch went to a writer that keeps it for a while (the events
    /// encoder's thread): the buffer makes room for the next one anew.
    fn reserve(&mut self) {}
}

pub(super) struct StackRows {
    stack_id: UInt64Builder,
    pid: UInt32Builder,
    kernel: BooleanBuilder,
    truncated: BooleanBuilder,
    frames: ListBuilder<UInt64Builder>,
    n: usize,
}

impl Default for StackRows {
    fn default() -> Self {
        let item = Arc::new(arrow_schema::Field::new(
            "item",
            arrow_schema::DataType::UInt64,
            false,
        ));
        StackRows {
            stack_id: UInt64Builder::new(),
            pid: UInt32Builder::new(),
            kernel: BooleanBuilder::new(),
            truncated: BooleanBuilder::new(),
            frames: ListBuilder::new(UInt64Builder::new()).with_field(item),
            n: 0,
        }
    }
}

impl StackRows {
    pub(super) fn push(&mut self, s: &StackRecord) {
        self.stack_id.append_value(s.stack_id);
        self.pid.append_value(s.pid);
        self.kernel.append_value(s.kernel);
        self.truncated.append_value(s.truncated);
        self.frames.values().append_slice(&s.frames);
        self.frames.append(true);
        self.n += 1;
    }
}

impl Rows for StackRows {
    fn len(&self) -> usize {
        self.n
    }
    fn take_batch(&mut self) -> RecordBatch {
        self.n = 0;
        let cols: Vec<ArrayRef> = vec![
            Arc::new(self.stack_id.finish()),
            Arc::new(self.pid.finish()),
            Arc::new(self.kernel.finish()),
            Arc::new(self.truncated.finish()),
            Arc::new(self.frames.finish()),
        ];
        RecordBatch::try_new(Table::Stacks.schema(), cols).expect("stacks batch matches schema")
    }
}

pub(super) struct FrameRows {
    pid: UInt32Builder,
    addr: UInt64Builder,
    build_id: StringBuilder,
    path: StringBuilder,
    file_offset: UInt64Builder,
    function: StringBuilder,
    func_offset: UInt64Builder,
    file: StringBuilder,
    line: UInt32Builder,
    column: UInt32Builder,
    inlined: ListBuilder<StructBuilder>,
    n: usize,
}

impl Default for FrameRows {
    fn default() -> Self {
        let fields = inlined_fields();
        let item = Arc::new(arrow_schema::Field::new(
            "item",
            arrow_schema::DataType::Struct(fields.clone()),
            false,
        ));
        FrameRows {
            pid: UInt32Builder::new(),
            addr: UInt64Builder::new(),
            build_id: StringBuilder::new(),
            path: StringBuilder::new(),
            file_offset: UInt64Builder::new(),
            function: StringBuilder::new(),
            func_offset: UInt64Builder::new(),
            file: StringBuilder::new(),
            line: UInt32Builder::new(),
            column: UInt32Builder::new(),
            inlined: ListBuilder::new(StructBuilder::from_fields(fields, 0)).with_field(item),
            n: 0,
        }
    }
}

impl FrameRows {
    pub(super) fn push(&mut self, f: &FrameRecord) {
        self.pid.append_value(f.pid);
        self.addr.append_value(f.addr);
        self.build_id.append_option(f.build_id.as_deref());
        self.path.append_option(f.path.as_deref());
        self.file_offset.append_option(f.file_offset);
        self.function.append_option(f.function.as_deref());
        self.func_offset.append_option(f.func_offset);
        self.file.append_option(f.file.as_deref());
        self.line.append_option(f.line);
        self.column.append_option(f.column);
        let s = self.inlined.values();
        for i in &f.inlined {
            s.field_builder::<StringBuilder>(0)
                .expect("function")
                .append_value(&i.function);
            s.field_builder::<StringBuilder>(1)
                .expect("file")
                .append_option(i.file.as_deref());
            s.field_builder::<UInt32Builder>(2)
                .expect("line")
                .append_option(i.line);
            s.field_builder::<UInt32Builder>(3)
                .expect("column")
                .append_option(i.column);
            s.append(true);
        }
        self.inlined.append(true);
        self.n += 1;
    }
}

impl Rows for FrameRows {
    fn len(&self) -> usize {
        self.n
    }
    fn take_batch(&mut self) -> RecordBatch {
        self.n = 0;
        let cols: Vec<ArrayRef> = vec![
            Arc::new(self.pid.finish()),
            Arc::new(self.addr.finish()),
            Arc::new(self.build_id.finish()),
            Arc::new(self.path.finish()),
            Arc::new(self.file_offset.finish()),
            Arc::new(self.function.finish()),
            Arc::new(self.func_offset.finish()),
            Arc::new(self.file.finish()),
            Arc::new(self.line.finish()),
            Arc::new(self.column.finish()),
            Arc::new(self.inlined.finish()),
        ];
        RecordBatch::try_new(Table::Frames.schema(), cols).expect("frames batch matches schema")
    }
}

#[derive(Default)]
pub(super) struct MapRows {
    rows: Vec<MapRecord>,
}

impl MapRows {
    pub(super) fn push(&mut self, m: &MapRecord) {
        self.rows.push(m.clone());
    }
}

impl Rows for MapRows {
    fn len(&self) -> usize {
        self.rows.len()
    }
    fn take_batch(&mut self) -> RecordBatch {
        let rows = std::mem::take(&mut self.rows);
        let u64col = |f: fn(&MapRecord) -> u64| -> ArrayRef {
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(f)))
        };
        let cols: Vec<ArrayRef> = vec![
            u64col(|m| m.ts_ns),
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(|m| m.pid))),
            u64col(|m| m.start),
            u64col(|m| m.end),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|m| m.perms.as_str()),
            )),
            u64col(|m| m.offset),
            u64col(|m| m.inode),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|m| m.path.as_deref()),
            )),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|m| m.build_id.as_deref()),
            )),
        ];
        RecordBatch::try_new(Table::Maps.schema(), cols).expect("maps batch matches schema")
    }
}

#[derive(Default)]
pub(super) struct ScanRows {
    rows: Vec<ScanRecord>,
}

impl ScanRows {
    pub(super) fn push(&mut self, r: &ScanRecord) {
        self.rows.push(r.clone());
    }
}

impl Rows for ScanRows {
    fn len(&self) -> usize {
        self.rows.len()
    }
    fn take_batch(&mut self) -> RecordBatch {
        let rows = std::mem::take(&mut self.rows);
        let u64col = |f: fn(&ScanRecord) -> u64| -> ArrayRef {
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(f)))
        };
        let cols: Vec<ArrayRef> = vec![
            u64col(|r| r.ts_ns),
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.pid))),
            u64col(|r| r.addr),
            u64col(|r| r.size),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.verdict.name()),
            )),
            Arc::new(BinaryArray::from_iter(
                rows.iter().map(|r| r.contents.as_deref()),
            )),
        ];
        RecordBatch::try_new(Table::Scan.schema(), cols).expect("scan batch matches schema")
    }
}
