//! Leak verdicts: the join of a trace's `scan` table (what a reachability
//! scan of the stopped process found for each outstanding block) with the
//! blocks the replay leaves outstanding, and the `--verdict` selection.
//!
//! The scan ran at one moment (`ts_ns`); the report is about another (the
//! end of the recording, or `--at`). A scan row says something about an
//! outstanding block only if it is the same block: same process, same
//! start address and size, and allocated at or before the scan. Blocks
//! with no such row (allocated after the scan, of a process that was not
//! scanned, kernel allocations) are *unscanned*. A report evaluated before
//! every scan has no verdicts at all. The table is read only when
//! `meta.json` lists a scan, so a trace without one costs nothing here.

use std::collections::HashMap;

use memleak_trace::{ScanInfo, ScanRecord, ScanVerdict, Trace};
use serde::Serialize;

/// Outstanding bytes and allocations of one class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ClassTotals {
    /// Bytes.
    pub bytes: u64,
    /// Allocations (a mapping cut in pieces by munmap counts once).
    pub allocations: u64,
}

impl ClassTotals {
    pub(crate) fn add(&mut self, bytes: u64, allocations: u64) {
        self.bytes += bytes;
        self.allocations += allocations;
    }
}

/// Bytes and blocks of each verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct VerdictTotals {
    /// No pointer to the block anywhere.
    pub definitely: ClassTotals,
    /// Pointed to only from lost blocks.
    pub indirectly: ClassTotals,
    /// Reached only through interior pointers.
    pub possibly: ClassTotals,
    /// A pointer to its start is reachable from the roots.
    pub reachable: ClassTotals,
    /// Outstanding, but not in the scan (allocated after it, or of a
    /// process or kind that was not scanned).
    pub unscanned: ClassTotals,
}

impl VerdictTotals {
    /// The totals of one verdict (`None`: unscanned).
    pub fn get(&self, v: Option<ScanVerdict>) -> ClassTotals {
        match v {
            Some(ScanVerdict::DefinitelyLost) => self.definitely,
            Some(ScanVerdict::IndirectlyLost) => self.indirectly,
            Some(ScanVerdict::PossiblyLost) => self.possibly,
            Some(ScanVerdict::Reachable) => self.reachable,
            None => self.unscanned,
        }
    }

    fn get_mut(&mut self, v: Option<ScanVerdict>) -> &mut ClassTotals {
        match v {
            Some(ScanVerdict::DefinitelyLost) => &mut self.definitely,
            Some(ScanVerdict::IndirectlyLost) => &mut self.indirectly,
            Some(ScanVerdict::PossiblyLost) => &mut self.possibly,
            Some(ScanVerdict::Reachable) => &mut self.reachable,
            None => &mut self.unscanned,
        }
    }

    /// Counts a block.
    pub fn add(&mut self, v: Option<ScanVerdict>, bytes: u64, allocations: u64) {
        let t = self.get_mut(v);
        t.bytes += bytes;
        t.allocations += allocations;
    }

    /// Adds another set of totals.
    pub fn merge(&mut self, o: &VerdictTotals) {
        for v in VERDICTS_AND_UNSCANNED {
            let t = o.get(v);
            self.add(v, t.bytes, t.allocations);
        }
    }

    /// The worst verdict with any block, and its totals (`None` inside:
    /// unscanned), or `None` when there is no block at all.
    pub fn worst(&self) -> Option<(Option<ScanVerdict>, ClassTotals)> {
        VERDICTS_AND_UNSCANNED
            .into_iter()
            .map(|v| (v, self.get(v)))
            .find(|(_, t)| t.allocations > 0 || t.bytes > 0)
    }
}

/// The four verdicts, worst first, then unscanned (`None`).
pub const VERDICTS_AND_UNSCANNED: [Option<ScanVerdict>; 5] = [
    Some(ScanVerdict::DefinitelyLost),
    Some(ScanVerdict::IndirectlyLost),
    Some(ScanVerdict::PossiblyLost),
    Some(ScanVerdict::Reachable),
    None,
];

