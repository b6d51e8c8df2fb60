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

use memleak_trace::{FrameRecord, ScanVerdict, StackRecord};

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
struct LogicalFrame<'a> {
    function: Option<&'a str>,
    object: Option<&'a str>,
    file: Option<&'a str>,
    line: Option<u32>,
}

fn logical_frames<'a>(
    rec: &'a StackRecord,
    frames: &'a HashMap<(u32, u64), FrameRecord>,
) -> Vec<LogicalFrame<'a>> {
    let pid = if rec.kernel { 0 } else { rec.pid };
    let mut out = Vec::with_capacity(rec.frames.len());
    for addr in &rec.frames {
        match frames.get(&(pid, *addr)) {
            Some(f) => {
                for inl in &f.inlined {
                    out.push(LogicalFrame {
                        function: Some(&inl.function),
                        object: f.path.as_deref(),
                        file: inl.file.as_deref(),
                        line: inl.line,
                    });
                }
                out.push(LogicalFrame {
                    function: f.function.as_deref(),
                    object: f.path.as_deref(),
                    file: f.file.as_deref(),
                    line: f.line,
                });
            }
            None => out.push(LogicalFrame {
                function: None,
                object: None,
                file: None,
                line: None,
            }),
        }
    }
    out
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
fn stack_matches(pats: &[FramePattern], frames: &[LogicalFrame<'_>]) -> bool {
    match pats.split_first() {
        None => true,
        Some((FramePattern::Any, rest)) => {
            (0..=frames.len()).any(|skip| stack_matches(rest, &frames[skip..]))
        }
        Some((p, rest)) => match frames.split_first() {
            Some((f, more)) => frame_matches(p, f) && stack_matches(rest, more),
            None => false,
        },
    }
}

/// Shell-style glob: `*` any run of characters, `?` one character.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // Iterative with one backtrack point: linear in practice.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
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
    p[pi..].iter().all(|&c| c == '*')
}

/// The first suppression that matches each stack of the trace, by stack
/// id (stacks no entry matches are left out). Kernel stacks are never
/// suppressed.
pub(crate) fn match_stacks(
    supps: &[Suppression],
    stacks: &HashMap<u64, StackRecord>,
    frames: &HashMap<(u32, u64), FrameRecord>,
) -> HashMap<u64, u32> {
    use rayon::prelude::*;
    if supps.is_empty() {
        return HashMap::new();
    }
    stacks
        .par_iter()
        .filter(|(_, rec)| !rec.kernel)
        .filter_map(|(&id, rec)| {
            let logical = logical_frames(rec, frames);
            supps
                .iter()
                .position(|s| stack_matches(&s.frames, &logical))
                .map(|i| (id, i as u32))
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
