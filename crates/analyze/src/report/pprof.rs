//! The report as a pprof profile: a gzipped `profile.proto` message
//! (github.com/google/pprof, `proto/profile.proto`), the format `go tool
//! pprof`, Pyroscope, Grafana and speedscope read.
//!
//! This module owns the translation from a [`Report`] to the profile's
//! tables and its encoding; the messages are derived with `prost` here, so
//! the build needs no `protoc`.
//!
//! * **Samples**: one per stack of the report, every stack rather than
//!   the top ones, with four values as in Go's heap profiles:
//!   `inuse_objects`/`inuse_space` (outstanding allocations and bytes,
//!   after every filter) and `alloc_objects`/`alloc_space` (allocations
//!   made during the trace, freed or not). `inuse_space` is the default.
//!   Labels: `pid` (user stacks), `kernel`, `truncated`, `stack_id` (the
//!   id in the JSON report).
//! * **Locations**: one per distinct frame address per object, its `Line`s
//!   innermost first: the functions inlined at the address, then the
//!   function containing it, which is how pprof expects an inlined chain.
//! * **Mappings**: a user frame belongs to the row of the trace's `maps`
//!   table of its process that holds its address (same object, same file
//!   offset); when that table lacks it, a mapping is made from the frames
//!   of the object. Kernel frames get one mapping per kernel object
//!   (`[kernel]`, modules) spanning their addresses. Build ids come from
//!   the maps row or the frame.
//! * `time_nanos` is the wall-clock start of the recording (meta.json's
//!   clock pair), `duration_nanos` the span the report covers.

use std::collections::HashMap;
use std::io::{self, Write};

use memleak_trace::{MapRecord, Trace};
use prost::Message;

use crate::model::{Frame, Report, StackReport};

/// The messages of `profile.proto` this export writes, field numbers as in
/// the specification. Strings are indexes into `string_table`; ids start
/// at 1 (0 means none).
pub mod proto {
    /// A profile.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        /// What each value of a sample measures.
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        /// The samples.
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        /// The objects the locations are in.
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        /// The frames.
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        /// The functions the lines name.
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        /// Every string of the profile; the first is empty.
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        /// Frames to drop (a regular expression; unused).
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        /// Frames to keep (a regular expression; unused).
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        /// Wall-clock time the profile starts, ns since the Unix epoch.
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        /// Length of the profile, ns.
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        /// What the period counts.
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        /// Sampling period.
        #[prost(int64, tag = "12")]
        pub period: i64,
        /// Free-form comments.
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        /// The sample type shown by default.
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    /// A measure and its unit.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        /// What is measured.
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        /// Its unit.
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    /// Values measured at one stack.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Locations, leaf first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        /// One value per sample type.
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        /// Labels.
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    /// A sample's label: a string or a number.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        /// Name.
        #[prost(int64, tag = "1")]
        pub key: i64,
        /// String value.
        #[prost(int64, tag = "2")]
        pub str: i64,
        /// Numeric value.
        #[prost(int64, tag = "3")]
        pub num: i64,
        /// Unit of the numeric value.
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    /// An object mapped into memory.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        /// Id, from 1.
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// First address.
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        /// Address after the last.
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        /// Offset in the file of `memory_start`.
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        /// Path of the object.
        #[prost(int64, tag = "5")]
        pub filename: i64,
        /// Build id, hex.
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        /// Every location in it has a function.
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        /// Every line has a file name.
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        /// Every line has a line number.
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        /// Inlined functions are expanded.
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    /// A frame: an address and the source lines there.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        /// Id, from 1.
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// The mapping holding the address (0: unknown).
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        /// The address.
        #[prost(uint64, tag = "3")]
        pub address: u64,
        /// Lines, innermost inlined function first.
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        /// Several frames folded into one (never, here).
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    /// A function and a line in it.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        /// The function.
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        /// Line number (0: unknown).
        #[prost(int64, tag = "2")]
        pub line: i64,
        /// Column (0: unknown).
        #[prost(int64, tag = "3")]
        pub column: i64,
    }

    /// A function.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        /// Id, from 1.
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// Name, demangled.
        #[prost(int64, tag = "2")]
        pub name: i64,
        /// Name as the system knows it (the same here).
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        /// Source file.
        #[prost(int64, tag = "4")]
        pub filename: i64,
        /// First line (0: unknown).
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

use proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

/// What the export needs from the trace beyond the report: the `maps`
/// table, which places user frames in their mappings, and the clocks and
/// host of meta.json.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// Mapping rows by process, each sorted by start, duplicates removed.
    maps: HashMap<u32, ProcessMaps>,
    /// Wall-clock ns since the Unix epoch of the report's start (0:
    /// unknown).
    wall_start_ns: u64,
    /// Host and kernel that recorded, for the comments.
    host: String,
}

#[derive(Debug, Clone, Default)]
struct ProcessMaps {
    rows: Vec<MapRecord>,
    /// Longest row, to bound the search for the rows holding an address.
    max_len: u64,
}

impl Context {
    /// Reads the `maps` table and meta.json's clocks of `trace`.
    pub fn read(trace: &Trace) -> memleak_trace::Result<Context> {
        let meta = trace.meta();
        let mut ctx = Context::from_maps(trace.maps()?);
        if !meta.host.is_empty() {
            ctx.host = format!("{} (Linux {})", meta.host, meta.kernel);
        }
        // The report starts at meta.start_ns, CLOCK_MONOTONIC.
        if meta.clock.realtime_ns != 0 && meta.start_ns != 0 {
            ctx.wall_start_ns = (meta.clock.realtime_ns as i128 + meta.start_ns as i128
                - meta.clock.monotonic_ns as i128)
                .max(0) as u64;
        }
        Ok(ctx)
    }

    /// A context of these `maps` rows, with no clock.
    pub fn from_maps(rows: Vec<MapRecord>) -> Context {
        let mut maps: HashMap<u32, ProcessMaps> = HashMap::new();
        for r in rows {
            if r.end > r.start {
                maps.entry(r.pid).or_default().rows.push(r);
            }
        }
        for m in maps.values_mut() {
            // Snapshots repeat the rows that did not change.
            m.rows.sort_unstable_by(|a, b| {
                (a.start, a.end, a.offset, &a.path, &a.build_id).cmp(&(
                    b.start,
                    b.end,
                    b.offset,
                    &b.path,
                    &b.build_id,
                ))
            });
            m.rows.dedup_by(|a, b| {
                (a.start, a.end, a.offset, &a.path, &a.build_id)
                    == (b.start, b.end, b.offset, &b.path, &b.build_id)
            });
            m.max_len = m.rows.iter().map(|r| r.end - r.start).max().unwrap_or(0);
        }
        Context {
            maps,
            ..Default::default()
        }
    }

    /// Sets the wall-clock time of the report's start.
    pub fn with_wall_start(mut self, ns: u64) -> Context {
        self.wall_start_ns = ns;
        self
    }

    /// The maps row of process `pid` that holds frame `f`: one of the same
    /// object whose file offset agrees with the frame's, else one of the
    /// same object, else (for a frame the recorder did not place) any
    /// executable one.
    fn row(&self, pid: u32, f: &Frame) -> Option<usize> {
        let m = self.maps.get(&pid)?;
        let end = m.rows.partition_point(|r| r.start <= f.addr);
        let mut best: Option<(u8, usize)> = None;
        for (i, r) in m.rows[..end].iter().enumerate().rev() {
            if r.start.saturating_add(m.max_len) <= f.addr {
                break;
            }
            if f.addr >= r.end {
                continue;
            }
            let same_object = f.path.is_some() && r.path == f.path;
            let rank = if same_object && f.file_offset == Some(f.addr - r.start + r.offset) {
                3
            } else if same_object {
                2
            } else if f.path.is_none() && r.perms.contains('x') {
                1
            } else {
                0
            };
            if rank > best.map_or(0, |b| b.0) {
                best = Some((rank, i));
            }
        }
        best.map(|b| b.1)
    }
}

