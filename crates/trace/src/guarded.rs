//! Calls into Parquet's decoder that cannot bring the program down.
//!
//! The `parquet` crate panics on some damaged pages instead of returning an
//! error: a data page that names a dictionary its column chunk never had
//! hits an `expect` (found by `cargo fuzz run trace_reader`). A damaged
//! trace must be reported as one, so every call that decodes pages runs
//! through [`decode`], which turns such a panic into an error and keeps the
//! panic message off stderr: the caller reports it on one line.

use std::any::Any;
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// Set while this thread runs inside [`decode`].
    static DECODING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, a call into Parquet's decoder. A panic inside it becomes
/// `Err` with the panic's message.
pub(crate) fn decode<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    quiet_hook();
    let outer = DECODING.replace(true);
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    DECODING.set(outer);
    r.map_err(|p| format!("the Parquet decoder failed: {}", message(&*p)))
}

/// Wraps the panic hook once so that panics inside [`decode`] print
/// nothing; every other panic goes to the hook that was there before.
fn quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !DECODING.get() {
                previous(info);
            }
        }));
    });
}

fn message(p: &(dyn Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("panic")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_becomes_an_error_and_outside_stays_a_panic() {
        assert_eq!(decode(|| 7), Ok(7));
        let e = decode(|| -> u32 { panic!("dictionary {} missing", 3) }).unwrap_err();
        assert_eq!(e, "the Parquet decoder failed: dictionary 3 missing");
        assert!(!DECODING.get(), "the flag is cleared after a panic");
        // Outside, a panic still unwinds to the caller as one.
        assert!(panic::catch_unwind(|| panic!("outside")).is_err());
    }
}
