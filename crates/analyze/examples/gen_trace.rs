//! Writes a realistic synthetic trace for benchmarks.
//!
//! ```text
//! cargo run --release -p memleak-analyze --example gen_trace -- \
//!     --events 10000000 --out /tmp/bench-10m.parquet [--max-leaked 100000]
//! ```
//!
//! For a fleet of hosts running one program (`bench/fleet.py`): `--host
//! NAME` and `--command "CMD ARGS"` go to meta.json; `--program-seed N`
//! draws the stacks from their own seed, so that every host given the same
//! one has the same stacks (and `--seed` varies only the events);
//! `--addr-shift N` moves every user frame by N bytes, as another build
//! or load address would, with the same functions, files and lines;
//! `--fleet-leak F` allocates a fraction F of the blocks from one more
//! stack, `fleet_leak` (on every host, whatever the fraction), and never
//! frees them.
//!
//! The model: a few processes with many threads each, thousands of stacks
//! of 6–24 frames, sizes skewed towards small blocks (a heavy tail up to
//! 1 MiB), a size-class allocator that reuses freed addresses LIFO (as
//! tcache does), mostly short-lived blocks freed soon by the thread that
//! made them, reallocs that grow in place or move, whole-mapping mmap and
//! munmap, some kernel slab traffic, and a few percent of allocations
//! leaked, mostly from a small set of leaky stacks. `--max-leaked` caps
//! the leaks so the outstanding set stops growing with the trace length
//! (what the peak-RSS comparison needs). Timestamps are strictly
//! increasing, so any replay order is unambiguous.

use std::path::PathBuf;

use memleak_trace::{Event, EventKind, FrameRecord, Meta, StackRecord, TraceWriter, WriterOptions};

struct Args {
    events: u64,
    out: PathBuf,
    pids: u32,
    threads: u32,
    stacks: u64,
    leak_fraction: f64,
    max_leaked: u64,
    working_set: usize,
    seed: u64,
    host: Option<String>,
    command: Vec<String>,
    program_seed: Option<u64>,
    addr_shift: u64,
    build_id: String,
    fleet_leak: f64,
}