/// Which mapping a location is in, while the profile is built.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum MapKey<'a> {
    /// A row of the `maps` table: the process and the row's index in
    /// its rows.
    Row(u32, usize),
    /// A kernel object, by name.
    Kernel(&'a str),
    /// A user object the `maps` table does not place: its frames with the
    /// same load bias (address minus file offset) in one process.
    Guess {
        pid: u32,
        path: &'a str,
        build_id: Option<&'a str>,
        bias: u64,
    },
}

/// A mapping being built.
struct MapAcc<'a> {
    key: MapKey<'a>,
    /// Lowest and highest address of its locations.
    low: u64,
    high: u64,
    /// Build id of its frames, when the key has none.
    build_id: Option<&'a str>,
    has_functions: bool,
    has_filenames: bool,
    has_line_numbers: bool,
}

/// The string table.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings::default();
        s.id("");
        s
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// Builds the profile's tables.
struct Builder<'a> {
    ctx: &'a Context,
    strings: Strings,
    functions: Vec<Function>,
    function_ids: HashMap<(&'a str, Option<&'a str>), u64>,
    locations: Vec<Location>,
    /// Index of each location's mapping in `mappings`, beside `locations`.
    location_maps: Vec<Option<usize>>,
    /// (mapping index + 1 or 0, pid if unmapped, address) -> location id.
    location_ids: HashMap<(usize, u32, u64), u64>,
    /// Locations standing for a stack without frames, by name.
    pseudo_ids: HashMap<String, u64>,
    mappings: Vec<MapAcc<'a>>,
    mapping_ids: HashMap<MapKey<'a>, usize>,
}

impl<'a> Builder<'a> {
    fn function(&mut self, name: &'a str, file: Option<&'a str>) -> u64 {
        if let Some(&id) = self.function_ids.get(&(name, file)) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let name_id = self.strings.id(name);
        let filename = file.map_or(0, |f| self.strings.id(f));
        self.functions.push(Function {
            id,
            name: name_id,
            system_name: name_id,
            filename,
            start_line: 0,
        });
        self.function_ids.insert((name, file), id);
        id
    }

    /// The mapping of a frame of `stack`, if it can be placed.
    fn mapping(&mut self, stack: &StackReport, f: &'a Frame) -> Option<usize> {
        let key = if stack.kernel {
            MapKey::Kernel(f.path.as_deref().unwrap_or("[kernel]"))
        } else {
            let pid = stack.pid?;
            match self.ctx.row(pid, f) {
                Some(i) => MapKey::Row(pid, i),
                None => match (&f.path, f.file_offset) {
                    (Some(path), Some(off)) => MapKey::Guess {
                        pid,
                        path,
                        build_id: f.build_id.as_deref(),
                        bias: f.addr.wrapping_sub(off),
                    },
                    _ => return None,
                },
            }
        };
        let i = match self.mapping_ids.get(&key) {
            Some(&i) => i,
            None => {
                let i = self.mappings.len();
                self.mappings.push(MapAcc {
                    key: key.clone(),
                    low: f.addr,
                    high: f.addr,
                    build_id: None,
                    has_functions: true,
                    has_filenames: true,
                    has_line_numbers: true,
                });
                self.mapping_ids.insert(key, i);
                i
            }
        };
        let m = &mut self.mappings[i];
        m.low = m.low.min(f.addr);
        m.high = m.high.max(f.addr);
        if m.build_id.is_none() {
            m.build_id = f.build_id.as_deref();
        }
        Some(i)
    }

