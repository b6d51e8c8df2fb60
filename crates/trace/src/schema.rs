//! Table schemas and the row types written into them.
//!
//! Column names and types here are the public contract documented in
//! `docs/format.md`. Within a major version, columns and tables may be added;
//! readers ignore what they do not know.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};

/// Major version of the format. Readers refuse a newer major.
pub const FORMAT_MAJOR: u32 = 1;
/// Minor version of the format. Newer minors only add tables or columns.
pub const FORMAT_MINOR: u32 = 6;
/// Value of the `format` field of `meta.json`.
pub const FORMAT_NAME: &str = "memleak-trace";
/// Parquet key-value metadata key naming the table a segment belongs to.
pub const TABLE_KEY: &str = "memleak.table";

macro_rules! event_kinds {
    ($($(#[$doc:meta])* $variant:ident = $code:literal => $name:literal, $class:ident;)*) => {
        /// What an event row records. The on-disk form is the name string.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum EventKind {
            $($(#[$doc])* $variant = $code,)*
        }

        impl EventKind {
            /// Every kind, in code order.
            pub const ALL: &'static [EventKind] = &[$(EventKind::$variant,)*];

            /// The name stored in the `kind` column.
            pub fn name(self) -> &'static str {
                match self { $(EventKind::$variant => $name,)* }
            }

            /// Parses a stored name.
            pub fn from_name(name: &str) -> Option<Self> {
                match name { $($name => Some(EventKind::$variant),)* _ => None }
            }

            /// Parses the numeric code shared with `bpf/memleak.h`.
            pub fn from_code(code: u8) -> Option<Self> {
                match code { $($code => Some(EventKind::$variant),)* _ => None }
            }

            /// How replay treats this kind.
            pub fn class(self) -> KindClass {
                match self { $(EventKind::$variant => KindClass::$class,)* }
            }
        }
    };
}

event_kinds! {
    /// `malloc(size)`.
    Malloc = 0 => "malloc", Alloc;
    /// `calloc(n, size)`; `size` is the product.
    Calloc = 1 => "calloc", Alloc;
    /// `realloc(old_addr, size)`.
    Realloc = 2 => "realloc", Realloc;
    /// `reallocarray(old_addr, n, size)`; `size` is the product.
    Reallocarray = 3 => "reallocarray", Realloc;
    /// `free(addr)`.
    Free = 4 => "free", Free;
    /// `posix_memalign(&addr, align, size)`.
    PosixMemalign = 5 => "posix_memalign", Alloc;
    /// `memalign(align, size)`.
    Memalign = 6 => "memalign", Alloc;
    /// `aligned_alloc(align, size)`.
    AlignedAlloc = 7 => "aligned_alloc", Alloc;
    /// `valloc(size)`.
    Valloc = 8 => "valloc", Alloc;
    /// `pvalloc(size)`; `size` is the requested size.
    Pvalloc = 9 => "pvalloc", Alloc;
    /// `mmap(…)` of anonymous or file memory; a range.
    Mmap = 10 => "mmap", MapRange;
    /// `munmap(addr, size)`; may cover part of a mapping.
    Munmap = 11 => "munmap", UnmapRange;
    /// `mremap(old_addr, old_size, size, …)`; moves or resizes a mapping.
    Mremap = 12 => "mremap", RemapRange;
    /// C++ `operator new`, every variant.
    New = 13 => "new", Alloc;
    /// C++ `operator new[]`, every variant.
    NewArray = 14 => "new[]", Alloc;
    /// C++ `operator delete`, every variant.
    Delete = 15 => "delete", Free;
    /// C++ `operator delete[]`, every variant.
    DeleteArray = 16 => "delete[]", Free;
    /// Kernel `kmalloc`.
    Kmalloc = 32 => "kmalloc", Alloc;
    /// Kernel `kfree`.
    Kfree = 33 => "kfree", Free;
    /// Kernel `kmem_cache_alloc`.
    KmemCacheAlloc = 34 => "kmem_cache_alloc", Alloc;
    /// Kernel `kmem_cache_free`.
    KmemCacheFree = 35 => "kmem_cache_free", Free;
    /// Kernel page allocation; `addr` identifies the page frame (the address
    /// of its `struct page`), `size` is `PAGE_SIZE << order`.
    PageAlloc = 36 => "page_alloc", Alloc;
    /// Kernel page free; `addr` as for [`EventKind::PageAlloc`].
    PageFree = 37 => "page_free", Free;
    /// Kernel per-CPU allocation.
    PercpuAlloc = 38 => "percpu_alloc", Alloc;
    /// Kernel per-CPU free.
    PercpuFree = 39 => "percpu_free", Free;
    /// The process called exec: its user-space allocations are gone.
    Exec = 48 => "exec", Process;
    /// The process exited: its user-space allocations are gone.
    Exit = 49 => "exit", Process;
    /// The process forked; `addr` holds the child pid.
    Fork = 50 => "fork", Process;
}

/// How replay treats an [`EventKind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindClass {
    /// Creates a block at `addr` of `size` bytes.
    Alloc,
    /// Releases the block at `addr`.
    Free,
    /// Releases `old_addr` (if any) and creates `addr` (if non-zero).
    Realloc,
    /// Creates the address range `[addr, addr+size)`.
    MapRange,
    /// Removes `[addr, addr+size)` from whatever ranges it overlaps.
    UnmapRange,
    /// Moves/resizes the range at `old_addr` to `[addr, addr+size)`.
    RemapRange,
    /// Process lifecycle marker.
    Process,
}

impl EventKind {
    /// Whether the event comes from the kernel allocators.
    pub fn is_kernel(self) -> bool {
        (32..48).contains(&(self as u8))
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One row of the `events` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// CLOCK_MONOTONIC nanoseconds, as from `bpf_ktime_get_ns`.
    pub ts_ns: u64,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// What happened.
    pub kind: EventKind,
    /// Address of the block (new address for realloc/mremap).
    pub addr: u64,
    /// Bytes requested; 0 for frees.
    pub size: u64,
    /// Previous address for realloc/mremap; `None` otherwise.
    pub old_addr: Option<u64>,
    /// Previous size for mremap (the length of the range that moves);
    /// `None` otherwise.
    pub old_size: Option<u64>,
    /// Stack of the allocation, a key of the `stacks` table.
    pub stack_id: Option<u64>,
}

/// One row of the `stacks` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackRecord {
    /// Trace-unique id; events refer to it.
    pub stack_id: u64,
    /// Process the stack belongs to (0 for kernel stacks).
    pub pid: u32,
    /// True for a kernel stack.
    pub kernel: bool,
    /// True when the stack may be missing outer frames (depth limit hit,
    /// or the unwinder stopped before reaching a root frame).
    pub truncated: bool,
    /// Raw instruction addresses, innermost first. User stacks are
    /// captured when the outermost allocator call returns, so every frame,
    /// frame 0 included, is a return address: the `frames` table resolves
    /// `addr - 1`, the call instruction.
    pub frames: Vec<u64>,
}

/// One function of an inlined chain, innermost first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InlinedFrame {
    /// Function name (demangled).
    pub function: String,
    /// Source file.
    pub file: Option<String>,
    /// Source line.
    pub line: Option<u32>,
    /// Source column.
    pub column: Option<u32>,
}