/// Name of a verdict on the command line and in reports; `unscanned` for
/// `None`.
pub fn verdict_name(v: Option<ScanVerdict>) -> &'static str {
    v.map_or("unscanned", ScanVerdict::name)
}

/// Rank of a verdict for sorting: definitely lost first, unscanned last.
pub fn verdict_rank(v: Option<ScanVerdict>) -> u8 {
    match v {
        Some(ScanVerdict::DefinitelyLost) => 0,
        Some(ScanVerdict::IndirectlyLost) => 1,
        Some(ScanVerdict::PossiblyLost) => 2,
        Some(ScanVerdict::Reachable) => 3,
        None => 4,
    }
}

/// Which verdicts count in a report (`--verdict`): a set of the four
/// verdicts and `unscanned`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerdictSet(u8);

impl Default for VerdictSet {
    fn default() -> Self {
        VerdictSet::ALL
    }
}

impl VerdictSet {
    /// Every verdict and the unscanned blocks: no selection.
    pub const ALL: VerdictSet = VerdictSet(0b1_1111);

    /// Parses a comma-separated list of `definitely`, `indirectly`,
    /// `possibly`, `reachable`, `unscanned` (and `lost`: the first three).
    pub fn parse(text: &str) -> Result<VerdictSet, String> {
        let mut bits = 0u8;
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            bits |= match name {
                "lost" => 0b111,
                "unscanned" => 1 << 4,
                _ => match ScanVerdict::from_name(name) {
                    Some(v) => 1 << verdict_rank(Some(v)),
                    None => {
                        return Err(format!(
                            "unknown verdict {name:?} (expected definitely, indirectly, \
                             possibly, reachable, unscanned or lost)"
                        ))
                    }
                },
            };
        }
        if bits == 0 {
            return Err("no verdict given".into());
        }
        Ok(VerdictSet(bits))
    }

    /// Whether blocks of this verdict count.
    pub fn contains(self, v: Option<ScanVerdict>) -> bool {
        self.0 & (1 << verdict_rank(v)) != 0
    }

    /// Whether this selects everything.
    pub fn is_all(self) -> bool {
        self == VerdictSet::ALL
    }

    /// The names in the set, worst first, comma-separated.
    pub fn describe(self) -> String {
        VERDICTS_AND_UNSCANNED
            .into_iter()
            .filter(|&v| self.contains(v))
            .map(verdict_name)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The scans that apply to a report and their rows, indexed by block.
pub(crate) struct ScanIndex {
    /// The scans used: per process, the last one (without an error) at or
    /// before the evaluation time.
    pub(crate) scans: Vec<ScanInfo>,
    rows: Vec<ScanRecord>,
    /// `(pid, addr)` -> index into `rows`.
    by_block: HashMap<(u32, u64), u32>,
    /// Time of the scan of each process.
    scan_ts: HashMap<u32, u64>,
    /// Whether any row kept the block's first bytes.
    pub(crate) has_contents: bool,
}

/// What the trace's scans say about a report evaluated at `eval_ts`.
pub(crate) enum Scans {
    /// The trace has no scan (or only failed ones).
    None,
    /// Every successful scan is after the evaluation time.
    AfterEval(Vec<ScanInfo>),
    /// These scans apply.
    Apply(ScanIndex),
}

impl Scans {
    /// Reads the `scan` table if `meta.json` lists a successful scan.
    pub(crate) fn load(trace: &Trace, eval_ts: u64) -> memleak_trace::Result<Scans> {
        let ok: Vec<&ScanInfo> = trace
            .meta()
            .scans
            .iter()
            .filter(|s| s.error.is_none())
            .collect();
        if ok.is_empty() {
            return Ok(Scans::None);
        }
        let mut chosen: HashMap<u32, &ScanInfo> = HashMap::new();
        for s in ok.iter().filter(|s| s.ts_ns <= eval_ts) {
            let e = chosen.entry(s.pid).or_insert(s);
            if s.ts_ns > e.ts_ns {
                *e = s;
            }
        }
        if chosen.is_empty() {
            return Ok(Scans::AfterEval(ok.into_iter().cloned().collect()));
        }
        let scan_ts: HashMap<u32, u64> = chosen.iter().map(|(&p, s)| (p, s.ts_ns)).collect();
        let mut scans: Vec<ScanInfo> = chosen.into_values().cloned().collect();
        scans.sort_by_key(|s| (s.ts_ns, s.pid));
        let rows: Vec<ScanRecord> = trace
            .scans()?
            .into_iter()
            .filter(|r| scan_ts.get(&r.pid) == Some(&r.ts_ns))
            .collect();
        let by_block = rows
            .iter()
            .enumerate()
            .map(|(i, r)| ((r.pid, r.addr), i as u32))
            .collect();
        let has_contents = rows.iter().any(|r| r.contents.is_some());
        Ok(Scans::Apply(ScanIndex {
            scans,
            rows,
            by_block,
            scan_ts,
            has_contents,
        }))
    }
}

impl ScanIndex {
    /// The verdict of an outstanding block and the index of its row, or
    /// `None` when the scan did not see it.
    pub(crate) fn lookup(
        &self,
        pid: Option<u32>,
        addr: u64,
        size: u64,
        ts: u64,
    ) -> Option<(ScanVerdict, u32)> {
        let pid = pid?;
        if ts > *self.scan_ts.get(&pid)? {
            return None; // allocated after the scan
        }
        let &i = self.by_block.get(&(pid, addr))?;
        let row = &self.rows[i as usize];
        (row.size == size).then_some((row.verdict, i))
    }

    /// A row by the index [`lookup`](Self::lookup) gave.
    pub(crate) fn row(&self, i: u32) -> &ScanRecord {
        &self.rows[i as usize]
    }
}

/// The first bytes of one lost block, as the recording kept them
/// (`--scan-contents N`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockContents {
    /// Block start.
    pub addr: u64,
    /// Block size.
    pub size: u64,
    /// Its verdict.
    pub verdict: Option<ScanVerdict>,
    /// The bytes kept (at most the recording's N).
    pub bytes: Vec<u8>,
}