    /// The location of a frame of `stack`.
    fn location(&mut self, stack: &StackReport, f: &'a Frame) -> u64 {
        let mapping = self.mapping(stack, f);
        let pid = match mapping {
            Some(_) => 0,
            None => stack.pid.unwrap_or(0),
        };
        let key = (mapping.map_or(0, |m| m + 1), pid, f.addr);
        if let Some(&id) = self.location_ids.get(&key) {
            return id;
        }
        let mut line = Vec::with_capacity(f.inlined.len() + 1);
        if let Some(func) = &f.function {
            for inl in &f.inlined {
                line.push(Line {
                    function_id: self.function(&inl.function, inl.file.as_deref()),
                    line: inl.line.unwrap_or(0) as i64,
                    column: inl.column.unwrap_or(0) as i64,
                });
            }
            line.push(Line {
                function_id: self.function(func, f.file.as_deref()),
                line: f.line.unwrap_or(0) as i64,
                column: f.column.unwrap_or(0) as i64,
            });
        }
        if let Some(m) = mapping {
            let m = &mut self.mappings[m];
            m.has_functions &= f.function.is_some();
            m.has_filenames &= f.file.is_some() && f.inlined.iter().all(|i| i.file.is_some());
            m.has_line_numbers &= f.line.is_some() && f.inlined.iter().all(|i| i.line.is_some());
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(Location {
            id,
            mapping_id: 0, // set when the mappings are numbered
            address: f.addr,
            line,
            is_folded: false,
        });
        self.location_maps.push(mapping);
        self.location_ids.insert(key, id);
        id
    }

    /// A location with no address standing for a stack without frames.
    fn pseudo_location(&mut self, name: String) -> u64 {
        if let Some(&id) = self.pseudo_ids.get(&name) {
            return id;
        }
        let id = self.locations.len() as u64 + 1;
        let name_id = self.strings.id(&name);
        let function_id = self.functions.len() as u64 + 1;
        self.functions.push(Function {
            id: function_id,
            name: name_id,
            system_name: name_id,
            filename: 0,
            start_line: 0,
        });
        self.locations.push(Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![Line {
                function_id,
                line: 0,
                column: 0,
            }],
            is_folded: false,
        });
        self.location_maps.push(None);
        self.pseudo_ids.insert(name, id);
        id
    }

    /// Numbers the mappings, user objects by address then kernel objects
    /// (pprof takes the first mapping for the main program, which is
    /// mapped lowest), and points the locations at them.
    fn finish_mappings(&mut self) -> Vec<Mapping> {
        let mut order: Vec<usize> = (0..self.mappings.len()).collect();
        let ctx = self.ctx;
        let row = |pid: u32, i: usize| &ctx.maps[&pid].rows[i];
        let start = |m: &MapAcc| match m.key {
            MapKey::Row(pid, i) => row(pid, i).start,
            _ => m.low,
        };
        order.sort_by_key(|&i| {
            let m = &self.mappings[i];
            (matches!(m.key, MapKey::Kernel(_)), start(m), i)
        });
        let mut id_of = vec![0u64; self.mappings.len()];
        let mut out = Vec::with_capacity(order.len());
        for (n, &i) in order.iter().enumerate() {
            id_of[i] = n as u64 + 1;
            let m = &self.mappings[i];
            let (memory_start, memory_limit, file_offset, filename, build_id) = match &m.key {
                MapKey::Row(pid, i) => {
                    let r = row(*pid, *i);
                    (
                        r.start,
                        r.end,
                        r.offset,
                        r.path.as_deref().unwrap_or(""),
                        r.build_id.as_deref().or(m.build_id),
                    )
                }
                MapKey::Kernel(name) => (m.low, m.high + 1, 0, *name, m.build_id),
                MapKey::Guess {
                    path,
                    build_id,
                    bias,
                    ..
                } => (m.low, m.high + 1, m.low - bias, *path, *build_id),
            };
            let filename = self.strings.id(filename);
            let build_id = build_id.map_or(0, |b| self.strings.id(b));
            out.push(Mapping {
                id: n as u64 + 1,
                memory_start,
                memory_limit,
                file_offset,
                filename,
                build_id,
                has_functions: m.has_functions,
                has_filenames: m.has_functions && m.has_filenames,
                has_line_numbers: m.has_functions && m.has_line_numbers,
                // The recorder expands every inlined chain it finds.
                has_inline_frames: m.has_functions,
            });
        }
        for (loc, m) in self.locations.iter_mut().zip(&self.location_maps) {
            loc.mapping_id = m.map_or(0, |i| id_of[i]);
        }
        out
    }
}

