//! `uct_rs._native`: the Python bindings of uct-rs's transfer API (crate
//! uct-transfer), under the package `uct_rs` (python/uct_rs/), which adds
//! the exception classes and the asyncio glue.
//!
//! - `transport`: `Transport` (bind, connect, write, read, flush,
//!   wait_for_write), `Probe`.
//! - `memory`: `Memory` (a buffer registered in place, or allocated),
//!   `View`, `RemoteBuffer`.
//! - `pending`: `Pending` (blockable with `.wait(timeout)`, awaitable),
//!   `Notification`.
//! - `hold`: what keeps the application's buffers alive while in use.
//! - `dispatch`: the thread between the transport and Python.
//! - `errors`: the transfer API's errors as Python exceptions.
//!
//! The GIL is released whenever a call may wait or copy (posting a write
//! over shared memory copies its bytes).

mod dispatch;
mod errors;
mod hold;
mod memory;
mod pending;
mod transport;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<transport::PyTransport>()?;
    m.add_class::<transport::PyProbe>()?;
    m.add_class::<memory::PyMemory>()?;
    m.add_class::<memory::PyView>()?;
    m.add_class::<memory::PyRemoteBuffer>()?;
    m.add_class::<pending::PyPending>()?;
    m.add_class::<pending::PyNotification>()?;
    m.add("URL_VERSION", uct_transfer::URL_VERSION)?;
    m.add("KEY_VERSION", uct_transfer::KEY_VERSION)?;
    m.add("DEFAULT_MAX_IN_FLIGHT", uct_transfer::DEFAULT_DEPTH)?;
    Ok(())
}
