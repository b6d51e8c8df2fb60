//! `memleak sql`: print the SQL that computes the outstanding-by-stack
//! report over traces or a dataset, for DuckDB or Spark (the statement is
//! written by `memleak_analyze::sql`; docs/fleet.md shows how to run it).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::bail;
use clap::ValueEnum;
use memleak_analyze::sql::{outstanding_sql, Dialect, Source, SqlGroup};
use memleak_trace::discover::{find_traces, is_trace};
use memleak_trace::Meta;

/// SQL engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DialectArg {
    /// DuckDB (one machine): `duckdb -c "$(memleak sql …)"`.
    Duckdb,
    /// Spark SQL (a cluster): `spark-sql -e "$(memleak sql --dialect spark …)"`.
    Spark,
}

/// What one row of the result is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GroupArg {
    /// A stack over every trace, with how many hosts and traces hold it.
    Stack,
    /// A stack on one host.
    Host,
    /// A stack in one trace.
    Trace,
}

/// Arguments of `memleak sql`.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  memleak sql trace.parquet | duckdb
  memleak sql --group-by host /data/fleet > fleet.sql; duckdb -c \".read fleet.sql\"
  spark-sql -e \"$(memleak sql --dialect spark --group-by host /shared/fleet)\"")]
pub struct SqlArgs {
    /// Traces (directories written by `memleak record`) or dataset roots
    /// (`ROOT/host=H/trace=ID/…`, written by `record --dataset ROOT`).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The engine to write for.
    #[arg(long, value_enum, default_value_t = DialectArg::Duckdb)]
    pub dialect: DialectArg,
    /// One row per stack, per stack and host, or per stack and trace.
    #[arg(long, value_enum, default_value_t = GroupArg::Stack)]
    pub group_by: GroupArg,
}

pub fn run(args: SqlArgs) -> anyhow::Result<ExitCode> {
    let mut sources = Vec::new();
    for path in &args.paths {
        sources.push(source(path)?);
    }
    let dialect = match args.dialect {
        DialectArg::Duckdb => Dialect::DuckDb,
        DialectArg::Spark => Dialect::Spark,
    };
    let group = match args.group_by {
        GroupArg::Stack => SqlGroup::Stack,
        GroupArg::Host => SqlGroup::Host,
        GroupArg::Trace => SqlGroup::Trace,
    };
    let sql = outstanding_sql(dialect, group, &sources)?;
    crate::output::to_stdout(|out| out.write_all(sql.as_bytes()))?;
    Ok(ExitCode::SUCCESS)
}

/// A trace (it has a meta.json) or a dataset root: every trace under it
/// (found as `memleak analyze ROOT` finds them) at `ROOT/host=H/trace=ID/`,
/// the layout the statement's glob reads.
fn source(path: &Path) -> anyhow::Result<Source> {
    let text = path.to_string_lossy().into_owned();
    if is_trace(path) {
        let meta = Meta::load(path)?;
        check_version(path, &meta)?;
        let trace = path
            .file_name()
            .map_or(text.clone(), |n| n.to_string_lossy().into_owned());
        return Ok(Source::Trace {
            path: text,
            host: meta.host.clone(),
            trace,
        });
    }
    let found = find_traces(path)?;
    if found.is_empty() {
        bail!(
            "{}: neither a trace (no meta.json) nor a dataset (no host=*/trace=*/meta.json)",
            path.display()
        );
    }
    for t in &found {
        let relative = t.path.strip_prefix(path).unwrap_or(&t.path);
        let names: Vec<String> = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if !matches!(names.as_slice(), [h, t] if h.starts_with("host=") && t.starts_with("trace="))
        {
            bail!(
                "{}: neither a trace (no meta.json) nor a dataset: the trace {} is not at \
                 host=*/trace=* below it, which the statement reads (give it as a path of its own)",
                path.display(),
                t.path.display()
            );
        }
        check_version(&t.path, &Meta::load(&t.path)?)?;
    }
    Ok(Source::Dataset(text))
}

/// The statement orders events by `seq` (format 1.5), and counts every
/// event as one allocation: a sampled recording's (`record --sample`)
/// would need each scaled by the mean in its meta.json, which the
/// statement cannot read, so it is refused (`memleak analyze` scales).
fn check_version(path: &Path, meta: &Meta) -> anyhow::Result<()> {
    if let Some(s) = meta.sampling {
        bail!(
            "{}: a sampled recording (--sample {}): the statement would count samples, not \
             allocations; use memleak analyze, which scales them",
            path.display(),
            crate::units::format_size(s.mean_bytes)
        );
    }
    if meta.version().is_none_or(|v| v < (1, 5)) {
        bail!(
            "{}: format {} has no seq column to order events by in SQL (recorded by an older memleak; `memleak analyze` reads it)",
            path.display(),
            meta.format_version
        );
    }
    Ok(())
}