/// One row of the `frames` table: an address of a process, normalized and
/// symbolized while the binaries were at hand.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FrameRecord {
    /// Process (0 for kernel addresses).
    pub pid: u32,
    /// The raw address as it appears in `stacks.frames`.
    pub addr: u64,
    /// Build id of the object, lowercase hex.
    pub build_id: Option<String>,
    /// Path of the object (or kernel module name).
    pub path: Option<String>,
    /// Offset of the address in the object file.
    pub file_offset: Option<u64>,
    /// Function containing the address (the outermost, non-inlined one).
    pub function: Option<String>,
    /// Offset of the address from the function start.
    pub func_offset: Option<u64>,
    /// Source file of the location.
    pub file: Option<String>,
    /// Source line; for return addresses, the line of the call.
    pub line: Option<u32>,
    /// Source column.
    pub column: Option<u32>,
    /// Functions inlined at this address, innermost first.
    pub inlined: Vec<InlinedFrame>,
}

/// One row of the `maps` table: a line of `/proc/PID/maps` at a time.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MapRecord {
    /// When the snapshot was taken (CLOCK_MONOTONIC ns).
    pub ts_ns: u64,
    /// Process.
    pub pid: u32,
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Permissions, as in `r-xp`.
    pub perms: String,
    /// File offset of the mapping.
    pub offset: u64,
    /// Inode of the backing file (0 for anonymous).
    pub inode: u64,
    /// Backing path or pseudo-name (`[heap]`).
    pub path: Option<String>,
    /// Build id of the backing ELF, lowercase hex.
    pub build_id: Option<String>,
}

