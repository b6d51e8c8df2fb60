//! `meta.json`: what was recorded, where, when, and what was lost.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::fsio;
use crate::schema::{FORMAT_MAJOR, FORMAT_MINOR, FORMAT_NAME};

/// A pair of clock readings taken back to back, to convert event
/// timestamps (CLOCK_MONOTONIC) to wall-clock time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockPair {
    /// CLOCK_MONOTONIC in nanoseconds.
    pub monotonic_ns: u64,
    /// CLOCK_REALTIME in nanoseconds since the Unix epoch.
    pub realtime_ns: u64,
}

impl ClockPair {
    /// Reads both clocks now.
    pub fn now() -> Self {
        ClockPair {
            monotonic_ns: clock_ns(libc::CLOCK_MONOTONIC),
            realtime_ns: clock_ns(libc::CLOCK_REALTIME),
        }
    }
}

/// Reads a clock in nanoseconds.
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Event counts by kind and losses by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Rows written, by kind name.
    #[serde(default)]
    pub events: BTreeMap<String, u64>,
    /// Events lost, by reason (`ring_full`, `stack_failed`, `inflight_full`, …);
    /// [`Counters::losses`] says which make outstanding figures uncertain.
    #[serde(default)]
    pub lost: BTreeMap<String, u64>,
}

impl Counters {
    /// Sum of all lost events.
    pub fn lost_total(&self) -> u64 {
        self.lost.values().sum()
    }
    /// The losses sorted by what they mean for a report
    /// ([`crate::losses`]).
    pub fn losses(&self) -> crate::losses::Losses {
        crate::losses::Losses::of(&self.lost)
    }
    /// Sum of all written events.
    pub fn events_total(&self) -> u64 {
        self.events.values().sum()
    }
}

/// A closed segment as `meta.json` lists it: the file, how many rows it
/// holds, and its length and CRC-32 (of the whole file, as in zlib), so a
/// reader can tell a missing, truncated or altered segment from a good one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    /// File name within the table's directory (`part-00003.parquet`).
    pub file: String,
    /// Rows in the segment.
    pub rows: u64,
    /// Length of the file in bytes.
    pub bytes: u64,
    /// CRC-32 (IEEE, as zlib and Parquet compute it) of the whole file.
    pub crc32: u32,
}

/// The closed segments of every table, in order, by table name.
pub type Manifest = BTreeMap<String, Vec<SegmentEntry>>;

/// The contents of `meta.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Always `memleak-trace`.
    pub format: String,
    /// `MAJOR.MINOR`.
    pub format_version: String,
    /// Version of the memleak that wrote the trace.
    #[serde(default)]
    pub tool_version: String,
    /// Host name.
    #[serde(default)]
    pub host: String,
    /// Kernel release (`uname -r`).
    #[serde(default)]
    pub kernel: String,
    /// Clocks read when recording started.
    #[serde(default)]
    pub clock: ClockPair,
    /// The memleak command line.
    #[serde(default)]
    pub command: Vec<String>,
    /// Traced processes.
    #[serde(default)]
    pub pids: Vec<u32>,
    /// Recording options, free-form.
    #[serde(default)]
    pub options: serde_json::Value,
    /// CLOCK_MONOTONIC ns when recording started.
    #[serde(default)]
    pub start_ns: u64,
    /// CLOCK_MONOTONIC ns when recording ended (0 while recording).
    #[serde(default)]
    pub end_ns: u64,
    /// False while recording, or if the recorder was killed.
    #[serde(default)]
    pub complete: bool,
    /// Event counts and losses.
    #[serde(default)]
    pub counters: Counters,
    /// Every closed segment, by table (format 1.1 and later). A trace
    /// without it (1.0) is read by listing the table directories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<Manifest>,
    /// CLOCK_MONOTONIC ns of the last checkpoint: every event before it is
    /// in a segment that `segments` lists.
    #[serde(default)]
    pub checkpoint_ns: u64,
    /// Exit status of the traced command in `-c` mode, as a shell
    /// reports it: the code it exited with, or 128 + the signal that
    /// killed it (then `exit_signal` says which).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that killed the traced command, if one did (1.4).
    /// Absent when it exited; in traces before 1.4 an `exit_code` above
    /// 128 may be either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_signal: Option<i32>,
    /// Whether that signal dumped core (1.4). Written only when it did.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exit_core_dumped: bool,
    /// Allocator calls that returned NULL or `MAP_FAILED`: neither events
    /// nor losses. The recorder always writes it; `None` in traces from
    /// other writers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_allocations: Option<u64>,
    /// User stacks the recorder cut short before an address that cannot
    /// be a return address (outside executable memory, in no function of
    /// an object that lists them all, or after no call instruction): what
    /// the frame-pointer walk read
    /// there was data, in code without frame pointers. Those stacks are
    /// marked truncated. The recorder always writes it; `None` in traces
    /// from other writers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_stacks: Option<u64>,
    /// Fork lineage seen while recording: child pid -> parent pid (JSON
    /// object keys are the child pids as strings). The analyzer uses it to
    /// give a `--pid` child the heap it inherited. Not written when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parents: BTreeMap<u32, u32>,
    /// What the recorder could not record (e.g. a tracepoint this kernel
    /// lacks), for whoever analyzes the trace. Not written when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// How allocator calls were captured: `bpf` (kernel uprobes) or
    /// `preload` (memleak's agent inside the command). Absent in traces
    /// from before the agent, which are all `bpf`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<String>,
    /// The recorder's own user+sys CPU time in nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorder_cpu_ns: Option<u64>,
    /// Kernel tracepoint runs the kernel skipped for recursion, and how many
    /// of them a later copy of the program recorded (kernel recording only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_recursion: Option<KernelRecursion>,
    /// How user stacks were walked and how the walks ended (recordings
    /// with user-space probes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unwind: Option<UnwindInfo>,
    /// Reachability scans of the recorded processes, in the order they
    /// ran (1.3); their blocks are the `scan` table's rows. Not written
    /// when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scans: Vec<ScanInfo>,
    /// `record --sample` (1.6): the heap allocations in the trace are a
    /// byte-weighted Poisson sample, and every figure drawn from them is
    /// an estimate ([`Sampling::weight`]). Absent: every call was
    /// recorded (and in every trace before 1.6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<Sampling>,
    /// Fields this version does not know (a newer minor version added
    /// them); preserved on rewrite.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `kernel_recursion` in `meta.json`: the recursion misses of the kernel
