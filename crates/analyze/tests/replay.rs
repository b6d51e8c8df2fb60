//! Replay on synthetic traces with exact expected answers. Every case runs
//! with 1, 2, 3, 4 and 5 partitions and must give the same report (peaks
//! per process included), which checks the interleaving of partitions.

mod common;

use common::{TraceBuilder, MS, S, T0};
use memleak_analyze::{analyze, AnalyzeOptions, Filter, KindScope, Report, SortKey};
use memleak_trace::{EventKind, Meta};

fn run_with(tb: &TraceBuilder, opts: AnalyzeOptions) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let path = tb.write(dir.path());
    let mut first: Option<Report> = None;
    for parts in [1, 2, 3, 4, 5] {
        let r = analyze(
            &path,
            &AnalyzeOptions {
                partitions: parts,
                ..opts.clone()
            },
        )
        .unwrap();
        check_growth(&r);
        match &first {
            None => first = Some(r),
            Some(f) => assert_eq!(f, &r, "report differs with {parts} partitions"),
        }
    }
    first.unwrap()
}

/// The growth samples end with the state the report shows: each stack's
/// last sample is its outstanding bytes, and the timeline's last total is
/// the report's.
fn check_growth(r: &Report) {
    let timeline = r.timeline.as_ref().expect("a timeline");
    assert_eq!(
        timeline.total_bytes.last().copied(),
        Some(r.summary.outstanding_bytes),
        "timeline ends at the outstanding total"
    );
    for s in &r.stacks {
        let g = s.growth.as_ref().expect("every stack has a verdict");
        assert_eq!(g.samples.len(), timeline.total_bytes.len());
        assert_eq!(
            g.samples.last().copied(),
            Some(s.bytes),
            "stack {}: last sample",
            s.stack_id
        );
    }
    for (w, &t) in timeline.total_bytes.iter().enumerate() {
        let sum: u64 = r
            .stacks
            .iter()
            .map(|s| s.growth.as_ref().unwrap().samples[w])
            .sum();
        assert_eq!(
            sum, t,
            "window {w}: the stacks' samples add up to the total"
        );
    }
}

fn run(tb: &TraceBuilder) -> Report {
    run_with(tb, AnalyzeOptions::default())
}

/// `(stack, bytes, count)` of every stack with outstanding allocations,
/// by stack id.
fn outstanding(r: &Report) -> Vec<(u64, u64, u64)> {
    let mut v: Vec<_> = r
        .stacks
        .iter()
        .filter(|s| s.count > 0)
        .map(|s| (s.stack_id, s.bytes, s.count))
        .collect();
    v.sort();
    v
}

/// `(pid, peak bytes, peak ns)` of every process, as the report orders
/// them.
fn peaks(r: &Report) -> Vec<(u32, u64, u64)> {
    r.summary
        .process_peaks
        .iter()
        .map(|p| (p.pid, p.peak_bytes, p.peak_ns))
        .collect()
}

#[test]
fn interleaved_allocs_and_frees_across_partitions() {
    let mut tb = TraceBuilder::new();
    // 40 blocks on 4 stacks; every third freed, in an order that mixes
    // addresses (and so partitions).
    for i in 0..40u64 {
        tb.malloc(i, 0x1000 + i * 0x40, 10 + i, 1 + i % 4);
    }
    for i in (0..40u64).rev().filter(|i| i % 3 == 0) {
        tb.free(100 + i, 0x1000 + i * 0x40);
    }
    let r = run(&tb);
    let mut want = std::collections::BTreeMap::new();
    for i in (0..40u64).filter(|i| i % 3 != 0) {
        let e = want.entry(1 + i % 4).or_insert((0, 0));
        e.0 += 10 + i;
        e.1 += 1;
    }
    let want: Vec<_> = want.into_iter().map(|(s, (b, c))| (s, b, c)).collect();
    assert_eq!(outstanding(&r), want);
    let s = &r.summary;
    assert_eq!(s.events, 40 + 14);
    assert_eq!(s.allocations, 40);
    assert_eq!(s.frees, 14);
    assert_eq!(s.anomalies.total(), 0);
    assert_eq!(s.outstanding_allocations, 26);
    assert_eq!(s.outstanding_bytes, want.iter().map(|w| w.1).sum::<u64>());
    // Peak: all 40 blocks were live after the last malloc at 39 ms.
    assert_eq!(s.peak_bytes, (0..40u64).map(|i| 10 + i).sum::<u64>());
    assert_eq!(s.peak_ns, 39 * MS);
    assert_eq!(s.events_by_kind["malloc"], 40);
    assert_eq!(s.events_by_kind["free"], 14);
}

#[test]
fn realloc_chains() {
    let mut tb = TraceBuilder::new();
    tb.malloc(1, 0xa000, 10, 1)
        .realloc(2, 0xa000, 0xb000, 20, 2) // moves: free a, alloc b on stack 2
        .realloc(3, 0xb000, 0xb000, 30, 3) // grows in place
        .realloc(4, 0, 0xc000, 5, 4) // realloc(NULL, 5) is malloc
        .realloc(5, 0xc000, 0, 0, 5) // realloc(c, 0) frees c
        .malloc(6, 0xd000, 7, 6)
        .realloc(7, 0xd000, 0, 100, 7) // failed: d stays
        .realloc(8, 0xe000, 0xe100, 8, 8); // realloc of a block from before attach
    let r = run(&tb);
    assert_eq!(outstanding(&r), vec![(3, 30, 1), (6, 7, 1), (8, 8, 1)]);
    let s = &r.summary;
    assert_eq!(s.allocations, 6);
    assert_eq!(s.frees, 3); // a, b (in place), c
    assert_eq!(s.freed_bytes, 10 + 20 + 5);
    assert_eq!(s.anomalies.unknown_frees, 1);
    assert_eq!(s.anomalies.total(), 1);
    // The move at 2 ms frees and allocates at the same instant: peak is
    // the 30 + 5 + 7 after the malloc at 6 ms, never 10 + 20.
    assert_eq!(s.peak_bytes, 30 + 7 + 8);
    assert_eq!(s.peak_ns, 8 * MS);
}

