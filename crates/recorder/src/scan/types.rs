//! What a scan judges and what it says: shared by the scan's modules.

/// An outstanding allocation to judge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Start address (a mapping's start for an `mmap` block).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// An `mmap` region rather than a heap block.
    pub is_mapping: bool,
}

/// What a scan says of a block, memcheck's four kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// No pointer to it (nor into it) from anywhere but other lost blocks'
    /// cliques; it leads one.
    DefinitelyLost,
    /// Reached only from lost blocks.
    IndirectlyLost,
    /// Reached only through interior pointers (or from such blocks).
    PossiblyLost,
    /// A pointer to its start is reachable from a root.
    Reachable,
}

impl Verdict {
    /// All verdicts, most severe first.
    pub const ALL: [Verdict; 4] = [
        Verdict::DefinitelyLost,
        Verdict::IndirectlyLost,
        Verdict::PossiblyLost,
        Verdict::Reachable,
    ];

    /// Short name: `definitely`, `indirectly`, `possibly`, `reachable`.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::DefinitelyLost => "definitely",
            Verdict::IndirectlyLost => "indirectly",
            Verdict::PossiblyLost => "possibly",
            Verdict::Reachable => "reachable",
        }
    }

    /// Whether the block counts as lost (not reachable).
    pub fn is_lost(self) -> bool {
        self != Verdict::Reachable
    }
}

/// Why a scan failed.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// The process exited (or exec'd away its threads) before or during
    /// the scan.
    #[error("process {0} exited during the scan")]
    Gone(u32),
    /// Not allowed to stop or read the process.
    #[error("{0}")]
    Permission(String),
    /// Anything else the system refused.
    #[error("{0}")]
    Os(String),
}