/// programs that have a second copy (slab and page events). Every event a
/// later copy records is one the kernel skipped for the first copy, so
/// `recorded_by_later_copies <= first_copy_skips`, and the difference is
/// part of `counters.lost["recursion"]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelRecursion {
    /// Runs of the first copy the kernel skipped.
    pub first_copy_skips: u64,
    /// Events the later copies recorded (each a skip of the first copy).
    pub recorded_by_later_copies: u64,
}

/// One entry of `scans` in `meta.json`: a reachability scan of one
/// stopped process, what it cost, and why it failed if it did. The rows
/// of the `scan` table with the same `pid` and `ts_ns` are its blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanInfo {
    /// Process scanned.
    pub pid: u32,
    /// CLOCK_MONOTONIC ns when the scan stopped the process.
    pub ts_ns: u64,
    /// How long the process was stopped for the scan, in ns.
    #[serde(default)]
    pub pause_ns: u64,
    /// Threads stopped (and whose registers and stacks were roots).
    #[serde(default)]
    pub threads: u32,
    /// Bytes of roots read (writable segments, stacks, registers, TLS).
    #[serde(default)]
    pub roots_bytes: u64,
    /// Bytes of outstanding blocks read.
    #[serde(default)]
    pub heap_bytes: u64,
    /// Outstanding blocks scanned: the `scan` rows of this scan.
    #[serde(default)]
    pub blocks: u64,
    /// Why the scan failed, for a scan that did (the recording is kept,
    /// and a failed scan has no rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `sampling` in `meta.json` (1.6): how the allocations of a sampled
/// recording were picked. Sample points fall on the bytes each thread
/// allocates at exponentially distributed distances of mean
/// `mean_bytes`; an allocation is recorded when one falls in it, with
/// probability `1 - exp(-size / mean_bytes)`. Mappings (`mmap`,
/// `mremap`, `munmap`) are never sampled: all of them are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sampling {
    /// The mean distance between sample points, in bytes.
    pub mean_bytes: u64,
}

impl Sampling {
    /// How many allocations one recorded heap allocation of `size` bytes
    /// stands for: the inverse of the probability it was recorded,
    /// `1 / (1 - exp(-size / mean_bytes))` (an unbiased estimate: counts
    /// scale by it, bytes by `size` times it). 1 for a size of 0, which
    /// is never sampled, and for a mean of 0.
    pub fn weight(&self, size: u64) -> f64 {
        if size == 0 || self.mean_bytes == 0 {
            return 1.0;
        }
        let p = -(-(size as f64) / self.mean_bytes as f64).exp_m1();
        1.0 / p
    }

    /// What one recorded heap block of `size` bytes adds to a report, as
    /// integers: `(bytes, blocks)`, its size times its weight (rounded)
    /// and its weight rounded up or down at random, the chance of up
    /// being the fraction (so the sum of many is unbiased). The block's
    /// address and time draw that chance: a block adds the same wherever
    /// it is counted (allocated, outstanding, freed).
    pub fn scaled(&self, size: u64, addr: u64, ts: u64) -> (u64, u64) {
        let key = addr ^ ts.rotate_left(32);
        let w = self.weight(size);
        let bytes = (size as f64 * w).round() as u64;
        let whole = w.floor();
        let mut h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 29;
        h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h ^= h >> 32;
        let u = (h >> 11) as f64 / (1u64 << 53) as f64;
        let count = whole as u64 + u64::from(u < w - whole);
        (bytes, count)
    }
}