/// Sizes of 2^56 and more and stack ids of 2^32 and more do not fit the
/// single-partition replay's packed operations: those rows are replayed
/// whole, in order with the rest, and give what several partitions give.
#[test]
fn sizes_and_stacks_too_wide_to_pack() {
    let big = 1u64 << 56;
    let far = 1u64 << 32;
    let mut tb = TraceBuilder::new();
    tb.malloc(1, 0xa000, big + 5, 1)
        .malloc(2, 0xb000, 10, far + 7)
        .realloc(3, 0xb000, 0xc000, big, 2) // moves to a huge block
        .realloc(4, 0xa000, 0xa000, 3, far) // shrinks in place, wide stack
        .malloc(5, 0xd000, 4, 3)
        .realloc(6, 0xd000, 0, big, 3) // fails: d stays
        .free(7, 0xc000)
        .malloc(8, 0xe000, big - 1, far + 1);
    tb.ev(9, 101, EventKind::Malloc, 0xf000, big, far + 2);
    let r = run(&tb);
    assert_eq!(
        outstanding(&r),
        vec![
            (3, 4, 1),
            (far, 3, 1),
            (far + 1, big - 1, 1),
            (far + 2, big, 1)
        ]
    );
    let s = &r.summary;
    assert_eq!(s.allocations, 7);
    assert_eq!(s.frees, 3); // a in place, b, c
    assert_eq!(s.freed_bytes, big + 5 + 10 + big);
    assert_eq!(s.anomalies.total(), 0);
    // 2 big + 5 after the move at 3 ms, then 2 big + 6 at 9 ms.
    assert_eq!(s.peak_bytes, 2 * big + 6);
    assert_eq!(s.peak_ns, 9 * MS);
    // The same with a process filter, which drops pid 101's block.
    let r = run_with(
        &tb,
        AnalyzeOptions {
            filter: Filter {
                pids: vec![100],
                ..Filter::default()
            },
            ..AnalyzeOptions::default()
        },
    );
    assert_eq!(
        outstanding(&r),
        vec![(3, 4, 1), (far, 3, 1), (far + 1, big - 1, 1)]
    );
}

#[test]
fn address_reuse_and_missed_frees() {
    let mut tb = TraceBuilder::new();
    tb.malloc(1, 0x1000, 16, 1)
        .free(2, 0x1000)
        .malloc(3, 0x1000, 32, 2) // reuse after a free: fine
        .malloc(4, 0x2000, 8, 3)
        .malloc(5, 0x2000, 64, 4); // live address allocated again: missed free
    let r = run(&tb);
    assert_eq!(outstanding(&r), vec![(2, 32, 1), (4, 64, 1)]);
    assert_eq!(r.summary.anomalies.missed_frees, 1);
    assert_eq!(r.summary.anomalies.total(), 1);
    // Stack 3's block was replaced, not freed; it still allocated.
    let s3 = r.stacks.iter().find(|s| s.stack_id == 3).unwrap();
    assert_eq!((s3.count, s3.allocations, s3.allocated_bytes), (0, 1, 8));
}

#[test]
fn double_frees_and_frees_before_attach() {
    let mut tb = TraceBuilder::new();
    tb.malloc(1, 0x1000, 16, 1)
        .free(2, 0x1000)
        .free(3, 0x1000) // double free
        .free(4, 0x9000) // allocated before the recording started
        .free(5, 0) // free(NULL) is nothing
        .ev(6, 100, EventKind::Delete, 0x9100, 0, 0); // unknown delete
    let r = run(&tb);
    let a = r.summary.anomalies;
    assert_eq!((a.unknown_frees, a.double_frees, a.missed_frees), (2, 1, 0));
    assert_eq!(r.summary.frees, 1);
    assert_eq!(r.summary.outstanding_bytes, 0);
    assert!(r.top_stacks().is_empty());
}

#[test]
fn mmap_partial_munmap_and_mremap() {
    let mut tb = TraceBuilder::new();
    tb.ev(1, 100, EventKind::Mmap, 0x10000, 0x4000, 1)
        .ev(2, 100, EventKind::Munmap, 0x11000, 0x1000, 0) // hole: two pieces, one mapping
        .ev(3, 100, EventKind::Munmap, 0x80000, 0x100000, 0) // over nothing: normal
        .ev(4, 100, EventKind::Mmap, 0x40000, 0x2000, 2)
        .mremap(5, 0x40000, 0x2000, 0x60000, 0x3000, 3) // move + grow: like realloc
        .ev(6, 100, EventKind::Munmap, 0x13000, 0x1000, 0); // tail of the first mapping
    let r = run(&tb);
    assert_eq!(outstanding(&r), vec![(1, 0x2000, 1), (3, 0x3000, 1)]);
    let s = &r.summary;
    assert_eq!(s.anomalies.total(), 0);
    assert_eq!(s.peak_bytes, 0x3000 + 0x3000);
    assert_eq!(s.peak_ns, 5 * MS);
    // The new range is the mremap's: made at 5 ms, aged at 10 s; the
    // mmap it came from holds nothing any more.
    let s3 = r.stacks.iter().find(|s| s.stack_id == 3).unwrap();
    assert_eq!(s3.oldest_age_ns, 10 * S - 5 * MS);
    let s2 = r.stacks.iter().find(|s| s.stack_id == 2).unwrap();
    assert_eq!((s2.count, s2.allocations), (0, 1));
}

/// A program that leaks, forks a child that exits at once, then execs:
/// its leaks vanish with its image, and the child's copies of them are
/// not the child's leaks (they were reported for the parent, which
/// dropped them at exec), with the child's exit recorded or not.
#[test]
fn exec_after_a_fork_leaves_nothing_of_the_old_image() {
    for child_exit in [false, true] {
        let mut tb = TraceBuilder::new();
        tb.meta.parents.insert(200, 100);
        for k in 0..5 {
            tb.malloc(1, 0x1000 + 0x1000 * k, 1002, 1);
        }
        tb.ev(2, 100, EventKind::Fork, 200, 0, 0);
        if child_exit {
            tb.ev(3, 200, EventKind::Exit, 0, 0, 0);
        }
        tb.ev(4, 100, EventKind::Exec, 0, 0, 0);
        let r = run(&tb);
        assert_eq!(outstanding(&r), vec![], "child exit recorded: {child_exit}");
        assert_eq!(r.summary.outstanding_bytes, 0);
        // The child alone, as valgrind on the child would see it.
        let r = run_with(
            &tb,
            AnalyzeOptions {
                filter: Filter {
                    pids: vec![200],
                    ..Filter::default()
                },
                ..Default::default()
            },
        );
        assert_eq!(outstanding(&r), vec![(1, 5010, 5)]);
    }
}

