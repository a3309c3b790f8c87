//! What concerns the library as a whole: its version, whether this
//! machine can connect two processes, the last error, strings.

use std::ffi::{c_char, CStr};

use uct_core::Registry;
use uct_transfer::Transport;

use crate::error::{call, last_error_ptr, CapiError};
use crate::ffi::{take_string, Out};
use crate::status::Status;

/// The version of this library, as a NUL-terminated string.
const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => c"unknown",
    };

/// The process's registry, with logging set up (`UCT_LOG_LEVEL`). An empty
/// one means the built-in transports were dropped by the linker: they
/// register themselves from code nothing calls, which a static link
/// leaves out unless told to keep the whole archive.
pub(crate) fn registry() -> Result<&'static Registry, CapiError> {
    uct_core::logging::init();
    uct_builtins::link();
    let reg = Registry::global();
    if reg.transport_names().is_empty() {
        return Err(CapiError::Transfer(uct_transfer::TransferError::NoTransport(
            "no transport is registered in this program: libuct_rs.a was linked without keeping the whole archive, so the linker dropped the built-in transports; link it as -Wl,--whole-archive -luct_rs -Wl,--no-whole-archive (or link libuct_rs.so)".into(),
        )));
    }
    Ok(reg)
}

/// The version of the library (`"0.1.0"`).
///
/// Ownership: `*version` is static; never free it. Thread-safe.
///
/// # Safety
/// `version` is NULL (refused) or points to a writable `const char *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_version(version: *mut *const c_char) -> Status {
    call("uct_rs_version", || {
        // SAFETY: the caller's contract.
        unsafe { Out::new(version, "version") }?.set(VERSION.as_ptr());
        Ok(Status::UCT_RS_OK)
    })
}

/// Whether this machine can connect two processes at all: `*supported`
/// is true when a transport other than `self` is usable here (see
/// `uct_rs_listing_create` for each one, with the reason where it is not).
///
/// Ownership: the caller owns `*supported`. Thread-safe.
///
/// # Safety
/// `supported` is NULL (refused) or points to a writable `bool`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_supported(supported: *mut bool) -> Status {
    call("uct_rs_supported", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(supported, "supported") }?;
        registry()?;
        out.set(Transport::supported());
        Ok(Status::UCT_RS_OK)
    })
}

/// The message of the calling thread's last failed call (`"function:
/// what failed and what to do"`), or `""` if none failed. Calls that
/// succeed leave it as it is.
///
/// Ownership and lifetime: the string belongs to the library; it stays
/// valid and unchanged until the next call on the same thread that fails
/// (which replaces it), or until the thread exits. Copy it to keep it.
/// Thread-safe: each thread has its own.
#[no_mangle]
pub extern "C" fn uct_rs_last_error() -> *const c_char {
    last_error_ptr()
}

/// Frees a string a uct-rs function returned (a URL, a remote key, a
/// name). A pointer uct-rs did not return, or one freed already, gives
/// `UCT_RS_ERR_INVALID_HANDLE` and is left alone. Strings are known by
/// address only: a second free is detected unless a newer string got
/// the same address since, in which case that newer string is freed.
///
/// Ownership: the string is invalid afterwards. Thread-safe.
#[no_mangle]
pub extern "C" fn uct_rs_string_free(string: *mut c_char) -> Status {
    call("uct_rs_string_free", || {
        take_string(string)?;
        Ok(Status::UCT_RS_OK)
    })
}