/// `unwind` in `meta.json`: the walks of user stacks by how they ended,
/// one per allocation event with a user stack.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnwindInfo {
    /// `--unwind`: `fp`, `auto` or `dwarf`.
    pub mode: String,
    /// Walks that reached the outermost frame (an `End` unwind row).
    #[serde(default)]
    pub complete: u64,
    /// Walks that ended where the frame-pointer chain ended: complete or
    /// not cannot be told from the walk (the recorder judges each stack by
    /// its outermost function).
    #[serde(default)]
    pub frame_pointer: u64,
    /// Walks cut short, by reason: `max_depth`, `no_mapping`, `no_table`,
    /// `maps_full`, `anonymous`, `no_unwind_info`, `rows_full`,
    /// `invalid_row`, `read_failed`, `null_return_address`,
    /// `not_progressing` (docs/format.md). Reasons with no walk are left
    /// out.
    #[serde(default)]
    pub truncated: BTreeMap<String, u64>,
    /// Objects whose unwind rows were loaded for the probe, and their rows.
    #[serde(default)]
    pub objects: u64,
    /// Rows loaded.
    #[serde(default)]
    pub rows: u64,
}

impl Default for Meta {
    fn default() -> Self {
        Meta {
            format: FORMAT_NAME.to_string(),
            format_version: format!("{FORMAT_MAJOR}.{FORMAT_MINOR}"),
            tool_version: String::new(),
            host: String::new(),
            kernel: String::new(),
            clock: ClockPair::default(),
            command: Vec::new(),
            pids: Vec::new(),
            options: serde_json::Value::Null,
            start_ns: 0,
            end_ns: 0,
            complete: false,
            counters: Counters::default(),
            segments: None,
            checkpoint_ns: 0,
            exit_code: None,
            exit_signal: None,
            exit_core_dumped: false,
            failed_allocations: None,
            cut_stacks: None,
            parents: BTreeMap::new(),
            notes: Vec::new(),
            capture: None,
            recorder_cpu_ns: None,
            kernel_recursion: None,
            unwind: None,
            scans: Vec::new(),
            sampling: None,
            extra: BTreeMap::new(),
        }
    }
}

impl Meta {
    /// A fresh meta for this host, with clocks read now.
    pub fn for_this_host(tool_version: &str) -> Self {
        let clock = ClockPair::now();
        Meta {
            tool_version: tool_version.to_string(),
            host: uname_field(|u| &u.nodename),
            kernel: uname_field(|u| &u.release),
            clock,
            start_ns: clock.monotonic_ns,
            ..Meta::default()
        }
    }

    /// Parses `MAJOR.MINOR` from `format_version`.
    pub fn version(&self) -> Option<(u32, u32)> {
        let (a, b) = self.format_version.split_once('.')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    }

    /// Reads and validates `dir/meta.json`.
    pub fn load(dir: &Path) -> Result<Meta> {
        let path = dir.join("meta.json");
        // Bytes, not a String: a garbage file is corrupt, not an I/O error.
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotATrace {
                    path: dir.to_path_buf(),
                    reason: "no meta.json".into(),
                })
            }
            Err(e) => return Err(Error::io(&path, e)),
        };
        let mut value: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| Error::Corrupt {
                path: path.clone(),
                reason: format!("invalid JSON: {e}"),
            })?;
        // The checksum of everything else; a file without one (1.0, or
        // edited by hand with the field removed) is taken as it is.
        let sealed = value.as_object_mut().and_then(|o| o.remove(CHECKSUM_FIELD));
        if let Some(sealed) = sealed {
            let found = checksum(&value);
            if sealed.as_u64() != Some(found as u64) {
                return Err(Error::Corrupt {
                    path,
                    reason: format!(
                        "checksum mismatch (CRC-32 {found:08x}, {CHECKSUM_FIELD} says {sealed}): the file was altered"
                    ),
                });
            }
        }
        if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT_NAME) {
            return Err(Error::NotATrace {
                path: dir.to_path_buf(),
                reason: format!("meta.json has no \"format\": \"{FORMAT_NAME}\""),
            });
        }
        let meta: Meta = serde_json::from_value(value).map_err(|e| Error::Corrupt {
            path: path.clone(),
            reason: format!("meta.json: {e}"),
        })?;
        match meta.version() {
            None => Err(Error::Corrupt {
                path,
                reason: format!("bad format_version {:?}", meta.format_version),
            }),
            Some((major, _)) if major > FORMAT_MAJOR => Err(Error::NewerVersion {
                path: dir.to_path_buf(),
                found: meta.format_version.clone(),
                supported: format!("{FORMAT_MAJOR}.x"),
            }),
            Some(_) => Ok(meta),
        }
    }

    /// Writes `dir/meta.json` atomically (temp file, fsync, rename), so a
    /// crash leaves either the old or the new version, never half of one.
    pub fn store(&self, dir: &Path) -> Result<()> {
        let path = dir.join("meta.json");
        let tmp = dir.join(".meta.json.tmp");
        let mut value = serde_json::to_value(self).expect("meta serializes");
        let sum = checksum(&value);
        if let Some(o) = value.as_object_mut() {
            o.insert(CHECKSUM_FIELD.into(), sum.into());
        }
        let mut text = serde_json::to_string_pretty(&value).expect("meta serializes");
        text.push('\n');
        fsio::replace_atomically(&path, &tmp, text.as_bytes()).map_err(|e| Error::io(&path, e))
    }
}

