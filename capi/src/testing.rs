//! A hook for this crate's tests: a panic inside the next call on this
//! thread, to show that it becomes `UCT_RS_ERR_PANIC` and never crosses
//! into C. Not in the header; nothing sets it outside the tests.

use std::cell::Cell;

thread_local! {
    static PANIC_NEXT: Cell<bool> = const { Cell::new(false) };
}

/// Makes the next exported call on this thread panic inside its guard.
#[doc(hidden)]
pub fn panic_in_next_call() {
    PANIC_NEXT.with(|p| p.set(true));
}

/// Panics if the tests asked for it.
pub(crate) fn panic_if_asked(func: &str) {
    if PANIC_NEXT.try_with(|p| p.replace(false)).unwrap_or(false) {
        panic!("the test hook's panic inside {func}");
    }
}
