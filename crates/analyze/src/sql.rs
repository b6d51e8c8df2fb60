//! The outstanding-by-stack report as one SQL statement, for DuckDB (one
//! machine) and Spark (a cluster), over one trace, several, or a dataset
//! of them (`ROOT/host=H/trace=ID/`, what `record --dataset` writes).
//!
//! The statement replays what `memleak analyze` replays, by the rule that
//! the last operation on an address decides, in the order of the events'
//! `seq` column (format 1.5; `ts_ns` ties, docs/format.md):
//!
//! - heap blocks, per process and address (kernel slab blocks and pages
//!   in tables of their own, as replay keeps them): an allocation (or the new
//!   block of a realloc) is outstanding when no free (or realloc away) of
//!   its address follows it; a realloc in place frees and allocates at
//!   the same `seq`, and the allocation wins;
//! - mappings: an `mmap` (or the new range of an `mremap`) keeps the bytes
//!   no later `munmap`, `mremap` source range or new mapping over it took
//!   away, so a partial munmap leaves the rest; a mapping cut in two
//!   still counts as one allocation, as in the analyzer;
//! - `exec` ends every allocation its process made before it;
//! - `exit` ends nothing (what was never freed is a leak);
//! - `fork`: a child's copies of its parent's blocks are not reported
//!   (the parent's are), as in the analyzer without `--pid`.
//!
//! Left out, and said in docs/fleet.md: the analyzer's filters and
//! `--at`, verdicts, and a pid reused within one trace.
//!
//! Stacks are keyed by their symbolized frames as `memleak diff` and
//! `memleak analyze A B…` key them (`diff::stack_key`: function without
//! compiler clone suffixes, source file base name, line, inlined frames;
//! the object and offset of a frame without a function), so the same code
//! on two hosts or two builds is one stack, and a row's `frames` is the
//! `key` of memleak's JSON.

use std::fmt::Write as _;

/// The SQL engine the statement is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// DuckDB 1.x (`read_parquet`, `filename`).
    DuckDb,
    /// Spark SQL 3.x/4.x (`parquet.` paths, `input_file_name()`). Spark
    /// reads Parquet's unsigned 64-bit columns as `DECIMAL(20,0)`.
    Spark,
}

/// What one row of the result is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqlGroup {
    /// A stack, over every trace: with how many hosts and traces hold it.
    Stack,
    /// A stack on a host.
    Host,
    /// A stack in a trace (with its host).
    Trace,
}

/// Where events come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A dataset root: every trace at `ROOT/host=H/trace=ID/`, host and
    /// trace taken from the path.
    Dataset(String),
    /// One trace directory, with the host and trace names to report.
    Trace {
        /// The trace directory.
        path: String,
        /// Its host (meta.json `host`).
        host: String,
        /// Its name in the report.
        trace: String,
    },
}

/// Why a statement cannot be written.
#[derive(Debug)]
pub enum SqlError {
    /// A path the dialect cannot quote.
    Unquotable(String),
    /// Nothing to read.
    Empty,
}

impl std::fmt::Display for SqlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SqlError::Unquotable(p) => {
                write!(
                    f,
                    "cannot put path {p:?} into Spark SQL (it holds a backquote)"
                )
            }
            SqlError::Empty => write!(f, "no traces given"),
        }
    }
}

impl std::error::Error for SqlError {}

const USER_ALLOCS: &str =
    "'malloc', 'calloc', 'posix_memalign', 'memalign', 'aligned_alloc', 'valloc', 'pvalloc', 'new', 'new[]'";
const USER_FREES: &str = "'free', 'delete', 'delete[]'";
const REALLOCS: &str = "'realloc', 'reallocarray'";
const KERNEL_ALLOCS: &str = "'kmalloc', 'kmem_cache_alloc', 'percpu_alloc', 'page_alloc'";
const KERNEL_FREES: &str = "'kfree', 'kmem_cache_free', 'percpu_free', 'page_free'";
/// The table an address belongs to: its process's heap, the kernel's
/// slabs, or the kernel's pages (page frame numbers), as replay keeps them.
const NAMESPACE: &str = "CASE WHEN kind IN ('page_alloc', 'page_free') THEN -2 \
     WHEN kind IN ('kmalloc', 'kfree', 'kmem_cache_alloc', 'kmem_cache_free', 'percpu_alloc', \
     'percpu_free') THEN -1 ELSE CAST(pid AS BIGINT) END";

