//! Minimal ELF64 little-endian reader for probe placement: function symbols
//! (`.dynsym` and `.symtab`, with GNU symbol versions), `PT_LOAD` segments
//! for address → file offset, and the bytes of a function.
//!
//! Only what [`crate::placement`] needs; everything is bounds-checked and a
//! malformed file yields an [`ElfError`] or fewer symbols, never a panic.

use std::path::{Path, PathBuf};

/// Errors from [`ElfFile::open`] / [`ElfFile::parse`].
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// The file could not be read. The OS error is part of the message,
    /// not its `source()`, which chain printers would print again.
    #[error("reading {}: {}", path.display(), memleak_trace::describe_io(error))]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// Valid ELF, but not 64-bit little-endian x86-64.
    #[error("not a supported ELF file: {0}")]
    Unsupported(&'static str),
    /// Truncated or inconsistent headers.
    #[error("malformed ELF file: {0}")]
    Malformed(&'static str),
}

/// Symbol type, restricted to what can be probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymbolKind {
    /// `STT_FUNC`
    Func,
    /// `STT_GNU_IFUNC`: the value is the resolver.
    Ifunc,
}

/// A defined function symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Name without version.
    pub name: String,
    /// GNU version name (e.g. `GLIBC_2.2.5`), if any.
    pub version: Option<String>,
    /// False for hidden (non-default, `name@VERSION`) versions.
    pub default_version: bool,
    /// True when the symbol comes from `.dynsym`.
    pub dynamic: bool,
    /// `st_value`: the virtual address.
    pub value: u64,
    /// `st_size` in bytes (0 when unknown).
    pub size: u64,
    /// Function or ifunc.
    pub kind: SymbolKind,
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    vaddr: u64,
    offset: u64,
    filesz: u64,
}

/// The bytes of an ELF file: mapped read-only from disk, or owned.
///
/// Mapped, only the pages that are read (headers, symbol tables, a few
/// functions' code) are ever loaded: reading whole files (libc's debug
/// file is megabytes) showed in every recording's start-up.
enum Bytes {
    Owned(Vec<u8>),
    Mapped(memmap2::Mmap),
}

/// Maps `file` whole, read-only and private, or `None` (empty file, or
/// mmap refused).
fn map_whole(file: &std::fs::File) -> Option<memmap2::Mmap> {
    let len = usize::try_from(file.metadata().ok()?.len()).ok()?;
    if len == 0 {
        return None;
    }
    // SAFETY: a read-only private mapping, owned by the `Bytes` every
    // slice of it borrows from. The file must not be truncated or rewritten
    // in place while it is mapped: package managers replace libraries and
    // debug files by renaming a new file over the old one, which leaves
    // the mapped one as it was.
    unsafe {
        memmap2::MmapOptions::new()
            .len(len)
            .map_copy_read_only(file)
    }
    .ok()
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Owned(v) => v,
            Bytes::Mapped(m) => m,
        }
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.len())
    }
}

/// A parsed ELF file (kept in memory).
#[derive(Debug)]
pub struct ElfFile {
    data: Bytes,
    segments: Vec<Segment>,
    symbols: Vec<Symbol>,
    /// (offset, size) of note segments and sections.
    notes: Vec<(u64, u64)>,
}

const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const SHT_GNU_VERDEF: u32 = 0x6fff_fffd;
const SHT_GNU_VERSYM: u32 = 0x6fff_ffff;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const SHT_NOTE: u32 = 7;
const NT_GNU_BUILD_ID: u32 = 3;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
const EM_X86_64: u16 = 62;

fn rd<const N: usize>(d: &[u8], off: u64) -> Result<[u8; N], ElfError> {
    let start = usize::try_from(off).map_err(|_| ElfError::Malformed("offset"))?;
    d.get(start..start.checked_add(N).ok_or(ElfError::Malformed("offset"))?)
        .map(|s| s.try_into().unwrap())
        .ok_or(ElfError::Malformed("truncated"))
}
fn u16_at(d: &[u8], off: u64) -> Result<u16, ElfError> {
    rd::<2>(d, off).map(u16::from_le_bytes)
}
fn u32_at(d: &[u8], off: u64) -> Result<u32, ElfError> {
    rd::<4>(d, off).map(u32::from_le_bytes)
}
fn u64_at(d: &[u8], off: u64) -> Result<u64, ElfError> {
    rd::<8>(d, off).map(u64::from_le_bytes)
}

