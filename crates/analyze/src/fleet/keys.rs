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

use memleak_trace::StackRef;

use crate::diff::{basename, normalize_function, push_row_key, MatchOptions, SEP};
use crate::frame_table::FrameTable;
use crate::hash::{int_map, IntHasher, IntMap};

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
    /// Normalized function names and source files' base names, numbered.
    names: HashMap<Box<str>, u32, BuildHasherDefault<IntHasher>>,
    /// The key number of a frame with a function, a source file (or
    /// none) and a line (or none), and no inlined function: by the
    /// numbers of its names ([`KeyIds::rows`]).
    located: IntMap<(u64, u64), u32>,
}

impl Default for KeyIds {
    fn default() -> KeyIds {
        let mut k = KeyIds {
            ids: HashMap::default(),
            texts: Vec::new(),
            names: HashMap::default(),
            located: int_map(),
        };
        for (i, t) in FIXED.iter().enumerate() {
            assert_eq!(k.number(t), i as u32);
        }
        k
    }
}

/// The number of `text` in `map`: the next one if `text` is new.
fn intern(map: &mut HashMap<Box<str>, u32, BuildHasherDefault<IntHasher>>, text: &str) -> u32 {
    if let Some(&id) = map.get(text) {
        return id;
    }
    let id = map.len() as u32;
    map.insert(text.into(), id);
    id
}

/// The number [`KeyIds::name`] has not given yet.
const UNSEEN: u32 = u32::MAX;

impl KeyIds {
    fn number(&mut self, text: &str) -> u32 {
        let id = intern(&mut self.ids, text);
        if id as usize == self.texts.len() {
            self.texts.push(text.into());
        }
        id
    }

    fn name(&mut self, name: &str) -> u32 {
        intern(&mut self.names, name)
    }

