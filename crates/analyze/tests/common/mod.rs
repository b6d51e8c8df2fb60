//! Synthetic traces for tests: a builder of events, stacks and frames.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use memleak_trace::{
    Event, EventKind, FrameRecord, InlinedFrame, Meta, ScanInfo, ScanRecord, ScanVerdict,
    StackRecord, TraceWriter, WriterOptions,
};

/// Recording start of every synthetic trace (ns, CLOCK_MONOTONIC).
pub const T0: u64 = 1_000_000_000_000;
/// Nanoseconds per millisecond and second, for readable timestamps.
pub const MS: u64 = 1_000_000;
/// One second.
pub const S: u64 = 1_000_000_000;

/// Builds a trace from events given in time order.
pub struct TraceBuilder {
    pub events: Vec<Event>,
    pub stacks: Vec<StackRecord>,
    pub frames: Vec<FrameRecord>,
    pub meta: Meta,
    /// Reachability scans, written after the events.
    pub scans: Vec<(ScanInfo, Vec<ScanRecord>)>,
    pub row_group_rows: usize,
    pub segment_rows: usize,
    /// Writer settings of the events table (`WriterOptions::events_tuning`).
    pub events_tuning: Option<
        fn(
            parquet::file::properties::WriterPropertiesBuilder,
        ) -> parquet::file::properties::WriterPropertiesBuilder,
    >,
}

impl Default for TraceBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TraceBuilder {
    pub fn new() -> Self {
        let meta = Meta {
            start_ns: T0,
            end_ns: T0 + 10 * S,
            pids: vec![100],
            ..Meta::default()
        };
        // Tiny row groups and segments, so every test crosses row-group,
        // window and segment boundaries.
        TraceBuilder {
            events: Vec::new(),
            stacks: Vec::new(),
            frames: Vec::new(),
            meta,
            scans: Vec::new(),
            row_group_rows: 3,
            segment_rows: 7,
            events_tuning: None,
        }
    }

    /// Adds an event at `ms` milliseconds after T0.
    pub fn ev(
        &mut self,
        ms: u64,
        pid: u32,
        kind: EventKind,
        addr: u64,
        size: u64,
        stack: u64,
    ) -> &mut Self {
        self.events.push(Event {
            ts_ns: T0 + ms * MS,
            pid,
            tid: pid,
            kind,
            addr,
            size,
            old_addr: None,
            old_size: None,
            stack_id: (stack != 0).then_some(stack),
        });
        self
    }

    pub fn malloc(&mut self, ms: u64, addr: u64, size: u64, stack: u64) -> &mut Self {
        self.ev(ms, 100, EventKind::Malloc, addr, size, stack)
    }

    pub fn free(&mut self, ms: u64, addr: u64) -> &mut Self {
        self.ev(ms, 100, EventKind::Free, addr, 0, 0)
    }

    pub fn realloc(&mut self, ms: u64, old: u64, new: u64, size: u64, stack: u64) -> &mut Self {
        self.ev(ms, 100, EventKind::Realloc, new, size, stack);
        self.events.last_mut().unwrap().old_addr = (old != 0).then_some(old);
        self
    }

    pub fn mremap(
        &mut self,
        ms: u64,
        old: u64,
        old_size: u64,
        new: u64,
        size: u64,
        stack: u64,
    ) -> &mut Self {
        self.ev(ms, 100, EventKind::Mremap, new, size, stack);
        let e = self.events.last_mut().unwrap();
        e.old_addr = Some(old);
        e.old_size = Some(old_size);
        self
    }

    /// A user stack of pid 100 with the given frames (innermost first).
    pub fn stack(&mut self, id: u64, frames: &[u64]) -> &mut Self {
        self.stacks.push(StackRecord {
            stack_id: id,
            pid: 100,
            kernel: false,
            truncated: false,
            frames: frames.to_vec(),
        });
        self
    }

    /// A symbolized frame of pid 100 (0 for kernel).
    pub fn frame(
        &mut self,
        pid: u32,
        addr: u64,
        function: &str,
        off: u64,
        file: &str,
        line: u32,
    ) -> &mut Self {
        self.frames.push(FrameRecord {
            pid,
            addr,
            build_id: Some("abcd".into()),
            path: Some("/usr/bin/leaky".into()),
            file_offset: Some(addr - 0x400000),
            function: Some(function.into()),
            func_offset: Some(off),
            file: Some(file.into()),
            line: Some(line),
            column: Some(5),
            inlined: Vec::new(),
        });
        self
    }

    pub fn inlined(&mut self, function: &str, file: &str, line: u32) -> &mut Self {
        self.frames.last_mut().unwrap().inlined.push(InlinedFrame {
            function: function.into(),
            file: Some(file.into()),
            line: Some(line),
            column: None,
        });
        self
    }

    /// Writes the trace under `dir` and returns its path.
    pub fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("trace.parquet");
        let opts = WriterOptions {
            row_group_rows: self.row_group_rows,
            segment_rows: self.segment_rows,
            // Keep the segments apart: replay across segments is tested.
            merge_segments: 0,
            events_tuning: self.events_tuning,
            force: true,
            ..WriterOptions::default()
        };
        let mut w = TraceWriter::create(&path, self.meta.clone(), opts).unwrap();
        for s in &self.stacks {
            w.push_stack(s).unwrap();
        }
        for f in &self.frames {
            w.push_frame(f).unwrap();
        }
        for e in &self.events {
            w.push_event(e).unwrap();
        }
        for (info, rows) in &self.scans {
            w.write_scan(info.clone(), rows).unwrap();
        }
        w.finish().unwrap();
        path
    }

    /// Adds a scan of pid 100 at `ms` after T0 with these blocks:
    /// `(addr, size, verdict, contents)`.
    pub fn scan(
        &mut self,
        ms: u64,
        blocks: &[(u64, u64, ScanVerdict, Option<&[u8]>)],
    ) -> &mut Self {
        let ts_ns = T0 + ms * MS;
        let rows: Vec<ScanRecord> = blocks
            .iter()
            .map(|&(addr, size, verdict, contents)| ScanRecord {
                ts_ns,
                pid: 100,
                addr,
                size,
                verdict,
                contents: contents.map(<[u8]>::to_vec),
            })
            .collect();
        let info = ScanInfo {
            pid: 100,
            ts_ns,
            pause_ns: 2_500_000,
            threads: 2,
            roots_bytes: 3 << 20,
            heap_bytes: blocks.iter().map(|b| b.1).sum(),
            blocks: rows.len() as u64,
            error: None,
        };
        self.scans.push((info, rows));
        self
    }
}
