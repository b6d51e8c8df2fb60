//! The analysis of many traces at once (`memleak_analyze::fleet`): the
//! merged report against the single-trace analyses it merges, stacks of
//! two builds matched by their frames, and a small fleet whose leaky
//! hosts must stand out.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::TraceBuilder;
use memleak_analyze::diff::{stack_key, MatchOptions};
use memleak_analyze::fleet::{analyze_traces, FleetOptions, GroupBy, TraceSource};
use memleak_analyze::{analyze, AnalyzeOptions, Report};
use memleak_trace::{find_traces, Trace};

/// The program every host runs: four functions called from `main`, at
/// `shift` bytes from where the first build has them.
const FUNCS: [(&str, u32); 4] = [
    ("parse_request", 31),
    ("cache_insert", 77),
    ("log_line", 12),
    ("fleet_leak", 42),
];
const MAIN: u64 = 0x401000;

fn program(tb: &mut TraceBuilder, shift: u64, build_id: &str) {
    tb.frame(100, MAIN + shift, "main", 0x10, "/src/app/main.c", 9);
    for (i, (f, line)) in FUNCS.iter().enumerate() {
        let addr = 0x402000 + 0x100 * i as u64 + shift;
        tb.frame(
            100,
            addr,
            f,
            0x20,
            &format!("/build/{build_id}/app/{f}.c"),
            *line,
        );
        tb.stack(i as u64 + 1, &[addr, MAIN + shift]);
    }
    for f in &mut tb.frames {
        f.build_id = Some(build_id.into());
    }
}

/// xorshift, for events that differ per host.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A host's trace: allocations of the first three stacks, most freed;
/// with `leak`, also blocks of `fleet_leak`, never freed.
fn host_trace(seed: u64, shift: u64, leak: bool) -> TraceBuilder {
    let mut tb = TraceBuilder::new();
    program(&mut tb, shift, if shift == 0 { "b1" } else { "b2" });
    tb.row_group_rows = 64;
    tb.segment_rows = 256;
    let mut rng = Rng(seed * 7919 + 1);
    let mut live: Vec<u64> = Vec::new();
    let mut next = 0x5000_0000u64;
    for ms in 0..600 {
        if leak && ms % 5 == 0 {
            tb.malloc(ms, next, 4096 + rng.below(4096), 4);
            next += 0x2000;
        }
        if live.is_empty() || rng.below(100) < 55 {
            tb.malloc(ms, next, 16 + rng.below(512), 1 + rng.below(3));
            live.push(next);
            next += 0x1000;
        } else {
            let i = rng.below(live.len() as u64) as usize;
            tb.free(ms, live.swap_remove(i));
        }
    }
    tb
}

/// Outstanding (bytes, count) by stack key.
fn by_key(report: &Report) -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for s in report.stacks.iter().filter(|s| s.count > 0) {
        let e = out
            .entry(stack_key(s, MatchOptions::default()))
            .or_default();
        e.0 += s.bytes;
        e.1 += s.count;
    }
    out
}

fn fleet(sources: &[TraceSource], by: GroupBy, concurrent: usize) -> Report {
    let opts = FleetOptions {
        analyze: AnalyzeOptions::default(),
        group_by: by,
        label: "fleet".into(),
        concurrent,
        ..Default::default()
    };
    analyze_traces(sources, &opts, |s| Trace::open(&s.path), None).unwrap()
}

fn source(path: PathBuf) -> TraceSource {
    TraceSource {
        path,
        host: None,
        trace: None,
    }
}

/// Writes `tb` as `dir/NAME`.
fn write(tb: &TraceBuilder, dir: &Path, name: &str) -> PathBuf {
    let parent = dir.join(name);
    std::fs::create_dir_all(&parent).unwrap();
    let written = tb.write(&parent);
    let path = dir.join(format!("{name}.trace"));
    std::fs::rename(&written, &path).unwrap();
    std::fs::remove_dir(&parent).unwrap();
    path
}