    /// The number of every row's key of a trace's frames table (the
    /// diff's [`frame_key`](crate::diff::frame_key)).
    ///
    /// A frame with a function and no inlined function, nearly every
    /// frame, is found by the numbers of its function's name and source
    /// file's base name, each made once per entry of the table's
    /// dictionaries, and its line: its text is made only the first time
    /// the fleet sees it. On the 200-host benchmark, making every row's
    /// text and hashing it took an eighth of the analysis's CPU.
    pub(crate) fn rows(&mut self, frames: &FrameTable, opts: MatchOptions) -> Vec<u32> {
        let columns = frames.columns();
        let mut out = Vec::with_capacity(columns.len());
        let mut text = String::new();
        for b in columns.batches() {
            let (functions, files) = (b.function(), b.file());
            let mut function_ids = vec![UNSEEN; functions.entries()];
            let mut file_ids = vec![UNSEEN; files.entries()];
            for i in 0..b.len() {
                let row = b.row(i);
                let located = match functions.key(i) {
                    Some(f) if !row.has_inlined() => {
                        if function_ids[f] == UNSEEN {
                            function_ids[f] = self.name(normalize_function(functions.value(f)));
                        }
                        // 0 for no file, else 1 + its number; the line
                        // shows only after a file.
                        let (file, line) = match files.key(i) {
                            Some(s) => {
                                if file_ids[s] == UNSEEN {
                                    file_ids[s] = self.name(basename(files.value(s)));
                                }
                                let line = match (row.line(), opts.ignore_lines) {
                                    (Some(l), false) => 1 + l as u64,
                                    _ => 0,
                                };
                                (1 + file_ids[s] as u64, line)
                            }
                            None => (0, 0),
                        };
                        Some(((function_ids[f] as u64) << 32 | file, line))
                    }
                    _ => None,
                };
                if let Some(&id) = located.as_ref().and_then(|k| self.located.get(k)) {
                    out.push(id);
                    continue;
                }
                text.clear();
                push_row_key(&mut text, row, opts);
                let id = self.number(&text);
                if let Some(k) = located {
                    self.located.insert(k, id);
                }
                out.push(id);
            }
        }
        out
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
    rec: Option<StackRef<'_>>,
    frames: &FrameTable,
    rows: &[u32],
) -> StackKey {
    let (kernel, truncated) = rec.map_or((false, false), |r| (r.kernel, r.truncated));
    let addrs: &[u64] = rec.map_or(&[], |r| r.frames);
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
    use crate::diff::frame_key;
    use memleak_trace::{FrameRecord, InlinedFrame, Meta, Trace, TraceWriter, WriterOptions};

    /// Frames of every shape a key is made from, in two traces (as two
    /// hosts): a function with and without file and line, gcc's clones,
    /// one name in two directories, inlined functions, frames without a
    /// function (with and without an object), repeated in the second
    /// trace at other addresses and in another order.
    fn frames() -> Vec<FrameRecord> {
        let f = |function: Option<&str>, file: Option<&str>, line: Option<u32>| FrameRecord {
            pid: 7,
            addr: 0,
            build_id: Some("b1".into()),
            path: Some("/usr/lib/libx.so".into()),
            file_offset: Some(0x40),
            function: function.map(Into::into),
            func_offset: Some(3),
            file: file.map(Into::into),
            line,
            column: None,
            inlined: Vec::new(),
        };
        let mut v = vec![
            f(Some("main"), Some("/src/a/m.c"), Some(3)),
            f(Some("main"), Some("/other/m.c"), Some(3)),
            f(Some("main"), Some("/src/a/m.c"), Some(4)),
            f(Some("main"), Some("/src/a/m.c"), None),
            f(Some("main"), None, Some(4)),
            f(Some("main"), None, None),
            f(Some("main.isra.0"), Some("/src/a/m.c"), Some(3)),
            f(Some("parse"), Some("/src/a/p.c"), Some(3)),
            f(None, Some("/src/a/p.c"), Some(3)),
            f(None, None, None),
        ];
        let mut inl = f(Some("main"), Some("/src/a/m.c"), Some(3));
        inl.inlined.push(InlinedFrame {
            function: "helper".into(),
            file: Some("/src/a/h.h".into()),
            line: Some(9),
            column: None,
        });
        v.push(inl);
        let mut no_object = f(None, None, None);
        no_object.path = None;
        v.push(no_object);
        let mut other_offset = f(None, None, None);
        other_offset.file_offset = Some(0x80);
        v.push(other_offset);
        for (i, r) in v.iter_mut().enumerate() {
            r.addr = 0x1000 + 16 * i as u64;
        }
        v
    }

    fn frame_of(f: &FrameRecord) -> crate::model::Frame {
        crate::model::Frame {
            addr: f.addr,
            function: f.function.clone(),
            offset: f.func_offset,
            file: f.file.clone(),
            line: f.line,
            column: f.column,
            path: f.path.clone(),
            file_offset: f.file_offset,
            build_id: f.build_id.clone(),
            inlined: f.inlined.clone(),
        }
    }

    fn table(dir: &std::path::Path, frames: &[FrameRecord]) -> FrameTable {
        let path = dir.join("t.parquet");
        let mut w = TraceWriter::create(&path, Meta::default(), WriterOptions::default()).unwrap();
        for f in frames {
            w.push_frame(f).unwrap();
        }
        w.finish().unwrap();
        FrameTable::new(Trace::open(&path).unwrap().frame_columns().unwrap())
    }

    #[test]
    fn rows_are_numbered_by_their_frame_keys() {
        for opts in [MatchOptions::default(), MatchOptions { ignore_lines: true }] {
            let mut ids = KeyIds::default();
            let first = frames();
            let mut second = first.clone();
            second.reverse();
            for r in &mut second {
                r.addr += 0x10_0000;
            }
            for frames in [&first, &second, &first] {
                let dir = tempfile::tempdir().unwrap();
                let rows = ids.rows(&table(dir.path(), frames), opts);
                assert_eq!(rows.len(), frames.len());
                for (f, &id) in frames.iter().zip(&rows) {
                    let want = frame_key(&frame_of(f), opts);
                    assert_eq!(ids.text(&[id]), want, "{f:?}");
                }
                // Equal keys, equal numbers.
                for (a, &x) in frames.iter().zip(&rows) {
                    for (b, &y) in frames.iter().zip(&rows) {
                        let (ka, kb) =
                            (frame_key(&frame_of(a), opts), frame_key(&frame_of(b), opts));
                        assert_eq!(ka == kb, x == y, "{ka} / {kb}");
                    }
                }
            }
        }
    }

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