fn cstr(d: &[u8], off: u64) -> Option<&str> {
    let start = usize::try_from(off).ok()?;
    let rest = d.get(start..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
}

#[derive(Clone, Copy)]
struct Section {
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

impl ElfFile {
    /// Maps (or, failing that, reads) and parses the file.
    pub fn open(path: &Path) -> Result<Self, ElfError> {
        let io = |error| ElfError::Io {
            path: path.to_path_buf(),
            error,
        };
        let mut file = std::fs::File::open(path).map_err(io)?;
        let data = match map_whole(&file) {
            Some(m) => Bytes::Mapped(m),
            None => {
                let mut v = Vec::new();
                std::io::Read::read_to_end(&mut file, &mut v).map_err(io)?;
                Bytes::Owned(v)
            }
        };
        Self::parse_bytes(data)
    }

    /// Parses an in-memory ELF64 little-endian x86-64 image.
    pub fn parse(data: Vec<u8>) -> Result<Self, ElfError> {
        Self::parse_bytes(Bytes::Owned(data))
    }

    fn parse_bytes(data: Bytes) -> Result<Self, ElfError> {
        let d = &data[..];
        if d.get(..4) != Some(b"\x7fELF") {
            return Err(ElfError::Unsupported("bad magic"));
        }
        if d.get(4) != Some(&2) || d.get(5) != Some(&1) {
            return Err(ElfError::Unsupported("only 64-bit little-endian ELF"));
        }
        if u16_at(d, 18)? != EM_X86_64 {
            return Err(ElfError::Unsupported("not x86-64"));
        }
        let phoff = u64_at(d, 32)?;
        let shoff = u64_at(d, 40)?;
        let phentsize = u64::from(u16_at(d, 54)?);
        let phnum = u64::from(u16_at(d, 56)?);
        let shentsize = u64::from(u16_at(d, 58)?);
        let shnum = u64::from(u16_at(d, 60)?);

        let mut segments = Vec::new();
        let mut notes = Vec::new();
        for i in 0..phnum {
            let ph = phoff + i * phentsize;
            match u32_at(d, ph)? {
                PT_LOAD => segments.push(Segment {
                    offset: u64_at(d, ph + 8)?,
                    vaddr: u64_at(d, ph + 16)?,
                    filesz: u64_at(d, ph + 32)?,
                }),
                PT_NOTE => notes.push((u64_at(d, ph + 8)?, u64_at(d, ph + 32)?)),
                _ => {}
            }
        }

        let mut sections = Vec::new();
        if shoff != 0 {
            for i in 0..shnum {
                let sh = shoff + i * shentsize;
                sections.push(Section {
                    kind: u32_at(d, sh + 4)?,
                    offset: u64_at(d, sh + 24)?,
                    size: u64_at(d, sh + 32)?,
                    link: u32_at(d, sh + 40)?,
                    entsize: u64_at(d, sh + 56)?,
                });
            }
        }

        notes.extend(
            sections
                .iter()
                .filter(|s| s.kind == SHT_NOTE)
                .map(|s| (s.offset, s.size)),
        );
        let versions = read_verdef(d, &sections);
        let versym = sections.iter().find(|s| s.kind == SHT_GNU_VERSYM).copied();
        let mut symbols = Vec::new();
        for sec in &sections {
            let dynamic = match sec.kind {
                SHT_DYNSYM => true,
                SHT_SYMTAB => false,
                _ => continue,
            };
            let Some(strtab) = sections.get(sec.link as usize) else {
                continue;
            };
            let entsize = if sec.entsize == 0 { 24 } else { sec.entsize };
            for i in 0..sec.size / entsize {
                let e = sec.offset + i * entsize;
                let Ok(name_off) = u32_at(d, e) else { break };
                let info = d.get(e as usize + 4).copied().unwrap_or(0);
                let shndx = u16_at(d, e + 6).unwrap_or(0);
                let value = u64_at(d, e + 8).unwrap_or(0);
                let size = u64_at(d, e + 16).unwrap_or(0);
                let kind = match info & 0xf {
                    STT_FUNC => SymbolKind::Func,
                    STT_GNU_IFUNC => SymbolKind::Ifunc,
                    _ => continue,
                };
                if shndx == 0 || value == 0 {
                    continue; // undefined
                }
                let Some(name) = cstr(d, strtab.offset + u64::from(name_off)) else {
                    continue;
                };
                if name.is_empty() {
                    continue;
                }
                let (version, default_version) = match (dynamic, versym) {
                    (true, Some(vs)) => match u16_at(d, vs.offset + 2 * i) {
                        Ok(v) => {
                            let idx = v & 0x7fff;
                            let name = versions
                                .iter()
                                .find(|(ndx, _)| *ndx == idx && idx > 1)
                                .map(|(_, n)| n.clone());
                            (name, v & 0x8000 == 0)
                        }
                        Err(_) => (None, true),
                    },
                    _ => (None, true),
                };
                symbols.push(Symbol {
                    name: name.to_string(),
                    version,
                    default_version,
                    dynamic,
                    value,
                    size,
                    kind,
                });
            }
        }
        Ok(ElfFile {
            data,
            segments,
            symbols,
            notes,
        })
    }

    /// The GNU build id (`NT_GNU_BUILD_ID` note), if the file has one.
    pub fn build_id(&self) -> Option<&[u8]> {
        let d = &self.data[..];
        for &(start, size) in &self.notes {
            let mut off = start;
            while off + 12 <= start + size {
                let namesz = u64::from(u32_at(d, off).ok()?);
                let descsz = u64::from(u32_at(d, off + 4).ok()?);
                let kind = u32_at(d, off + 8).ok()?;
                let name = off + 12;
                let desc = name + namesz.next_multiple_of(4);
                if kind == NT_GNU_BUILD_ID
                    && d.get(name as usize..(name + namesz) as usize) == Some(b"GNU\0")
                {
                    return d.get(desc as usize..(desc + descsz) as usize);
                }
                off = desc + descsz.next_multiple_of(4);
            }
        }
        None
    }

    /// Where distributions install the separate debug file of an object
    /// with this build id (`/usr/lib/debug/.build-id/xx/rest.debug`).
    pub fn debug_file_path(&self) -> Option<std::path::PathBuf> {
        let id = self.build_id()?;
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        if hex.len() < 3 {
            return None;
        }
        Some(std::path::PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &hex[..2],
            &hex[2..]
        )))
    }

    /// All defined function symbols (dynamic first, then `.symtab`).
    pub fn function_symbols(&self) -> impl Iterator<Item = &Symbol> {
        self.symbols.iter()
    }

    /// Finds a function by name, optionally versioned: `name`,
    /// `name@VERSION` or `name@@VERSION`. Without a version the default
    /// (`@@`) version wins over hidden ones; `.dynsym` wins over `.symtab`.
    /// A symbol of size 0 is used only when no sized one exists.
    pub fn lookup_function(&self, requested: &str) -> Option<&Symbol> {
        let (name, version) = match requested.find('@') {
            Some(at) => (
                &requested[..at],
                Some(requested[at..].trim_start_matches('@')),
            ),
            None => (requested, None),
        };
        self.symbols
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| match version {
                Some(v) => s.version.as_deref() == Some(v),
                None => true,
            })
            .max_by_key(|s| (s.default_version, s.dynamic, s.size != 0))
    }

    /// File offset of a virtual address, via the `PT_LOAD` segment containing it.
    pub fn vaddr_to_offset(&self, vaddr: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz)
            .map(|s| vaddr - s.vaddr + s.offset)
    }

    /// The file bytes backing `[vaddr, vaddr + len)`, clipped to the segment's
    /// file size (so possibly shorter than `len`).
    pub fn bytes_at(&self, vaddr: u64, len: u64) -> Option<&[u8]> {
        let seg = self
            .segments
            .iter()
            .find(|s| vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz)?;
        let avail = seg.filesz - (vaddr - seg.vaddr);
        let start = usize::try_from(vaddr - seg.vaddr + seg.offset).ok()?;
        let n = usize::try_from(len.min(avail)).ok()?;
        self.data.get(start..start.checked_add(n)?)
    }
}