#[test]
fn exec_drops_fork_copies_exit_keeps() {
    let mut tb = TraceBuilder::new();
    tb.malloc(1, 0x1000, 10, 1)
        .ev(2, 100, EventKind::Fork, 200, 0, 0) // child 200 gets a copy
        .ev(3, 200, EventKind::Free, 0x1000, 0, 0) // the child frees its copy
        .ev(4, 200, EventKind::Malloc, 0x2000, 20, 2)
        .ev(5, 200, EventKind::Exec, 0, 0, 0) // the child's pre-exec heap vanishes
        .ev(6, 200, EventKind::Malloc, 0x3000, 40, 3)
        .ev(7, 200, EventKind::Exit, 0, 0, 0) // exit: outstanding stays
        .ev(8, 300, EventKind::Malloc, 0x4000, 80, 4)
        .ev(9, 300, EventKind::Free, 0x1000, 0, 0); // other process: unknown
    let r = run(&tb);
    assert_eq!(outstanding(&r), vec![(1, 10, 1), (3, 40, 1), (4, 80, 1)]);
    assert_eq!(r.summary.anomalies.unknown_frees, 1);
    assert_eq!(r.summary.frees, 1);
    // The live total: 10 (the parent's; the child's copy is the same
    // memory) + 40 until the child exits at 7 ms, then 10 + 80 at 8 ms.
    assert_eq!(r.summary.peak_bytes, 10 + 80);
    assert_eq!(r.summary.peak_ns, 8 * MS);
    assert_eq!(
        peaks(&r),
        vec![(300, 80, 8 * MS), (200, 40, 6 * MS), (100, 10, MS)]
    );
}

/// Heap blocks, mappings and kernel allocations apart, in the summary and
/// by --kind heap|mmap, so a reader can compare the heap with valgrind's.
#[test]
fn heap_mappings_and_kernel_are_told_apart() {
    let mut tb = TraceBuilder::new();
    tb.malloc(1, 0x1000, 100, 1)
        .malloc(2, 0x2000, 200, 1)
        .ev(3, 100, EventKind::Mmap, 0x10_0000, 0x3000, 2)
        .ev(4, 100, EventKind::Munmap, 0x10_1000, 0x1000, 0) // two pieces, one mapping
        .ev(5, 100, EventKind::Mmap, 0x20_0000, 0x1000, 3)
        .ev(6, 100, EventKind::Munmap, 0x20_0000, 0x1000, 0)
        .ev(7, 0, EventKind::Kmalloc, 0xffff_8880_0000_1000, 64, 4)
        .free(8, 0x2000);
    let r = run(&tb);
    let c = &r.summary.outstanding_by_class;
    assert_eq!((c.heap.bytes, c.heap.allocations), (100, 1));
    assert_eq!((c.mapped.bytes, c.mapped.allocations), (0x2000, 1));
    assert_eq!((c.kernel.bytes, c.kernel.allocations), (64, 1));
    assert_eq!(r.summary.outstanding_bytes, 100 + 0x2000 + 64);
    let s2 = r.stacks.iter().find(|s| s.stack_id == 2).unwrap();
    assert_eq!((s2.mapped_bytes, s2.mapped_count), (0x2000, 1));
    for (kind, want) in [
        (KindScope::Heap, vec![(1, 100, 1)]),
        (KindScope::Mmap, vec![(2, 0x2000, 1)]),
        (KindScope::User, vec![(1, 100, 1), (2, 0x2000, 1)]),
    ] {
        let r = run_with(
            &tb,
            AnalyzeOptions {
                filter: Filter {
                    kind,
                    ..Filter::default()
                },
                ..Default::default()
            },
        );
        assert_eq!(outstanding(&r), want, "{kind:?}");
    }
}

#[test]
fn kernel_events_share_one_address_space() {
    let mut tb = TraceBuilder::new();
    tb.ev(1, 100, EventKind::Kmalloc, 0xffff_8880_0000_1000, 64, 1)
        .ev(2, 200, EventKind::Kfree, 0xffff_8880_0000_1000, 0, 0) // freed from another task
        .ev(
            3,
            0,
            EventKind::KmemCacheAlloc,
            0xffff_8880_0000_2000,
            128,
            2,
        )
        .ev(4, 0, EventKind::PageAlloc, 0x1234, 4096, 3)
        .ev(5, 0, EventKind::Kfree, 0x1234, 0, 0) // a pfn is not an address
        .ev(6, 100, EventKind::Malloc, 0xffff_8880_0000_2000, 8, 4); // user, same number
    let r = run(&tb);
    assert_eq!(outstanding(&r), vec![(2, 128, 1), (3, 4096, 1), (4, 8, 1)]);
    assert_eq!(r.summary.anomalies.unknown_frees, 1);

    let r = run_with(
        &tb,
        AnalyzeOptions {
            filter: Filter {
                kind: KindScope::User,
                ..Filter::default()
            },
            ..Default::default()
        },
    );
    assert_eq!(outstanding(&r), vec![(4, 8, 1)]);
    let r = run_with(
        &tb,
        AnalyzeOptions {
            filter: Filter {
                kind: KindScope::Kernel,
                ..Filter::default()
            },
            ..Default::default()
        },
    );
    assert_eq!(outstanding(&r), vec![(2, 128, 1), (3, 4096, 1)]);
    // A pid filter selects processes; kernel allocations have none.
    let r = run_with(
        &tb,
        AnalyzeOptions {
            filter: Filter {
                pids: vec![100],
                ..Filter::default()
            },
            ..Default::default()
        },
    );
    assert_eq!(outstanding(&r), vec![(4, 8, 1)]);
}

fn windowed() -> TraceBuilder {
    let mut tb = TraceBuilder::new();
    tb.malloc(1000, 0x1000, 100, 1) // 1 s
        .malloc(2000, 0x2000, 200, 2) // 2 s
        .malloc(3000, 0x3000, 300, 3) // 3 s
        .free(4000, 0x1000)
        .malloc(5000, 0x5000, 5000, 4) // 5 s
        .free(6000, 0x2000);
    tb
}