/// The statement computing outstanding bytes and allocations by stack
/// over `sources`, one row per `group`, most bytes first.
pub fn outstanding_sql(
    dialect: Dialect,
    group: SqlGroup,
    sources: &[Source],
) -> Result<String, SqlError> {
    if sources.is_empty() {
        return Err(SqlError::Empty);
    }
    let d = dialect;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "-- memleak: outstanding allocations by stack ({}), docs/fleet.md",
        match group {
            SqlGroup::Stack => "stack",
            SqlGroup::Host => "host, stack",
            SqlGroup::Trace => "host, trace, stack",
        }
    );
    s += "WITH\n";
    for (table, cols) in [
        (
            "events",
            "seq, pid, kind, addr, size, old_addr, old_size, stack_id",
        ),
        ("stacks", "stack_id, pid, kernel, truncated, frames"),
        (
            "frames",
            "pid, addr, function, file, line, path, file_offset, inlined",
        ),
    ] {
        let parts = sources
            .iter()
            .map(|src| from_source(d, src, table, cols))
            .collect::<Result<Vec<_>, _>>()?;
        let _ = writeln!(s, "{table} AS (\n  {}\n),", parts.join("\n  UNION ALL\n  "));
    }
    let _ = write!(
        s,
        "\
-- Heap blocks: the last operation on an address decides, within a
-- process's heap (ns = pid), the kernel's slabs (-1) or its pages (-2); a
-- realloc frees its old block and allocates its new one at one seq.
heap_ops AS (
  SELECT host, trace, {ns} AS ns, addr, seq, 1 AS op, size, stack_id FROM events
    WHERE kind IN ({USER_ALLOCS}, {KERNEL_ALLOCS}, {REALLOCS}) AND addr <> 0
  UNION ALL
  SELECT host, trace, {ns} AS ns, addr, seq, 0 AS op, 0 AS size, NULL AS stack_id FROM events
    WHERE kind IN ({USER_FREES}, {KERNEL_FREES})
  UNION ALL
  SELECT host, trace, {ns} AS ns, old_addr AS addr, seq, 0 AS op, 0 AS size, NULL AS stack_id
    FROM events WHERE kind IN ({REALLOCS}) AND old_addr IS NOT NULL
),
last_heap AS (
  SELECT host, trace, ns, seq, op, size, stack_id,
    row_number() OVER (PARTITION BY host, trace, ns, addr ORDER BY seq DESC, op DESC) AS nth
  FROM heap_ops
),
-- exec ends every allocation its process made before it.
execs AS (
  SELECT host, trace, pid, max(seq) AS exec_seq FROM events WHERE kind = 'exec'
  GROUP BY host, trace, pid
),
-- Mappings keep what no later munmap, mremap source or new mapping took.
maps AS (
  SELECT host, trace, pid, seq, addr AS lo, addr + size AS hi, size, stack_id FROM events
    WHERE kind IN ('mmap', 'mremap') AND addr <> 0 AND size > 0
),
cuts AS (
  SELECT host, trace, pid, seq, addr AS lo, addr + size AS hi FROM events WHERE kind = 'munmap'
  UNION ALL
  SELECT host, trace, pid, seq, old_addr AS lo, old_addr + old_size AS hi FROM events
    WHERE kind = 'mremap' AND old_addr IS NOT NULL AND old_size IS NOT NULL
  UNION ALL
  SELECT host, trace, pid, seq, lo, hi FROM maps
),
clipped AS (
  SELECT m.host, m.trace, m.pid, m.seq AS map_seq,
    greatest(c.lo, m.lo) AS lo, least(c.hi, m.hi) AS hi
  FROM maps m JOIN cuts c
    ON c.host = m.host AND c.trace = m.trace AND c.pid = m.pid
    AND c.seq > m.seq AND c.lo < m.hi AND c.hi > m.lo
),
cut_bytes AS (
  SELECT host, trace, pid, map_seq,
    sum(greatest(0, hi - greatest(lo, coalesce(before_hi, lo)))) AS cut
  FROM (
    SELECT host, trace, pid, map_seq, lo, hi,
      max(hi) OVER (PARTITION BY host, trace, pid, map_seq ORDER BY lo, hi
                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_hi
    FROM clipped
  ) pieces
  GROUP BY host, trace, pid, map_seq
),
blocks AS (
  SELECT h.host, h.trace, h.ns AS pid, h.stack_id, h.size AS bytes
  FROM last_heap h LEFT JOIN execs x ON x.host = h.host AND x.trace = h.trace AND x.pid = h.ns
  WHERE h.nth = 1 AND h.op = 1 AND (x.exec_seq IS NULL OR h.seq > x.exec_seq)
  UNION ALL
  SELECT m.host, m.trace, m.pid, m.stack_id, m.size - coalesce(k.cut, 0) AS bytes
  FROM maps m
  LEFT JOIN cut_bytes k
    ON k.host = m.host AND k.trace = m.trace AND k.pid = m.pid AND k.map_seq = m.seq
  LEFT JOIN execs x ON x.host = m.host AND x.trace = m.trace AND x.pid = m.pid
  WHERE m.size - coalesce(k.cut, 0) > 0 AND (x.exec_seq IS NULL OR m.seq > x.exec_seq)
),
by_stack_id AS (
  SELECT host, trace, stack_id, sum(bytes) AS bytes, count(*) AS allocations
  FROM blocks GROUP BY host, trace, stack_id
),
-- A frame's key: `function @ file:line`, then ` <- ` and each inlined
-- function the same way; `[object+0xoffset]` without a function.
frame_keys AS (
  SELECT host, trace, pid, addr, {frame_key} AS fkey
  FROM frames
),
stack_frames AS (
  SELECT s.host, s.trace, s.stack_id, s.kernel, s.truncated, s.pos,
    coalesce(f.fkey, '[unknown]') AS fkey
  FROM ({positions}) s
  LEFT JOIN frame_keys f
    ON f.host = s.host AND f.trace = s.trace
    AND f.pid = CASE WHEN s.kernel THEN 0 ELSE s.pid END AND f.addr = s.addr
),
stack_keys AS (
  SELECT host, trace, stack_id,
    CASE WHEN max(CAST(kernel AS INT)) = 1 THEN '[kernel] | ' ELSE '' END
    || CASE WHEN max(CAST(truncated AS INT)) = 1 THEN '[truncated] | ' ELSE '' END
    || {joined} AS frames
  FROM stack_frames GROUP BY host, trace, stack_id
),
keyed AS (
  SELECT b.host, b.trace,
    CASE WHEN b.stack_id IS NULL THEN '[no stack]'
         ELSE coalesce(k.frames, '[missing stack]') END AS frames,
    b.bytes, b.allocations
  FROM by_stack_id b
  LEFT JOIN stack_keys k ON k.host = b.host AND k.trace = b.trace AND k.stack_id = b.stack_id
)
",
        ns = NAMESPACE,
        frame_key = frame_key(d),
        positions = stack_positions(d),
        joined = ordered_join(d, "fkey", "pos", " | "),
    );
    s += match group {
        SqlGroup::Stack => {
            "SELECT frames, sum(bytes) AS bytes, sum(allocations) AS count,\n  \
             count(DISTINCT host) AS hosts, count(DISTINCT host || '/' || trace) AS traces\n\
             FROM keyed GROUP BY frames\nORDER BY bytes DESC, frames;\n"
        }
        SqlGroup::Host => {
            "SELECT host, frames, sum(bytes) AS bytes, sum(allocations) AS count\n\
             FROM keyed GROUP BY host, frames\nORDER BY host, bytes DESC, frames;\n"
        }
        SqlGroup::Trace => {
            "SELECT host, trace, frames, sum(bytes) AS bytes, sum(allocations) AS count\n\
             FROM keyed GROUP BY host, trace, frames\nORDER BY host, trace, bytes DESC, frames;\n"
        }
    };
    Ok(s)
}

