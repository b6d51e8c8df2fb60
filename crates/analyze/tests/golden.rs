//! Golden-file tests of the text, JSON and folded outputs, and a
//! well-formedness check of the SVG. Regenerate the golden files with
//! `UPDATE_GOLDEN=1 cargo test -p memleak-analyze --test golden`, then
//! review the diff by eye.

mod common;

use std::path::PathBuf;

use common::{TraceBuilder, MS};
use memleak_analyze::{
    analyze, folded, html, json, pprof, suppress, svg, text, AnalyzeOptions, Filter, Report,
    SortKey, VerdictSet, Weight,
};
use memleak_trace::{EventKind, FrameRecord, ScanVerdict, StackRecord};

/// A small program's trace: two leaking user stacks (one through an
/// inlined helper, one through an unsymbolized library frame), a kernel
/// leak, a truncated stack, a fully freed stack, and some anomalies.
fn fixture() -> TraceBuilder {
    let mut tb = TraceBuilder::new();
    tb.stack(1, &[0x401010, 0x401200, 0x7f00_0002_9d90])
        .stack(2, &[0x401300, 0x401200, 0x7f00_0002_9d90])
        .stack(3, &[0x401400, 0x401200])
        .stack(5, &[0x401500]);
    tb.stacks.push(StackRecord {
        stack_id: 4,
        pid: 0,
        kernel: true,
        truncated: false,
        frames: vec![0xffff_ffff_8123_4567, 0xffff_ffff_8100_1000],
    });
    tb.stacks[2].truncated = true;
    tb.frame(100, 0x401010, "make_leak", 0x10, "leak.c", 12)
        .inlined("fill_buffer", "util.h", 7)
        .frame(100, 0x401200, "main", 0x40, "leak.c", 30)
        .frame(100, 0x401300, "cache_insert", 0x22, "cache.c", 88)
        .frame(100, 0x401400, "parse_line", 0x8, "parse.c", 41)
        .frame(100, 0x401500, "worker_loop", 0x30, "worker.c", 9);
    // A library frame without a symbol: only the object and offset.
    tb.frames.push(FrameRecord {
        pid: 100,
        addr: 0x7f00_0002_9d90,
        path: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
        file_offset: Some(0x29d90),
        ..FrameRecord::default()
    });
    tb.frame(
        0,
        0xffff_ffff_8123_4567,
        "kmalloc_trace",
        0x27,
        "mm/slub.c",
        4012,
    )
    .frame(
        0,
        0xffff_ffff_8100_1000,
        "do_syscall_64",
        0x5d,
        "arch/x86/entry/common.c",
        83,
    );
    tb.meta.counters.lost.insert("ring_full".into(), 3);

    tb.malloc(100, 0x5000, 4096, 1)
        .malloc(200, 0x6000, 4096, 1)
        .malloc(300, 0x7000, 100, 2)
        .malloc(400, 0x7100, 100, 2)
        .malloc(500, 0x7200, 100, 2)
        .malloc(600, 0x8000, 24, 3)
        .free(700, 0x8000)
        .malloc(800, 0x8100, 24, 3)
        .ev(900, 100, EventKind::Kmalloc, 0xffff_8880_0001_0000, 512, 4)
        .malloc(1000, 0x9000, 64, 5)
        .realloc(1100, 0x9000, 0x9100, 128, 5)
        .free(1200, 0x9100)
        .free(1300, 0xdead0) // allocated before the recording
        .free(1400, 0x8000); // a double free
    tb.malloc(9000, 0xa000, 1_000_000, 1); // young and large
    tb
}

/// The fixture with a scan at 9.5 s: the two 4 KiB blocks of stack 1
/// definitely lost (one with its first bytes kept), stack 2's three
/// blocks indirectly lost, possibly lost and reachable, stack 3's block
/// reachable; the 1 MB block of stack 1 has no row (unscanned), nor has
/// the kernel's.
fn scanned_fixture() -> TraceBuilder {
    let mut tb = fixture();
    tb.scan(
        9_500,
        &[
            (
                0x5000,
                4096,
                ScanVerdict::DefinitelyLost,
                Some(b"GET /index.html HTTP/1.1\r\nHost: \x00\x01"),
            ),
            (0x6000, 4096, ScanVerdict::DefinitelyLost, None),
            (0x7000, 100, ScanVerdict::IndirectlyLost, None),
            (0x7100, 100, ScanVerdict::PossiblyLost, None),
            (0x7200, 100, ScanVerdict::Reachable, None),
            (0x8100, 24, ScanVerdict::Reachable, None),
        ],
    );
    tb
}

