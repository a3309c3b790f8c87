//! posix's part of the sm component ([`SmComponent`](crate::SmComponent)):
//! its transport name, its device, its iface, its rkeys and its
//! configuration (`UCT_POSIX_*`).

use std::sync::Arc;
use std::time::Duration;

use uct_core::config::{Config, ConfigKind, ConfigVar};
use uct_core::{Iface, MemoryDomain, RemoteKey, Result, RkeyEntry, TlResource};

use super::{PosixIface, PosixRkey};
use crate::host;

/// The transport's name (its memory domain's too).
pub const TRANSPORT_NAME: &str = "posix";

/// How long a live peer may leave its receive ring undrained.
pub const PEER_TIMEOUT_VAR: ConfigVar = ConfigVar {
    name: "UCT_POSIX_PEER_TIMEOUT",
    default: "10s",
    kind: ConfigKind::Duration,
    doc: "How long a posix peer that is alive may leave messages in its receive ring without draining any, before the endpoint to it fails with a timeout naming it (a stopped or stuck process). A peer whose process exited is found within milliseconds, not by this timeout.",
};

/// UCT_POSIX_PEER_TIMEOUT, or its default (logged) when it does not parse.
pub(crate) fn peer_timeout() -> Duration {
    let (cfg, errors) = Config::from_env_lenient(&[("sm", &[PEER_TIMEOUT_VAR])]);
    for e in errors {
        log::error!("{e}; using its default");
    }
    cfg.get_duration(PEER_TIMEOUT_VAR.name)
        .unwrap_or(Duration::from_secs(10))
}

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
