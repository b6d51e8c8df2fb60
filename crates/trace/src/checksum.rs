//! The checksums of listed segments: a segment's length and CRC-32 against
//! its entry in meta.json, so that a truncated or altered file is an
//! error, never a different report.
//!
//! A segment is checked whole before any of it is used
//! ([`verify_listed`]), except the events segments of a trace opened with
//! [`Trace::open_deferred`](crate::Trace::open_deferred), which are
//! checked as they are read ([`Deferred`]): the event decoder computes
//! the CRC of each range it reads while the bytes are in the cache, and
//! [`Deferred::verify`] combines those CRCs with the CRCs of the ranges
//! it did not read once the caller is done. Reading a 222 MB events file
//! once for its checksum and again to decode it cost 40 ms before replay
//! could start, and some 50 ms of CPU in mapping and unmapping it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crc32fast::Hasher;

use crate::error::{Error, Result};
use crate::meta::SegmentEntry;

/// Files up to this size are read for their CRC: mapping and unmapping
/// them cost more than the copy (the unmapping flushes the TLB of every
/// thread of the process).
const SMALL: u64 = 1 << 20;

/// Larger ranges are mapped this much at a time, a few windows at once on
/// the worker pool, and their CRCs combined in order.
const WINDOW: u64 = 16 << 20;

/// A deferred read is checksummed this much at a time, right after the
/// piece is read, while it is still in the cache.
const PIECE: usize = 256 << 10;

/// Checks a listed segment's length and CRC-32 against its entry, so that
/// a truncated or altered file is an error before any of it is used.
pub(crate) fn verify_listed(path: &Path, entry: &SegmentEntry) -> Result<()> {
    let file = open_checking_length(path, entry)?;
    let crc = crc_of_range(path, &file, 0, entry.bytes)?;
    check_crc(path, entry, crc.finalize())
}

/// Opens a listed segment and checks its length against its entry.
pub(crate) fn open_checking_length(path: &Path, entry: &SegmentEntry) -> Result<File> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len != entry.bytes {
        return Err(Error::corrupt(
            path,
            format!(
                "{len} bytes, meta.json lists {}: truncated or altered",
                entry.bytes
            ),
        ));
    }
    Ok(file)
}

fn check_crc(path: &Path, entry: &SegmentEntry, crc: u32) -> Result<()> {
    if crc != entry.crc32 {
        return Err(Error::corrupt(
            path,
            format!(
                "checksum mismatch (CRC-32 {crc:08x}, meta.json lists {:08x}): the file was altered",
                entry.crc32
            ),
        ));
    }
    Ok(())
}

/// The CRC of bytes `from..to` of `file`. Read when small; else mapped a
/// window at a time, not read (reading copies every byte from the page
/// cache first, which cost more than the CRC itself), and not mapped
/// whole (whose pages would all count in the process's RSS at once).
fn crc_of_range(path: &Path, file: &File, from: u64, to: u64) -> Result<Hasher> {
    let io = |e| Error::io(path, e);
    let mut crc = Hasher::new();
    if to - from <= SMALL {
        let mut buf = [0u8; 64 << 10];
        let mut at = from;
        while at < to {
            let n = (buf.len() as u64).min(to - at) as usize;
            match file.read_at(&mut buf[..n], at) {
                Ok(0) => {
                    let e = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
                    return Err(io(e));
                }
                Ok(n) => {
                    crc.update(&buf[..n]);
                    at += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e)),
            }
        }
        return Ok(crc);
    }
    use rayon::prelude::*;
    let parts: Vec<std::io::Result<Hasher>> = (0..(to - from).div_ceil(WINDOW))
        .into_par_iter()
        .map(|w| {
            let at = from + w * WINDOW;
            let n = WINDOW.min(to - at);
            // SAFETY: the map is read only here; a trace changed under a
            // reader is damage the CRC reports.
            let map = unsafe {
                memmap2::MmapOptions::new()
                    .offset(at)
                    .len(n as usize)
                    .populate()
                    .map(file)
            }?;
            let mut crc = Hasher::new();
            crc.update(&map);
            Ok(crc)
        })
        .collect();
    for part in parts {
        crc.combine(&part.map_err(io)?);
    }
    Ok(crc)
}

/// The checksum of a listed segment, checked from the reads of whoever
/// decodes it, then [`Deferred::verify`].
pub(crate) struct Deferred {
    path: PathBuf,
    entry: SegmentEntry,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Ranges read so far, and their CRCs: (offset, length, CRC).
    reads: Vec<(u64, u64, Hasher)>,
    /// Whether the whole file was found to match its entry; reads are no
    /// longer noted then.
    verified: bool,
}