fn report(opts: AnalyzeOptions) -> Report {
    report_of(fixture(), opts)
}

fn report_of(tb: TraceBuilder, opts: AnalyzeOptions) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let path = tb.write(dir.path());
    let mut r = analyze(&path, &opts).unwrap();
    // The temporary directory differs per run.
    r.summary.trace = "golden/trace.parquet".into();
    r
}

fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    if expected != actual {
        let diff: Vec<String> = expected
            .lines()
            .zip(actual.lines())
            .enumerate()
            .filter(|(_, (e, a))| e != a)
            .take(5)
            .map(|(i, (e, a))| format!("line {}:\n  expected: {e}\n  actual:   {a}", i + 1))
            .collect();
        panic!(
            "{name} differs from the golden file ({} vs {} lines):\n{}\n(run with UPDATE_GOLDEN=1 to accept)",
            expected.lines().count(),
            actual.lines().count(),
            diff.join("\n")
        );
    }
}

#[test]
fn text_report() {
    golden(
        "report.txt",
        &text::render(&report(AnalyzeOptions {
            top: 10,
            ..Default::default()
        })),
    );
}

#[test]
fn text_report_filtered() {
    let opts = AnalyzeOptions {
        top: 2,
        filter: Filter {
            older_than_ns: Some(9_500 * MS),
            ..Filter::default()
        },
        ..Default::default()
    };
    golden("report-older-than.txt", &text::render(&report(opts)));
}

#[test]
fn text_report_by_growth() {
    let opts = AnalyzeOptions {
        sort: SortKey::Growth,
        ..Default::default()
    };
    golden("report-growth.txt", &text::render(&report(opts)));
}

#[test]
fn text_report_at_peak() {
    let opts = AnalyzeOptions {
        at_peak: true,
        ..Default::default()
    };
    let r = report(opts);
    let peak = r.summary.at_peak.expect("a peak view");
    assert_eq!(peak.bytes, r.summary.outstanding_bytes);
    golden("report-peak.txt", &text::render(&r));
}

#[test]
fn json_report() {
    let text = json::render(&report(AnalyzeOptions {
        top: 10,
        ..Default::default()
    }));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["summary"]["outstanding_bytes"],
        4096 * 2 + 1_000_000 + 300 + 24 + 512
    );
    assert_eq!(v["stacks"][0]["frames"][0]["function"], "make_leak");
    golden("report.json", &text);
}

/// The fixture's counters replaced by `lost` (reason -> count).
fn with_lost(lost: &[(&str, u64)]) -> TraceBuilder {
    let mut tb = fixture();
    tb.meta.counters.lost = lost.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    tb
}

/// The comments of the pprof profile of `r`.
fn pprof_comments(r: &Report) -> Vec<String> {
    let p = pprof::profile(r, &pprof::Context::from_maps(Vec::new()));
    p.comment
        .iter()
        .map(|&i| p.string_table[i as usize].clone())
        .collect()
}

#[test]
fn lost_events_put_every_format_in_doubt() {
    // A full ring, calls left untraced because their return could not be
    // probed safely (a newer recorder's reason), and events kept without
    // their stack, which put no figure in doubt.
    let r = report_of(
        with_lost(&[
            ("ring_full", 548_983),
            ("unsafe_return", 12),
            ("stack_failed", 4),
            ("inflight_full", 0),
            ("recursion", 0),
        ]),
        AnalyzeOptions {
            top: 10,
            ..Default::default()
        },
    );
    let warning = "548983 events lost (ring buffer full), 12 calls not traced (a signal stack \
                   above the thread's stack; tracing them could crash the program): outstanding \
                   figures are uncertain";

    // Text: the first line, not only the summary at the end.
    let text = text::render(&r);
    assert_eq!(text.lines().next().unwrap(), format!("WARNING: {warning}."));
    golden("report-lost.txt", &text);

    let v: serde_json::Value = serde_json::from_str(&json::render(&r)).unwrap();
    let s = &v["summary"];
    assert_eq!(s["uncertain"], true);
    assert_eq!(s["lost_events"]["total"], 548_983 + 12 + 4);
    assert_eq!(s["lost_events"]["missing"], 548_983 + 12);
    assert_eq!(s["lost_events"]["stackless"], 4);
    assert_eq!(s["lost_events"]["by_reason"]["unsafe_return"], 12);
    assert_eq!(s["lost_events"]["warning"], warning);

    // HTML: a banner at the top of the page, before the summary.
    let page = html::render(&r).unwrap();
    let banner = page.find("id=\"lost-events\"").expect("a loss banner");
    assert!(banner < page.find("<section id=\"summary\">").unwrap());
    assert!(page.contains(&format!(
        "<strong>Warning:</strong> {}.",
        html::escape(warning)
    )));

    assert_eq!(
        pprof_comments(&r),
        [
            "memleak analyze golden/trace.parquet".to_string(),
            format!("WARNING: {warning}"),
        ]
    );
}

