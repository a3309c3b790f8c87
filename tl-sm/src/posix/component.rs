//! posix's part of the sm component ([`SmComponent`](crate::SmComponent)):
//! its transport name, its device, its iface and its rkeys.

use std::sync::Arc;

use uct_core::{Iface, MemoryDomain, RemoteKey, Result, RkeyEntry, TlResource};

use super::{PosixIface, PosixRkey};
use crate::host;

/// The transport's name (its memory domain's too).
pub const TRANSPORT_NAME: &str = "posix";

/// posix's one device: this host's memory.
pub(crate) fn tl_resources() -> Vec<TlResource> {
    vec![host::memory_resource(TRANSPORT_NAME)]
}

/// A posix iface on `md`, the posix MD.
pub(crate) fn open_iface(md: &Arc<dyn MemoryDomain>) -> Result<Box<dyn Iface>> {
    Ok(Box::new(PosixIface::open(md.clone())?))
}

/// A packed posix rkey, decoded.
pub(crate) fn unpack_rkey(component: &str, entry: &RkeyEntry) -> Result<RemoteKey> {
    crate::rkey::unpack::<PosixRkey>(component, entry)
}