/// What a reachability scan found for one outstanding block, as memcheck
/// names its leak kinds. The on-disk form is the name string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScanVerdict {
    /// No pointer to the block (start or interior) anywhere: no root and no
    /// other block holds one.
    DefinitelyLost,
    /// Pointed to only from lost blocks (the inner nodes of a lost tree or
    /// the members of a lost cycle but one).
    IndirectlyLost,
    /// Reachable only through pointers into its interior, not to its start.
    PossiblyLost,
    /// A root, or a reachable block, holds a pointer to its start.
    Reachable,
}

impl ScanVerdict {
    /// Every verdict, worst first.
    pub const ALL: [ScanVerdict; 4] = [
        ScanVerdict::DefinitelyLost,
        ScanVerdict::IndirectlyLost,
        ScanVerdict::PossiblyLost,
        ScanVerdict::Reachable,
    ];

    /// The name stored in the `verdict` column: `definitely`,
    /// `indirectly`, `possibly`, `reachable`.
    pub fn name(self) -> &'static str {
        match self {
            ScanVerdict::DefinitelyLost => "definitely",
            ScanVerdict::IndirectlyLost => "indirectly",
            ScanVerdict::PossiblyLost => "possibly",
            ScanVerdict::Reachable => "reachable",
        }
    }

    /// Parses a stored name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name() == name)
    }

    /// Whether the block is lost in some way (all but `reachable`).
    pub fn is_lost(self) -> bool {
        self != ScanVerdict::Reachable
    }
}

impl std::fmt::Display for ScanVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One row of the `scan` table: an outstanding block as a reachability
/// scan of the stopped process found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanRecord {
    /// CLOCK_MONOTONIC ns when the scan stopped the process (the clock of
    /// event `ts_ns`); the [`ScanInfo`](crate::meta::ScanInfo) of the scan
    /// has the same `pid` and `ts_ns`.
    pub ts_ns: u64,
    /// Process scanned.
    pub pid: u32,
    /// Block start (a mapping's start for an `mmap` block).
    pub addr: u64,
    /// Block size in bytes.
    pub size: u64,
    /// What the scan found.
    pub verdict: ScanVerdict,
    /// The first bytes of the block, when the recorder was asked to keep
    /// them (`--scan-contents N`); `None` otherwise.
    pub contents: Option<Vec<u8>>,
}

/// The tables of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Table {
    /// Allocator events.
    Events,
    /// Stack frames by id.
    Stacks,
    /// Symbolized frames.
    Frames,
    /// Memory-map snapshots.
    Maps,
    /// Reachability scans: one row per outstanding block scanned (1.3).
    Scan,
}

impl Table {
    /// Every table.
    pub const ALL: [Table; 5] = [
        Table::Events,
        Table::Stacks,
        Table::Frames,
        Table::Maps,
        Table::Scan,
    ];

    /// Directory name (and `memleak.table` metadata value).
    pub fn name(self) -> &'static str {
        match self {
            Table::Events => "events",
            Table::Stacks => "stacks",
            Table::Frames => "frames",
            Table::Maps => "maps",
            Table::Scan => "scan",
        }
    }

    /// Arrow schema of the table.
    pub fn schema(self) -> SchemaRef {
        match self {
            Table::Events => events_schema(),
            Table::Stacks => stacks_schema(),
            Table::Frames => frames_schema(),
            Table::Maps => maps_schema(),
            Table::Scan => scan_schema(),
        }
    }
}