#[test]
fn merged_stacks_are_the_sum_of_each_traces_analysis() {
    let dir = tempfile::tempdir().unwrap();
    let traces: Vec<PathBuf> = (0..5)
        .map(|i| {
            let mut tb = host_trace(i, (i % 2) * 0x10000, i == 3);
            tb.meta.host = format!("host{}", i % 3);
            write(&tb, dir.path(), &format!("t{i}"))
        })
        .collect();
    let mut want: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut per_trace = Vec::new();
    let (mut events, mut allocations) = (0, 0);
    for t in &traces {
        let r = analyze(t, &AnalyzeOptions::default()).unwrap();
        for (k, (b, c)) in by_key(&r) {
            let e = want.entry(k).or_default();
            e.0 += b;
            e.1 += c;
        }
        per_trace.push((
            r.summary.outstanding_bytes,
            r.summary.outstanding_allocations,
            r.summary.events,
        ));
        events += r.summary.events;
        allocations += r.summary.allocations;
    }
    let sources: Vec<TraceSource> = traces.iter().cloned().map(source).collect();
    let merged = fleet(&sources, GroupBy::Trace, 0);
    let got: BTreeMap<String, (u64, u64)> = merged
        .stacks
        .iter()
        .filter(|s| s.count > 0)
        .map(|s| (s.origin.as_ref().unwrap().key.clone(), (s.bytes, s.count)))
        .collect();
    assert_eq!(got, want);
    // Keys are as the diff makes them: the report's own frames give them.
    for s in &merged.stacks {
        assert_eq!(
            stack_key(s, MatchOptions::default()),
            s.origin.as_ref().unwrap().key
        );
    }
    let sum = merged.summary.clone();
    assert_eq!(sum.events, events);
    assert_eq!(sum.allocations, allocations);
    assert_eq!(
        (sum.outstanding_bytes, sum.outstanding_allocations),
        want.values().fold((0, 0), |(b, c), (x, y)| (b + x, c + y))
    );
    assert_eq!(sum.outstanding_stacks, want.len() as u64);

    // The breakdown: one row per trace, as the trace's own analysis says.
    let f = merged.fleet.as_ref().unwrap();
    assert_eq!(f.traces.len(), 5);
    for (t, (bytes, count, events)) in f.traces.iter().zip(&per_trace) {
        assert_eq!((t.bytes, t.count, t.events), (*bytes, *count, *events));
    }
    assert_eq!(f.traces[0].trace, "t0.trace");
    assert_eq!(f.traces[4].host, "host1");
    // Grouped by host: the traces of each host summed.
    let hosts = fleet(&sources, GroupBy::Host, 0);
    let groups = &hosts.fleet.as_ref().unwrap().groups;
    assert_eq!(groups.len(), 3);
    for g in groups {
        let of_host: Vec<_> = (0..5)
            .filter(|i| format!("host{}", i % 3) == g.group)
            .collect();
        assert_eq!(g.traces, of_host.len() as u64);
        assert_eq!(
            g.bytes,
            of_host.iter().map(|&i| per_trace[i].0).sum::<u64>()
        );
        assert_eq!(
            g.count,
            of_host.iter().map(|&i| per_trace[i].1).sum::<u64>()
        );
    }
    // Sorted most bytes first.
    assert!(groups.windows(2).all(|w| w[0].bytes >= w[1].bytes));
}

#[test]
fn two_builds_of_one_program_merge_by_frames() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(&host_trace(1, 0, true), dir.path(), "a");
    // The same run of a build whose code is 64 KiB further on, with
    // another build id and build directory.
    let b = write(&host_trace(1, 0x10000, true), dir.path(), "b");
    let single = analyze(&a, &AnalyzeOptions::default()).unwrap();
    let shifted = analyze(&b, &AnalyzeOptions::default()).unwrap();
    assert_ne!(
        single.stacks[0].frames[0].addr,
        shifted.stacks[0].frames[0].addr
    );
    let merged = fleet(&[source(a), source(b)], GroupBy::Trace, 0);
    let leaking: Vec<_> = merged.stacks.iter().filter(|s| s.count > 0).collect();
    assert_eq!(leaking.len(), by_key(&single).len());
    for s in leaking {
        let o = s.origin.as_ref().unwrap();
        let (b, c) = by_key(&single)[&o.key];
        assert_eq!((s.bytes, s.count), (2 * b, 2 * c), "{}", o.key);
        assert_eq!(o.traces, 2);
        // Frames from the first trace (equal bytes: the first wins).
        assert_eq!(o.trace, "a.trace");
    }
}

