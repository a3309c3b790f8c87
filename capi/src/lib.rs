//! The C ABI of uct-rs (work in progress).
