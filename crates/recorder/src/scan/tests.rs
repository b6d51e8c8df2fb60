//! The marking on a fake address space: known pointer shapes, exact
//! verdicts (the shapes of valgrind's leak tests).

use super::mem::Memory;
use super::*;

/// Regions of fake memory; anything else reads as zeros.
#[derive(Default)]
struct Fake {
    regions: Vec<(u64, Vec<u8>)>,
}

impl Fake {
    fn put(&mut self, addr: u64, words: &[u64]) {
        let bytes = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        self.regions.push((addr, bytes));
    }
}

impl Memory for Fake {
    fn read(&mut self, ranges: &[(u64, u64)], out: &mut Vec<u8>) -> Result<(), ScanError> {
        out.clear();
        for &(a, l) in ranges {
            for k in 0..l {
                let x = a + k;
                let byte = self
                    .regions
                    .iter()
                    .find(|(s, b)| x >= *s && x < s + b.len() as u64)
                    .map_or(0, |(s, b)| b[(x - s) as usize]);
                out.push(byte);
            }
        }
        Ok(())
    }
}

const ROOT: u64 = 0x1000;
const HEAP: u64 = 0x10_0000;

fn block(i: u64, size: u64) -> Block {
    Block {
        addr: HEAP + i * 0x100,
        size,
        is_mapping: false,
    }
}

fn run(fake: &mut Fake, blocks: &[Block], root_words: usize) -> Vec<Verdict> {
    let maps = vec![crate::procmaps::Mapping {
        start: ROOT,
        end: ROOT + root_words as u64 * 8,
        perms: "rw-p".into(),
        offset: 0,
        inode: 1,
        path: Some("/fake/libdata.so".into()),
    }];
    scan_with(fake, &maps, &[], &[], blocks, &ScanOptions::default())
        .unwrap()
        .verdicts
}

use Verdict::*;

#[test]
fn a_chain_from_a_root_is_reachable_and_an_unreferenced_block_is_definitely_lost() {
    let b: Vec<Block> = (0..3).map(|i| block(i, 64)).collect();
    let mut f = Fake::default();
    f.put(ROOT, &[b[0].addr]);
    f.put(b[0].addr, &[0, b[1].addr]);
    assert_eq!(run(&mut f, &b, 1), [Reachable, Reachable, DefinitelyLost]);
}

#[test]
fn interior_pointers_make_possibly_lost_and_what_such_blocks_reach_too() {
    let b: Vec<Block> = (0..3).map(|i| block(i, 64)).collect();
    let mut f = Fake::default();
    // An interior pointer to 0 (offset 16: no heuristic fits), whose
    // start pointer to 1 is only as good as 0's reachability.
    f.put(ROOT, &[b[0].addr + 16]);
    f.put(b[0].addr, &[b[1].addr]);
    // 2: an interior pointer first, then a start pointer: reachable.
    f.put(ROOT + 8, &[b[2].addr + 32, b[2].addr]);
    assert_eq!(run(&mut f, &b, 3), [PossiblyLost, PossiblyLost, Reachable]);
}

#[test]
fn a_lost_cycle_has_one_definitely_lost_leader() {
    let b: Vec<Block> = (0..2).map(|i| block(i, 16)).collect();
    let mut f = Fake::default();
    f.put(b[0].addr, &[b[1].addr]);
    f.put(b[1].addr, &[b[0].addr]);
    assert_eq!(run(&mut f, &b, 1), [DefinitelyLost, IndirectlyLost]);
}

#[test]
fn a_tree_lost_at_its_root_is_one_definitely_and_the_rest_indirectly_lost() {
    // Root at the highest address, so that its children are visited
    // (and would lead cliques) first: a later leader takes them over.
    let b: Vec<Block> = (0..7).map(|i| block(i, 16)).collect();
    let mut f = Fake::default();
    f.put(b[6].addr, &[b[4].addr, b[5].addr]);
    f.put(b[4].addr, &[b[0].addr, b[1].addr]);
    f.put(b[5].addr, &[b[2].addr + 8, b[3].addr]); // interior: still indirect
    let v = run(&mut f, &b, 1);
    assert_eq!(v.iter().filter(|&&v| v == DefinitelyLost).count(), 1);
    assert_eq!(v[6], DefinitelyLost);
    assert_eq!(v.iter().filter(|&&v| v == IndirectlyLost).count(), 6);
}