/// The field of `meta.json` that holds the CRC-32 of the rest of it.
pub const CHECKSUM_FIELD: &str = "meta_crc32";

/// CRC-32 of a JSON value written compactly with every object's keys in
/// sorted order, so that neither whitespace nor key order (which differ
/// between JSON writers) matter, and every value does.
fn checksum(v: &serde_json::Value) -> u32 {
    fn canonical(v: &serde_json::Value, out: &mut Vec<u8>) {
        match v {
            serde_json::Value::Object(o) => {
                let mut keys: Vec<&String> = o.keys().collect();
                keys.sort();
                out.push(b'{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    serde_json::to_writer(&mut *out, k).expect("a string serializes");
                    out.push(b':');
                    canonical(&o[k], out);
                }
                out.push(b'}');
            }
            serde_json::Value::Array(a) => {
                out.push(b'[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    canonical(x, out);
                }
                out.push(b']');
            }
            other => serde_json::to_writer(&mut *out, other).expect("a value serializes"),
        }
    }
    let mut out = Vec::new();
    canonical(v, &mut out);
    crc32fast::hash(&out)
}

fn uname_field(pick: impl Fn(&libc::utsname) -> &[libc::c_char; 65]) -> String {
    // SAFETY: utsname is plain old data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    let field = pick(&u);
    let bytes: Vec<u8> = field
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::Sampling;

    const R: u64 = 512 << 10;

    #[test]
    fn weight_is_the_inverse_of_the_chance_to_be_sampled() {
        let s = Sampling { mean_bytes: R };
        let e = std::f64::consts::E;
        assert!((s.weight(R) - e / (e - 1.0)).abs() < 1e-12);
        // Small blocks stand for about R/size blocks, large ones for one.
        assert!((s.weight(64) - (R as f64 / 64.0 + 0.5)).abs() < 1e-3);
        assert!((s.weight(64 * R) - 1.0).abs() < 1e-12);
        assert_eq!(s.weight(0), 1.0);
        assert_eq!(Sampling { mean_bytes: 0 }.weight(100), 1.0);
    }

    /// The blocks a block stands for are its weight rounded up or down,
    /// the same every time for the same block, and unbiased in sum.
    #[test]
    fn scaled_counts_round_at_random_without_bias() {
        let s = Sampling { mean_bytes: R };
        let size = 100_000;
        let w = s.weight(size);
        let (bytes, n) = s.scaled(size, 0x7f00_1234_5670, 42);
        assert_eq!(bytes, (size as f64 * w).round() as u64);
        assert!(n == w.floor() as u64 || n == w.ceil() as u64);
        assert_eq!(s.scaled(size, 0x7f00_1234_5670, 42), (bytes, n));
        let blocks = 200_000u64;
        let sum: u64 = (0..blocks)
            .map(|i| s.scaled(size, 0x5555_0000_0000 + i * 48, i * 7919).1)
            .sum();
        let mean = sum as f64 / blocks as f64;
        // Each adds w's fraction or not: sd of the mean 0.5/sqrt(200000).
        assert!((mean - w).abs() < 0.01, "{mean} against {w}");
    }

    #[test]
    fn sampling_is_in_meta_json_only_when_sampled() {
        let mut m = super::Meta::default();
        let text = serde_json::to_string(&m).unwrap();
        assert!(!text.contains("sampling"));
        m.sampling = Some(Sampling { mean_bytes: R });
        let text = serde_json::to_string(&m).unwrap();
        assert!(
            text.contains("\"sampling\":{\"mean_bytes\":524288}"),
            "{text}"
        );
        let back: super::Meta = serde_json::from_str(&text).unwrap();
        assert_eq!(back.sampling, m.sampling);
    }
}
