//! Pools of spare buffers the replay workers share.

/// Locks a pool of spare buffers, even one a panicking worker left
/// poisoned: a pool holds only buffers to reuse, never half-written state.
pub(crate) fn lock_pool<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
