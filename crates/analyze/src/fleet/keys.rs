//! Stack keys as numbers.
//!
//! The traces of a fleet share most of their frames. Each distinct frame
//! key (the diff's [`frame_key`](crate::diff::frame_key)) gets a number
//! once, for all traces, and a stack's key is the list of its parts'
//! numbers: it hashes and compares in a fraction of the time its text
//! takes (about a kilobyte for a 15-frame stack), and is freed as one
//! small allocation. The text is made only for the merged report's
//! stacks. On the 200-host benchmark (docs/benchmarks.md) making, hashing
//! and dropping the texts of every trace's 4,000 keys took a third of the
//! analysis's CPU.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use memleak_trace::StackRecord;

use crate::diff::{FrameKeys, SEP};
use crate::frame_table::FrameTable;
use crate::hash::IntHasher;

/// A stack's key: the numbers of its parts, which [`KeyIds::text`] joins
/// into the text [`stack_key`](crate::diff::stack_key) gives.
pub(crate) type StackKey = Box<[u32]>;

/// The parts of a key that are not frames, numbered first.
const KERNEL: u32 = 0;
const TRUNCATED: u32 = 1;
const NO_STACK: u32 = 2;
const MISSING_STACK: u32 = 3;
const UNKNOWN: u32 = 4;
const FIXED: [&str; 5] = [
    "[kernel]",
    "[truncated]",
    "[no stack]",
    "[missing stack]",
    "[unknown]",
];

/// The numbers of the key parts seen so far, shared by the traces.
pub(crate) struct KeyIds {
    ids: HashMap<Box<str>, u32, BuildHasherDefault<IntHasher>>,
    texts: Vec<Box<str>>,
}

impl Default for KeyIds {
    fn default() -> KeyIds {
        let mut k = KeyIds {
            ids: HashMap::default(),
            texts: Vec::new(),
        };
        for (i, t) in FIXED.iter().enumerate() {
            assert_eq!(k.number(t), i as u32);
        }
        k
    }
}

impl KeyIds {
    fn number(&mut self, text: &str) -> u32 {
        if let Some(&id) = self.ids.get(text) {
            return id;
        }
        let id = self.texts.len() as u32;
        self.texts.push(text.into());
        self.ids.insert(text.into(), id);
        id
    }

    /// The number of every row's key of a trace's frames table.
    pub(crate) fn rows(&mut self, keys: &FrameKeys) -> Vec<u32> {
        (0..keys.len()).map(|r| self.number(keys.key(r))).collect()
    }

    /// The key's text: its parts joined as `stack_key` joins them.
    pub(crate) fn text(&self, key: &[u32]) -> String {
        let mut out = String::new();
        for (i, &id) in key.iter().enumerate() {
            if i > 0 {
                out.push_str(SEP);
            }
            out.push_str(&self.texts[id as usize]);
        }
        out
    }
}

/// The key of the stack `stack_id` of a trace whose report left it
/// without frames: `rec` is its record in the stacks table (if any),
/// `frames` the trace's frames table and `rows` its rows' numbers
/// ([`KeyIds::rows`]). Its text is the one `stack_key` gives the stack
/// with its frames resolved: whether it is a kernel stack and truncated,
/// why it has no frames, then its frames.
pub(crate) fn stack_key_ids(
    stack_id: u64,
    rec: Option<&StackRecord>,
    frames: &FrameTable,
    rows: &[u32],
) -> StackKey {
    let (kernel, truncated) = rec.map_or((false, false), |r| (r.kernel, r.truncated));
    let addrs: &[u64] = rec.map_or(&[], |r| &r.frames);
    let mut key = Vec::with_capacity(addrs.len() + 2);
    if kernel {
        key.push(KERNEL);
    }
    if truncated {
        key.push(TRUNCATED);
    }
    if addrs.is_empty() {
        key.push(if stack_id == 0 {
            NO_STACK
        } else {
            MISSING_STACK
        });
    }
    // Kernel frames are symbolized once for all processes, under pid 0.
    let pid = rec.map_or(0, |r| if r.kernel { 0 } else { r.pid });
    key.extend(
        addrs
            .iter()
            .map(|&a| frames.row(&(pid, a)).map_or(UNKNOWN, |r| rows[r])),
    );
    key.into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_text_joins_its_parts() {
        let mut ids = KeyIds::default();
        let f = ids.number("main @ m.c:3");
        assert_eq!(ids.number("main @ m.c:3"), f, "one number per text");
        assert_eq!(ids.number("[unknown]"), UNKNOWN);
        assert_eq!(
            ids.text(&[KERNEL, TRUNCATED, f, UNKNOWN]),
            "[kernel] | [truncated] | main @ m.c:3 | [unknown]"
        );
        assert_eq!(ids.text(&[NO_STACK]), "[no stack]");
        assert_eq!(
            ids.text(&[KERNEL, MISSING_STACK]),
            "[kernel] | [missing stack]"
        );
    }
}
