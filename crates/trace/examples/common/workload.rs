//! The synthetic two-thread malloc/free workload shared by the examples
//! (`bytes_per_event`, `write_speed`); see `bytes_per_event.rs` for what it
//! imitates.

use std::collections::HashMap;

use memleak_trace::{Event, EventKind};

/// splitmix64: small, fast, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Thread {
    tid: u32,
    top: u64,
    /// Free blocks by 16-byte size class, last freed on top.
    free: HashMap<u64, Vec<u64>>,
    /// Live blocks in allocation order: (addr, class).
    live: Vec<(u64, u64)>,
}

impl Thread {
    fn new(tid: u32, base: u64) -> Self {
        Thread {
            tid,
            top: base,
            free: HashMap::new(),
            live: Vec::new(),
        }
    }

    fn malloc(&mut self, size: u64) -> u64 {
        // glibc chunk: 8 bytes of header, 16-byte aligned, 32 bytes minimum.
        let class = ((size + 8 + 15) & !15).max(32);
        let addr = match self.free.get_mut(&class).and_then(|l| l.pop()) {
            Some(a) => a,
            None => {
                let a = self.top + 16;
                self.top += class;
                a
            }
        };
        self.live.push((addr, class));
        addr
    }

    /// Frees one of the most recent live blocks.
    fn free(&mut self, rng: &mut Rng) -> u64 {
        let n = self.live.len();
        let back = (rng.below(4) as usize).min(n - 1);
        let (addr, class) = self.live.remove(n - 1 - back);
        self.free.entry(class).or_default().push(addr);
        addr
    }
}

/// The synthetic workload: `n` events, half mallocs and half frees.
pub fn workload(n: usize, seed: u64) -> Vec<Event> {
    let mut rng = Rng(seed);
    let pid = 41_207;
    let mut threads = [
        Thread::new(pid, 0x5583_1a2b_4000),
        Thread::new(pid + 1, 0x7f3c_a400_0b10),
    ];
    let mut out = Vec::with_capacity(n);
    let mut ts: u64 = 1_734_000_000_000_000 % 10_000_000_000_000; // a few hours of uptime
    let mut cur = 0usize;
    let mut burst = 0u64;
    // Stack ids of the allocation sites, most calls from the first few.
    let stacks = [3u64, 7, 8, 12, 13, 21];
    while out.len() < n {
        if burst == 0 {
            cur ^= 1;
            burst = 1 + rng.below(64);
            ts += rng.below(20_000); // the other CPU's batch arrives
        }
        burst -= 1;
        ts += 1_000 + rng.below(2_000);
        if rng.below(1000) == 0 {
            ts += rng.below(200_000); // preemption, page fault, ...
        }
        let t = &mut threads[cur];
        let free = !t.live.is_empty() && (t.live.len() >= 8 || rng.below(2) == 0);
        if free {
            let addr = t.free(&mut rng);
            out.push(Event {
                ts_ns: ts,
                pid,
                tid: t.tid,
                kind: EventKind::Free,
                addr,
                size: 0,
                old_addr: None,
                old_size: None,
                stack_id: None,
            });
        } else {
            let size = if rng.below(100) == 0 {
                4096 + rng.below(1 << 20)
            } else {
                (4096f64.powf(rng.unit())) as u64
            }
            .max(1);
            let addr = t.malloc(size);
            let stack = stacks[(rng.unit() * rng.unit() * stacks.len() as f64) as usize];
            out.push(Event {
                ts_ns: ts,
                pid,
                tid: t.tid,
                kind: EventKind::Malloc,
                addr,
                size,
                old_addr: None,
                old_size: None,
                stack_id: Some(stack),
            });
        }
    }
    out
}