impl Deferred {
    /// The deferred check of the segment at `path`, whose length was
    /// checked ([`open_checking_length`]).
    pub(crate) fn new(path: PathBuf, entry: SegmentEntry) -> Self {
        Deferred {
            path,
            entry,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a list of reads and a flag, each written whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fills `buf` from `file` (this segment) at `offset`, and notes the
    /// CRC of what it read.
    pub(crate) fn read_at(&self, file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if self.state().verified {
            return file.read_exact_at(buf, offset);
        }
        let mut crc = Hasher::new();
        let mut at = offset;
        for piece in buf.chunks_mut(PIECE) {
            file.read_exact_at(piece, at)?;
            crc.update(piece);
            at += piece.len() as u64;
        }
        let mut st = self.state();
        if !st.verified {
            st.reads.push((offset, buf.len() as u64, crc));
        }
        Ok(())
    }

    /// Checks the whole segment against its entry: the CRCs of the ranges
    /// read, in order, and of the ranges between them, read now. Once it
    /// matched, later calls return at once.
    ///
    /// The lock is not held while the gaps are read: reading a large one
    /// runs on the worker pool, whose threads may take a decoding task
    /// meanwhile, and its read would wait on the lock for ever.
    pub(crate) fn verify(&self) -> Result<()> {
        let mut reads = {
            let mut st = self.state();
            if st.verified {
                return Ok(());
            }
            std::mem::take(&mut st.reads)
        };
        reads.sort_unstable_by_key(|r| (r.0, r.1));
        // A range read twice counts once (the same range, read again after
        // the page decoder gave up on it).
        reads.dedup_by_key(|r| (r.0, r.1));
        let file = open_checking_length(&self.path, &self.entry)?;
        let len = self.entry.bytes;
        let overlapping = reads.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0);
        let crc = if overlapping || reads.last().is_some_and(|r| r.0 + r.1 > len) {
            // Not what the decoder reads: the file again, whole.
            crc_of_range(&self.path, &file, 0, len)?
        } else {
            let mut crc = Hasher::new();
            let mut at = 0;
            for (offset, n, part) in &reads {
                if *offset > at {
                    crc.combine(&crc_of_range(&self.path, &file, at, *offset)?);
                }
                crc.combine(part);
                at = offset + n;
            }
            if at < len {
                crc.combine(&crc_of_range(&self.path, &file, at, len)?);
            }
            crc
        };
        check_crc(&self.path, &self.entry, crc.finalize())?;
        let mut st = self.state();
        st.verified = true;
        st.reads = Vec::new();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(len: usize, x: &mut u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                *x ^= *x << 13;
                *x ^= *x >> 7;
                *x ^= *x << 17;
                *x as u8
            })
            .collect()
    }

    fn entry(data: &[u8]) -> SegmentEntry {
        SegmentEntry {
            file: "part-00000.parquet".into(),
            rows: 0,
            bytes: data.len() as u64,
            crc32: crc32fast::hash(data),
        }
    }

    /// Small files are read and large ones mapped a window at a time:
    /// either way, the CRC of the whole file is checked.
    #[test]
    fn a_segments_crc_is_checked_whatever_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("part-00000.parquet");
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in [0usize, 1, 100 << 10, 1 << 20, (1 << 20) + 1, (16 << 20) + 5] {
            let data = noise(len, &mut x);
            std::fs::write(&path, &data).unwrap();
            let entry = entry(&data);
            verify_listed(&path, &entry).unwrap();
            if len == 0 {
                continue;
            }
            let mut bad = data.clone();
            bad[len - 1] ^= 4;
            std::fs::write(&path, &bad).unwrap();
            let e = verify_listed(&path, &entry).unwrap_err().to_string();
            assert!(e.contains("checksum mismatch"), "{len}: {e}");
        }
    }

    /// A deferred check combines the CRCs of the ranges read (out of
    /// order, one twice, one larger than a piece) with those of the gaps
    /// between them, small and large; a byte changed anywhere (in a range
    /// read, in a gap, in the tail) is a mismatch, as is a byte changed
    /// between a read and the check. Overlapping reads fall back to the
    /// whole file.
    #[test]
    fn a_deferred_check_sees_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("part-00000.parquet");
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let len = (20 << 20) + 17;
        let data = noise(len, &mut x);
        let entry = entry(&data);
        // Ranges read: a gap of 100 bytes at the start, one of 17 MiB in
        // the middle, a tail of 1000 bytes.
        let reads: [(u64, usize); 4] = [
            ((18 << 20) + 300, (2 << 20) - 1300 + 17),
            (100, 1000),
            (1100, PIECE * 3 + 5),
            (1100, PIECE * 3 + 5),
        ];
        let check = |bytes: &[u8], changed_after_read: Option<usize>| {
            std::fs::write(&path, bytes).unwrap();
            let d = Deferred::new(path.clone(), entry.clone());
            let file = File::open(&path).unwrap();
            for &(at, n) in &reads {
                let mut buf = vec![0u8; n];
                d.read_at(&file, &mut buf, at).unwrap();
                assert_eq!(buf, bytes[at as usize..at as usize + n]);
            }
            if let Some(i) = changed_after_read {
                let mut b = bytes.to_vec();
                b[i] ^= 1;
                std::fs::write(&path, &b).unwrap();
            }
            d.verify()
        };
        check(&data, None).unwrap();
        let tail = reads[0].0 as usize + reads[0].1;
        for i in [0, 50, 150, 1100 + PIECE, 5 << 20, tail + 3, len - 1] {
            let mut bad = data.clone();
            bad[i] ^= 0x10;
            let e = check(&bad, None).unwrap_err().to_string();
            assert!(e.contains("checksum mismatch"), "byte {i}: {e}");
        }
        // Changed in a gap after the reads: the check reads the gap then.
        let e = check(&data, Some(10 << 20)).unwrap_err().to_string();
        assert!(e.contains("checksum mismatch"), "{e}");
        // Overlapping reads: the whole file is read again.
        let d = Deferred::new(path.clone(), entry.clone());
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        for (at, n) in [(0u64, 5000usize), (4000, 5000)] {
            d.read_at(&file, &mut vec![0u8; n], at).unwrap();
        }
        d.verify().unwrap();
        // Once verified, reads are not noted and the check is done.
        d.read_at(&file, &mut [0u8; 10], 0).unwrap();
        assert!(d.state().reads.is_empty());
        d.verify().unwrap();
    }
}