#[test]
fn memchecks_heuristics_count_as_start_pointers() {
    // new[]: the element count first, the pointer past it; length64 and
    // std::string (old ABI: length, capacity, refcount, characters).
    let mut b = vec![block(0, 8 + 10 * 4), block(1, 24 + 5 + 1), block(2, 64)];
    b.push(block(3, 8 + 12));
    let mut f = Fake::default();
    f.put(b[0].addr, &[10]);
    f.put(b[1].addr, &[3, 5, 0]);
    f.put(b[2].addr, &[9]); // 56 bytes are not 9 elements: no new[]
    f.put(b[3].addr, &[12]);
    f.put(
        ROOT,
        &[b[0].addr + 8, b[1].addr + 24, b[2].addr + 8, b[3].addr + 8],
    );
    assert_eq!(
        run(&mut f, &b, 4),
        [Reachable, Reachable, PossiblyLost, Reachable]
    );
    let maps = vec![crate::procmaps::Mapping {
        start: ROOT,
        end: ROOT + 32,
        perms: "rw-p".into(),
        offset: 0,
        inode: 1,
        path: Some("/fake/libdata.so".into()),
    }];
    let off = ScanOptions {
        heuristics: false,
        ..ScanOptions::default()
    };
    let v = scan_with(&mut f, &maps, &[], &[], &b, &off)
        .unwrap()
        .verdicts;
    assert_eq!(v, [PossiblyLost; 4]);
}

#[test]
fn mmap_blocks_are_roots_as_for_memcheck_and_contents_are_kept_for_lost_blocks() {
    let b = vec![
        block(0, 16),
        block(1, 16),
        Block {
            addr: 0x20_0000,
            size: 0x1000,
            is_mapping: true,
        },
    ];
    let mut f = Fake::default();
    // The mmap block lies inside a rw mapping; it points to block 0 and
    // nothing points to it. memcheck scans every rw mapping: block 0 is
    // reachable from it, while the mapping itself, which no word points
    // to, is lost.
    f.put(0x20_0000, &[b[0].addr]);
    f.put(b[1].addr, &[0x4142_4344_4546_4748, 0]);
    f.put(ROOT, &[b[1].addr]);
    let maps = vec![
        crate::procmaps::Mapping {
            start: ROOT,
            end: ROOT + 8,
            perms: "rw-p".into(),
            offset: 0,
            inode: 1,
            path: Some("/fake/libdata.so".into()),
        },
        crate::procmaps::Mapping {
            start: HEAP,
            end: HEAP + 0x1000,
            perms: "rw-p".into(),
            offset: 0,
            inode: 0,
            path: Some("[heap]".into()),
        },
        crate::procmaps::Mapping {
            start: 0x1f_f000,
            end: 0x20_2000,
            perms: "rw-p".into(),
            offset: 0,
            inode: 0,
            path: None,
        },
    ];
    let opts = ScanOptions {
        contents: 4,
        ..ScanOptions::default()
    };
    let out = scan_with(&mut f, &maps, &[], &[], &b, &opts).unwrap();
    assert_eq!(out.verdicts, [Reachable, Reachable, DefinitelyLost]);
    assert_eq!(out.contents[0], None);
    assert_eq!(out.contents[1], None);
    assert_eq!(out.contents[2], Some(b[0].addr.to_ne_bytes()[..4].to_vec()));
    // Roots: the data word and the whole anonymous mapping.
    assert_eq!(out.stats.roots_bytes, 8 + 0x3000);
}

fn anon(start: u64, end: u64, path: Option<&str>) -> crate::procmaps::Mapping {
    crate::procmaps::Mapping {
        start,
        end,
        perms: "rw-p".into(),
        offset: 0,
        inode: u64::from(path.is_some_and(|p| p.starts_with('/'))),
        path: path.map(String::from),
    }
}