/// Lost blocks whose contents a stack's report keeps, at most.
pub const CONTENTS_PER_STACK: usize = 3;

/// `hex  |printable|` of up to `max` bytes, as `hexdump -C` prints a line
/// (non-printable bytes as `.`).
pub fn hex_preview(bytes: &[u8], max: usize) -> String {
    let b = &bytes[..bytes.len().min(max)];
    let hex: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    let text: String = b
        .iter()
        .map(|&c| {
            if c.is_ascii_graphic() || c == b' ' {
                c as char
            } else {
                '.'
            }
        })
        .collect();
    format!("{}  |{text}|", hex.join(" "))
}

/// Lowercase hex of every byte, for JSON.
pub fn hex_string(bytes: &[u8]) -> String {
    bytes.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_sets_parse_and_describe() {
        let s = VerdictSet::parse("definitely, possibly").unwrap();
        assert!(s.contains(Some(ScanVerdict::DefinitelyLost)));
        assert!(s.contains(Some(ScanVerdict::PossiblyLost)));
        assert!(!s.contains(Some(ScanVerdict::IndirectlyLost)));
        assert!(!s.contains(None));
        assert_eq!(s.describe(), "definitely,possibly");
        assert_eq!(
            VerdictSet::parse("lost").unwrap().describe(),
            "definitely,indirectly,possibly"
        );
        assert!(
            VerdictSet::parse("definitely,reachable,indirectly,possibly,unscanned")
                .unwrap()
                .is_all()
        );
        assert!(VerdictSet::parse("leaked")
            .unwrap_err()
            .contains("\"leaked\""));
        assert!(VerdictSet::parse(",").is_err());
    }

    #[test]
    fn hex_preview_marks_unprintable_bytes() {
        assert_eq!(
            hex_preview(b"ab\0\xffz", 4),
            "61 62 00 ff  |ab..|".to_string()
        );
        assert_eq!(hex_string(b"\x01\xab"), "01ab");
    }
}