/// `SELECT host, trace, COLS FROM` one source's `table`.
fn from_source(d: Dialect, src: &Source, table: &str, cols: &str) -> Result<String, SqlError> {
    Ok(match src {
        Source::Dataset(root) => {
            let glob = format!(
                "{}/host=*/trace=*/{table}/*.parquet",
                root.trim_end_matches('/')
            );
            let (file, from) = match d {
                Dialect::DuckDb => (
                    "filename".to_string(),
                    format!(
                        "read_parquet({}, filename = true, hive_partitioning = false)",
                        literal(&glob)
                    ),
                ),
                Dialect::Spark => ("input_file_name()".to_string(), spark_path(&glob)?),
            };
            format!(
                "SELECT regexp_extract({file}, 'host=([^/]+)/', 1) AS host, \
                 regexp_extract({file}, 'trace=([^/]+)/', 1) AS trace, {cols} FROM {from}"
            )
        }
        Source::Trace { path, host, trace } => {
            let glob = format!("{}/{table}/*.parquet", path.trim_end_matches('/'));
            let from = match d {
                Dialect::DuckDb => format!(
                    "read_parquet({}, hive_partitioning = false)",
                    literal(&glob)
                ),
                Dialect::Spark => spark_path(&glob)?,
            };
            format!(
                "SELECT {} AS host, {} AS trace, {cols} FROM {from}",
                literal(host),
                literal(trace)
            )
        }
    })
}

/// A SQL string literal.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn spark_path(glob: &str) -> Result<String, SqlError> {
    if glob.contains('`') {
        return Err(SqlError::Unquotable(glob.to_string()));
    }
    Ok(format!("parquet.`{glob}`"))
}

