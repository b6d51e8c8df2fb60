//! Reading a stopped process's memory: many ranges per `process_vm_readv`
//! call, with a page-by-page fallback where a range is partly unreadable.

use super::types::ScanError;

/// Remote ranges per `process_vm_readv` call (the kernel's `IOV_MAX`).
const IOVECS: usize = 1024;
const PAGE: u64 = 4096;

/// Where the marking gets memory from: the process, or a test's fake.
pub(crate) trait Memory {
    /// Reads `ranges` (address, length) one after the other into `out`
    /// (cleared first; its length is then the sum of the lengths). Bytes
    /// that cannot be read are zeros: a zero word points nowhere.
    fn read(&mut self, ranges: &[(u64, u64)], out: &mut Vec<u8>) -> Result<(), ScanError>;
}

/// The memory of a live process, through `process_vm_readv`.
pub(crate) struct ProcessMemory {
    pid: u32,
    /// Pages that could not be read (unmapped, PROT_NONE, device).
    pub unreadable_pages: u64,
    /// `process_vm_readv` calls made.
    pub calls: u64,
}

impl ProcessMemory {
    pub fn new(pid: u32) -> Self {
        ProcessMemory {
            pid,
            unreadable_pages: 0,
            calls: 0,
        }
    }

    /// One call for `ranges` into `buf` (their total length); returns
    /// the bytes read, which stop at the first range the kernel could
    /// not read completely.
    fn readv(&mut self, ranges: &[(u64, u64)], buf: &mut [u8]) -> Result<usize, ScanError> {
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote: Vec<libc::iovec> = ranges
            .iter()
            .map(|&(a, l)| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: l as usize,
            })
            .collect();
        self.calls += 1;
        // SAFETY: the local iovec covers `buf`; remote addresses are only
        // read by the kernel, in the other process.
        let n = unsafe {
            libc::process_vm_readv(
                self.pid as libc::pid_t,
                &local,
                1,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let os = std::io::Error::last_os_error();
        let e = memleak_trace::describe_io(&os);
        match os.raw_os_error() {
            // Nothing of the first range could be read.
            Some(libc::EFAULT) | Some(libc::EIO) => Ok(0),
            Some(libc::ESRCH) => Err(ScanError::Gone(self.pid)),
            Some(libc::EPERM) | Some(libc::EACCES) => Err(ScanError::Permission(format!(
                "cannot read the memory of process {}: {e} (memleak needs root or CAP_SYS_PTRACE)",
                self.pid
            ))),
            _ => Err(ScanError::Os(format!(
                "process_vm_readv of process {}: {e}",
                self.pid
            ))),
        }
    }

    /// Reads one range page by page into `buf`, leaving zeros (and
    /// counting the pages) where it cannot.
    fn read_pages(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), ScanError> {
        let mut off = 0usize;
        while off < buf.len() {
            let a = addr + off as u64;
            let len = ((PAGE - a % PAGE) as usize).min(buf.len() - off);
            let n = self.readv(&[(a, len as u64)], &mut buf[off..off + len])?;
            if n < len {
                buf[off + n..off + len].fill(0);
                self.unreadable_pages += 1;
            }
            off += len;
        }
        Ok(())
    }
}

impl Memory for ProcessMemory {
    fn read(&mut self, ranges: &[(u64, u64)], out: &mut Vec<u8>) -> Result<(), ScanError> {
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        out.clear();
        out.resize(total as usize, 0);
        let mut i = 0; // first range not read yet
        let mut off = 0usize; // where it goes in `out`
        while i < ranges.len() {
            let batch = &ranges[i..(i + IOVECS).min(ranges.len())];
            let len: u64 = batch.iter().map(|r| r.1).sum();
            let n = self.readv(batch, &mut out[off..off + len as usize])?;
            // Skip the ranges read completely.
            let mut done = 0usize;
            let mut k = 0;
            while k < batch.len() && done + batch[k].1 as usize <= n {
                done += batch[k].1 as usize;
                k += 1;
            }
            i += k;
            off += done;
            if k < batch.len() {
                // Range `i` stopped short: the rest of it page by page.
                let (a, l) = ranges[i];
                let got = n - done;
                let end = off + l as usize;
                self.read_pages(a + got as u64, &mut out[off + got..end])?;
                i += 1;
                off = end;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our own memory, with an unreadable page between two readable ones:
    /// one call reads all ranges, the bad page reads as zeros and counts.
    #[test]
    fn reads_many_ranges_and_skips_an_unreadable_page() {
        let len = 4 * PAGE as usize;
        // SAFETY: a fresh anonymous mapping, ours.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        // SAFETY: inside the mapping.
        unsafe {
            std::ptr::write_bytes(p, 0xab, len);
            for page in [1, 3] {
                let at = p.add(page * PAGE as usize).cast();
                assert_eq!(libc::mprotect(at, PAGE as usize, libc::PROT_NONE), 0);
            }
        }
        let base = p as u64;
        let data = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let mut mem = ProcessMemory::new(std::process::id());
        let ranges = [
            (data.as_ptr() as u64, 8),
            (base + PAGE - 8, 16 + 2 * PAGE), // ends 8 bytes into page 3
            (data.as_ptr() as u64 + 4, 4),
        ];
        let mut out = Vec::new();
        mem.read(&ranges, &mut out).unwrap();
        assert_eq!(out.len(), 8 + 16 + 2 * PAGE as usize + 4);
        assert_eq!(&out[..8], &data);
        assert_eq!(&out[8..16], &[0xab; 8]);
        let bad = &out[16..16 + PAGE as usize];
        assert!(bad.iter().all(|&b| b == 0));
        let good = &out[16 + PAGE as usize..16 + 2 * PAGE as usize];
        assert!(good.iter().all(|&b| b == 0xab));
        assert_eq!(&out[out.len() - 4..], &[5, 6, 7, 8]);
        // Pages 1 and 3, PROT_NONE.
        assert_eq!(mem.unreadable_pages, 2);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), len) };
    }
}