/// A section found by [`ElfFile::section`].
#[derive(Clone, Copy, Debug)]
pub struct SectionData<'a> {
    /// `sh_addr`: where the section is in the object's virtual address
    /// space (0 for sections that are not loaded, such as `.debug_frame`).
    pub vaddr: u64,
    /// The section's bytes in the file.
    pub bytes: &'a [u8],
}

const SHT_NOBITS: u32 = 8;
const SHF_COMPRESSED: u64 = 0x800;

impl ElfFile {
    /// The entry point (`e_entry`), 0 if it has none.
    pub fn entry(&self) -> u64 {
        u64_at(&self.data[..], 24).unwrap_or(0)
    }

    /// The first section named `name`, or `None` when there is none or it
    /// has no usable bytes: `SHT_NOBITS` (the `.debug_*` stubs left in a
    /// stripped file) and `SHF_COMPRESSED` sections (not decompressed here).
    ///
    /// The section headers are read again on each call, rather than kept
    /// from [`ElfFile::parse`], because only the unwind-table builder asks,
    /// a few times per object.
    pub fn section(&self, name: &str) -> Option<SectionData<'_>> {
        let d = &self.data[..];
        let shoff = u64_at(d, 40).ok()?;
        let shentsize = u64::from(u16_at(d, 58).ok()?);
        let shnum = u64::from(u16_at(d, 60).ok()?);
        let shstrndx = u64::from(u16_at(d, 62).ok()?);
        if shoff == 0 || shentsize < 64 {
            return None;
        }
        let header = |i: u64| shoff.checked_add(i.checked_mul(shentsize)?);
        let names = u64_at(d, header(shstrndx)? + 24).ok()?;
        for i in 0..shnum {
            let sh = header(i)?;
            let Ok(name_off) = u32_at(d, sh) else { break };
            if cstr(d, names.saturating_add(u64::from(name_off))) != Some(name) {
                continue;
            }
            let kind = u32_at(d, sh + 4).ok()?;
            let flags = u64_at(d, sh + 8).ok()?;
            if kind == SHT_NOBITS || flags & SHF_COMPRESSED != 0 {
                return None;
            }
            let vaddr = u64_at(d, sh + 16).ok()?;
            let offset = usize::try_from(u64_at(d, sh + 24).ok()?).ok()?;
            let size = usize::try_from(u64_at(d, sh + 32).ok()?).ok()?;
            let bytes = d.get(offset..offset.checked_add(size)?)?;
            return Some(SectionData { vaddr, bytes });
        }
        None
    }

    /// The `PT_LOAD` segments as `(p_vaddr, p_offset, p_filesz)`, for
    /// callers that map file offsets to addresses (load biases).
    pub fn load_segments(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.segments.iter().map(|s| (s.vaddr, s.offset, s.filesz))
    }
}