/// The profile of a report.
pub fn profile(report: &Report, ctx: &Context) -> Profile {
    let mut b = Builder {
        ctx,
        strings: Strings::new(),
        functions: Vec::new(),
        function_ids: HashMap::new(),
        locations: Vec::new(),
        location_maps: Vec::new(),
        location_ids: HashMap::new(),
        pseudo_ids: HashMap::new(),
        mappings: Vec::new(),
        mapping_ids: HashMap::new(),
    };
    let value_type = |b: &mut Builder, t: &str, u: &str| ValueType {
        r#type: b.strings.id(t),
        unit: b.strings.id(u),
    };
    let sample_type = vec![
        value_type(&mut b, "inuse_objects", "count"),
        value_type(&mut b, "inuse_space", "bytes"),
        value_type(&mut b, "alloc_objects", "count"),
        value_type(&mut b, "alloc_space", "bytes"),
    ];
    let period_type = value_type(&mut b, "space", "bytes");
    let default_sample_type = sample_type[1].r#type;
    let (pid_key, kernel_key, truncated_key, stack_key, true_id) = (
        b.strings.id("pid"),
        b.strings.id("kernel"),
        b.strings.id("truncated"),
        b.strings.id("stack_id"),
        b.strings.id("true"),
    );
    let mut samples = Vec::with_capacity(report.stacks.len());
    for s in &report.stacks {
        let value = [s.count, s.bytes, s.allocations, s.allocated_bytes];
        if value.iter().all(|&v| v == 0) {
            continue;
        }
        let location_id: Vec<u64> = if s.frames.is_empty() {
            vec![b.pseudo_location(if s.stack_id == 0 {
                "[no stack]".to_string()
            } else {
                format!("[missing stack {}]", s.stack_id)
            })]
        } else {
            s.frames.iter().map(|f| b.location(s, f)).collect()
        };
        let mut label = Vec::with_capacity(4);
        let num = |key: i64, num: i64| Label {
            key,
            num,
            ..Default::default()
        };
        let yes = |key: i64| Label {
            key,
            str: true_id,
            ..Default::default()
        };
        if let Some(pid) = s.pid {
            label.push(num(pid_key, pid as i64));
        }
        if s.kernel {
            label.push(yes(kernel_key));
        }
        if s.truncated {
            label.push(yes(truncated_key));
        }
        label.push(num(stack_key, s.stack_id as i64));
        samples.push(Sample {
            location_id,
            value: value.iter().map(|&v| v as i64).collect(),
            label,
        });
    }
    let mapping = b.finish_mappings();
    let sum = &report.summary;
    let mut comments = vec![format!("memleak analyze {}", sum.trace)];
    if let Some(w) = sum.losses().warning() {
        // `go tool pprof -raw` and `-comments` show it.
        comments.push(format!("WARNING: {w}"));
    }
    if let Some(n) = sum.sampling_note() {
        comments.push(format!("ESTIMATES: {n}"));
    }
    if !ctx.host.is_empty() {
        comments.push(format!("recorded on {}", ctx.host));
    }
    if !sum.filters.is_empty() {
        comments.push(format!("filters: {}", sum.filters.join(", ")));
    }
    let comment = comments.iter().map(|c| b.strings.id(c)).collect();
    Profile {
        sample_type,
        sample: samples,
        mapping,
        location: b.locations,
        function: b.functions,
        string_table: b.strings.table,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: ctx.wall_start_ns as i64,
        duration_nanos: sum.duration_ns() as i64,
        // Every allocation is recorded: nothing is sampled.
        period_type: Some(period_type),
        period: 1,
        comment,
        default_sample_type,
    }
}