fn u64f(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::UInt64, nullable)
}

/// Type of the `kind` column: dictionary-encoded strings, so SQL can say
/// `kind = 'malloc'` and readers decode a kind once per dictionary entry.
pub fn kind_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8))
}

/// Schema of `events`.
pub fn events_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        u64f("ts_ns", false),
        Field::new("pid", DataType::UInt32, false),
        Field::new("tid", DataType::UInt32, false),
        Field::new("kind", kind_type(), false),
        u64f("addr", false),
        u64f("size", false),
        u64f("old_addr", true),
        u64f("old_size", true),
        u64f("stack_id", true),
        u64f("seq", false),
    ]))
}

/// The format version that added a column to a table, for the columns
/// added after 1.0: a segment written by an older version lacks it.
pub fn column_since(table: Table, column: &str) -> (u32, u32) {
    match (table, column) {
        (Table::Events, "seq") => (1, 5),
        _ => (1, 0),
    }
}

/// Schema of `stacks`.
pub fn stacks_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        u64f("stack_id", false),
        Field::new("pid", DataType::UInt32, false),
        Field::new("kernel", DataType::Boolean, false),
        Field::new("truncated", DataType::Boolean, false),
        Field::new(
            "frames",
            DataType::List(Arc::new(Field::new("item", DataType::UInt64, false))),
            false,
        ),
    ]))
}

/// Fields of one entry of `frames.inlined`.
pub fn inlined_fields() -> Fields {
    Fields::from(vec![
        Field::new("function", DataType::Utf8, false),
        Field::new("file", DataType::Utf8, true),
        Field::new("line", DataType::UInt32, true),
        Field::new("column", DataType::UInt32, true),
    ])
}

/// Schema of `frames`.
pub fn frames_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("pid", DataType::UInt32, false),
        u64f("addr", false),
        Field::new("build_id", DataType::Utf8, true),
        Field::new("path", DataType::Utf8, true),
        u64f("file_offset", true),
        Field::new("function", DataType::Utf8, true),
        u64f("func_offset", true),
        Field::new("file", DataType::Utf8, true),
        Field::new("line", DataType::UInt32, true),
        Field::new("column", DataType::UInt32, true),
        Field::new(
            "inlined",
            DataType::List(Arc::new(Field::new(
                "item",
                DataType::Struct(inlined_fields()),
                false,
            ))),
            false,
        ),
    ]))
}

/// Schema of `maps`.
pub fn maps_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        u64f("ts_ns", false),
        Field::new("pid", DataType::UInt32, false),
        u64f("start", false),
        u64f("end", false),
        Field::new("perms", DataType::Utf8, false),
        u64f("offset", false),
        u64f("inode", false),
        Field::new("path", DataType::Utf8, true),
        Field::new("build_id", DataType::Utf8, true),
    ]))
}

/// Schema of `scan`.
pub fn scan_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        u64f("ts_ns", false),
        Field::new("pid", DataType::UInt32, false),
        u64f("addr", false),
        u64f("size", false),
        Field::new("verdict", DataType::Utf8, false),
        Field::new("contents", DataType::Binary, true),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_round_trip_and_are_unique() {
        let mut names = std::collections::HashSet::new();
        for &k in EventKind::ALL {
            assert!(names.insert(k.name()), "duplicate name {}", k.name());
            assert_eq!(EventKind::from_name(k.name()), Some(k));
            assert_eq!(EventKind::from_code(k as u8), Some(k));
        }
        assert_eq!(EventKind::from_name("calloc"), Some(EventKind::Calloc));
        assert_eq!(EventKind::from_name("nonsense"), None);
        assert!(EventKind::Kfree.is_kernel());
        assert!(!EventKind::Free.is_kernel());
        assert!(!EventKind::Exec.is_kernel());
    }
}
