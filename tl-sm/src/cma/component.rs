//! cma's part of the sm component ([`SmComponent`](crate::SmComponent)):
//! its transport name, its device, its iface and its rkeys.

use std::sync::Arc;

use uct_core::{Iface, MemoryDomain, RemoteKey, Result, RkeyEntry, TlResource};

use super::{CmaIface, CmaRkey};
use crate::host;

/// The transport's name (its memory domain's too).
pub const TRANSPORT_NAME: &str = "cma";

/// cma's one device: this host's memory.
pub(crate) fn tl_resources() -> Vec<TlResource> {
    vec![host::memory_resource(TRANSPORT_NAME)]
}

/// A cma iface on `md`, the cma MD.
pub(crate) fn open_iface(md: &Arc<dyn MemoryDomain>) -> Result<Box<dyn Iface>> {
    Ok(Box::new(CmaIface::open(md.clone())))
}

/// A packed cma rkey, decoded.
pub(crate) fn unpack_rkey(component: &str, entry: &RkeyEntry) -> Result<RemoteKey> {
    crate::rkey::unpack::<CmaRkey>(component, entry)
}
