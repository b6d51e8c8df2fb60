//! The symbols and segments of an ELF object as `readelf` lists them, as
//! an oracle for the frames the recorder names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One symbol of `.symtab` or `.dynsym`.
#[derive(Debug, Clone)]
pub struct ElfSym {
    pub name: String,
    pub value: u64,
    pub size: u64,
    /// `FUNC`, `IFUNC`, `OBJECT`, `NOTYPE`, …
    pub kind: String,
}

/// What `readelf` says about an object and its debug file.
#[derive(Debug, Default)]
pub struct ElfSyms {
    /// `(p_offset, p_vaddr, p_filesz, executable)` of each `PT_LOAD`.
    pub loads: Vec<(u64, u64, u64, bool)>,
    /// Every defined symbol of the object and of its debug file.
    pub syms: Vec<ElfSym>,
    /// A separate debug file was found (by build id).
    pub has_debug_file: bool,
}

fn readelf(args: &[&str], path: &Path) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(path)
        .output()
        .expect("readelf runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

impl ElfSyms {
    pub fn read(path: &Path) -> ElfSyms {
        let mut e = ElfSyms::default();
        for line in readelf(&["-lW"], path).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.first() == Some(&"LOAD") && f.len() >= 8 {
                let flags: String = f[6..f.len() - 1].concat();
                e.loads.push((
                    hex(f[1]).unwrap(),
                    hex(f[2]).unwrap(),
                    hex(f[4]).unwrap(),
                    flags.contains('E'),
                ));
            }
        }
        let mut files = vec![path.to_path_buf()];
        let notes = readelf(&["-nW"], path);
        if let Some(id) = notes
            .lines()
            .find_map(|l| l.split_once("Build ID: ").map(|(_, id)| id.trim()))
        {
            let dbg = PathBuf::from(format!(
                "/usr/lib/debug/.build-id/{}/{}.debug",
                &id[..2],
                &id[2..]
            ));
            if dbg.exists() {
                e.has_debug_file = true;
                files.push(dbg);
            }
        }
        for file in files {
            for line in readelf(&["-sW"], &file).lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 8 || !f[0].ends_with(':') || f[6] == "UND" {
                    continue;
                }
                let size = if let Some(h) = f[2].strip_prefix("0x") {
                    u64::from_str_radix(h, 16).unwrap_or(0)
                } else {
                    f[2].parse().unwrap_or(0)
                };
                e.syms.push(ElfSym {
                    name: f[7].split('@').next().unwrap().to_string(),
                    value: hex(f[1]).unwrap_or(0),
                    size,
                    kind: f[3].to_string(),
                });
            }
        }
        e
    }

    /// The virtual address of a file offset, and whether its segment is
    /// executable.
    pub fn vaddr(&self, file_offset: u64) -> Option<(u64, bool)> {
        self.loads
            .iter()
            .find(|&&(off, _, size, _)| file_offset >= off && file_offset - off < size)
            .map(|&(off, vaddr, _, exec)| (file_offset - off + vaddr, exec))
    }

    /// The file offset of a virtual address.
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.loads
            .iter()
            .find(|&&(_, va, size, _)| vaddr >= va && vaddr - va < size)
            .map(|&(off, va, _, _)| vaddr - va + off)
    }

    /// Function symbols (`FUNC`, `IFUNC`) with a size that contain `vaddr`.
    pub fn functions_at(&self, vaddr: u64) -> Vec<&ElfSym> {
        self.syms
            .iter()
            .filter(|s| {
                (s.kind == "FUNC" || s.kind == "IFUNC")
                    && s.value <= vaddr
                    && vaddr < s.value + s.size
            })
            .collect()
    }

    /// Function symbols named `name`.
    pub fn functions_named(&self, name: &str) -> Vec<&ElfSym> {
        self.syms
            .iter()
            .filter(|s| (s.kind == "FUNC" || s.kind == "IFUNC") && s.name == name)
            .collect()
    }
}

/// [`ElfSyms`] of each object, read once.
#[derive(Default)]
pub struct ElfSymsCache(HashMap<String, ElfSyms>);

impl ElfSymsCache {
    pub fn get(&mut self, path: &str) -> &ElfSyms {
        self.0
            .entry(path.to_string())
            .or_insert_with(|| ElfSyms::read(Path::new(path)))
    }
}
