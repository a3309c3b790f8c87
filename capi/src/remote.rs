//! Remote buffers: a peer's memory as its remote key describes it, and
//! slices of it.

use std::ffi::c_char;
use std::sync::{Arc, LazyLock};

use uct_transfer::RemoteBuffer;

use crate::error::call;
use crate::ffi::{text, Out};
use crate::handle::{Kind, Table};
use crate::memory::{rights_of, UctRsRegionInfo};
use crate::status::Status;
use crate::transport::memory_type_value;

/// A remote buffer (opaque): a peer's memory, or a slice of it.
pub struct UctRsRemote {
    _opaque: [u8; 0],
}

/// A remote buffer, as its table holds it.
pub(crate) struct RemoteEntry {
    pub(crate) buf: RemoteBuffer,
}

pub(crate) static REMOTES: LazyLock<Table<RemoteEntry>> =
    LazyLock::new(|| Table::new(Kind::Remote));

fn enter(buf: RemoteBuffer, out: Out<*mut UctRsRemote>) -> Result<Status, crate::error::CapiError> {
    out.set(REMOTES.insert(Arc::new(RemoteEntry { buf }))?);
    Ok(Status::UCT_RS_OK)
}

/// Reads a remote key the peer's `uct_rs_mem_remote_key` gave. A key of
/// another version, a truncated or altered one, and garbage give
/// `UCT_RS_ERR_BAD_KEY`; the peer's transport checks every access against
/// its registration anyway.
///
/// Ownership: `key` is read during the call only; `*remote` is the
/// caller's, to free with `uct_rs_remote_free`. Thread-safe.
///
/// # Safety
/// `key` is NULL (refused) or a NUL-terminated string; `remote` is NULL
/// (refused) or points to a writable `uct_rs_remote *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_remote_parse(
    key: *const c_char,
    remote: *mut *mut UctRsRemote,
) -> Status {
    call("uct_rs_remote_parse", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(remote, "remote") }?;
        // SAFETY: the caller's contract.
        let key = unsafe { text(key, "key") }?;
        enter(RemoteBuffer::parse(key)?, out)
    })
}

/// A slice of `length` bytes from `offset` of the remote buffer (out of
/// range: `UCT_RS_ERR_OUT_OF_RANGE`): where a write of that length goes.
///
/// Ownership: `*slice` is the caller's, to free with
/// `uct_rs_remote_free`; it is independent of `remote`. Thread-safe.
///
/// # Safety
/// `slice` is NULL (refused) or points to a writable `uct_rs_remote *`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_remote_slice(
    remote: *mut UctRsRemote,
    offset: usize,
    length: usize,
    slice: *mut *mut UctRsRemote,
) -> Status {
    call("uct_rs_remote_slice", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(slice, "slice") }?;
        let r = REMOTES.get(remote, "remote")?;
        enter(r.buf.slice(offset, length)?, out)
    })
}

/// The peer's address, the length, the memory type and the rights the
/// peer granted.
///
/// Ownership: the caller owns `*info`. Thread-safe.
///
/// # Safety
/// `info` is NULL (refused) or points to a writable `uct_rs_region_info`.
#[no_mangle]
pub unsafe extern "C" fn uct_rs_remote_info(
    remote: *mut UctRsRemote,
    info: *mut UctRsRegionInfo,
) -> Status {
    call("uct_rs_remote_info", || {
        // SAFETY: the caller's contract.
        let out = unsafe { Out::new(info, "info") }?;
        let r = REMOTES.get(remote, "remote")?;
        out.set(UctRsRegionInfo {
            address: r.buf.addr(),
            length: r.buf.len(),
            memory_type: memory_type_value(r.buf.mem_type()),
            rights: rights_of(r.buf.access()),
        });
        Ok(Status::UCT_RS_OK)
    })
}

/// Frees the remote buffer (the peer's memory is not affected; requests
/// posted to it go on).
///
/// Ownership: the handle is invalid afterwards. Thread-safe.
#[no_mangle]
pub extern "C" fn uct_rs_remote_free(remote: *mut UctRsRemote) -> Status {
    call("uct_rs_remote_free", || {
        REMOTES.remove(remote, "remote")?;
        Ok(Status::UCT_RS_OK)
    })
}
