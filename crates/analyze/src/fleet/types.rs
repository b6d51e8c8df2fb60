//! What a multi-trace report adds to a [`Report`](crate::Report): where
//! each trace came from and what it holds ([`TraceTotals`]), those totals
//! grouped ([`GroupBy`], [`GroupTotals`]), and which traces hold each
//! merged stack ([`StackOrigin`]). Nothing here reads the rest of the
//! crate (only the trace crate's loss table): the report's model and its formats import these types.

use std::collections::BTreeMap;

use serde::Serialize;

/// What the per-trace breakdown of a multi-trace report is grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    /// One row per host (the `host=` partition, else meta.json's host).
    Host,
    /// One row per trace, named `host/trace`.
    #[default]
    Trace,
    /// One row per traced command (the command `record` started, else
    /// memleak's own command line).
    Command,
}

impl GroupBy {
    /// Name as given on the command line and written in JSON.
    pub fn name(self) -> &'static str {
        match self {
            GroupBy::Host => "host",
            GroupBy::Trace => "trace",
            GroupBy::Command => "command",
        }
    }
}

/// One trace of a multi-trace report: where it is, whose it is, and what
/// its own analysis found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceTotals {
    /// The trace directory.
    pub path: String,
    /// Host: the `host=` partition of the path, else meta.json's `host`.
    pub host: String,
    /// Trace id: the `trace=` partition of the path, else the directory's
    /// name.
    pub trace: String,
    /// The traced command.
    pub command: String,
    /// Event rows read.
    pub events: u64,
    /// From the recording's start to its evaluation time, ns.
    pub duration_ns: u64,
    /// Whether the recording finished cleanly.
    pub complete: bool,
    /// Events its recorder lost, by reason (meta.json's).
    pub lost_by_reason: BTreeMap<String, u64>,
    /// Outstanding bytes matching every filter.
    pub bytes: u64,
    /// Outstanding allocations matching every filter.
    pub count: u64,
    /// Its stacks with outstanding allocations.
    pub stacks: u64,
    /// Its own peak of the live total.
    pub peak_bytes: u64,
    /// Reachability scans whose verdicts apply.
    pub scans: u64,
}

impl TraceTotals {
    /// Its lost events sorted by what they mean: those missing from the
    /// trace make its figures uncertain.
    pub fn losses(&self) -> memleak_trace::Losses {
        memleak_trace::Losses::of(&self.lost_by_reason)
    }

    /// The name of its group under `by`: its host, `host/trace` (trace ids
    /// are a host's own: every host of a dataset may have a `trace=1`), or
    /// its command.
    pub fn group(&self, by: GroupBy) -> String {
        match by {
            GroupBy::Host => self.host.clone(),
            GroupBy::Trace => format!("{}/{}", self.host, self.trace),
            GroupBy::Command => self.command.clone(),
        }
    }

    /// What tells its group apart under `by`: the name, but for `trace`
    /// the path, so that two traces named alike stay two rows.
    pub fn group_key(&self, by: GroupBy) -> String {
        match by {
            GroupBy::Trace => self.path.clone(),
            _ => self.group(by),
        }
    }
}

/// Outstanding allocations of a group of traces (the whole report's, or
/// one stack's).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct GroupTotals {
    /// The group's name: a host, a trace id or a command.
    pub group: String,
    /// Traces in the group (holding the stack, for a stack's groups).
    pub traces: u64,
    /// Outstanding bytes.
    pub bytes: u64,
    /// Outstanding allocations.
    pub count: u64,
}

/// Where a stack of a multi-trace report comes from: its stack id, pid
/// and addresses are those of one trace (the one holding the most bytes
/// under its key), and it is merged from every trace holding the key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StackOrigin {
    /// The key the stack was matched by across traces
    /// ([`stack_key`](crate::diff::stack_key)).
    pub key: String,
    /// The host of the trace its id, pid and addresses are from.
    pub host: String,
    /// That trace's id.
    pub trace: String,
    /// Traces with outstanding allocations under the key.
    pub traces: u64,
    /// Those allocations by group, most bytes first (ties by name).
    pub groups: Vec<GroupTotals>,
}

/// The breakdown of a multi-trace report.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fleet {
    /// How `groups` (and each stack's groups) are grouped.
    pub group_by: GroupBy,
    /// Every trace, in the order given (or found).
    pub traces: Vec<TraceTotals>,
    /// The traces' outstanding allocations by group, most bytes first
    /// (ties by name).
    pub groups: Vec<GroupTotals>,
}