fn parse_args() -> Args {
    let mut a = Args {
        events: 10_000_000,
        out: PathBuf::from("bench-trace.parquet"),
        pids: 4,
        threads: 64,
        stacks: 4000,
        leak_fraction: 0.03,
        max_leaked: u64::MAX,
        working_set: 256,
        seed: 42,
        host: None,
        command: Vec::new(),
        program_seed: None,
        addr_shift: 0,
        build_id: "5eed".into(),
        fleet_leak: 0.0,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--events" => a.events = v.replace('_', "").parse().expect("--events N"),
            "--out" => a.out = PathBuf::from(v),
            "--pids" => a.pids = v.parse().expect("--pids N"),
            "--threads" => a.threads = v.parse().expect("--threads N"),
            "--stacks" => a.stacks = v.parse().expect("--stacks N"),
            "--leak-fraction" => a.leak_fraction = v.parse().expect("--leak-fraction F"),
            "--max-leaked" => a.max_leaked = v.replace('_', "").parse().expect("--max-leaked N"),
            "--working-set" => a.working_set = v.parse().expect("--working-set N"),
            "--seed" => a.seed = v.parse().expect("--seed N"),
            "--host" => a.host = Some(v),
            "--command" => a.command = v.split_whitespace().map(str::to_string).collect(),
            "--program-seed" => a.program_seed = Some(v.parse().expect("--program-seed N")),
            "--addr-shift" => a.addr_shift = v.parse().expect("--addr-shift N"),
            "--build-id" => a.build_id = v,
            "--fleet-leak" => a.fleet_leak = v.parse().expect("--fleet-leak F"),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

/// xorshift64*: fast, deterministic, good enough for workloads.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() >> 32) * n) >> 32
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    /// Skewed towards 0: the minimum of two uniforms.
    fn skewed(&mut self, n: u64) -> u64 {
        self.below(n).min(self.below(n))
    }
}

/// Sizes: mostly small, a heavy tail (log-uniform-ish) up to 1 MiB.
fn size(rng: &mut Rng) -> u64 {
    let class = match rng.below(100) {
        0..=59 => 4 + rng.below(4),   // 16..255
        60..=89 => 8 + rng.below(4),  // 256..4 KiB
        90..=98 => 12 + rng.below(5), // 4..128 KiB
        _ => 17 + rng.below(4),       // 128 KiB..1 MiB
    };
    (1 << class) + rng.below(1 << class)
}

/// A process's heap: size classes with LIFO free lists and a bump pointer.
struct Heap {
    free: Vec<Vec<u64>>,
    top: u64,
}

impl Heap {
    fn new(base: u64) -> Self {
        Heap {
            free: vec![Vec::new(); 64],
            top: base,
        }
    }
    fn class(size: u64) -> usize {
        (64 - size.max(16).leading_zeros()) as usize
    }
    fn alloc(&mut self, size: u64) -> u64 {
        let c = Self::class(size);
        if let Some(a) = self.free[c].pop() {
            return a;
        }
        let a = self.top;
        self.top += 1 << c;
        a
    }
    fn release(&mut self, addr: u64, size: u64) {
        self.free[Self::class(size)].push(addr);
    }
}

struct Live {
    addr: u64,
    size: u64,
}

fn main() {
    let a = parse_args();
    let mut rng = Rng(a.seed.max(1));
    let t0: u64 = 5_000_000_000_000;
    let mut command = vec!["gen_trace".to_string()];
    if !a.command.is_empty() {
        command.push("--".into());
        command.extend(a.command.iter().cloned());
    }
    let meta = Meta {
        start_ns: t0,
        pids: (0..a.pids).map(|p| 1000 + p).collect(),
        command,
        host: a.host.clone().unwrap_or_default(),
        options: match a.command.is_empty() {
            true => serde_json::Value::Null,
            false => serde_json::json!({ "target_command": a.command }),
        },
        ..Meta::default()
    };
    let opts = WriterOptions {
        force: true,
        // A synthetic trace written at full speed: no checkpoints, so its
        // layout (and the benchmarks on it) does not depend on how fast
        // this machine writes it.
        segment_duration: std::time::Duration::from_secs(1 << 20),
        ..WriterOptions::default()
    };
    let mut w = TraceWriter::create(&a.out, meta, opts).expect("create trace");

    // Stacks: user stacks spread over the processes, plus 5% kernel ones
    // (and the fleet leak's, last).
    let mut program_rng = a.program_seed.map(|s| Rng(s.max(1)));
    let funcs_per_binary = 2000u64;
    let frame_addr = |f: u64, off: u64| 0x40_0000 + a.addr_shift + f * 0x200 + off;
    let mut stack_pid = Vec::new(); // index = stack_id - 1
    let mut frames_seen = std::collections::HashSet::new();
    let kernel_stacks = (a.stacks / 20).max(1);
    let build_id = a.build_id.clone();
    let srng = match program_rng.as_mut() {
        Some(p) => p,
        None => &mut rng,
    };
    for id in 1..=a.stacks {
        let kernel = id > a.stacks - kernel_stacks;
        let pid = if kernel {
            0
        } else {
            1000 + (id % a.pids as u64) as u32
        };
        let depth = 6 + srng.below(19);
        let frames: Vec<u64> = (0..depth)
            .map(|d| {
                let f = if d + 2 >= depth {
                    srng.below(8)
                } else {
                    srng.skewed(funcs_per_binary)
                };
                let addr = if kernel {
                    0xffff_ffff_8100_0000 + f * 0x400 + 0x2b
                } else {
                    frame_addr(f, 0x1b + d * 4)
                };
                (addr, f)
            })
            .map(|(addr, f)| {
                if frames_seen.insert((pid, addr)) {
                    let rec = FrameRecord {
                        pid,
                        addr,
                        build_id: Some(build_id.clone()),
                        path: Some(if kernel {
                            "vmlinux".into()
                        } else {
                            "/usr/bin/bench-app".into()
                        }),
                        file_offset: Some(addr & 0xff_ffff),
                        function: Some(format!("{}fn_{f}", if kernel { "k" } else { "" })),
                        func_offset: Some(addr & 0x1ff),
                        file: Some(format!("src/mod_{}.c", f % 50)),
                        line: Some(10 + (f % 500) as u32),
                        column: None,
                        inlined: Vec::new(),
                    };
                    w.push_frame(&rec).expect("frame");
                }
                addr
            })
            .collect();
        w.push_stack(&StackRecord {
            stack_id: id,
            pid,
            kernel,
            truncated: false,
            frames,
        })
        .expect("stack");
        stack_pid.push(pid);
    }
    // The fleet leak's stack, of the first process: a function of its own
    // above three of the program's.
    let fleet_stack = a.stacks + 1;
    let fleet_frames: Vec<u64> = (0..4u64)
        .map(|d| {
            let f = [funcs_per_binary, 3, 2, 1][d as usize];
            let addr = frame_addr(f, 0x1b + d * 4);
            if frames_seen.insert((1000, addr)) {
                w.push_frame(&FrameRecord {
                    pid: 1000,
                    addr,
                    build_id: Some(build_id.clone()),
                    path: Some("/usr/bin/bench-app".into()),
                    file_offset: Some(addr & 0xff_ffff),
                    function: Some(if d == 0 {
                        "fleet_leak".into()
                    } else {
                        format!("fn_{f}")
                    }),
                    func_offset: Some(addr & 0x1ff),
                    file: Some(if d == 0 {
                        "src/leak.c".into()
                    } else {
                        format!("src/mod_{}.c", f % 50)
                    }),
                    line: Some(if d == 0 { 42 } else { 10 + (f % 500) as u32 }),
                    column: None,
                    inlined: Vec::new(),
                })
                .expect("frame");
            }
            addr
        })
        .collect();
    w.push_stack(&StackRecord {
        stack_id: fleet_stack,
        pid: 1000,
        kernel: false,
        truncated: false,
        frames: fleet_frames,
    })
    .expect("stack");
    let user_stacks: Vec<u64> = (1..=a.stacks - kernel_stacks).collect();
    let kstacks: Vec<u64> = (a.stacks - kernel_stacks + 1..=a.stacks).collect();
    // A stack of each process, for picking a stack of the right pid.
    let mut by_pid: Vec<Vec<u64>> = vec![Vec::new(); a.pids as usize];
    for &s in &user_stacks {
        by_pid[(stack_pid[s as usize - 1] - 1000) as usize].push(s);
    }
    let leaky: Vec<Vec<u64>> = by_pid
        .iter()
        .map(|v| v.iter().copied().filter(|s| s % 23 == 0).collect())
        .collect();

    let mut heaps: Vec<Heap> = (0..a.pids)
        .map(|p| Heap::new(0x5500_0000_0000 + (p as u64) * 0x100_0000_0000))
        .collect();
    let mut maps_top: Vec<u64> = (0..a.pids)
        .map(|p| 0x7f00_0000_0000 + (p as u64) * 0x10_0000_0000)
        .collect();
    let nthreads = a.threads as usize;
    let mut live: Vec<Vec<Live>> = (0..nthreads).map(|_| Vec::new()).collect();
    let mut mapped: Vec<Vec<Live>> = (0..a.pids).map(|_| Vec::new()).collect();
    let mut klive: Vec<(u64, u64)> = Vec::new();
    let mut kfree_list: Vec<u64> = Vec::new();
    let mut ktop: u64 = 0xffff_8880_1000_0000;
    let mut leaked = 0u64;
    let mut ts = t0;
    let mut n = 0u64;
    let push = |w: &mut TraceWriter, ev: Event, n: &mut u64| {
        w.push_event(&ev).expect("event");
        *n += 1;
    };
    let pick = |rng: &mut Rng, v: &Vec<u64>| v[rng.skewed(v.len() as u64) as usize];

    while n < a.events {
        ts += 1 + rng.below(2000);
        let t = rng.skewed(nthreads as u64) as usize;
        let pidx = t % a.pids as usize;
        let pid = 1000 + pidx as u32;
        let tid = pid * 100 + t as u32;
        let ev = |kind: EventKind, addr: u64, size: u64, stack: Option<u64>| Event {
            ts_ns: ts,
            pid,
            tid,
            kind,
            addr,
            size,
            old_addr: None,
            old_size: None,
            stack_id: stack,
        };
        let r = rng.below(1000);
        if r < 20 {
            // Kernel slab traffic, in the context of whatever task runs.
            if klive.len() < 4096 && (rng.chance(0.55) || klive.is_empty()) {
                let sz = 32 << rng.below(6);
                let addr = kfree_list.pop().unwrap_or_else(|| {
                    ktop += 0x1000;
                    ktop
                });
                let stack = pick(&mut rng, &kstacks);
                let kind = if rng.chance(0.5) {
                    EventKind::Kmalloc
                } else {
                    EventKind::KmemCacheAlloc
                };
                push(&mut w, ev(kind, addr, sz, Some(stack)), &mut n);
                if leaked < a.max_leaked && rng.chance(a.leak_fraction) {
                    leaked += 1;
                } else {
                    klive.push((addr, sz));
                }
            } else {
                let i = rng.below(klive.len() as u64) as usize;
                let (addr, _) = klive.swap_remove(i);
                kfree_list.push(addr);
                push(&mut w, ev(EventKind::Kfree, addr, 0, None), &mut n);
            }
            continue;
        }
        if r < 23 {
            // Whole mappings, mapped and unmapped.
            let m = &mut mapped[pidx];
            if m.len() < 64 && (rng.chance(0.5) || m.is_empty()) {
                let sz = (1 + rng.below(64)) << 12;
                let addr = maps_top[pidx];
                maps_top[pidx] += sz + 0x1000;
                let stack = pick(&mut rng, &by_pid[pidx]);
                push(&mut w, ev(EventKind::Mmap, addr, sz, Some(stack)), &mut n);
                if leaked < a.max_leaked && rng.chance(a.leak_fraction) {
                    leaked += 1;
                } else {
                    m.push(Live { addr, size: sz });
                }
            } else {
                let i = rng.below(m.len() as u64) as usize;
                let b = m.swap_remove(i);
                push(&mut w, ev(EventKind::Munmap, b.addr, b.size, None), &mut n);
            }
            continue;
        }
        let set = &mut live[t];
        let want_alloc =
            set.is_empty() || (set.len() < a.working_set && rng.chance(0.5)) || rng.chance(0.02);
        if r < 70 && !set.is_empty() {
            // realloc: grow in place half the time, else move.
            let i = set.len() - 1 - rng.skewed(set.len() as u64) as usize;
            let old = set[i].addr;
            let new_size = set[i].size + size(&mut rng) / 2;
            let heap = &mut heaps[pidx];
            let new = if rng.chance(0.5) {
                old
            } else {
                heap.alloc(new_size)
            };
            if new != old {
                heap.release(old, set[i].size);
            }
            let stack = pick(&mut rng, &by_pid[pidx]);
            let mut e = ev(EventKind::Realloc, new, new_size, Some(stack));
            e.old_addr = Some(old);
            push(&mut w, e, &mut n);
            set[i] = Live {
                addr: new,
                size: new_size,
            };
        } else if a.fleet_leak > 0.0 && rng.chance(a.fleet_leak) {
            let sz = 4096 + rng.below(4096);
            let addr = heaps[pidx].alloc(sz);
            push(
                &mut w,
                ev(EventKind::Malloc, addr, sz, Some(fleet_stack)),
                &mut n,
            );
            leaked += 1;
        } else if want_alloc {
            let sz = size(&mut rng);
            let heap = &mut heaps[pidx];
            let addr = heap.alloc(sz);
            let leak = leaked < a.max_leaked && rng.chance(a.leak_fraction);
            let stack = if leak && rng.chance(0.8) {
                pick(&mut rng, &leaky[pidx])
            } else {
                pick(&mut rng, &by_pid[pidx])
            };
            let kind = match rng.below(10) {
                0 => EventKind::Calloc,
                1 | 2 => EventKind::New,
                _ => EventKind::Malloc,
            };
            push(&mut w, ev(kind, addr, sz, Some(stack)), &mut n);
            if leak {
                leaked += 1;
            } else {
                set.push(Live { addr, size: sz });
            }
        } else {
            // Mostly recent blocks die first.
            let i = set.len() - 1 - rng.skewed(set.len() as u64) as usize;
            let b = set.swap_remove(i);
            heaps[pidx].release(b.addr, b.size);
            let kind = if rng.chance(0.3) {
                EventKind::Delete
            } else {
                EventKind::Free
            };
            push(&mut w, ev(kind, b.addr, 0, None), &mut n);
        }
    }
    w.meta_mut().end_ns = ts + 1_000_000;
    let meta = w.finish().expect("finish");
    eprintln!(
        "wrote {} events ({} leaked blocks) to {} spanning {:.2}s",
        meta.counters.events_total(),
        leaked,
        a.out.display(),
        (ts - t0) as f64 / 1e9
    );
}