#[test]
fn time_windows_and_at() {
    let tb = windowed();
    let r = run(&tb);
    assert_eq!(outstanding(&r), vec![(3, 300, 1), (4, 5000, 1)]);

    // Allocations made in [2 s, 5 s) and still outstanding at the end.
    let f = Filter {
        from_ns: Some(2 * S),
        to_ns: Some(5 * S),
        ..Filter::default()
    };
    let r = run_with(
        &tb,
        AnalyzeOptions {
            filter: f,
            ..Default::default()
        },
    );
    assert_eq!(outstanding(&r), vec![(3, 300, 1)]);
    // Frees of filtered-out blocks are not anomalies.
    assert_eq!(r.summary.anomalies.total(), 0);

    // The state at 4.5 s: block 1 freed, 2 and 3 live, 5 not yet made.
    let r = run_with(
        &tb,
        AnalyzeOptions {
            at_ns: Some(4500 * MS),
            ..Default::default()
        },
    );
    assert_eq!(outstanding(&r), vec![(2, 200, 1), (3, 300, 1)]);
    assert_eq!(r.summary.eval_ts, T0 + 4500 * MS);
    assert_eq!(r.summary.events, 4);
    let s3 = r.stacks.iter().find(|s| s.stack_id == 3).unwrap();
    assert_eq!(s3.oldest_age_ns, 1500 * MS);

    // bcc's -o: at least 6 s old at the end (10 s).
    let f = Filter {
        older_than_ns: Some(6 * S),
        ..Filter::default()
    };
    let r = run_with(
        &tb,
        AnalyzeOptions {
            filter: f,
            ..Default::default()
        },
    );
    assert_eq!(outstanding(&r), vec![(3, 300, 1)]);

    let f = Filter {
        min_size: Some(300),
        max_size: Some(4999),
        ..Filter::default()
    };
    let r = run_with(
        &tb,
        AnalyzeOptions {
            filter: f,
            ..Default::default()
        },
    );
    assert_eq!(outstanding(&r), vec![(3, 300, 1)]);
}

#[test]
fn age_buckets() {
    let tb = windowed();
    let r = run(&tb);
    // At 10 s: stack 3 is 7 s old, stack 4 is 5 s old.
    // 7 s = 7e6 us: 2^22 <= 7e6 < 2^23, bucket 23. 5 s = 5e6 us: also 23.
    let b = r.summary.age_histogram.buckets();
    assert_eq!(b.len(), 1);
    assert_eq!(
        (b[0].low_us, b[0].high_us, b[0].count, b[0].bytes),
        (1 << 22, (1 << 23) - 1, 2, 5300)
    );

    let r = run_with(
        &tb,
        AnalyzeOptions {
            at_ns: Some(5001 * MS),
            ..Default::default()
        },
    );
    // At 5.001 s: stack 2 is 3.001 s (bucket 22), stack 3 is 2.001 s
    // (bucket 21), stack 4 is 1 ms (bucket 10: 512..1023 us? no: 1000 us).
    let b = r.summary.age_histogram.buckets();
    let got: Vec<(u64, u64)> = b
        .iter()
        .filter(|b| b.count > 0)
        .map(|b| (b.low_us, b.bytes))
        .collect();
    assert_eq!(got, vec![(512, 5000), (1 << 20, 300), (1 << 21, 200)]);
    let s4 = r.stacks.iter().find(|s| s.stack_id == 4).unwrap();
    assert_eq!(s4.age_histogram.buckets().len(), 1);
}

