//! What the rkeys of both sm transports share: they begin with a
//! [`SoftRkey`] (region id, secret, the owner's range and rights), and are
//! refused at unpacking when that range wraps around the address space.

use std::any::Any;

use serde::de::DeserializeOwned;
use uct_core::region_table::SoftRkey;
use uct_core::rkey::decode_payload;
use uct_core::{Access, MemHandle, RemoteKey, Result, RkeyEntry, UctError};

/// An sm rkey's payload.
pub(crate) trait SmRkey: DeserializeOwned + Any + Send + Sync {
    /// The part every software transport's rkey has.
    fn soft(&self) -> &SoftRkey;
}

/// Decodes an rkey of memory domain `entry.md` of component `component`.
pub(crate) fn unpack<K: SmRkey>(component: &str, entry: &RkeyEntry) -> Result<RemoteKey> {
    let key: K = decode_payload(&entry.payload)?;
    if key.soft().base.checked_add(key.soft().len).is_none() {
        return Err(UctError::BadRkey(
            "region wraps around the address space".into(),
        ));
    }
    Ok(RemoteKey::new(component, entry.md.clone(), Box::new(key)))
}

/// The backing of `mem` as memory domain `md_name`'s type `B`, for packing
/// its rkey; a handle of another MD is an error that says to `how` (allocate
/// or register) the memory with `md_name`.
pub(crate) fn backing_of<'mem, B: 'static>(
    mem: &'mem MemHandle,
    md_name: &str,
    how: &str,
) -> Result<&'mem B> {
    mem.backing().as_any().downcast_ref::<B>().ok_or_else(|| {
        UctError::InvalidParam(format!(
            "memory handle belongs to memory domain {}, not {md_name}; {how} it with {md_name}",
            mem.md_name()
        ))
    })
}

/// A new key for `len` bytes at `base` with rights `access`, protected by
/// `secret`, under a fresh random region id, never 0 (the id of the posix
/// iface's ring and identity segments, which no rkey names).
pub(crate) fn new_soft_key(secret: u64, base: u64, len: usize, access: Access) -> SoftRkey {
    SoftRkey {
        region_id: (crate::host::random_u64() >> 16) | 1,
        secret,
        base,
        len: len as u64,
        access,
    }
}