#[test]
fn a_fleet_shows_its_leaky_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let leaky = ["h03", "h11", "h17"];
    for i in 0..20u64 {
        let host = format!("h{i:02}");
        let mut tb = host_trace(100 + i, (i % 2) * 0x10000, leaky.contains(&host.as_str()));
        tb.meta.command = vec!["memleak".into(), "record".into(), "--".into(), "app".into()];
        let partition = dir.path().join(format!("host={host}/trace=1"));
        std::fs::create_dir_all(&partition).unwrap();
        tb.write(&partition);
    }
    let sources: Vec<TraceSource> = find_traces(dir.path())
        .unwrap()
        .into_iter()
        .map(TraceSource::from)
        .collect();
    assert_eq!(sources.len(), 20);
    let report = fleet(&sources, GroupBy::Host, 0);
    let f = report.fleet.as_ref().unwrap();
    let mut top: Vec<&str> = f.groups[..3].iter().map(|g| g.group.as_str()).collect();
    top.sort();
    assert_eq!(top, leaky);
    // The leak's stack leads, and is held by those hosts alone.
    let first = &report.stacks[0];
    assert_eq!(first.frames[0].function.as_deref(), Some("fleet_leak"));
    let o = first.origin.as_ref().unwrap();
    let mut holders: Vec<&str> = o.groups.iter().map(|g| g.group.as_str()).collect();
    holders.sort();
    assert_eq!(holders, leaky);
    assert_eq!(o.traces, 3);
    // Trace ids and hosts from the partitions.
    assert!(f
        .traces
        .iter()
        .all(|t| t.trace == "1" && t.host.starts_with('h')));

    // The same whatever the order the traces finish in.
    assert_eq!(fleet(&sources, GroupBy::Host, 1), report);
    assert_eq!(fleet(&sources, GroupBy::Host, 3), report);

    // By trace: a row each, though every host calls its trace 1.
    let by_trace = fleet(&sources, GroupBy::Trace, 0);
    let groups = &by_trace.fleet.as_ref().unwrap().groups;
    assert_eq!(groups.len(), 20);
    assert!(groups.iter().any(|g| g.group == "h17/1" && g.traces == 1));

    // By command: every host runs one.
    let by_command = fleet(&sources, GroupBy::Command, 0);
    let groups = &by_command.fleet.as_ref().unwrap().groups;
    assert_eq!(groups.len(), 1);
    assert_eq!((groups[0].group.as_str(), groups[0].traces), ("app", 20));

    // JSON: the breakdown, and where each stack comes from.
    let json: serde_json::Value =
        serde_json::from_str(&memleak_analyze::json::render(&report)).unwrap();
    assert_eq!(json["group_by"], "host");
    assert_eq!(json["traces"].as_array().unwrap().len(), 20);
    assert_eq!(json["traces"][0]["trace"], "1");
    assert_eq!(json["stacks"][0]["traces"], 3);
    assert!(json["stacks"][0]["host"].is_string());
    assert_eq!(json["stacks"][0]["groups"].as_array().unwrap().len(), 3);
    // Text: the breakdown after the summary.
    let text = memleak_analyze::text::render(&report);
    assert!(text.contains("Outstanding by host (20 hosts, 20 traces)"));
    assert!(text.contains("by host (3 of 20): "));
}

#[test]
fn a_single_traces_report_has_no_fleet_fields() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(&host_trace(5, 0, true), dir.path(), "one");
    let r = analyze(&t, &AnalyzeOptions::default()).unwrap();
    assert!(r.fleet.is_none() && r.stacks.iter().all(|s| s.origin.is_none()));
    let json: serde_json::Value = serde_json::from_str(&memleak_analyze::json::render(&r)).unwrap();
    for field in ["traces", "groups", "group_by"] {
        assert!(json.get(field).is_none(), "{field}");
    }
    for field in ["key", "host", "trace", "traces", "groups"] {
        assert!(json["stacks"][0].get(field).is_none(), "{field}");
    }
}
