//! Stack interning: raw frames in, trace-unique stack ids out.
//!
//! The probes send every allocation's frames in full; deduplication happens
//! here by comparing the frames themselves, never just a hash. Two call
//! sites can therefore never share an id (bcc's stack map can: a hash
//! collision there drops the stack or hands it to the wrong site), and
//! there is no map that can fill up and freeze.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A cheap multiplicative hasher for the u64 stack digests.
#[derive(Default)]
struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100000001b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type DigestMap<V> = HashMap<u64, V, BuildHasherDefault<IdentityHasher>>;

/// Digest of a stack: pid, kind and every frame.
#[inline]
fn digest(pid: u32, kernel: bool, frames: impl Iterator<Item = u64>) -> u64 {
    let mut h = (pid as u64) << 1 | kernel as u64;
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for f in frames {
        h = (h ^ f).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
    h ^ (h >> 32)
}

struct Entry {
    id: u64,
    pid: u32,
    kernel: bool,
    frames: Box<[u64]>,
}

/// Assigns ids to distinct (pid, kernel, frames) stacks.
#[derive(Default)]
pub struct StackInterner {
    by_digest: DigestMap<Vec<Entry>>,
    next_id: u64,
    /// The stack interned last, checked first: allocation loops repeat
    /// one call site, and comparing a few frames is cheaper than hashing
    /// them and probing the map. `frames` is reused, never reallocated
    /// once grown.
    last: LastStack,
}

#[derive(Default)]
struct LastStack {
    /// 0: none (ids start at 1).
    id: u64,
    pid: u32,
    kernel: bool,
    frames: Vec<u64>,
}

/// Result of interning a stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interned {
    /// The stack's id (ids start at 1).
    pub id: u64,
    /// True when this is the first time the stack was seen.
    pub new: bool,
}

impl StackInterner {
    /// Looks up or inserts a stack.
    #[inline]
    pub fn intern<I>(&mut self, pid: u32, kernel: bool, frames: I) -> Interned
    where
        I: ExactSizeIterator<Item = u64> + Clone,
    {
        let last = &self.last;
        if last.id != 0
            && last.pid == pid
            && last.kernel == kernel
            && last.frames.len() == frames.len()
            && last.frames.iter().copied().eq(frames.clone())
        {
            return Interned {
                id: last.id,
                new: false,
            };
        }
        let found = self.intern_slow(pid, kernel, frames.clone());
        let last = &mut self.last;
        last.pid = pid;
        last.kernel = kernel;
        last.id = found.id;
        last.frames.clear();
        last.frames.extend(frames);
        found
    }

    fn intern_slow<I>(&mut self, pid: u32, kernel: bool, frames: I) -> Interned
    where
        I: ExactSizeIterator<Item = u64> + Clone,
    {
        let d = digest(pid, kernel, frames.clone());
        let bucket = self.by_digest.entry(d).or_default();
        let len = frames.len();
        for e in bucket.iter() {
            if e.pid == pid
                && e.kernel == kernel
                && e.frames.len() == len
                && e.frames.iter().copied().eq(frames.clone())
            {
                return Interned {
                    id: e.id,
                    new: false,
                };
            }
        }
        self.next_id += 1;
        let id = self.next_id;
        bucket.push(Entry {
            id,
            pid,
            kernel,
            frames: frames.collect(),
        });
        Interned { id, new: true }
    }

    /// Number of distinct stacks.
    pub fn len(&self) -> u64 {
        self.next_id
    }

    /// True when no stack was interned.
    pub fn is_empty(&self) -> bool {
        self.next_id == 0
    }

    /// Forgets the stacks of a process whose image was replaced (exec):
    /// its old addresses mean nothing now.
    pub fn forget_pid(&mut self, pid: u32) {
        if self.last.pid == pid && !self.last.kernel {
            self.last.id = 0;
        }
        for bucket in self.by_digest.values_mut() {
            bucket.retain(|e| e.pid != pid || e.kernel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_stacks_share_ids_and_different_ones_never_do() {
        let mut s = StackInterner::default();
        let a = s.intern(1, false, [1u64, 2, 3].into_iter());
        let b = s.intern(1, false, [1u64, 2, 3].into_iter());
        let c = s.intern(1, false, [1u64, 2].into_iter());
        let d = s.intern(2, false, [1u64, 2, 3].into_iter());
        let e = s.intern(1, true, [1u64, 2, 3].into_iter());
        assert_eq!(a, Interned { id: 1, new: true });
        assert_eq!(b, Interned { id: 1, new: false });
        assert_eq!([c.id, d.id, e.id], [2, 3, 4]);
        assert!(c.new && d.new && e.new);
    }

    #[test]
    fn the_last_stack_is_remembered_only_while_it_is_the_same() {
        let mut s = StackInterner::default();
        let a = s.intern(7, false, [1u64, 2, 3].into_iter());
        // Same frames, other pid or stack kind, or a prefix: not the memo.
        let b = s.intern(8, false, [1u64, 2, 3].into_iter());
        let c = s.intern(8, true, [1u64, 2, 3].into_iter());
        let d = s.intern(8, true, [1u64, 2].into_iter());
        assert_eq!([a.id, b.id, c.id, d.id], [1, 2, 3, 4]);
        // Alternating stacks keep their ids.
        for _ in 0..3 {
            assert_eq!(s.intern(7, false, [1u64, 2, 3].into_iter()).id, 1);
            assert_eq!(s.intern(8, true, [1u64, 2].into_iter()).id, 4);
        }
        // An exec forgets the pid's stacks, the memo included.
        s.intern(7, false, [1u64, 2, 3].into_iter());
        s.forget_pid(7);
        let e = s.intern(7, false, [1u64, 2, 3].into_iter());
        assert_eq!(e, Interned { id: 5, new: true });
    }

    #[test]
    fn digest_collisions_are_resolved_by_comparing_frames() {
        let mut s = StackInterner::default();
        // Force a collision by planting an entry under the digest of [9].
        let d = digest(1, false, [9u64].into_iter());
        s.by_digest.entry(d).or_default().push(Entry {
            id: 100,
            pid: 1,
            kernel: false,
            frames: Box::new([8]),
        });
        s.next_id = 100;
        let got = s.intern(1, false, [9u64].into_iter());
        assert_eq!(got, Interned { id: 101, new: true });
    }
}
