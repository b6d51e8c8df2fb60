//! Allocation behaviour on synthetic traces with exact answers: temporary
//! allocations (the per-thread rule of `replay/temporary.rs`), size
//! histograms and rates. Each case runs with 1 to 4 partitions, and with
//! row groups of 3 rows (every match crosses row groups) and of 1000
//! (every match within one), and must give the same report.

mod common;

use common::{TraceBuilder, T0};
use memleak_analyze::behaviour::SizeCount;
use memleak_analyze::{analyze, AnalyzeOptions, Filter, Report, SortKey};
use memleak_trace::{Event, EventKind};

const US: u64 = 1_000;

/// An event of thread `tid` of pid 100 at `us` microseconds.
fn at(tb: &mut TraceBuilder, us: u64, tid: u32, kind: EventKind, addr: u64, size: u64, stack: u64) {
    tb.events.push(Event {
        ts_ns: T0 + us * US,
        pid: 100,
        tid,
        kind,
        addr,
        size,
        old_addr: None,
        old_size: None,
        stack_id: (stack != 0).then_some(stack),
    });
}

fn run_with(tb: &mut TraceBuilder, opts: AnalyzeOptions) -> Report {
    let mut first: Option<Report> = None;
    for rows in [3, 1000] {
        tb.row_group_rows = rows;
        tb.segment_rows = rows * 2;
        let dir = tempfile::tempdir().unwrap();
        let path = tb.write(dir.path());
        for partitions in 1..=4 {
            let o = AnalyzeOptions {
                partitions,
                ..opts.clone()
            };
            let mut r = analyze(&path, &o).unwrap();
            r.summary.trace.clear();
            match &first {
                None => first = Some(r),
                Some(f) => assert!(
                    f == &r,
                    "report differs with {partitions} partitions, row groups of {rows}: {:?}",
                    temporaries(&r)
                ),
            }
        }
    }
    first.unwrap()
}

/// `(stack, temporary, allocations)` of every stack that allocated.
fn temporaries(r: &Report) -> Vec<(u64, u64, u64)> {
    let mut v: Vec<_> = r
        .stacks
        .iter()
        .map(|s| (s.stack_id, s.temporary, s.allocations))
        .collect();
    v.sort();
    v
}

/// The cases of the rule, one stack each (see the comments).
fn cases() -> TraceBuilder {
    use EventKind::{Free, Malloc, Realloc};
    let mut tb = TraceBuilder::new();
    let tb_ = &mut tb;
    // 1: malloc then free at once: temporary.
    at(tb_, 0, 100, Malloc, 0xa000, 24, 1);
    at(tb_, 10, 100, Free, 0xa000, 0, 0);
    // 2 then 3: the outer block is freed after the inner one was
    // allocated (not temporary); the inner one after a free only
    // (temporary).
    at(tb_, 20, 100, Malloc, 0xb000, 48, 2);
    at(tb_, 30, 100, Malloc, 0xc000, 100, 3);
    at(tb_, 40, 100, Free, 0xb000, 0, 0);
    at(tb_, 50, 100, Free, 0xc000, 0, 0);
    // 4: freed 2 ms later, nothing in between: over the threshold.
    at(tb_, 100, 100, Malloc, 0xd000, 200, 4);
    at(tb_, 2100, 100, Free, 0xd000, 0, 0);
    // 5 then 6: realloc frees the malloc'd block (temporary) and its own
    // block is freed next (temporary).
    at(tb_, 3000, 100, Malloc, 0xe000, 16, 5);
    at(tb_, 3010, 100, Realloc, 0xf000, 32, 6);
    tb_.events.last_mut().unwrap().old_addr = Some(0xe000);
    at(tb_, 3020, 100, Free, 0xf000, 0, 0);
    // 7: freed by another thread: not temporary.
    at(tb_, 4000, 100, Malloc, 0x10000, 64, 7);
    at(tb_, 4010, 101, Free, 0x10000, 0, 0);
    // 8: two threads interleave pairs: both temporary (per thread).
    at(tb_, 5000, 100, Malloc, 0x11000, 64, 8);
    at(tb_, 5001, 101, Malloc, 0x12000, 64, 8);
    at(tb_, 5002, 100, Free, 0x11000, 0, 0);
    at(tb_, 5003, 101, Free, 0x12000, 0, 0);
    // 9 then 10: thread 101 frees 100's block, 102 gets the address,
    // 100 frees it: neither is temporary.
    at(tb_, 6000, 100, Malloc, 0x13000, 300, 9);
    at(tb_, 6001, 101, Free, 0x13000, 0, 0);
    at(tb_, 6002, 102, Malloc, 0x13000, 300, 10);
    at(tb_, 6003, 100, Free, 0x13000, 0, 0);
    // 11: leaked, never freed.
    at(tb_, 7000, 100, Malloc, 0x14000, 4000, 11);
    tb
}

