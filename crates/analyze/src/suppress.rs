//! Suppressions: named lists of frame patterns whose matching stacks are
//! left out of the reports and counted apart, as valgrind's suppression
//! files do for leaks the program cannot help (runtime caches and pools).
//!
//! The syntax (docs/analyzer.md, "Suppressions") is valgrind's, made
//! simpler: an entry starts with `[name]`; then optional `verdict:` and
//! `kind:` lines restrict it; then one line per frame, innermost first:
//! `fun:GLOB` (function), `obj:GLOB` (object path), `src:GLOB` (`file:line`
//! or `file`), or `...` for any number of frames. A stack matches when the
//! patterns match its frames from the innermost one (the caller of the
//! allocator); frames past the last pattern do not matter. Globs have `*`
//! and `?`. Inlined functions count as frames of their own, innermost
//! first, before the function they were inlined into.
//!
//! The default file, `default.supp` in this crate, covers what the C and
//! C++ runtimes keep on purpose; `memleak analyze` applies it unless
//! `--no-default-suppressions` is given.

use std::collections::HashMap;

use memleak_trace::{ScanVerdict, StackRef};

use crate::frame_table::FrameTable;
use crate::stack_table::StackTable;

use crate::verdicts::VerdictSet;

/// The suppressions `memleak analyze` applies by default.
pub const DEFAULT_SUPPRESSIONS: &str = include_str!("../default.supp");

/// One frame pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FramePattern {
    /// `fun:GLOB`.
    Fun(String),
    /// `obj:GLOB`.
    Obj(String),
    /// `src:GLOB`.
    Src(String),
    /// `...`: any number of frames, none included.
    Any,
}

/// Which blocks an entry may suppress, by where they live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuppressKind {
    /// Heap blocks (malloc, new, …).
    Heap,
    /// Memory mappings.
    Mmap,
}

/// One named suppression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suppression {
    /// The entry's name, as reports show it.
    pub name: String,
    /// Verdicts it applies to (`verdict:`; every one when absent).
    pub verdicts: VerdictSet,
    /// Heap blocks or mappings only (`kind:`).
    pub kind: Option<SuppressKind>,
    frames: Vec<FramePattern>,
}

impl Suppression {
    /// Whether a block of this verdict and kind falls under the entry.
    pub fn applies_to(&self, verdict: Option<ScanVerdict>, mapping: bool) -> bool {
        let kind_ok = match self.kind {
            None => true,
            Some(SuppressKind::Heap) => !mapping,
            Some(SuppressKind::Mmap) => mapping,
        };
        kind_ok && self.verdicts.contains(verdict)
    }
}

/// Parses a suppression file; `origin` names it in errors, which are one
/// line each (`origin:LINE: what`).
pub fn parse(text: &str, origin: &str) -> Result<Vec<Suppression>, String> {
    let mut out: Vec<Suppression> = Vec::new();
    let mut start_line = 0;
    let finish = |s: &Suppression, line: usize| -> Result<(), String> {
        if s.frames.iter().all(|f| *f == FramePattern::Any) {
            return Err(format!(
                "{origin}:{line}: suppression [{}] has no fun:, obj: or src: line",
                s.name
            ));
        }
        Ok(())
    };
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let Some(name) = rest.strip_suffix(']').map(str::trim) else {
                return Err(format!(
                    "{origin}:{n}: an entry name is [name], got {line:?}"
                ));
            };
            if name.is_empty() {
                return Err(format!("{origin}:{n}: empty suppression name"));
            }
            if let Some(prev) = out.last() {
                finish(prev, start_line)?;
            }
            out.push(Suppression {
                name: name.to_string(),
                verdicts: VerdictSet::ALL,
                kind: None,
                frames: Vec::new(),
            });
            start_line = n;
            continue;
        }
        let Some(cur) = out.last_mut() else {
            return Err(format!(
                "{origin}:{n}: {line:?} before the first [name] line"
            ));
        };
        if line == "..." {
            cur.frames.push(FramePattern::Any);
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(format!(
                "{origin}:{n}: expected fun:, obj:, src:, verdict:, kind: or ..., got {line:?}"
            ));
        };
        let value = value.trim().to_string();
        let frames_started = !cur.frames.is_empty();
        match key.trim() {
            "fun" => cur.frames.push(FramePattern::Fun(value)),
            "obj" => cur.frames.push(FramePattern::Obj(value)),
            "src" => cur.frames.push(FramePattern::Src(value)),
            "verdict" | "kind" if frames_started => {
                return Err(format!(
                    "{origin}:{n}: {key}: must come before the frame lines"
                ))
            }
            "verdict" => {
                cur.verdicts =
                    VerdictSet::parse(&value).map_err(|e| format!("{origin}:{n}: {e}"))?;
            }
            "kind" => {
                cur.kind = Some(match value.as_str() {
                    "heap" => SuppressKind::Heap,
                    "mmap" => SuppressKind::Mmap,
                    _ => return Err(format!("{origin}:{n}: kind is heap or mmap, got {value:?}")),
                })
            }
            other => {
                return Err(format!(
                    "{origin}:{n}: unknown key {other:?} (fun, obj, src, verdict, kind)"
                ))
            }
        }
    }
    if let Some(last) = out.last() {
        finish(last, start_line)?;
    }
    Ok(out)
}

