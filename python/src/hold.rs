//! What keeps the application's memory alive while uct-rs has it
//! registered: the buffer export of a bytearray, memoryview or NumPy array
//! (which also stops it from being resized), or a reference to a torch
//! tensor.
//!
//! A hold is shared by the Memory, its views, and every operation posted
//! from them; an operation whose Python object is gone before it resolved
//! hands its hold to the dispatcher thread, which drops it once the
//! operation resolved ([`crate::dispatch`]). A hold is dropped only where
//! Python can be attached (a Python thread, or the dispatcher): never on the
//! transport's progress thread.

use std::sync::Arc;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;

use crate::errors;

/// The application's memory, held.
pub enum Hold {
    /// A buffer export (PyBuffer): released, under the interpreter, when
    /// the last user is gone.
    Buffer(PyUntypedBuffer),
}

/// Shared among a Memory, its views and their operations.
pub type Held = Arc<Hold>;

/// The address and length of a writable, contiguous buffer of `obj`, and
/// the export that keeps it. Refuses read-only buffers (peers write into
/// registered memory, and the NIC registers it writable), non-contiguous
/// ones and empty ones, naming what to pass instead.
pub fn export(obj: &Bound<'_, PyAny>) -> PyResult<(*mut u8, usize, Hold)> {
    let type_name = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into());
    let buf = PyUntypedBuffer::get(obj).map_err(|e| {
        errors::input(format!(
            "a {type_name} cannot be registered: it has no buffer ({e}); pass a bytearray, a writable memoryview, a NumPy array or a torch tensor"
        ))
    })?;
    if buf.readonly() {
        return Err(errors::input(format!(
            "this {type_name} is not writable (a read-only buffer); registered memory must be writable: pass a bytearray, a writable memoryview or a writable NumPy array, or use Memory.alloc"
        )));
    }
    if !(buf.is_c_contiguous() || buf.is_fortran_contiguous()) {
        return Err(errors::input(format!(
            "this {type_name} is not contiguous; register a contiguous copy (numpy.ascontiguousarray) or the array it is a view of"
        )));
    }
    let len = buf.len_bytes();
    if len == 0 {
        return Err(errors::input(format!(
            "this {type_name} is empty; register at least 1 byte"
        )));
    }
    Ok((buf.buf_ptr().cast::<u8>(), len, Hold::Buffer(buf)))
}