#[test]
fn an_exited_threads_stack_is_read_from_its_last_stack_pointer_up() {
    let b: Vec<Block> = (0..2).map(|i| block(i, 64)).collect();
    let (s, e) = (0x7000_0000u64, 0x7000_4000u64);
    let mut f = Fake::default();
    f.put(s + 0x1000, &[b[0].addr]); // a dead frame, below the last SP
    f.put(s + 0x2800, &[b[1].addr]); // the thread's last frames
    let tcb = s + 0x3f00;
    f.put(tcb, &[tcb]); // glibc's TCB points to itself
    let maps = vec![anon(s, e, None)];
    let exited = [ExitedThread {
        sp: s + 0x2100,
        fs_base: tcb,
    }];
    let v = scan_with(&mut f, &maps, &[], &exited, &b, &ScanOptions::default())
        .unwrap()
        .verdicts;
    assert_eq!(v, [DefinitelyLost, Reachable]);
    // Without the note of its exit, the mapping is read whole.
    let v = scan_with(&mut f, &maps, &[], &[], &b, &ScanOptions::default())
        .unwrap()
        .verdicts;
    assert_eq!(v, [Reachable, Reachable]);
}

#[test]
fn glibcs_main_arena_is_not_a_root() {
    // A block whose last bytes hold the top chunk's address: main_arena's
    // `top` points into it.
    let b = vec![block(0, 1234)];
    let (s, e) = (0x7f00_0000u64, 0x7f00_2000u64);
    let x = s + 0x800; // main_arena
    let mut f = Fake::default();
    let mut state = vec![0u64; 2200 / 8];
    state[96 / 8] = b[0].addr + 1232; // top
    for k in 0..127 {
        let own = x + 96 + 16 * k;
        state[(112 + 16 * k as usize) / 8] = own;
        state[(120 + 16 * k as usize) / 8] = own;
    }
    state[2160 / 8] = x; // next: the only arena
    f.put(x, &state);
    let maps = vec![anon(s, e, Some("/usr/lib/x86_64-linux-gnu/libc.so.6"))];
    let v = scan_with(&mut f, &maps, &[], &[], &b, &ScanOptions::default())
        .unwrap()
        .verdicts;
    assert_eq!(v, [DefinitelyLost]);
    // The same words in another library's data are a root.
    let maps = vec![anon(s, e, Some("/usr/lib/libother.so"))];
    let v = scan_with(&mut f, &maps, &[], &[], &b, &ScanOptions::default())
        .unwrap()
        .verdicts;
    assert_eq!(v, [PossiblyLost]);
}

#[test]
fn another_allocators_heap_is_not_a_root_and_glibcs_mmapped_chunks_are_blocks() {
    // jemalloc's slab: blocks side by side, its metadata pointing at them.
    let (s, e) = (0x6000_0000u64, 0x6020_0000u64);
    let slab = vec![
        Block {
            addr: s + 0x1000,
            size: 16,
            is_mapping: false,
        },
        Block {
            addr: s + 0x1010,
            size: 16,
            is_mapping: false,
        },
    ];
    let mut f = Fake::default();
    f.put(s, &[slab[0].addr, slab[1].addr]);
    let maps = vec![anon(s, e, None)];
    let v = scan_with(&mut f, &maps, &[], &[], &slab, &ScanOptions::default())
        .unwrap()
        .verdicts;
    assert_eq!(v, [DefinitelyLost, DefinitelyLost]);
    // A glibc mmapped chunk (header: 0, size | IS_MMAPPED) in a mapping
    // it shares with memory ld.so mapped, which points to it: a root.
    let chunk = s + 0x10_0000;
    let big = vec![Block {
        addr: chunk + 16,
        size: 0x1_0000 - 16,
        is_mapping: false,
    }];
    let mut f = Fake::default();
    f.put(chunk, &[0, 0x1_0000 | 2]);
    f.put(s + 8, &[big[0].addr]);
    let v = scan_with(&mut f, &maps, &[], &[], &big, &ScanOptions::default())
        .unwrap()
        .verdicts;
    assert_eq!(v, [Reachable]);
}