/// One frame as patterns see it: an inlined function or the function that
/// contains the address.
#[derive(Clone, Copy)]
struct LogicalFrame<'a> {
    function: Option<&'a str>,
    object: Option<&'a str>,
    file: Option<&'a str>,
    line: Option<u32>,
}

/// A stack's logical frames, innermost first, resolved as patterns reach
/// them: most stacks fail the first pattern on their first frame, and
/// need no other.
struct LogicalFrames<'a> {
    out: Vec<LogicalFrame<'a>>,
    /// The addresses not resolved yet, their pid and the frames table.
    pending: Option<(&'a [u64], u32, &'a FrameTable)>,
}

impl<'a> LogicalFrames<'a> {
    fn of(rec: StackRef<'a>, frames: &'a FrameTable) -> LogicalFrames<'a> {
        let pid = if rec.kernel { 0 } else { rec.pid };
        LogicalFrames {
            out: Vec::new(),
            pending: Some((rec.frames, pid, frames)),
        }
    }

    /// The logical frame at `i`, if the stack has that many.
    fn get(&mut self, i: usize) -> Option<LogicalFrame<'a>> {
        while self.out.len() <= i {
            let Some((addrs, pid, table)) = self.pending else {
                break;
            };
            let Some((addr, rest)) = addrs.split_first() else {
                self.pending = None;
                break;
            };
            self.pending = Some((rest, pid, table));
            match table.get(&(pid, *addr)) {
                Some(f) => {
                    for inl in f.inlined() {
                        self.out.push(LogicalFrame {
                            function: Some(inl.function),
                            object: f.path(),
                            file: inl.file,
                            line: inl.line,
                        });
                    }
                    self.out.push(LogicalFrame {
                        function: f.function(),
                        object: f.path(),
                        file: f.file(),
                        line: f.line(),
                    });
                }
                None => self.out.push(LogicalFrame {
                    function: None,
                    object: None,
                    file: None,
                    line: None,
                }),
            }
        }
        self.out.get(i).copied()
    }

    /// How many logical frames the stack has (resolving them all).
    fn len(&mut self) -> usize {
        self.get(usize::MAX);
        self.out.len()
    }
}

/// What an unknown name is matched as, as valgrind writes it.
const UNKNOWN: &str = "???";

fn frame_matches(p: &FramePattern, f: &LogicalFrame<'_>) -> bool {
    match p {
        FramePattern::Fun(g) => glob(g, f.function.unwrap_or(UNKNOWN)),
        FramePattern::Obj(g) => glob(g, f.object.unwrap_or(UNKNOWN)),
        FramePattern::Src(g) => match (f.file, f.line) {
            (Some(file), Some(line)) => glob(g, &format!("{file}:{line}")) || glob(g, file),
            (Some(file), None) => glob(g, file),
            _ => glob(g, UNKNOWN),
        },
        FramePattern::Any => true,
    }
}