#[test]
fn temporary_allocations_follow_the_per_thread_rule() {
    let r = run_with(&mut cases(), AnalyzeOptions::default());
    assert_eq!(
        temporaries(&r),
        vec![
            (1, 1, 1),
            (2, 0, 1),
            (3, 1, 1),
            (4, 0, 1),
            (5, 1, 1),
            (6, 1, 1),
            (7, 0, 1),
            (8, 2, 2),
            (9, 0, 1),
            (10, 0, 1),
            (11, 0, 1),
        ]
    );
    assert_eq!(r.summary.temporary_allocations, 6);
    assert_eq!(r.summary.temporary_threshold_ns, 1_000_000);
}

#[test]
fn the_threshold_and_the_filters_apply() {
    // 5 ms: the block freed after 2 ms is temporary too.
    let r = run_with(
        &mut cases(),
        AnalyzeOptions {
            temporary_threshold_ns: Some(5_000_000),
            ..AnalyzeOptions::default()
        },
    );
    assert_eq!(r.summary.temporary_allocations, 7);
    assert_eq!(temporaries(&r)[3], (4, 1, 1));
    // Only allocations of 64 bytes or more count, temporary ones too.
    let r = run_with(
        &mut cases(),
        AnalyzeOptions {
            filter: Filter {
                min_size: Some(64),
                ..Filter::default()
            },
            ..AnalyzeOptions::default()
        },
    );
    assert_eq!(r.summary.temporary_allocations, 3); // stacks 3 and 8
    let total: u64 = r.summary.allocation_sizes.total_count();
    assert_eq!(total, 8); // 100, 200, 64 x3, 300 x2, 4000
}

#[test]
fn sizes_and_rates_by_stack_and_overall() {
    let r = run_with(&mut cases(), AnalyzeOptions::default());
    let s8 = r.stacks.iter().find(|s| s.stack_id == 8).unwrap();
    assert_eq!(s8.allocation_sizes, vec![SizeCount::new(7, 2)]); // 64..127
    assert_eq!(
        memleak_analyze::behaviour::per_second(s8.allocations, r.summary.rate_interval_ns),
        0.2
    );
    assert_eq!(r.summary.rate_interval_ns, 10_000_000_000);
    let overall: Vec<(u64, u64, u64)> = r
        .summary
        .allocation_sizes
        .buckets()
        .iter()
        .map(|b| (b.low, b.count, b.bytes))
        .collect();
    assert_eq!(
        overall,
        vec![
            (16, 2, 40),     // 24, 16
            (32, 2, 80),     // 48, 32
            (64, 4, 292),    // 100, 64 x3
            (128, 1, 200),   // 200
            (256, 2, 600),   // 300 x2
            (2048, 1, 4000), // 4000
        ]
    );
    // Outstanding: the leak alone.
    let out: Vec<(u64, u64)> = r
        .summary
        .outstanding_sizes
        .buckets()
        .iter()
        .map(|b| (b.low, b.count))
        .collect();
    assert_eq!(out, vec![(2048, 1)]);
    // JSON carries the same.
    let j: serde_json::Value = serde_json::from_str(&memleak_analyze::json::render(&r)).unwrap();
    assert_eq!(j["summary"]["temporary_allocations"], 6);
    assert_eq!(j["stacks"][0]["stack_id"], 11);
    assert_eq!(j["stacks"][0]["allocation_sizes"][0]["low"], 2048);
    assert_eq!(j["stacks"][0]["allocations_per_s"], 0.1);
}

#[test]
fn sort_by_temporary_shows_stacks_with_nothing_outstanding() {
    let r = run_with(
        &mut cases(),
        AnalyzeOptions {
            sort: SortKey::Temporary,
            ..AnalyzeOptions::default()
        },
    );
    let shown: Vec<(u64, u64)> = r
        .top_stacks()
        .iter()
        .map(|s| (s.stack_id, s.temporary))
        .collect();
    assert_eq!(shown, vec![(8, 2), (3, 1), (6, 1), (1, 1), (5, 1), (11, 0)]);
    let text = memleak_analyze::text::render(&r);
    assert!(text.contains("temporary: 2 (100.0%)"), "{text}");
}

/// Two processes (a parent and its forked child, say) each allocate at
/// the same address and free their own block at once: both are
/// temporary. A block of one process is not another's, whatever its
/// address: the child's allocation there does not take the parent's
/// block, and its free does not end it.
#[test]
fn temporary_allocations_are_per_process() {
    let mut tb = TraceBuilder::default();
    let mut ev = |us: u64, pid: u32, kind: EventKind, size: u64, stack: u64| {
        tb.events.push(Event {
            ts_ns: T0 + us * US,
            pid,
            tid: pid,
            kind,
            addr: 0x20000,
            size,
            old_addr: None,
            old_size: None,
            stack_id: (stack != 0).then_some(stack),
        });
    };
    use EventKind::{Free, Malloc};
    ev(0, 100, Malloc, 100, 1);
    ev(1, 200, Malloc, 200, 2);
    ev(2, 200, Free, 0, 0);
    ev(3, 100, Free, 0, 0);
    // The other order of frees, at another time.
    ev(5000, 100, Malloc, 100, 3);
    ev(5001, 200, Malloc, 200, 4);
    ev(5002, 100, Free, 0, 0);
    ev(5003, 200, Free, 0, 0);
    let r = run_with(&mut tb, AnalyzeOptions::default());
    assert_eq!(
        temporaries(&r),
        vec![(1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 1)]
    );
}
