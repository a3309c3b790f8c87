//! The status every function returns, and its name.

use std::ffi::{c_char, CStr};

/// What a call did. `UCT_RS_OK` (0) and `UCT_RS_IN_PROGRESS` (1) are not
/// errors; every error is negative, and `uct_rs_last_error()` then gives
/// its message on the calling thread.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// The variants are the names C programs use, as cbindgen writes them.
#[allow(non_camel_case_types)]
pub enum Status {
    /// Done.
    UCT_RS_OK = 0,
    /// Not done yet (a request still in flight, no notification yet); not
    /// an error: test again later.
    UCT_RS_IN_PROGRESS = 1,
    /// A handle that is NULL, was freed, was never issued, or is of another
    /// kind (a memory handle passed as a transport).
    UCT_RS_ERR_INVALID_HANDLE = -1,
    /// An argument that is not acceptable: a NULL out-pointer, a string
    /// that is not UTF-8, an unknown flag or memory type, a zero length.
    UCT_RS_ERR_INVALID_ARGUMENT = -2,
    /// A string that is not a transfer URL, or one cut short, altered, or
    /// of another format version.
    UCT_RS_ERR_BAD_URL = -3,
    /// A remote key that cannot be read, or one registered for another
    /// kind of transport.
    UCT_RS_ERR_BAD_KEY = -4,
    /// No transport here can do what was asked (none in common with the
    /// peer, none usable, none by that name).
    UCT_RS_ERR_NO_TRANSPORT = -5,
    /// The peer could not be reached.
    UCT_RS_ERR_UNREACHABLE = -6,
    /// The peer died or the connection failed.
    UCT_RS_ERR_PEER_FAILED = -7,
    /// Called in the wrong state: not bound, not connected, or connected
    /// already.
    UCT_RS_ERR_STATE = -8,
    /// The transport was destroyed with the operation pending.
    UCT_RS_ERR_CLOSED = -9,
    /// An offset or length outside the memory, or lengths that differ.
    UCT_RS_ERR_OUT_OF_RANGE = -10,
    /// A right the remote buffer does not grant, or memory registered with
    /// another transport.
    UCT_RS_ERR_ACCESS = -11,
    /// A memory type the transport cannot reach, or that is not what the
    /// pointer is.
    UCT_RS_ERR_MEMORY_TYPE = -12,
    /// Something the transport cannot do (notify, over cma).
    UCT_RS_ERR_UNSUPPORTED = -13,
    /// Nothing came within the timeout; what was waited for goes on.
    UCT_RS_ERR_TIMED_OUT = -14,
    /// The memory is in use by a pending request; wait for it, then free.
    UCT_RS_ERR_BUSY = -15,
    /// An error of the transport layer (a device, a system call).
    UCT_RS_ERR_TRANSPORT = -16,
    /// A panic inside uct-rs was caught at the boundary: a bug; the message
    /// says where.
    UCT_RS_ERR_PANIC = -17,
    /// An internal limit or inconsistency (a bug); the message says which.
    UCT_RS_ERR_INTERNAL = -18,
}

impl Status {
    /// Every status, for lookups by value.
    const ALL: [Status; 20] = [
        Status::UCT_RS_OK,
        Status::UCT_RS_IN_PROGRESS,
        Status::UCT_RS_ERR_INVALID_HANDLE,
        Status::UCT_RS_ERR_INVALID_ARGUMENT,
        Status::UCT_RS_ERR_BAD_URL,
        Status::UCT_RS_ERR_BAD_KEY,
        Status::UCT_RS_ERR_NO_TRANSPORT,
        Status::UCT_RS_ERR_UNREACHABLE,
        Status::UCT_RS_ERR_PEER_FAILED,
        Status::UCT_RS_ERR_STATE,
        Status::UCT_RS_ERR_CLOSED,
        Status::UCT_RS_ERR_OUT_OF_RANGE,
        Status::UCT_RS_ERR_ACCESS,
        Status::UCT_RS_ERR_MEMORY_TYPE,
        Status::UCT_RS_ERR_UNSUPPORTED,
        Status::UCT_RS_ERR_TIMED_OUT,
        Status::UCT_RS_ERR_BUSY,
        Status::UCT_RS_ERR_TRANSPORT,
        Status::UCT_RS_ERR_PANIC,
        Status::UCT_RS_ERR_INTERNAL,
    ];

