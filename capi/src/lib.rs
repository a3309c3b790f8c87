//! uct-capi: the C ABI of uct-rs, over the transfer API (`uct_transfer`).
//! It builds `libuct_rs.so` and `libuct_rs.a`; `include/uct_rs.h` is
//! generated from this crate by cbindgen (`tests/header.rs` checks it is
//! current) and `include/uct_rs.hpp` wraps it in C++ classes.
//!
//! The rules every function keeps:
//!
//! - It returns a [`Status`]: `UCT_RS_OK`, `UCT_RS_IN_PROGRESS`, or a
//!   negative error whose message `uct_rs_last_error()` gives on the
//!   calling thread.
//! - No panic crosses into C: one is caught and becomes
//!   `UCT_RS_ERR_PANIC`.
//! - Handles are opaque pointer-typed values holding an id and a kind,
//!   looked up in a table on every call: a NULL, freed, never-issued or
//!   wrong-kind handle is `UCT_RS_ERR_INVALID_HANDLE`, never a crash. Ids
//!   are never reused.
//! - Memory a request in flight uses cannot be freed
//!   (`UCT_RS_ERR_BUSY`); destroying a transport ends its pending requests
//!   with `UCT_RS_ERR_CLOSED`.
//!
//! The functions are also callable from Rust (the tests do), as the
//! `unsafe extern "C" fn`s they are.

// Declared in the order the header lists their items (cbindgen keeps
// the order it reads them in).

// What every call returns.
mod status;

// Version, support, the last error, strings handed out.
mod global;

// Transports: options, create, bind, connect, progress, destroy.
mod transport;

// Memory and views.
mod memory;

// Remote buffers.
mod remote;

// Writes, reads, flushes and their requests.
mod request;

// Notifications of the peer's writes.
mod notify;

// The registry listing.
mod listing;

// The machinery behind them.
mod error;
mod ffi;
mod handle;
mod snapshot;
#[doc(hidden)]
pub mod testing;

pub use global::*;
pub use listing::*;
pub use memory::*;
pub use notify::*;
pub use remote::*;
pub use request::*;
pub use status::*;
pub use transport::*;
