//! No import cycles between the modules of any crate of the workspace (the
//! CLI included): a module that uses another must not be used by it back,
//! directly or through others.
//! A cycle means neither module can be understood, tested or moved
//! without the other; the usual fix is to move what both need into a
//! module of its own.
//!
//! The check reads the sources (no compiler involved): every file is a
//! module, and a module depends on another when its code, outside
//! `#[cfg(test)]` items, names a path into it (`use` or a path in an
//! expression, through `crate::`, `super::`, `self::` or a child module's
//! name). Declaring a child (`mod x;`) is not a dependency: a folder's
//! `mod.rs` may compose its children, which then take what they share
//! from a sibling, never from the `mod.rs` that declares them.
//!
//! [`CRATES`] lists the source folders checked: every crate's. A new crate
//! is added there.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Source folders (relative to the workspace root) whose modules must
/// form no cycle.
const CRATES: &[&str] = &[
    "crates/analyze/src",
    "crates/trace/src",
    "crates/recorder/src",
    "src",
];

#[test]
fn no_import_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = format!(
            "crates/{}/src",
            entry.unwrap().file_name().to_string_lossy()
        );
        if root.join(&src).is_dir() {
            assert!(CRATES.contains(&src.as_str()), "{src} is not in CRATES");
        }
    }
    let mut report = String::new();
    for dir in CRATES {
        for (cycle, members) in cycles(&root.join(dir)) {
            report += &format!(
                "{dir}: {} (all {} modules of the cycle: {})\n",
                cycle.join(" -> "),
                members.len(),
                members.join(", ")
            );
        }
    }
    assert!(report.is_empty(), "import cycles:\n{report}");
}

/// Checks the checker on a crate made up for it.
#[test]
fn finds_a_cycle_and_only_it() {
    let dir = tempfile::tempdir().unwrap();
    let w = |p: &str, s: &str| {
        let p = dir.path().join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    };
    w("lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\npub use a::A;\n");
    w(
        "a.rs",
        "use crate::{b::B, c};\n// crate::d::D in a comment\npub struct A;\n",
    );
    w(
        "b.rs",
        "pub struct B(crate::a::A);\nconst S: &str = \"crate::d\";\n",
    );
    w("c.rs", "#[cfg(test)]\nmod tests { use crate::a::*; }\n");
    w("d/mod.rs", "mod e;\nuse e::E;\n");
    w("d/e.rs", "pub struct E(super::super::c::C);\n");
    let found = cycles(dir.path());
    let a_b_a = vec!["a".to_string(), "b".into(), "a".into()];
    assert_eq!(found, vec![(a_b_a, vec!["a".to_string(), "b".into()])]);
}

/// The cycles among the modules under `src`: one per strongly connected
/// component of more than one module, as a path through it, and the
/// component's modules.
fn cycles(src: &Path) -> Vec<(Vec<String>, Vec<String>)> {
    let files = rust_files(src);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    let mut deps: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (m, file) in &modules {
        let code = strip(&std::fs::read_to_string(file).unwrap());
        let children: BTreeSet<String> = child_modules(&code);
        let mut out = BTreeSet::new();
        for path in paths(&code) {
            let abs = match path[0].as_str() {
                "crate" => path[1..].to_vec(),
                "self" => [&m[..], &path[1..]].concat(),
                "super" => {
                    let ups = path.iter().take_while(|s| *s == "super").count();
                    if ups > m.len() {
                        continue;
                    }
                    [&m[..m.len() - ups], &path[ups..]].concat()
                }
                first if children.contains(first) => [&m[..], &path[..]].concat(),
                _ => continue,
            };
            // The longest prefix that is a module of the crate.
            if let Some(target) = (0..=abs.len())
                .rev()
                .map(|n| abs[..n].to_vec())
                .find(|p| modules.contains_key(p))
            {
                if &target != m {
                    out.insert(target);
                }
            }
        }
        deps.insert(m.clone(), out);
    }
    strongly_connected(&deps)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            (
                cycle_through(&c, &deps),
                c.iter().map(|m| name(m)).collect(),
            )
        })
        .collect()
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// `a/b.rs` and `a/b/mod.rs` are module `[a, b]`; `lib.rs` and `main.rs`
/// the crate root `[]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod")) {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

