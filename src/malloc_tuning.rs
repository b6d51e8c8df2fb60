//! How memleak tunes its own allocator.

/// Both commands work through multi-megabyte buffers freed and allocated
/// again (decoded row groups; Parquet pages being encoded). By default glibc
/// hands such blocks back to the kernel (mmap'd chunks, heap trimming) and
/// the next one faults its pages in again: measured, a sixth of analyze's
/// run time. Keep them instead; peak memory is unchanged, since the same
/// sizes are reused.
pub(crate) fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes the allocator; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_ARENA_MAX, 4);
    }
}
