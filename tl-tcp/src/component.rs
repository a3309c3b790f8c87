//! The tcp component: one host MD, one transport per network interface,
//! and its configuration (`UCT_TCP_*`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use uct_core::config::{Config, ConfigKind, ConfigVar};
use uct_core::host_md::HostMd;
use uct_core::{
    BuiltinComponent, Component, DeviceType, Iface, IfaceParams, MemoryDomain, RemoteKey, Result,
    RkeyEntry, TlResource, UctError,
};

use crate::iface::TcpIface;
use crate::link::Timeouts;
use crate::{devices, md};

/// The component's name, and the transport's.
const NAME: &str = "tcp";

/// The tcp component's configuration.
pub const TCP_CONFIG: &[ConfigVar] = &[
    ConfigVar {
        name: "UCT_TCP_PEER_TIMEOUT",
        default: "10s",
        kind: ConfigKind::Duration,
        doc: "How long a tcp peer may leave requests unanswered, or data unacknowledged or unread, before its endpoint fails and every pending operation completes with an error. A connection a peer opened whose replies it leaves unread this long is closed.",
    },
    ConfigVar {
        name: "UCT_TCP_MAX_ACCEPTED",
        default: "1024",
        kind: ConfigKind::Uint,
        doc: "Most connections a tcp iface keeps that peers opened to it (one per peer iface that sends to it). At the limit, the oldest that has not said Hello yet is closed for a new one, else, of those that never sent a request or whose put with immediate data waits for this iface to connect back, the one idle longest if idle for UCT_TCP_PEER_TIMEOUT; if none is, the new one is refused (a connection that carried a request is never closed for a new one). Connections that say no Hello within UCT_BOOTSTRAP_TIMEOUT are closed. `auto`: the default.",
    },
];

/// What an iface takes from the configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) timeouts: Timeouts,
    pub(crate) max_accepted: usize,
}

/// The tcp variables (and UCT_BOOTSTRAP_TIMEOUT), each its default (logged)
/// when it does not parse.
fn settings() -> Settings {
    let (cfg, errors) = Config::from_env_lenient(&[(NAME, TCP_CONFIG)]);
    for e in errors {
        log::error!("{e}; using its default");
    }
    Settings {
        timeouts: Timeouts {
            peer: cfg
                .get_duration("UCT_TCP_PEER_TIMEOUT")
                .unwrap_or(Duration::from_secs(10)),
            hello: cfg
                .get_duration("UCT_BOOTSTRAP_TIMEOUT")
                .unwrap_or(Duration::from_secs(30)),
        },
        max_accepted: cfg
            .get_uint("UCT_TCP_MAX_ACCEPTED")
            .ok()
            .flatten()
            .map(|n| n.min(usize::MAX as u64) as usize)
            .unwrap_or(1024),
    }
}

/// The tcp component: one host MD, one transport per network interface.
pub struct TcpComponent {
    md: OnceLock<Arc<HostMd>>,
}

impl TcpComponent {
    fn host_md(&self) -> Arc<HostMd> {
        self.md.get_or_init(|| md::open(NAME)).clone()
    }
}

impl Component for TcpComponent {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "TCP sockets: active messages, and put/get/atomics executed by the target"
    }

    fn transport_names(&self) -> Vec<String> {
        vec![NAME.into()]
    }

    fn config_table(&self) -> &'static [ConfigVar] {
        TCP_CONFIG
    }

    fn md_names(&self) -> Result<Vec<String>> {
        Ok(vec![md::MD_NAME.into()])
    }

    fn open_md(&self, name: &str) -> Result<Arc<dyn MemoryDomain>> {
        if name != md::MD_NAME {
            return Err(UctError::NoDevice(format!(
                "component tcp has memory domain tcp, not {name}"
            )));
        }
        Ok(self.host_md())
    }

    fn tl_resources(&self, md: &Arc<dyn MemoryDomain>) -> Result<Vec<TlResource>> {
        if md.component() != NAME {
            return Ok(vec![]);
        }
        Ok(devices::list()
            .into_iter()
            .map(|device| TlResource {
                transport: NAME.into(),
                device: device.name,
                device_type: DeviceType::Network,
                system_device: None,
            })
            .collect())
    }

    fn open_iface(
        &self,
        md: &Arc<dyn MemoryDomain>,
        resource: &TlResource,
        _params: &IfaceParams,
    ) -> Result<Box<dyn Iface>> {
        let host = HostMd::of(md, NAME).ok_or_else(|| {
            UctError::InvalidParam(format!("tcp needs memory domain tcp, got {}", md.name()))
        })?;
        let device = devices::list()
            .into_iter()
            .find(|device| device.name == resource.device)
            .ok_or_else(|| {
                UctError::NoDevice(format!(
                    "network interface {} (is it up, with an IPv4 address?)",
                    resource.device
                ))
            })?;
        Ok(Box::new(TcpIface::open(
            device,
            md.clone(),
            host.table().clone(),
            settings(),
        )?))
    }

    fn unpack_rkey(&self, entry: &RkeyEntry) -> Result<RemoteKey> {
        HostMd::unpack_rkey(NAME, entry)
    }
}

fn create() -> Arc<dyn Component> {
    Arc::new(TcpComponent {
        md: OnceLock::new(),
    })
}

inventory::submit! {
    BuiltinComponent { create }
}