#[test]
fn sort_orders_and_top() {
    let mut tb = TraceBuilder::new();
    tb.malloc(1, 0x1000, 10, 1) // oldest
        .malloc(2, 0x2000, 1000, 2) // biggest
        .malloc(3, 0x3000, 1, 3)
        .malloc(4, 0x3100, 1, 3)
        .malloc(5, 0x3200, 1, 3); // most
    let order = |sort, top| {
        let r = run_with(
            &tb,
            AnalyzeOptions {
                sort,
                top,
                ..Default::default()
            },
        );
        r.top_stacks()
            .iter()
            .map(|s| s.stack_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(order(SortKey::Bytes, 0), vec![2, 1, 3]);
    assert_eq!(order(SortKey::Count, 0), vec![3, 2, 1]);
    assert_eq!(order(SortKey::Age, 0), vec![1, 2, 3]);
    assert_eq!(order(SortKey::Bytes, 2), vec![2, 1]);
}

#[test]
fn lost_events_come_from_meta() {
    let mut tb = TraceBuilder::new();
    tb.meta.counters.lost.insert("ring_full".into(), 7);
    tb.meta.counters.lost.insert("stack_failed".into(), 2);
    tb.malloc(1, 0x1000, 1, 1);
    let r = run(&tb);
    assert_eq!(r.summary.lost_total(), 9);
    assert_eq!(r.summary.lost_by_reason["ring_full"], 7);
}

#[test]
fn start_falls_back_to_first_event() {
    let mut tb = TraceBuilder::new();
    tb.meta = Meta {
        start_ns: 0,
        end_ns: 0,
        ..Meta::default()
    };
    tb.malloc(1000, 0x1000, 1, 1).malloc(3000, 0x2000, 1, 1);
    let r = run(&tb);
    assert_eq!(r.summary.start_ts, T0 + 1000 * MS);
    // No end recorded... except that finish() stamps the writer's clock;
    // ages are measured to the later of that and the last event.
    assert!(r.summary.eval_ts >= T0 + 3000 * MS);
}

/// A small deterministic generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random traces against a straightforward sequential model.
#[test]
fn random_traces_match_a_sequential_model() {
    use std::collections::{BTreeMap, HashMap};
    for seed in 1..6u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut tb = TraceBuilder::new();
        tb.row_group_rows = 17;
        tb.segment_rows = 100;
        let mut live: HashMap<(u32, u64), (u64, u64)> = HashMap::new();
        let mut anomalies = 0u64;
        for i in 0..600u64 {
            let pid = [100, 101][(rng.next() % 2) as usize];
            let addr = 0x1000 + (rng.next() % 64) * 16;
            let stack = 1 + rng.next() % 5;
            let size = 1 + rng.next() % 100;
            match rng.next() % 4 {
                0 | 1 => {
                    tb.ev(i, pid, EventKind::Malloc, addr, size, stack);
                    if live.insert((pid, addr), (size, stack)).is_some() {
                        anomalies += 1;
                    }
                }
                2 => {
                    tb.ev(i, pid, EventKind::Free, addr, 0, 0);
                    if live.remove(&(pid, addr)).is_none() {
                        anomalies += 1;
                    }
                }
                _ => {
                    let new = 0x1000 + (rng.next() % 64) * 16;
                    tb.ev(i, pid, EventKind::Realloc, new, size, stack);
                    tb.events.last_mut().unwrap().old_addr = Some(addr);
                    if live.remove(&(pid, addr)).is_none() {
                        anomalies += 1;
                    }
                    if live.insert((pid, new), (size, stack)).is_some() {
                        anomalies += 1;
                    }
                }
            }
        }
        let mut want: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for (size, stack) in live.values() {
            let e = want.entry(*stack).or_default();
            e.0 += size;
            e.1 += 1;
        }
        let want: Vec<_> = want.into_iter().map(|(s, (b, c))| (s, b, c)).collect();
        let r = run(&tb);
        assert_eq!(outstanding(&r), want, "seed {seed}");
        assert_eq!(r.summary.anomalies.total(), anomalies, "seed {seed}");
    }
}

#[test]
fn empty_trace() {
    let tb = TraceBuilder::new();
    let r = run(&tb);
    assert_eq!(r.summary.events, 0);
    assert!(r.stacks.is_empty());
    let text = memleak_analyze::text::render(&r);
    assert!(text.starts_with("No outstanding allocations.\n"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&memleak_analyze::json::render(&r)).unwrap();
    assert_eq!(v["stacks"].as_array().unwrap().len(), 0);
}

/// `--pid CHILD` keeps what the child inherited at fork: the parent is
/// replayed (the recorder's `parents` map in meta.json names it) but only
/// the child's blocks are reported.
#[test]
fn pid_filter_keeps_what_a_child_inherited() {
    let mut tb = TraceBuilder::new();
    tb.meta.parents.insert(200, 100);
    tb.malloc(1, 0x1000, 111, 1) // before the fork: both will hold it
        .ev(2, 100, EventKind::Fork, 200, 0, 0)
        .ev(3, 200, EventKind::Malloc, 0x2000, 222, 2)
        .ev(4, 100, EventKind::Malloc, 0x3000, 333, 3); // the parent's own
    let only_child = AnalyzeOptions {
        filter: Filter {
            pids: vec![200],
            ..Default::default()
        },
        ..Default::default()
    };
    let r = run_with(&tb, only_child);
    assert_eq!(outstanding(&r), vec![(1, 111, 1), (2, 222, 1)]);
    assert!(r
        .stacks
        .iter()
        .filter(|s| s.count > 0)
        .all(|s| s.stack_id != 3));
    // Without the lineage the inherited block cannot be known.
    tb.meta.parents.clear();
    let r = run_with(
        &tb,
        AnalyzeOptions {
            filter: Filter {
                pids: vec![200],
                ..Default::default()
            },
            ..Default::default()
        },
    );
    assert_eq!(outstanding(&r), vec![(2, 222, 1)]);
}

/// Random traces of every event kind, with the edge cases of the packed
/// single-partition replay (address 0, sizes around 2^56, stack ids
/// around 2^32, reallocs in place, failed or freeing, mremap, exec,
/// fork), written in row groups of a few rows and in pages of a few
/// dozen rows (so the page decoder hands rows over in many pieces, and
/// dictionaries fall back to plain pages mid-chunk): one partition must
/// give the same report as two and three, under every filter.
#[test]
fn random_traces_of_every_kind_agree_across_partitions() {
    use EventKind::*;
    const KINDS: [EventKind; 26] = [
        Malloc,
        Malloc,
        Malloc,
        Calloc,
        New,
        Free,
        Free,
        Free,
        Delete,
        Realloc,
        Realloc,
        Reallocarray,
        Kmalloc,
        Kfree,
        KmemCacheAlloc,
        KmemCacheFree,
        PageAlloc,
        PageFree,
        PercpuAlloc,
        PercpuFree,
        Mmap,
        Munmap,
        Mremap,
        Exec,
        Exit,
        Fork,
    ];
    let build = |seed: u64| {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut r = |n: u64| rng.next() % n;
        let mut tb = TraceBuilder::new();
        tb.meta.pids = vec![100, 101, 102];
        let mut ms = 0;
        for _ in 0..3000 {
            ms += (r(4) == 0) as u64;
            let kind = KINDS[r(KINDS.len() as u64) as usize];
            let pid = 100 + r(3) as u32;
            let mut addr = if r(20) == 0 { 0 } else { 0x1000 * (1 + r(48)) };
            let mut size = match r(30) {
                0 => 0,
                1 => (1 << 56) + r(5),
                2 => (1 << 56) - 1,
                _ => 1 + r(5000),
            };
            let stack = match r(30) {
                0 => (1 << 32) + r(3),
                1 => u32::MAX as u64,
                _ => r(12),
            };
            if kind == Fork {
                addr = 100 + r(4);
            }
            if matches!(kind, Mmap | Munmap | Mremap) {
                size = 0x1000 * (1 + r(4));
            }
            tb.ev(ms, pid, kind, addr, size, stack);
            let e = tb.events.last_mut().unwrap();
            if matches!(kind, Realloc | Reallocarray | Mremap) {
                let old = if r(6) == 0 { 0 } else { 0x1000 * (1 + r(48)) };
                e.old_addr = (old != 0).then_some(old);
                if r(8) == 0 {
                    e.addr = old; // in place
                }
                if r(8) == 0 {
                    e.addr = 0; // failed, or a free
                    if r(2) == 0 {
                        e.size = 0;
                    }
                }
            }
            if kind == Mremap {
                e.old_size = Some(0x1000 * (1 + r(4)));
            }
        }
        tb
    };
    let mut options = vec![
        AnalyzeOptions::default(),
        AnalyzeOptions {
            filter: Filter {
                pids: vec![101],
                ..Filter::default()
            },
            ..AnalyzeOptions::default()
        },
        AnalyzeOptions {
            filter: Filter {
                kind: KindScope::Kernel,
                ..Filter::default()
            },
            ..AnalyzeOptions::default()
        },
        AnalyzeOptions {
            filter: Filter {
                kind: KindScope::User,
                min_size: Some(100),
                max_size: Some(3000),
                from_ns: Some(100 * MS),
                to_ns: Some(500 * MS),
                ..Filter::default()
            },
            ..AnalyzeOptions::default()
        },
    ];
    for at in [0, 333, 100_000] {
        options.push(AnalyzeOptions {
            at_ns: Some(at * MS),
            filter: Filter {
                pids: if at == 333 { vec![100, 102] } else { vec![] },
                ..Filter::default()
            },
            ..AnalyzeOptions::default()
        });
    }
    for seed in 1..4u64 {
        for (rows, small_pages) in [(3, false), (1000, true)] {
            let mut tb = build(seed);
            tb.row_group_rows = rows;
            tb.segment_rows = 3 * rows + 7;
            if small_pages {
                tb.events_tuning = Some(|b| {
                    b.set_data_page_size_limit(300)
                        .set_write_batch_size(17)
                        .set_dictionary_page_size_limit(200)
                });
            }
            for (i, o) in options.iter().enumerate() {
                let r = run_with(&tb, o.clone());
                assert!(
                    r.summary.events > 0 || o.at_ns == Some(0),
                    "seed {seed}, options {i}"
                );
            }
        }
    }
}

/// Damaged pages behind an intact footer: the page decoders stop, and the
/// reference reader, which the analyzer falls back on, reports the
/// segment as corrupt, at every partition count and wherever in the row
/// group the damage starts.
#[test]
fn damaged_pages_are_a_corrupt_segment() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let mut tb = TraceBuilder::new();
    tb.row_group_rows = 2000;
    tb.segment_rows = 100_000;
    for i in 0..6000u64 {
        tb.malloc(i, 0x1000 + (i % 500) * 16, 1 + i % 50, 1 + i % 7);
    }
    for (column, from_half) in [("addr", false), ("addr", true), ("ts_ns", false)] {
        let dir = tempfile::tempdir().unwrap();
        let path = tb.write(dir.path());
        let seg = path.join("events/part-00000.parquet");
        let (start, len) = {
            let r = SerializedFileReader::new(std::fs::File::open(&seg).unwrap()).unwrap();
            let rg = r.metadata().row_group(1);
            let c = (0..rg.num_columns())
                .find(|&i| rg.column(i).column_path().string() == column)
                .unwrap();
            rg.column(c).byte_range()
        };
        let mut bytes = std::fs::read(&seg).unwrap();
        let from = if from_half { len / 2 } else { 0 };
        for b in &mut bytes[(start + from) as usize..(start + len) as usize] {
            *b = 0xA5;
        }
        std::fs::write(&seg, bytes).unwrap();
        for parts in [1, 2] {
            let e = analyze(
                &path,
                &AnalyzeOptions {
                    partitions: parts,
                    ..AnalyzeOptions::default()
                },
            )
            .expect_err("a damaged segment");
            let msg = e.to_string();
            assert!(
                msg.contains("part-00000.parquet") && msg.contains("corrupt"),
                "{column}, {parts} partitions: {msg}"
            );
        }
    }
}

/// Rewrites the length and CRC-32 that meta.json lists for a segment, as
/// if the damage had happened before it was listed: what is left to catch
/// it are the pages' own CRCs.
fn relist(trace: &std::path::Path, table: &str, file: &str) {
    let bytes = std::fs::read(trace.join(table).join(file)).unwrap();
    let meta = trace.join("meta.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta).unwrap()).unwrap();
    m.as_object_mut().unwrap().remove("meta_crc32");
    for e in m["segments"][table].as_array_mut().unwrap() {
        if e["file"] == file {
            e["bytes"] = bytes.len().into();
            e["crc32"] = crc32fast::hash(&bytes).into();
        }
    }
    std::fs::write(&meta, serde_json::to_string(&m).unwrap()).unwrap();
}

/// One flipped bit in any page of any column: the segment's checksum in
/// meta.json catches it, and so do the pages' CRCs when meta.json was
/// rewritten to match: never a different report.
#[test]
fn a_flipped_bit_in_a_page_is_an_error_not_another_report() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let mut tb = TraceBuilder::new();
    tb.row_group_rows = 2000;
    tb.segment_rows = 100_000;
    for i in 0..6000u64 {
        tb.malloc(i, 0x1000 + (i % 500) * 16, 1 + i % 50, 1 + i % 7);
        if i % 3 == 0 {
            tb.free(i, 0x1000 + (i % 500) * 16);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = tb.write(dir.path());
    let seg = path.join("events/part-00000.parquet");
    let good = std::fs::read(&seg).unwrap();
    let original = format!("{:?}", analyze(&path, &AnalyzeOptions::default()).unwrap());
    let ranges: Vec<(String, u64, u64)> = {
        let r = SerializedFileReader::new(std::fs::File::open(&seg).unwrap()).unwrap();
        let rg = r.metadata().row_group(1);
        (0..rg.num_columns())
            .map(|c| {
                let (start, len) = rg.column(c).byte_range();
                (rg.column(c).column_path().string(), start, len)
            })
            .collect()
    };
    for (column, start, len) in ranges {
        // The middle of the chunk: past the first page header, in values.
        let at = (start + len / 2 + len / 4) as usize;
        for relisted in [false, true] {
            let mut bytes = good.clone();
            bytes[at] ^= 0x04;
            std::fs::write(&seg, &bytes).unwrap();
            if relisted {
                relist(&path, "events", "part-00000.parquet");
            }
            for parts in [1, 2] {
                let opts = AnalyzeOptions {
                    partitions: parts,
                    ..AnalyzeOptions::default()
                };
                let case = format!("{column} at {at}, relisted {relisted}, {parts} partitions");
                match analyze(&path, &opts) {
                    Err(e) => {
                        let msg = e.to_string();
                        assert!(
                            msg.contains("part-00000.parquet") && msg.contains("corrupt"),
                            "{case}: {msg}"
                        );
                    }
                    // Damage that decoding never sees (a column replay
                    // does not read, a header field it does not use) may
                    // pass, and then nothing changes.
                    Ok(r) => {
                        assert!(relisted, "{case}: meta.json's checksum missed it");
                        assert_eq!(format!("{r:?}"), original, "{case}: a different report");
                    }
                }
            }
        }
        std::fs::write(&seg, &good).unwrap();
        relist(&path, "events", "part-00000.parquet");
    }
}

/// A recorder killed after a checkpoint: the report leads with what is
/// missing, never a plain "No outstanding allocations", and the JSON says
/// it too.
#[test]
fn a_killed_recording_is_reported_as_incomplete() {
    use memleak_trace::{Event, TraceWriter, WriterOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("killed.parquet");
    let meta = Meta {
        start_ns: T0,
        pids: vec![100],
        ..Meta::default()
    };
    let mut w = TraceWriter::create(&path, meta, WriterOptions::default()).unwrap();
    let ev = |ms: u64, kind, addr| Event {
        ts_ns: T0 + ms * MS,
        pid: 100,
        tid: 100,
        kind,
        addr,
        size: if kind == EventKind::Malloc { 64 } else { 0 },
        old_addr: None,
        old_size: None,
        stack_id: None,
    };
    w.push_event(&ev(1, EventKind::Malloc, 0x1000)).unwrap();
    w.push_event(&ev(2, EventKind::Free, 0x1000)).unwrap();
    w.rotate().unwrap();
    // After the checkpoint: a leak nobody will see, then the kill.
    w.push_event(&ev(3, EventKind::Malloc, 0x2000)).unwrap();
    std::mem::forget(w); // no finish, no drop: as after kill -9
    let trace = memleak_trace::Trace::open(&path).unwrap();
    let inc = trace.incomplete().expect("incomplete");
    assert!(inc.listed);
    let r = analyze(&path, &AnalyzeOptions::default()).unwrap();
    let text = memleak_analyze::text::render(&r);
    assert!(
        text.starts_with("WARNING: incomplete trace: the recording did not finish"),
        "{text}"
    );
    assert!(
        text.contains("No outstanding allocations in the part of the recording that was saved."),
        "{text}"
    );
    assert!(text.contains("are missing"), "{text}");
    let json = memleak_analyze::json::render(&r);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["summary"]["complete"], false);
    assert!(
        v["summary"]["incomplete"]["missing_after_ns"].is_u64(),
        "{json}"
    );
}
const MIB: u64 = 1 << 20;

/// Issue 16: ten processes, one after the other, each allocating 4 MiB
/// and exiting without freeing it. At most 4 MiB were ever held at once
/// (an exiting process's memory goes back to the system), yet all ten
/// blocks are leaks and stay in the report.
#[test]
fn sequential_processes_peak_at_one_process() {
    let mut tb = TraceBuilder::new();
    tb.meta.pids = (1000..1010).collect();
    for k in 0..10u64 {
        let pid = 1000 + k as u32;
        // The same program: the same address in every process.
        tb.ev(
            10 * k + 1,
            pid,
            EventKind::Malloc,
            0x7f00_0000_1000,
            4 * MIB,
            1,
        )
        .ev(10 * k + 5, pid, EventKind::Exit, 0, 0, 0);
    }
    let r = run(&tb);
    let s = &r.summary;
    assert_eq!(s.peak_bytes, 4 * MIB);
    assert_eq!(s.peak_ns, MS);
    let want: Vec<_> = (0..10u64)
        .map(|k| (1000 + k as u32, 4 * MIB, (10 * k + 1) * MS))
        .collect();
    assert_eq!(peaks(&r), want);
    // Still ten leaks of 4 MiB.
    assert_eq!(outstanding(&r), vec![(1, 40 * MIB, 10)]);
    assert_eq!(s.outstanding_allocations, 10);
    assert_eq!(s.outstanding_bytes, 40 * MIB);
    assert_eq!(s.anomalies.total(), 0);

    let v: serde_json::Value = serde_json::from_str(&memleak_analyze::json::render(&r)).unwrap();
    assert_eq!(v["summary"]["peak_outstanding_bytes"], 4 * MIB);
    let pp = v["summary"]["process_peaks"].as_array().unwrap();
    assert_eq!(pp.len(), 10);
    assert_eq!(pp[9]["pid"], 1009);
    assert_eq!(pp[9]["peak_outstanding_bytes"], 4 * MIB);
    assert_eq!(pp[9]["peak_ns"], 91 * MS);
    // The text summary names the first five, and says how many more.
    let text = memleak_analyze::text::render(&r);
    assert!(
        text.contains("  peak outstanding  4194304 bytes (4.00 MiB) at 1.00ms\n  peak by process   pid 1000: 4194304 bytes (4.00 MiB) at 1.00ms\n                    pid 1001: 4194304 bytes (4.00 MiB) at 11.0ms\n"),
        "{text}"
    );
    assert!(
        text.contains("pid 1004: 4194304 bytes (4.00 MiB) at 41.0ms\n                    and 5 more processes (all in --format json)\n"),
        "{text}"
    );
    assert!(!text.contains("pid 1005"), "{text}");
}

/// Processes alive at the same time add up; once one exits, only the
/// others count.
#[test]
fn overlapping_processes_add_up_while_both_live() {
    let mut tb = TraceBuilder::new();
    tb.ev(1, 100, EventKind::Malloc, 0x1000, 4 * MIB, 1)
        .ev(2, 200, EventKind::Malloc, 0x1000, 3 * MIB, 2)
        .ev(3, 100, EventKind::Malloc, 0x2000, MIB, 1) // both live: 8 MiB
        .ev(4, 100, EventKind::Exit, 0, 0, 0)
        .ev(5, 200, EventKind::Malloc, 0x2000, 2 * MIB, 2) // 5 MiB: 100 is gone
        .ev(6, 300, EventKind::Malloc, 0x1000, 2 * MIB, 3) // 7 MiB
        .ev(7, 200, EventKind::Free, 0x1000, 0, 0)
        .ev(8, 200, EventKind::Exit, 0, 0, 0);
    let r = run(&tb);
    assert_eq!(r.summary.peak_bytes, 8 * MIB);
    assert_eq!(r.summary.peak_ns, 3 * MS);
    assert_eq!(
        peaks(&r),
        vec![
            (100, 5 * MIB, 3 * MS),
            (200, 5 * MIB, 5 * MS),
            (300, 2 * MIB, 6 * MS)
        ]
    );
    // Exited or not, the unfreed blocks are outstanding.
    assert_eq!(
        outstanding(&r),
        vec![(1, 5 * MIB, 2), (2, 2 * MIB, 1), (3, 2 * MIB, 1)]
    );
}

/// exec replaces the program image: the old image's blocks are gone, from
/// the live total and from the report.
#[test]
fn exec_drops_the_old_images_bytes() {
    let mut tb = TraceBuilder::new();
    tb.ev(1, 100, EventKind::Malloc, 0x1000, 4 * MIB, 1)
        .ev(2, 100, EventKind::Exec, 0, 0, 0)
        .ev(3, 100, EventKind::Malloc, 0x2000, 3 * MIB, 2)
        .ev(4, 200, EventKind::Malloc, 0x1000, 2 * MIB, 3) // 5 MiB, not 9
        .ev(5, 100, EventKind::Free, 0x1000, 0, 0); // the old image's: unknown
    let r = run(&tb);
    assert_eq!(r.summary.peak_bytes, 5 * MIB);
    assert_eq!(r.summary.peak_ns, 4 * MS);
    assert_eq!(peaks(&r), vec![(100, 4 * MIB, MS), (200, 2 * MIB, 4 * MS)]);
    assert_eq!(outstanding(&r), vec![(2, 3 * MIB, 1), (3, 2 * MIB, 1)]);
    assert_eq!(r.summary.anomalies.unknown_frees, 1);
}

/// Kernel allocations belong to no process: an exit, even of the task
/// that made them, leaves them in the live total.
#[test]
fn kernel_allocations_survive_exits() {
    let mut tb = TraceBuilder::new();
    tb.ev(1, 100, EventKind::Kmalloc, 0xffff_8880_0000_1000, MIB, 1)
        .ev(2, 100, EventKind::Malloc, 0x1000, 2 * MIB, 2)
        .ev(3, 100, EventKind::PageAlloc, 0x1234, 4096, 3)
        .ev(4, 100, EventKind::Exit, 0, 0, 0) // the kernel's stay
        .ev(
            5,
            200,
            EventKind::Kmalloc,
            0xffff_8880_0000_2000,
            2 * MIB,
            1,
        )
        .ev(6, 200, EventKind::Exit, 0, 0, 0)
        .ev(
            7,
            300,
            EventKind::KmemCacheAlloc,
            0xffff_8880_0000_3000,
            64,
            4,
        );
    let r = run(&tb);
    let k = 3 * MIB + 4096 + 64;
    // 1 + 2 MiB + a page at 3 ms, then 1 MiB + a page, then 3 MiB + a page.
    assert_eq!(r.summary.peak_bytes, k);
    assert_eq!(r.summary.peak_ns, 7 * MS);
    // Only user allocations make a process's share.
    assert_eq!(peaks(&r), vec![(100, 2 * MIB, 2 * MS)]);
    assert_eq!(r.summary.outstanding_bytes, k + 2 * MIB);
    let r = run_with(
        &tb,
        AnalyzeOptions {
            filter: Filter {
                kind: KindScope::Kernel,
                ..Filter::default()
            },
            ..Default::default()
        },
    );
    assert_eq!(r.summary.peak_bytes, k);
    assert!(peaks(&r).is_empty());
}

/// A forked child's copy of its parent's heap is the same memory: it
/// counts once, for the parent, and the child counts what it allocates.
#[test]
fn fork_copies_count_once() {
    let mut tb = TraceBuilder::new();
    tb.meta.parents.insert(200, 100);
    tb.ev(1, 100, EventKind::Malloc, 0x1000, 4 * MIB, 1)
        .ev(2, 100, EventKind::Mmap, 0x10_0000, 2 * MIB, 2)
        .ev(3, 100, EventKind::Fork, 200, 0, 0)
        .ev(4, 200, EventKind::Malloc, 0x2000, MIB, 3) // 7 MiB, not 13
        .ev(5, 200, EventKind::Free, 0x1000, 0, 0) // its copy: the parent's stays
        .ev(6, 200, EventKind::Munmap, 0x10_0000, MIB, 0) // half its copy
        .ev(7, 200, EventKind::Exit, 0, 0, 0) // 6 MiB
        .ev(8, 100, EventKind::Free, 0x1000, 0, 0) // 2 MiB
        .ev(9, 300, EventKind::Malloc, 0x1000, 4 * MIB, 4); // 6 MiB
    let r = run(&tb);
    let s = &r.summary;
    assert_eq!((s.peak_bytes, s.peak_ns), (7 * MIB, 4 * MS));
    assert_eq!(
        peaks(&r),
        vec![
            (100, 6 * MIB, 2 * MS),
            (300, 4 * MIB, 9 * MS),
            (200, MIB, 4 * MS)
        ]
    );
    // The parent's mapping, the child's own block (left at exit) and
    // 300's block. The child's half of its copy of the mapping is the
    // parent's allocation, which the parent reports: it is the child's
    // only under --pid 200 (below).
    assert_eq!(
        outstanding(&r),
        vec![(2, 2 * MIB, 1), (3, MIB, 1), (4, 4 * MIB, 1)]
    );
    assert_eq!((s.frees, s.freed_bytes), (3, 9 * MIB));
    assert_eq!(s.anomalies.total(), 0);
    // --pid 200: the parent is replayed for what it passed on, and its
    // share counts in the peak, but only the child has a peak of its own.
    let r = run_with(
        &tb,
        AnalyzeOptions {
            filter: Filter {
                pids: vec![200],
                ..Filter::default()
            },
            ..Default::default()
        },
    );
    assert_eq!((r.summary.peak_bytes, r.summary.peak_ns), (7 * MIB, 4 * MS));
    assert_eq!(peaks(&r), vec![(200, MIB, 4 * MS)]);
    assert_eq!(outstanding(&r), vec![(2, MIB, 1), (3, MIB, 1)]);
}

/// Events of a pid after its exit (threads that outlive the main one, or
/// a new process with the same pid): what it allocates then is held
/// anew, and a free of a block from before the exit releases it without
/// taking it off the live total a second time.
#[test]
fn allocations_after_an_exit_are_held_anew() {
    let mut tb = TraceBuilder::new();
    tb.ev(1, 100, EventKind::Malloc, 0x1000, 4 * MIB, 1)
        .ev(2, 100, EventKind::Malloc, 0x2000, MIB, 1)
        .ev(3, 100, EventKind::Exit, 0, 0, 0)
        .ev(4, 100, EventKind::Malloc, 0x3000, 2 * MIB, 2) // 2 MiB
        .ev(5, 100, EventKind::Free, 0x1000, 0, 0) // from before: still 2 MiB
        .ev(6, 100, EventKind::Malloc, 0x2000, 4 * MIB, 3) // over a leak: 6 MiB
        .ev(7, 200, EventKind::Malloc, 0x1000, 128, 4)
        .ev(8, 100, EventKind::Free, 0x1000, 0, 0); // now unknown
    let r = run(&tb);
    let s = &r.summary;
    assert_eq!((s.peak_bytes, s.peak_ns), (6 * MIB + 128, 7 * MS));
    assert_eq!(peaks(&r), vec![(100, 6 * MIB, 6 * MS), (200, 128, 7 * MS)]);
    assert_eq!(
        outstanding(&r),
        vec![(2, 2 * MIB, 1), (3, 4 * MIB, 1), (4, 128, 1)]
    );
    let a = s.anomalies;
    assert_eq!((a.missed_frees, a.unknown_frees, a.double_frees), (1, 0, 1));
    assert_eq!(s.frees, 1);
}
