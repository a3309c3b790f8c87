//! cma's part of the sm component ([`SmComponent`](crate::SmComponent)):
//! its transport name, its device, its iface, its rkeys and its
//! configuration (`UCT_CMA_*`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use uct_core::config::{Config, ConfigKind, ConfigVar};
use uct_core::rkey::decode_payload;
use uct_core::{Iface, MemoryDomain, RemoteKey, Result, RkeyEntry, TlResource};

use super::{table, CmaIface, CmaRkey};
use crate::host;

/// The transport's name (its memory domain's too).
pub const TRANSPORT_NAME: &str = "cma";

/// How long deregistration waits for peers' transfers in flight.
pub const PEER_TIMEOUT_VAR: ConfigVar = ConfigVar {
    name: "UCT_CMA_PEER_TIMEOUT",
    default: "10s",
    kind: ConfigKind::Duration,
    doc: "How long deregistering a cma region waits for a live peer's transfer into it that started before (a peer stopped inside one, or one that holds its busy counter). Past it the region's record is retired, and memory the cma MD allocated kept, until no live peer counts it; memory registered by address is handed back with an error in the log; that peer is not waited for again. The counts of a peer process that is gone are dropped at once (found through its pid), never waited for.",
};

/// cma's variables.
pub const CMA_CONFIG: &[ConfigVar] = &[PEER_TIMEOUT_VAR];

/// UCT_CMA_PEER_TIMEOUT (read once), or its default (logged) when it does
/// not parse.
pub(crate) fn peer_timeout() -> Duration {
    static TIMEOUT: OnceLock<Duration> = OnceLock::new();
    *TIMEOUT.get_or_init(|| {
        let (cfg, errors) = Config::from_env_lenient(&[("sm", CMA_CONFIG)]);
        for e in errors {
            log::error!("{e}; using its default");
        }
        cfg.get_duration(PEER_TIMEOUT_VAR.name)
            .unwrap_or(Duration::from_secs(10))
    })
}

/// cma's one device: this host's memory.
pub(crate) fn tl_resources() -> Vec<TlResource> {
    vec![host::memory_resource(TRANSPORT_NAME)]
}

/// A cma iface on `md`, the cma MD.
pub(crate) fn open_iface(md: &Arc<dyn MemoryDomain>) -> Result<Box<dyn Iface>> {
    Ok(Box::new(CmaIface::open(md.clone())))
}

/// A packed cma rkey, decoded; one whose record table is not its own
/// process's is refused here, before any endpoint opens it.
pub(crate) fn unpack_rkey(component: &str, entry: &RkeyEntry) -> Result<RemoteKey> {
    let key: CmaRkey = decode_payload(&entry.payload)?;
    table::check_path(&key.table, key.pid)?;
    crate::rkey::unpack::<CmaRkey>(component, entry)
}