/// Compiler clone suffixes a function key drops (`f.isra.0` -> `f`), as
/// `diff::normalize_function` does.
const CLONE_TAGS: &str = "isra|constprop|part|cold|lto_priv|localalias|llvm|specialized";

/// `function`'s name without a clone suffix: the part before the first
/// dot when every dotted part after it is a tag or a number, one a tag.
fn normalized(d: Dialect, function: &str) -> String {
    // `[.]`, not a backslash: Spark's string literals take backslashes
    // as escapes.
    let all = format!("^[^.]+([.]({CLONE_TAGS}|[0-9]+))+$");
    let tag = format!("[.]({CLONE_TAGS})([.]|$)");
    type Matches = fn(&str, &str) -> String;
    let (matches, first): (Matches, String) = match d {
        Dialect::DuckDb => (
            |x, re| format!("regexp_matches({x}, '{re}')"),
            format!("regexp_extract({function}, '^[^.]+')"),
        ),
        Dialect::Spark => (
            |x, re| format!("{x} RLIKE '{re}'"),
            format!("regexp_extract({function}, '^[^.]+', 0)"),
        ),
    };
    format!(
        "CASE WHEN {} AND {} THEN {first} ELSE {function} END",
        matches(function, &all),
        matches(function, &tag)
    )
}

/// `name @ file:line` (file's base name; `:line` only with a line; the
/// file part only with a file).
fn location(d: Dialect, function: &str, file: &str, line: &str) -> String {
    let base = basename(d, file);
    format!(
        "{} || coalesce(' @ ' || {base} || coalesce(':' || CAST({line} AS STRING), ''), '')",
        normalized(d, function)
    )
}

fn basename(d: Dialect, path: &str) -> String {
    match d {
        Dialect::DuckDb => format!("regexp_extract({path}, '[^/]*$')"),
        Dialect::Spark => format!("regexp_extract({path}, '[^/]*$', 0)"),
    }
}

/// A frame's key, as `diff::frame_key` writes it.
fn frame_key(d: Dialect) -> String {
    let offset_hex = match d {
        Dialect::DuckDb => "lower(hex(file_offset))",
        Dialect::Spark => "lower(hex(CAST(file_offset AS BIGINT)))",
    };
    let unsymbolized = format!(
        "CASE WHEN path IS NULL THEN '[unknown]' ELSE '[' || {} || coalesce('+0x' || {offset_hex}, '') || ']' END",
        basename(d, "path")
    );
    let outer = format!(
        "CASE WHEN function IS NULL THEN {unsymbolized} ELSE {} END",
        location(d, "function", "file", "line")
    );
    let inner = location(d, "i.function", "i.file", "i.line");
    match d {
        Dialect::DuckDb => format!(
            "{outer} || array_to_string(list_transform(inlined, lambda i: ' <- ' || {inner}), '')"
        ),
        Dialect::Spark => {
            format!("{outer} || array_join(transform(inlined, i -> ' <- ' || {inner}), '')")
        }
    }
}

/// Each frame of each stack with its position, innermost first (0).
fn stack_positions(d: Dialect) -> &'static str {
    match d {
        Dialect::DuckDb => {
            "SELECT host, trace, stack_id, pid, kernel, truncated, unnest(frames) AS addr, \
             generate_subscripts(frames, 1) AS pos FROM stacks"
        }
        Dialect::Spark => {
            "SELECT host, trace, stack_id, pid, kernel, truncated, p.pos, p.addr \
             FROM stacks LATERAL VIEW posexplode(frames) p AS pos, addr"
        }
    }
}

/// `col` of a group's rows joined by `sep` in the order of `by`.
fn ordered_join(d: Dialect, col: &str, by: &str, sep: &str) -> String {
    match d {
        Dialect::DuckDb => format!("string_agg({col}, '{sep}' ORDER BY {by})"),
        Dialect::Spark => format!(
            "array_join(transform(array_sort(collect_list(struct({by}, {col}))), x -> x.{col}), '{sep}')"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_paths_and_refuses_what_it_cannot_quote() {
        let src = Source::Trace {
            path: "/t/it's".into(),
            host: "h".into(),
            trace: "t".into(),
        };
        let sql = outstanding_sql(Dialect::DuckDb, SqlGroup::Stack, &[src]).unwrap();
        assert!(sql.contains("'/t/it''s/events/*.parquet'"), "{sql}");
        let bad = Source::Dataset("/a`b".into());
        assert!(outstanding_sql(Dialect::Spark, SqlGroup::Host, &[bad]).is_err());
        assert!(outstanding_sql(Dialect::Spark, SqlGroup::Host, &[]).is_err());
    }
}