    /// The status whose value is `value`, if there is one.
    pub fn from_value(value: i32) -> Option<Status> {
        Status::ALL.into_iter().find(|s| *s as i32 == value)
    }

    /// Its C name, as a NUL-terminated string that lives for ever.
    pub fn name(self) -> &'static CStr {
        match self {
            Status::UCT_RS_OK => c"UCT_RS_OK",
            Status::UCT_RS_IN_PROGRESS => c"UCT_RS_IN_PROGRESS",
            Status::UCT_RS_ERR_INVALID_HANDLE => c"UCT_RS_ERR_INVALID_HANDLE",
            Status::UCT_RS_ERR_INVALID_ARGUMENT => c"UCT_RS_ERR_INVALID_ARGUMENT",
            Status::UCT_RS_ERR_BAD_URL => c"UCT_RS_ERR_BAD_URL",
            Status::UCT_RS_ERR_BAD_KEY => c"UCT_RS_ERR_BAD_KEY",
            Status::UCT_RS_ERR_NO_TRANSPORT => c"UCT_RS_ERR_NO_TRANSPORT",
            Status::UCT_RS_ERR_UNREACHABLE => c"UCT_RS_ERR_UNREACHABLE",
            Status::UCT_RS_ERR_PEER_FAILED => c"UCT_RS_ERR_PEER_FAILED",
            Status::UCT_RS_ERR_STATE => c"UCT_RS_ERR_STATE",
            Status::UCT_RS_ERR_CLOSED => c"UCT_RS_ERR_CLOSED",
            Status::UCT_RS_ERR_OUT_OF_RANGE => c"UCT_RS_ERR_OUT_OF_RANGE",
            Status::UCT_RS_ERR_ACCESS => c"UCT_RS_ERR_ACCESS",
            Status::UCT_RS_ERR_MEMORY_TYPE => c"UCT_RS_ERR_MEMORY_TYPE",
            Status::UCT_RS_ERR_UNSUPPORTED => c"UCT_RS_ERR_UNSUPPORTED",
            Status::UCT_RS_ERR_TIMED_OUT => c"UCT_RS_ERR_TIMED_OUT",
            Status::UCT_RS_ERR_BUSY => c"UCT_RS_ERR_BUSY",
            Status::UCT_RS_ERR_TRANSPORT => c"UCT_RS_ERR_TRANSPORT",
            Status::UCT_RS_ERR_PANIC => c"UCT_RS_ERR_PANIC",
            Status::UCT_RS_ERR_INTERNAL => c"UCT_RS_ERR_INTERNAL",
        }
    }
}

/// The name of a status (`"UCT_RS_ERR_BAD_URL"`), for messages.
///
/// Ownership: the string is static; never free it. Thread-safe. A value
/// that is no status gives `"UCT_RS_UNKNOWN_STATUS"`.
#[no_mangle]
pub extern "C" fn uct_rs_status_name(status: i32) -> *const c_char {
    Status::from_value(status)
        .map(Status::name)
        .unwrap_or(c"UCT_RS_UNKNOWN_STATUS")
        .as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_its_own_value_and_name() {
        for (i, a) in Status::ALL.iter().enumerate() {
            assert_eq!(Status::from_value(*a as i32), Some(*a));
            assert!(a.name().to_str().unwrap().starts_with("UCT_RS_"));
            for b in &Status::ALL[i + 1..] {
                assert_ne!(*a as i32, *b as i32);
                assert_ne!(a.name(), b.name());
            }
        }
        assert_eq!(Status::from_value(12345), None);
    }
}