impl ElfFile {
    /// Whether the file has a `.symtab` (`strip` removes it).
    pub fn has_symtab(&self) -> bool {
        self.section(".symtab").is_some()
    }
}

/// `(version index, name)` pairs from `.gnu.version_d`.
fn read_verdef(d: &[u8], sections: &[Section]) -> Vec<(u16, String)> {
    let mut out = Vec::new();
    let Some(sec) = sections.iter().find(|s| s.kind == SHT_GNU_VERDEF) else {
        return out;
    };
    let Some(strtab) = sections.get(sec.link as usize) else {
        return out;
    };
    let mut off = sec.offset;
    let end = sec.offset.saturating_add(sec.size);
    // Bounded: a malformed chain must not loop forever.
    for _ in 0..4096 {
        if off >= end {
            break;
        }
        let (Ok(ndx), Ok(aux), Ok(next)) =
            (u16_at(d, off + 4), u32_at(d, off + 12), u32_at(d, off + 16))
        else {
            break;
        };
        if let Ok(name_off) = u32_at(d, off + u64::from(aux)) {
            if let Some(name) = cstr(d, strtab.offset + u64::from(name_off)) {
                out.push((ndx, name.to_string()));
            }
        }
        if next == 0 {
            break;
        }
        off += u64::from(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapped file parses exactly as its bytes read into memory do.
    #[test]
    fn open_maps_what_parse_reads() {
        let exe = std::env::current_exe().unwrap();
        let mapped = ElfFile::open(&exe).unwrap();
        assert!(matches!(mapped.data, Bytes::Mapped(_)));
        let owned = ElfFile::parse(std::fs::read(&exe).unwrap()).unwrap();
        assert_eq!(mapped.data.len(), owned.data.len());
        assert!(mapped.data[..] == owned.data[..]);
        assert_eq!(mapped.symbols, owned.symbols);
        assert_eq!(mapped.build_id(), owned.build_id());
        assert!(mapped.function_symbols().next().is_some());
    }

    /// An empty file is read, not mapped, and is no ELF file; a missing
    /// one is an I/O error naming it.
    #[test]
    fn empty_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.so");
        std::fs::write(&empty, b"").unwrap();
        let err = ElfFile::open(&empty).unwrap_err();
        assert_eq!(err.to_string(), "not a supported ELF file: bad magic");
        let short = dir.path().join("short.so");
        std::fs::write(&short, b"\x7fELF\x02\x01").unwrap();
        let err = ElfFile::open(&short).unwrap_err();
        assert_eq!(err.to_string(), "malformed ELF file: truncated");
        let missing = dir.path().join("missing.so");
        let err = ElfFile::open(&missing).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("reading {}: No such file or directory", missing.display())
        );
        // Said once: not also the error's source, which a chain printer
        // would add again.
        assert!(std::error::Error::source(&err).is_none());
    }
}