#[test]
fn kept_events_and_failed_allocations_put_nothing_in_doubt() {
    let r = report_of(
        with_lost(&[
            ("stack_failed", 4),
            ("failed_alloc", 2),
            ("ring_full", 0),
            ("recursion", 0),
        ]),
        AnalyzeOptions {
            top: 10,
            ..Default::default()
        },
    );
    let text = text::render(&r);
    assert!(!text.contains("WARNING"), "{text}");
    assert!(!text.contains("uncertain"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&json::render(&r)).unwrap();
    let s = &v["summary"];
    assert_eq!(s["uncertain"], false);
    assert_eq!(s["lost_events"]["missing"], 0);
    assert_eq!(s["lost_events"]["stackless"], 4);
    assert!(s["lost_events"].get("warning").is_none(), "{s}");
    let page = html::render(&r).unwrap();
    assert!(!page.contains("lost-events"));
    assert!(!page.contains("uncertain"));
    assert_eq!(pprof_comments(&r), ["memleak analyze golden/trace.parquet"]);
}

#[test]
fn verdict_reports() {
    let all = report_of(
        scanned_fixture(),
        AnalyzeOptions {
            top: 10,
            ..Default::default()
        },
    );
    let leak = all.summary.leak.as_ref().expect("the scan applies");
    assert_eq!(
        (
            leak.totals.definitely.bytes,
            leak.totals.definitely.allocations
        ),
        (8192, 2)
    );
    assert_eq!(leak.totals.unscanned.bytes, 1_000_000 + 512);
    // Definitely lost first, though the 1 MB unscanned block is larger.
    assert_eq!(all.stacks[0].stack_id, 1);
    golden("verdicts.txt", &text::render(&all));
    golden("verdicts.json", &json::render(&all));

    let lost = report_of(
        scanned_fixture(),
        AnalyzeOptions {
            top: 10,
            verdicts: VerdictSet::parse("definitely,possibly").unwrap(),
            ..Default::default()
        },
    );
    assert_eq!(lost.summary.outstanding_bytes, 8192 + 100);
    golden("verdicts-lost.txt", &text::render(&lost));
    golden(
        "verdicts-lost.folded",
        &folded::render(&lost, Weight::Bytes),
    );

    // --at before the scan: no verdicts, and the report says why.
    let before = report_of(
        scanned_fixture(),
        AnalyzeOptions {
            at_ns: Some(5_000 * MS),
            ..Default::default()
        },
    );
    assert!(before.summary.leak.is_none());
    assert!(before.stacks.iter().all(|s| s.verdicts.is_none()));
    let note = before.summary.scan_note.as_deref().unwrap();
    assert!(note.contains("after the evaluation time"), "{note}");
}

#[test]
fn suppressions_leave_stacks_out_and_count_them() {
    let supps = suppress::parse(
        "[caches]\nverdict: reachable,indirectly\nfun: cache_insert\n\n\
         [parser]\n...\nsrc: parse.c:41\n",
        "golden.supp",
    )
    .unwrap();
    let r = report_of(
        scanned_fixture(),
        AnalyzeOptions {
            top: 10,
            suppressions: supps.clone(),
            ..Default::default()
        },
    );
    let s = &r.summary.suppressed;
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!(
        (s[0].name.as_str(), s[0].bytes, s[0].allocations),
        ("caches", 200, 2)
    );
    assert_eq!(
        (s[1].name.as_str(), s[1].bytes, s[1].allocations),
        ("parser", 24, 1)
    );
    // Stack 2 keeps its possibly lost block; stack 3 is gone.
    let st2 = r.stacks.iter().find(|s| s.stack_id == 2).unwrap();
    assert_eq!((st2.bytes, st2.count), (100, 1));
    assert!(r.stacks.iter().all(|s| s.stack_id != 3));
    golden("suppressed.txt", &text::render(&r));

    // Without a scan, a verdict-restricted entry has nothing to match.
    let r = report(AnalyzeOptions {
        suppressions: supps,
        ..Default::default()
    });
    assert_eq!(r.summary.suppressed.len(), 1);
    assert_eq!(r.summary.suppressed[0].name, "parser");
}

#[test]
fn folded_stacks() {
    let r = report(AnalyzeOptions::default());
    golden("bytes.folded", &folded::render(&r, Weight::Bytes));
    golden(
        "allocations.folded",
        &folded::render(&r, Weight::Allocations),
    );
}

#[test]
fn svg_is_well_formed_and_names_the_leaks() {
    use quick_xml::events::Event;
    let r = report(AnalyzeOptions::default());
    let svg = String::from_utf8(svg::render(&r, Weight::Bytes).unwrap()).unwrap();
    let mut reader = quick_xml::Reader::from_str(&svg);
    let mut depth = 0i64;
    let mut texts = String::new();
    loop {
        match reader.read_event() {
            Ok(Event::Start(_)) => depth += 1,
            Ok(Event::End(_)) => depth -= 1,
            Ok(Event::Text(t)) => {
                texts.push_str(&t.decode().unwrap());
                texts.push('\n');
            }
            Ok(Event::Eof) => break,
            Ok(_) => {}
            Err(e) => panic!(
                "SVG is not well-formed at {}: {e}",
                reader.buffer_position()
            ),
        }
    }
    assert_eq!(depth, 0, "unbalanced elements");
    assert!(
        texts.contains("memleak: trace.parquet, by outstanding bytes"),
        "title names trace and weight"
    );
    for f in [
        "make_leak",
        "cache_insert",
        "main",
        "kmalloc_trace",
        "fill_buffer",
    ] {
        assert!(texts.contains(f), "{f} missing from the flamegraph");
    }
    // Stack 5 freed everything: it has no outstanding bytes to draw.
    assert!(!texts.contains("worker_loop"));

    // Nothing outstanding: still a valid SVG that says so.
    let none = report(AnalyzeOptions {
        filter: Filter {
            min_size: Some(u64::MAX),
            ..Filter::default()
        },
        ..Default::default()
    });
    let svg = String::from_utf8(svg::render(&none, Weight::Bytes).unwrap()).unwrap();
    let mut reader = quick_xml::Reader::from_str(&svg);
    while !matches!(reader.read_event().unwrap(), Event::Eof) {}
    assert!(svg.contains("nothing to draw"));
}

/// The stack ids in the order each format lists them: the report's shown
/// stacks, text, JSON, pprof samples (those with outstanding allocations),
/// the HTML table; each must be the same.
fn orders(r: &Report) -> Vec<u64> {
    let shown: Vec<u64> = r.top_stacks().iter().map(|s| s.stack_id).collect();
    let text = text::render(r);
    let text_ids: Vec<u64> = text
        .lines()
        .filter_map(|l| l.split(" from stack ").nth(1))
        .map(|rest| rest.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(text_ids, shown, "text\n{text}");
    let v: serde_json::Value = serde_json::from_str(&json::render(r)).unwrap();
    let json_ids: Vec<u64> = v["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stack_id"].as_u64().unwrap())
        .collect();
    assert_eq!(json_ids, shown, "json");
    let p = pprof::profile(r, &pprof::Context::from_maps(Vec::new()));
    let pprof_ids: Vec<u64> = p
        .sample
        .iter()
        .filter(|s| s.value[0] > 0)
        .map(|s| s.label.last().unwrap().num as u64)
        .collect();
    assert_eq!(pprof_ids, shown, "pprof");
    let page = html::render(r).unwrap();
    let html_ids: Vec<u64> = page
        .split("<tr data-stack=\"")
        .skip(1)
        .map(|rest| rest[..rest.find('"').unwrap()].parse().unwrap())
        .collect();
    assert_eq!(html_ids, shown, "html");
    shown
}

/// `--sort` orders every format, with a scan too; stacks are grouped by
/// verdict only when asked, and the headers name the order used.
#[test]
fn sort_is_honoured_with_a_scan() {
    let run = |sort, group_by_verdict| {
        report_of(
            scanned_fixture(),
            AnalyzeOptions {
                top: 10,
                sort,
                group_by_verdict,
                ..Default::default()
            },
        )
    };
    // Outstanding: stack 1 1008192 bytes in 3 (definitely lost and
    // unscanned), 2 300 in 3 (indirectly, possibly, reachable), 3 24 in 1
    // (reachable), 4 512 in 1 (kernel, unscanned).
    let r = run(SortKey::Bytes, false);
    assert_eq!(orders(&r), [1, 4, 2, 3]);
    let text = text::render(&r);
    assert!(
        text.contains("Top 4 of 4 stacks with outstanding allocations, by bytes:"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&json::render(&r)).unwrap();
    assert_eq!(v["summary"]["sort"], "bytes");
    assert!(v["summary"].get("group_by").is_none());

    // By count: ties of count by bytes.
    assert_eq!(orders(&run(SortKey::Count, false)), [1, 2, 4, 3]);

    // Grouped: definitely, indirectly (worst of stack 2), reachable,
    // unscanned; the header says both.
    for r in [run(SortKey::Verdict, false), run(SortKey::Bytes, true)] {
        assert_eq!(orders(&r), [1, 2, 3, 4]);
        let text = text::render(&r);
        assert!(
            text.contains(
                "Top 4 of 4 stacks with outstanding allocations, by verdict (definitely lost \
                 first), then by bytes:"
            ),
            "{text}"
        );
        let page = html::render(&r).unwrap();
        assert!(
            page.contains("by verdict (definitely lost first), then by bytes."),
            "html header"
        );
        let v: serde_json::Value = serde_json::from_str(&json::render(&r)).unwrap();
        assert_eq!(v["summary"]["group_by"], "verdict");
    }
    let r = run(SortKey::Temporary, true);
    assert!(text::render(&r).contains(
        "stacks with temporary or outstanding allocations, by verdict (definitely lost first), \
         then by temporary:"
    ));

    // Without a scan, nothing to group by: the order is the sort's.
    let r = report(AnalyzeOptions {
        top: 10,
        sort: SortKey::Verdict,
        ..Default::default()
    });
    assert!(!r.summary.group_by_verdict);
    assert!(text::render(&r).contains("outstanding allocations, by bytes:"));
}

/// A leak of one 64-byte block every 100 ms (stack 1) and a per-request
/// buffer of 518 bytes (stack 2) allocated every 100 ms and freed 5 ms
/// later: at the peak, the last request's buffer is live. Its rise is one
/// allocation: too few samples for a verdict, not "growing".
#[test]
fn one_live_buffer_at_the_peak_is_too_few_samples() {
    let mut tb = TraceBuilder::new();
    tb.stack(1, &[0x401010]).stack(2, &[0x401300]);
    tb.frame(100, 0x401010, "leak_session", 0, "server.c", 40)
        .frame(100, 0x401300, "handle_request", 0, "server.c", 62);
    for i in 0..100u64 {
        let t = 100 + i * 100;
        tb.malloc(t, 0x10_0000 + i * 0x100, 64, 1)
            .malloc(t + 10, 0x80_0000 + i * 0x1000, 518, 2)
            .free(t + 15, 0x80_0000 + i * 0x1000);
    }
    let r = report_of(
        tb,
        AnalyzeOptions {
            at_peak: true,
            ..Default::default()
        },
    );
    let stack = |id| r.stacks.iter().find(|s| s.stack_id == id).unwrap();
    let buffer = stack(2);
    assert_eq!((buffer.bytes, buffer.count), (518, 1));
    let g = buffer.growth.as_ref().unwrap();
    assert_eq!(g.verdict, memleak_analyze::Verdict::Unknown, "{g:?}");
    // The samples alone, without what the stack holds, read as a rise.
    let window = r.timeline.as_ref().unwrap().window_ns;
    let alone = memleak_analyze::Growth::classify(g.samples.clone(), window);
    assert_eq!(
        alone.verdict,
        memleak_analyze::Verdict::Growing,
        "{alone:?}"
    );
    let leak = stack(1).growth.as_ref().unwrap();
    assert_eq!(leak.verdict, memleak_analyze::Verdict::Growing, "{leak:?}");
    let text = text::render(&r);
    let block = &text[text.find("from stack 2").unwrap()..];
    assert!(
        block.lines().nth(2).unwrap().trim() == "growth: unknown (too few samples)",
        "{text}"
    );
    assert!(!block.contains("growing"), "{text}");
    let page = html::render(&r).unwrap();
    assert!(page.contains("too few samples"));
}

/// The base64 flamegraph of `weight` (`bytes`, `count`) in the page,
/// decoded.
fn page_flamegraph(page: &str, weight: &str) -> String {
    use base64::Engine as _;
    let tag = format!("id=\"flamegraph-{weight}\">");
    let at = page.find(&tag).expect("flamegraph element") + tag.len();
    let end = at + page[at..].find("</script>").unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&page[at..end])
        .unwrap();
    String::from_utf8(bytes).unwrap()
}

/// With a scan, the HTML page leads with the LEAK SUMMARY, has a verdict
/// column, colours the flamegraph by verdict by default (definitely lost
/// red from the root to the leak) and by growth on demand, and counts
/// stacks alike everywhere.
#[test]
fn html_leads_with_the_leak_summary_and_colours_by_verdict() {
    let r = report_of(
        scanned_fixture(),
        AnalyzeOptions {
            top: 10,
            ..Default::default()
        },
    );
    let page = html::render(&r).unwrap();
    let leak = page
        .find("<section id=\"leak-summary\">")
        .expect("leak summary");
    assert!(leak < page.find("<section id=\"summary\">").unwrap());
    assert!(leak < page.find("<section id=\"flamegraph\"").unwrap());
    assert!(page.contains(
        "<dt class=\"verdict definitely\">definitely lost</dt><dd>8192 bytes (8.00 KiB) in 2 blocks</dd>"
    ));
    assert!(page.contains("<dt class=\"verdict unscanned\">unscanned</dt>"));
    // The verdict column: stack 1's worst is definitely lost.
    assert!(page.contains("<th data-numeric title=\"worst verdict first\">verdict</th>"));
    let row = &page[page.find("<tr data-stack=\"1\"").unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(
        row.contains("<span class=\"verdict definitely\">definitely lost</span>"),
        "{row}"
    );
    // Coloured by verdict by default, with both toggles and legends.
    assert!(page.contains("<section id=\"flamegraph\" data-colour=\"verdict\">"));
    assert!(page.contains("data-colour=\"growth\" aria-pressed"));
    let svg = page_flamegraph(&page, "bytes");
    assert!(svg.contains(".by-verdict rect[data-verdict=\"definitely\"]"));
    let rect_of = |name: &str| {
        let g = &svg[svg.find(&format!("<title>{name} (")).unwrap()..];
        g[..g.find("/>").unwrap()].to_string()
    };
    // The leak's frames and the root above it are definitely lost; the
    // cache's own frame is indirectly lost (its worst), the kernel's
    // unscanned.
    for f in ["make_leak", "fill_buffer", "all"] {
        assert!(
            rect_of(f).contains("data-verdict=\"definitely\""),
            "{f}: {}",
            rect_of(f)
        );
    }
    assert!(rect_of("cache_insert").contains("data-verdict=\"indirectly\""));
    assert!(rect_of("kmalloc_trace").contains("data-verdict=\"unscanned\""));
    assert!(rect_of("cache_insert").contains("data-growth=\"plateau\""));
    assert!(rect_of("make_leak").contains("data-growth=\"unknown\""));
    // Counts agree: the cards, the table's header, the flamegraphs'
    // titles and the paragraph above them.
    let n = r.summary.outstanding_stacks;
    assert_eq!(n, 4);
    assert!(page.contains(&format!(
        "<div class=\"v\">{n}</div><div class=\"k\">stacks</div>"
    )));
    assert!(page.contains(&format!("Top 4 of {n} stacks with outstanding allocations")));
    assert!(page.contains(&format!("the {n} stacks with outstanding allocations")));
    for w in ["bytes", "count"] {
        let svg = page_flamegraph(&page, w);
        assert!(svg.contains(&format!(">{n} stacks<")), "{w}");
    }
    // The inlined fill_buffer labels stack 1, not make_leak.
    assert!(row.contains("<code>fill_buffer (util.h:7)</code>"), "{row}");

    // Without a scan: no summary, no column, colours by function.
    let page = html::render(&report(AnalyzeOptions::default())).unwrap();
    assert!(!page.contains("id=\"leak-summary\""));
    assert!(!page.contains(">verdict</th>"));
    assert!(!page.contains("<button type=\"button\" data-colour=\"verdict\""));
    assert!(page.contains("<button type=\"button\" data-colour=\"growth\""));
    assert!(page.contains("<section id=\"flamegraph\" data-colour=\"function\">"));
}