/// Whether `pats` match a prefix of `frames`.
#[cfg(test)]
fn stack_matches(pats: &[FramePattern], frames: &[LogicalFrame<'_>]) -> bool {
    let mut frames = LogicalFrames {
        out: frames.to_vec(),
        pending: None,
    };
    matches_from(pats, &mut frames, 0)
}

/// Whether `pats` match a prefix of the frames from the `at`-th on.
fn matches_from(pats: &[FramePattern], frames: &mut LogicalFrames<'_>, at: usize) -> bool {
    match pats.split_first() {
        None => true,
        Some((FramePattern::Any, rest)) => {
            let n = frames.len();
            (at..=n).any(|skip| matches_from(rest, frames, skip))
        }
        Some((p, rest)) => match frames.get(at) {
            Some(f) => frame_matches(p, &f) && matches_from(rest, frames, at + 1),
            None => false,
        },
    }
}

/// Shell-style glob: `*` any run of characters, `?` one character.
pub fn glob(pattern: &str, text: &str) -> bool {
    if !pattern.contains('?') {
        return glob_stars(pattern, text);
    }
    if pattern.is_ascii() && text.is_ascii() {
        // Bytes are characters: no copy.
        return glob_units(pattern.as_bytes(), text.as_bytes(), b'?', b'*');
    }
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    glob_units(&p, &t, '?', '*')
}

/// [`glob`] of a pattern without `?` (every suppression file's so far):
/// its literal pieces in order, the first at the start and the last at
/// the end, each found with a substring search. Matching each piece at
/// its leftmost place is right when `*` is the only wildcard. The default
/// suppressions are matched against every stack of every trace, and the
/// character-by-character walk was most of their cost.
fn glob_stars(pattern: &str, text: &str) -> bool {
    let Some((head, rest)) = pattern.split_once('*') else {
        return pattern == text;
    };
    let (middle, tail) = rest.rsplit_once('*').unwrap_or(("", rest));
    if text.len() < head.len() + tail.len() || !text.starts_with(head) || !text.ends_with(tail) {
        return false;
    }
    let mut between = &text[head.len()..text.len() - tail.len()];
    for piece in middle.split('*').filter(|p| !p.is_empty()) {
        match between.find(piece) {
            Some(at) => between = &between[at + piece.len()..],
            None => return false,
        }
    }
    true
}

/// [`glob`] over characters `p` and `t`, given what `?` and `*` are.
fn glob_units<T: Copy + PartialEq>(p: &[T], t: &[T], one: T, any: T) -> bool {
    // Iterative with one backtrack point: linear in practice.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == one || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == any {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == any)
}

/// The first suppression that matches each stack of the trace, by stack
/// id (stacks no entry matches are left out). Kernel stacks are never
/// suppressed.
pub(crate) fn match_stacks(
    supps: &[Suppression],
    stacks: &StackTable,
    frames: &FrameTable,
) -> HashMap<u64, u32> {
    use rayon::prelude::*;
    if supps.is_empty() {
        return HashMap::new();
    }
    stacks
        .par_rows()
        .filter(|rec| !rec.kernel)
        .filter_map(|rec| {
            let mut logical = LogicalFrames::of(rec, frames);
            supps
                .iter()
                .position(|s| matches_from(&s.frames, &mut logical, 0))
                .map(|i| (rec.stack_id, i as u32))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("*", ""));
        assert!(glob("_dl_*", "_dl_init"));
        assert!(!glob("_dl_*", "dl_init"));
        assert!(glob(
            "*/libstdc++.so*",
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30"
        ));
        assert!(glob("a?c", "abc"));
        assert!(!glob("a?c", "ac"));
        assert!(glob("*a*b*", "xxaxxbxx"));
        assert!(!glob("*a*b", "xxaxxbxx"));
        // Without `?`: pieces in order, anchored at both ends.
        assert!(glob("abc", "abc"));
        assert!(!glob("abc", "abcd"));
        assert!(glob("ab*", "abc"));
        assert!(!glob("ab*", "xabc"));
        assert!(glob("*bc", "abc"));
        assert!(!glob("*bc", "abcx"));
        assert!(glob("a*a", "aa"));
        assert!(!glob("aa*aa", "aaa"), "the ends may not overlap");
        assert!(glob("**", ""));
        assert!(glob("a**b", "ab"));
        assert!(glob("*x*y*x*", "axbyxc"));
        assert!(!glob("*x*y*x*", "axbxyc"));
        assert!(glob("*é*", "café"));
        // The same answers as the general walk, over a few shapes.
        for p in ["*a*", "a*b*c", "*ab*ba*", "ab", "*", "b*a", "*aa*aa*"] {
            for t in ["", "a", "ab", "abba", "aabbaa", "cab", "abcab", "aaaa"] {
                assert_eq!(
                    glob_stars(p, t),
                    glob_units(p.as_bytes(), t.as_bytes(), b'?', b'*'),
                    "{p} {t}"
                );
            }
        }
    }

    fn frame(function: Option<&'static str>, object: &'static str) -> LogicalFrame<'static> {
        LogicalFrame {
            function,
            object: Some(object),
            file: Some("x.c"),
            line: Some(7),
        }
    }

    #[test]
    fn patterns_match_from_the_innermost_frame() {
        let supps = parse(
            "# runtime\n[pool]\nverdict: reachable\nobj: */libstdc++*\n...\nfun: _dl_init\n\n\
             [any]\n...\nsrc: x.c:7\n",
            "t.supp",
        )
        .unwrap();
        assert_eq!(supps.len(), 2);
        assert_eq!(supps[0].name, "pool");
        assert!(supps[0].applies_to(Some(ScanVerdict::Reachable), false));
        assert!(!supps[0].applies_to(Some(ScanVerdict::DefinitelyLost), false));
        assert!(!supps[0].applies_to(None, false));
        let stack = [
            frame(None, "/lib/libstdc++.so.6"),
            frame(Some("call_init"), "/lib/ld-linux-x86-64.so.2"),
            frame(Some("_dl_init"), "/lib/ld-linux-x86-64.so.2"),
            frame(Some("_start"), "/lib/ld-linux-x86-64.so.2"),
        ];
        assert!(stack_matches(&supps[0].frames, &stack));
        assert!(!stack_matches(&supps[0].frames, &stack[1..]));
        assert!(stack_matches(&supps[1].frames, &stack[2..]));
        assert!(!stack_matches(&supps[1].frames, &[]));
    }

    #[test]
    fn bad_files_name_the_line() {
        for (text, needle) in [
            (
                "fun: x\n",
                "t.supp:1: \"fun: x\" before the first [name] line",
            ),
            ("[a]\n...\n", "t.supp:1: suppression [a] has no fun:"),
            (
                "[a]\nfun: x\nverdict: reachable\n",
                "t.supp:3: verdict: must come before",
            ),
            (
                "[a]\nverdict: lots\nfun: x\n",
                "t.supp:2: unknown verdict \"lots\"",
            ),
            (
                "[a]\nkind: stack\nfun: x\n",
                "t.supp:2: kind is heap or mmap",
            ),
            ("[a]\nfunc: x\n", "t.supp:2: unknown key \"func\""),
            ("[a\nfun: x\n", "t.supp:1: an entry name is [name]"),
        ] {
            let e = parse(text, "t.supp").unwrap_err();
            assert!(e.contains(needle), "{e}");
            assert!(!e.contains('\n'));
        }
    }

    #[test]
    fn the_default_file_parses() {
        let d = parse(DEFAULT_SUPPRESSIONS, "default.supp").unwrap();
        assert!(d.len() >= 3, "{d:?}");
    }
}