/// Writes the profile of `report`, gzipped, as `go tool pprof` reads it.
pub fn write(report: &Report, ctx: &Context, w: &mut dyn Write) -> io::Result<()> {
    let bytes = profile(report, ctx).encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(w, flate2::Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()?;
    Ok(())
}

/// The pprof profile, with the trace's mappings in its [`Context`]:
/// `--format pprof`, `profile.pb.gz`.
pub struct Pprof(pub Context);

impl crate::render::Render<Report> for Pprof {
    fn file_name(&self) -> &'static str {
        "profile.pb.gz"
    }

    fn write(&self, report: &Report, out: &mut (dyn Write + Send)) -> io::Result<()> {
        write(report, &self.0, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Inlined, Summary};

    fn frame(addr: u64, function: Option<&str>, path: Option<&str>, file_offset: u64) -> Frame {
        Frame {
            addr,
            function: function.map(str::to_string),
            file: function.map(|_| "src/prog.c".to_string()),
            line: function.map(|_| 40),
            column: None,
            path: path.map(str::to_string),
            file_offset: path.map(|_| file_offset),
            build_id: path.map(|_| "b1d".to_string()),
            ..Default::default()
        }
    }

    fn stack(id: u64, pid: Option<u32>, values: [u64; 4], frames: Vec<Frame>) -> StackReport {
        StackReport {
            stack_id: id,
            pid,
            kernel: pid.is_none() && id != 0,
            known: true,
            count: values[0],
            bytes: values[1],
            allocations: values[2],
            allocated_bytes: values[3],
            frames,
            ..Default::default()
        }
    }

    fn map_row(ts_ns: u64, pid: u32, start: u64, end: u64, offset: u64, path: &str) -> MapRecord {
        MapRecord {
            ts_ns,
            pid,
            start,
            end,
            perms: "r-xp".into(),
            offset,
            inode: 1,
            path: Some(path.into()),
            build_id: Some(format!("id-{path}")),
        }
    }

    /// A report of: a stack of pid 10 in an object the maps table lacks,
    /// its leaf with two inlined functions; a stack of pid 11 in libc, which
    /// the maps table places (beside a row of another object over the same
    /// addresses, from an older snapshot, and a duplicate row); a kernel
    /// stack; a stack without frames; a stack of nothing; a frame no one
    /// symbolized.
    fn report() -> (Report, Context) {
        let mut leaf = frame(0x1010, Some("leaf"), Some("/bin/prog"), 0x10);
        leaf.inlined = vec![
            Inlined {
                function: "inner".into(),
                file: Some("src/inner.h".into()),
                line: Some(7),
                column: Some(3),
            },
            Inlined {
                function: "middle".into(),
                file: Some("src/middle.h".into()),
                line: Some(9),
                column: None,
            },
        ];
        let main = frame(0x2020, Some("main"), Some("/bin/prog"), 0x1020);
        let libc = frame(
            0x7f00_0100,
            Some("malloc_wrapper"),
            Some("/lib/libc.so"),
            0x3100,
        );
        let kernel = |addr| Frame {
            addr,
            function: Some("kmalloc_caller".into()),
            path: Some("[kernel]".into()),
            ..Default::default()
        };
        let report = Report {
            summary: Summary {
                trace: "t.parquet".into(),
                start_ts: 1_000,
                eval_ts: 5_001_000,
                filters: vec!["min-size=8".into()],
                ..Default::default()
            },
            stacks: vec![
                stack(
                    1,
                    Some(10),
                    [2, 200, 3, 300],
                    vec![leaf.clone(), main.clone()],
                ),
                stack(2, Some(11), [1, 50, 4, 400], vec![libc, main.clone()]),
                stack(
                    3,
                    None,
                    [5, 5_000, 5, 5_000],
                    vec![kernel(0xffff_8000_0000_0100), kernel(0xffff_8000_0000_0010)],
                ),
                stack(
                    4,
                    Some(10),
                    [0, 0, 7, 700],
                    vec![leaf, frame(0x9999, None, None, 0)],
                ),
                stack(0, None, [0, 0, 1, 8], vec![]),
                stack(5, Some(10), [0, 0, 0, 0], vec![main]),
            ],
            top: 10,
            ..Default::default()
        };
        let ctx = Context::from_maps(vec![
            map_row(1, 11, 0x7f00_0000, 0x7f00_2000, 0x3000, "/lib/libc.so"),
            map_row(2, 11, 0x7f00_0000, 0x7f00_2000, 0x3000, "/lib/libc.so"),
            map_row(0, 11, 0x7eff_0000, 0x7f10_0000, 0, "/lib/old.so"),
        ])
        .with_wall_start(1_700_000_000_000_000_000);
        (report, ctx)
    }

    fn decoded() -> Profile {
        let (report, ctx) = report();
        let mut gz = Vec::new();
        write(&report, &ctx, &mut gz).unwrap();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
        Profile::decode(&raw[..]).unwrap()
    }

    fn names(p: &Profile, loc: &Location) -> Vec<(String, String, i64)> {
        loc.line
            .iter()
            .map(|l| {
                let f = &p.function[l.function_id as usize - 1];
                assert_eq!(f.id, l.function_id);
                let s = |i: i64| p.string_table[i as usize].clone();
                (s(f.name), s(f.filename), l.line)
            })
            .collect()
    }

    #[test]
    fn tables_are_consistent() {
        let p = decoded();
        assert_eq!(p.string_table[0], "");
        let unique: std::collections::HashSet<_> = p.string_table.iter().collect();
        assert_eq!(unique.len(), p.string_table.len(), "duplicate strings");
        for (i, l) in p.location.iter().enumerate() {
            assert_eq!(l.id, i as u64 + 1);
            assert!(l.mapping_id as usize <= p.mapping.len());
        }
        for (i, m) in p.mapping.iter().enumerate() {
            assert_eq!(m.id, i as u64 + 1);
        }
        for (i, f) in p.function.iter().enumerate() {
            assert_eq!(f.id, i as u64 + 1);
        }
        let s = |i: i64| p.string_table[i as usize].as_str();
        let types: Vec<_> = p
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(
            types,
            [
                ("inuse_objects", "count"),
                ("inuse_space", "bytes"),
                ("alloc_objects", "count"),
                ("alloc_space", "bytes")
            ]
        );
        assert_eq!(s(p.default_sample_type), "inuse_space");
        assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(p.duration_nanos, 5_000_000);
        let comments: Vec<_> = p.comment.iter().map(|&c| s(c)).collect();
        assert_eq!(
            comments,
            ["memleak analyze t.parquet", "filters: min-size=8"]
        );
    }

    #[test]
    fn one_sample_per_stack_with_values_and_labels() {
        let p = decoded();
        let s = |i: i64| p.string_table[i as usize].as_str();
        // The stack of nothing is left out.
        assert_eq!(p.sample.len(), 5);
        let values: Vec<_> = p.sample.iter().map(|x| x.value.clone()).collect();
        assert_eq!(
            values,
            [
                vec![2, 200, 3, 300],
                vec![1, 50, 4, 400],
                vec![5, 5_000, 5, 5_000],
                vec![0, 0, 7, 700],
                vec![0, 0, 1, 8]
            ]
        );
        let labels = |x: &Sample| -> Vec<(String, String)> {
            x.label
                .iter()
                .map(|l| {
                    let v = if l.str != 0 {
                        s(l.str).to_string()
                    } else {
                        l.num.to_string()
                    };
                    (s(l.key).to_string(), v)
                })
                .collect()
        };
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            labels(&p.sample[0]),
            [pair("pid", "10"), pair("stack_id", "1")]
        );
        assert_eq!(
            labels(&p.sample[2]),
            [pair("kernel", "true"), pair("stack_id", "3")]
        );
        // A stack without frames gets a location that says so.
        let none = &p.location[p.sample[4].location_id[0] as usize - 1];
        assert_eq!(
            names(&p, none),
            [("[no stack]".to_string(), String::new(), 0)]
        );
        assert_eq!(none.mapping_id, 0);
    }

    #[test]
    fn locations_carry_inlined_lines_innermost_first() {
        let p = decoded();
        let leaf = &p.location[p.sample[0].location_id[0] as usize - 1];
        assert_eq!(leaf.address, 0x1010);
        let line = |f: &str, file: &str, l: i64| (f.to_string(), file.to_string(), l);
        assert_eq!(
            names(&p, leaf),
            [
                line("inner", "src/inner.h", 7),
                line("middle", "src/middle.h", 9),
                line("leaf", "src/prog.c", 40)
            ]
        );
        assert_eq!(leaf.line[0].column, 3);
        // The same address of the same object is one location; `main` is
        // one location in pid 10's object, another in pid 11's.
        assert_eq!(p.sample[3].location_id[0], p.sample[0].location_id[0]);
        assert_ne!(p.sample[1].location_id[1], p.sample[0].location_id[1]);
        // A frame no one symbolized: its address, no lines, no mapping.
        let unknown = &p.location[p.sample[3].location_id[1] as usize - 1];
        assert_eq!(
            (unknown.address, unknown.line.len(), unknown.mapping_id),
            (0x9999, 0, 0)
        );
    }

    #[test]
    fn mappings_come_from_the_maps_table_or_the_frames() {
        let p = decoded();
        let s = |i: i64| p.string_table[i as usize].as_str();
        let maps: Vec<_> = p
            .mapping
            .iter()
            .map(|m| {
                (
                    m.memory_start,
                    m.memory_limit,
                    m.file_offset,
                    s(m.filename),
                    s(m.build_id),
                )
            })
            .collect();
        assert_eq!(
            maps,
            [
                // pid 10's program, from its frames: lowest address first,
                // the offset at which the bias (addr - file_offset) puts it.
                (0x1010, 0x2021, 0x10, "/bin/prog", "b1d"),
                // pid 11's program, the same object elsewhere, no maps rows.
                (0x2020, 0x2021, 0x1020, "/bin/prog", "b1d"),
                // libc: the maps row of its object, not the older row of
                // another object over the same address.
                (
                    0x7f00_0000,
                    0x7f00_2000,
                    0x3000,
                    "/lib/libc.so",
                    "id-/lib/libc.so"
                ),
                // The kernel last, spanning its frames.
                (
                    0xffff_8000_0000_0010,
                    0xffff_8000_0000_0101,
                    0,
                    "[kernel]",
                    ""
                ),
            ]
        );
        assert!(p.mapping[0].has_functions && p.mapping[0].has_inline_frames);
        assert!(p.mapping[0].has_filenames && p.mapping[0].has_line_numbers);
        // The kernel frames have no source lines.
        assert!(p.mapping[3].has_functions && !p.mapping[3].has_line_numbers);
        let mapping_of = |sample: usize, frame: usize| {
            p.location[p.sample[sample].location_id[frame] as usize - 1].mapping_id
        };
        assert_eq!((mapping_of(0, 0), mapping_of(0, 1)), (1, 1));
        assert_eq!((mapping_of(1, 0), mapping_of(1, 1)), (3, 2));
        assert_eq!(mapping_of(2, 0), 4);
    }

    #[test]
    fn an_empty_report_is_a_valid_profile() {
        let mut gz = Vec::new();
        write(&Report::default(), &Context::default(), &mut gz).unwrap();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
        let p = Profile::decode(&raw[..]).unwrap();
        assert!(p.sample.is_empty() && p.location.is_empty() && p.mapping.is_empty());
        assert_eq!(p.sample_type.len(), 4);
    }
}