/// The code without comments, string and character literals, and
/// `#[cfg(test)]` items (tests may use anything).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if rest.starts_with("#[cfg(test)]") {
            i += "#[cfg(test)]".len();
            i += skip_item(&src[i..]);
        } else if let Some(n) = raw_string(rest) {
            i += n;
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            i = j + 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && char_literal(rest).is_some() {
            i += char_literal(rest).unwrap();
            out.push_str("' '");
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The length of the item or statement at the start of `s`: up to its
/// `;`, or its braces if one opens first.
fn skip_item(s: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            ';' if depth == 0 => return i + 1,
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    s.len()
}

/// The length of a raw string literal at the start of `s`.
fn raw_string(s: &str) -> Option<usize> {
    let s2 = s.strip_prefix('b').unwrap_or(s);
    let body = s2.strip_prefix('r')?;
    let hashes = body.len() - body.trim_start_matches('#').len();
    let body = body[hashes..].strip_prefix('"')?;
    let close = format!("\"{}", "#".repeat(hashes));
    let end = body.find(&close)?;
    Some(s.len() - body.len() + end + close.len())
}

/// The length of a character literal at the start of `s` (not a
/// lifetime).
fn char_literal(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    if b.get(1) == Some(&b'\\') {
        return s[2..].find('\'').map(|e| e + 3);
    }
    let c = s[1..].chars().next()?;
    (s[1 + c.len_utf8()..].starts_with('\'')).then_some(2 + c.len_utf8())
}

/// The modules `code` declares in files of their own (`mod x;`).
fn child_modules(code: &str) -> BTreeSet<String> {
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ';'))
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .filter(|w| w[0] == "mod" && w[1].ends_with(';'))
        .map(|w| w[1].trim_end_matches(';').to_string())
        .collect()
}

/// Every path of two or more segments in `code`, with `use` trees
/// expanded (`use a::{b, c::d}` gives `a::b` and `a::c::d`).
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = find_word(rest, "use") {
        let after = &rest[i + 3..];
        let end = after.find(';').unwrap_or(after.len());
        expand(&after[..end], &mut Vec::new(), &mut out);
        rest = &after[end..];
    }
    // Paths in expressions and types.
    let mut seg = String::new();
    let mut path: Vec<String> = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i <= chars.len() {
        let c = chars.get(i).copied().unwrap_or(' ');
        if c.is_alphanumeric() || c == '_' {
            seg.push(c);
        } else if c == ':' && chars.get(i + 1) == Some(&':') && !seg.is_empty() {
            path.push(std::mem::take(&mut seg));
            i += 1;
        } else {
            if !seg.is_empty() && !path.is_empty() {
                path.push(std::mem::take(&mut seg));
            }
            if path.len() >= 2 {
                out.push(std::mem::take(&mut path));
            }
            path.clear();
            seg.clear();
        }
        i += 1;
    }
    out
}

fn find_word(s: &str, word: &str) -> Option<usize> {
    let b = s.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    s.match_indices(word).map(|(i, _)| i).find(|&i| {
        (i == 0 || !ident(b[i - 1])) && b.get(i + word.len()).is_some_and(|&c| !ident(c))
    })
}

/// Expands a `use` tree under `prefix` into full paths.
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(inner) = tree.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        for part in split_top(inner) {
            expand(part, &mut prefix.clone(), out);
        }
        return;
    }
    match tree.find("::") {
        Some(i) if !tree[..i].contains('{') => {
            prefix.push(tree[..i].trim().to_string());
            expand(&tree[i + 2..], prefix, out);
        }
        _ => {
            let name = tree.split_whitespace().next().unwrap_or("");
            let mut p = prefix.clone();
            if !name.is_empty() && name != "*" && name != "self" {
                p.push(name.to_string());
            }
            if !p.is_empty() {
                out.push(p);
            }
        }
    }
}

/// `inner` split at its top-level commas.
fn split_top(inner: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0, 0, Vec::new());
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&inner[start..]);
    out.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

/// Tarjan's strongly connected components.
fn strongly_connected(g: &Graph) -> Vec<Vec<Vec<String>>> {
    struct State<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on: BTreeSet<&'a Vec<String>>,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Vec<String>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in &s.g[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            comp.sort();
            s.out.push(comp);
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// A cycle through the first module of a component, by breadth-first
/// search within it, as module names (`a::b`, or `crate` for the root).
fn cycle_through(comp: &[Vec<String>], g: &Graph) -> Vec<String> {
    let inside: BTreeSet<&Vec<String>> = comp.iter().collect();
    let start = &comp[0];
    let mut prev: BTreeMap<&Vec<String>, &Vec<String>> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    let mut end = None;
    'search: while let Some(v) = queue.pop_front() {
        for w in &g[v] {
            if w == start {
                end = Some(v);
                break 'search;
            }
            if inside.contains(w) && !prev.contains_key(w) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    let mut path = vec![name(start)];
    let mut v = end.expect("a component of several modules has a cycle");
    let mut back = Vec::new();
    while v != start {
        back.push(name(v));
        v = prev[v];
    }
    path.extend(back.into_iter().rev());
    path.push(name(start));
    path
}

/// A module's name: `a::b`, or `crate` for the root.
fn name(m: &[String]) -> String {
    match m.is_empty() {
        true => "crate".to_string(),
        false => m.join("::"),
    }
}
