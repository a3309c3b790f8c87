//! The `ib` component: one memory domain per RDMA device, transport rc on
//! each active port; its configuration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use md_ib::verbs::Context;
use uct_core::config::{Config, ConfigKind, ConfigVar};
use uct_core::{
    Component, DeviceType, Iface, IfaceParams, MemoryDomain, RemoteKey, Result, RkeyEntry,
    TlResource, UctError,
};

use crate::conn::Queues;
use crate::iface::RcIface;
use crate::md::RcMd;
use crate::port_watch::PortWatch;

pub(crate) const NAME: &str = "ib";

/// The ib component's configuration.
pub const IB_CONFIG: &[ConfigVar] = &[
    ConfigVar {
        name: "UCT_IB_GID_INDEX",
        default: "auto",
        kind: ConfigKind::Uint,
        doc: "GID table index to use; auto picks the first RoCE v2 IPv4-mapped GID, then the first RoCE v2 one, then the first one.",
    },
    ConfigVar {
        name: "UCT_RC_TX_QUEUE_LEN",
        default: "256",
        kind: ConfigKind::Uint,
        doc: "Send queue length of each rc endpoint: operations in flight before NoResource.",
    },
    ConfigVar {
        name: "UCT_RC_PEER_TIMEOUT",
        default: "10s",
        kind: ConfigKind::Duration,
        doc: "An rc endpoint whose peer shows no sign of life for this long fails: with operations outstanding and no work completion, or when a keepalive (a zero-length RDMA write, sent after half of it without a completion) gets no answer within the other half. Bytes posted ahead of the completion waited for extend it by their time at 64 MiB/s. Values under 100ms are raised to 100ms. Some NICs, rxe among them, never time out such a QP themselves.",
    },
    ConfigVar {
        name: "UCT_RC_RX_QUEUE_LEN",
        default: "64",
        kind: ConfigKind::Uint,
        doc: "Receive buffers posted by each rc endpoint for active messages.",
    },
];

/// An open device: its MD and the watcher of its ports.
type Device = (Arc<RcMd>, Arc<PortWatch>);

/// The ib component: one memory domain per RDMA device, transport rc on
/// each active port.
pub struct IbComponent {
    /// Each device's MD and the watcher of its ports, opened once.
    mds: Mutex<HashMap<String, Device>>,
}

impl Default for IbComponent {
    fn default() -> Self {
        Self::new()
    }
}

impl IbComponent {
    /// The component, for a program that links rc rather than loading the
    /// module (tests).
    pub fn new() -> Self {
        IbComponent {
            mds: Mutex::new(HashMap::new()),
        }
    }

    /// The MD of device `name`, opened once.
    fn ib_md(&self, name: &str) -> Result<Arc<RcMd>> {
        Ok(self.device(name)?.0)
    }

    /// The MD of device `name` and its port watcher, opened once.
    fn device(&self, name: &str) -> Result<Device> {
        let mut mds = self.mds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = mds.get(name) {
            return Ok(found.clone());
        }
        let md = Arc::new(RcMd::open(NAME, name)?);
        let watch = PortWatch::new(md.pd().context().clone());
        mds.insert(name.to_string(), (md.clone(), watch.clone()));
        Ok((md, watch))
    }
}

impl Component for IbComponent {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "InfiniBand/RoCE verbs: memory domains per device (host and DMA-buf registration), RC transport"
    }

    fn transport_names(&self) -> Vec<String> {
        vec!["rc".into()]
    }

    fn config_table(&self) -> &'static [ConfigVar] {
        IB_CONFIG
    }

    fn md_names(&self) -> Result<Vec<String>> {
        Ok(Context::device_names())
    }

    fn open_md(&self, name: &str) -> Result<Arc<dyn MemoryDomain>> {
        Ok(self.ib_md(name)?)
    }

    fn tl_resources(&self, md: &Arc<dyn MemoryDomain>) -> Result<Vec<TlResource>> {
        if md.component() != NAME {
            return Ok(vec![]);
        }
        let ib = self.ib_md(md.name())?;
        let info = ib.info();
        Ok(info
            .ports
            .iter()
            .filter(|p| p.active)
            .map(|p| TlResource {
                transport: "rc".into(),
                device: format!("{}:{}", info.name, p.num),
                device_type: DeviceType::Network,
                system_device: info.pci.clone(),
            })
            .collect())
    }

    fn open_iface(
        &self,
        md: &Arc<dyn MemoryDomain>,
        resource: &TlResource,
        _params: &IfaceParams,
    ) -> Result<Box<dyn Iface>> {
        let (ib, watch) = self.device(md.name())?;
        let port: u8 = resource
            .device
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .ok_or_else(|| {
                UctError::NoDevice(format!(
                    "rc device {} (expected NAME:PORT)",
                    resource.device
                ))
            })?;
        let (cfg, errors) = Config::from_env_lenient(&[(NAME, IB_CONFIG)]);
        for e in errors {
            log::error!("{e}; using its default");
        }
        let gid_index = cfg
            .get_uint("UCT_IB_GID_INDEX")
            .ok()
            .flatten()
            .map(|v| v as u32);
        let queues = Queues {
            tx: cfg
                .get_uint("UCT_RC_TX_QUEUE_LEN")
                .ok()
                .flatten()
                .unwrap_or(256)
                .clamp(8, 16384) as u32,
            rx: cfg
                .get_uint("UCT_RC_RX_QUEUE_LEN")
                .ok()
                .flatten()
                .unwrap_or(64)
                .clamp(8, 16384) as u32,
            peer_timeout: peer_timeout(
                cfg.get_duration("UCT_RC_PEER_TIMEOUT")
                    .unwrap_or(std::time::Duration::from_secs(10)),
            ),
        };
        Ok(Box::new(RcIface::open(
            md.clone(),
            (ib, watch),
            port,
            gid_index,
            queues,
        )?))
    }

    fn unpack_rkey(&self, entry: &RkeyEntry) -> Result<RemoteKey> {
        RcMd::unpack_rkey(NAME, entry)
    }
}

/// The shortest UCT_RC_PEER_TIMEOUT taken: below it (0 included) every
/// endpoint would be declared dead at its first look at the clock.
pub const MIN_PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(100);

/// UCT_RC_PEER_TIMEOUT as set, raised to [`MIN_PEER_TIMEOUT`] with a
/// warning.
fn peer_timeout(set: std::time::Duration) -> std::time::Duration {
    if set < MIN_PEER_TIMEOUT {
        log::warn!(
            "rc: UCT_RC_PEER_TIMEOUT={set:?} would declare every peer dead at once; using {MIN_PEER_TIMEOUT:?} (set it to 100ms or more)"
        );
        return MIN_PEER_TIMEOUT;
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_zero_peer_timeout_is_raised_to_the_floor() {
        assert_eq!(peer_timeout(Duration::ZERO), MIN_PEER_TIMEOUT);
        assert_eq!(peer_timeout(Duration::from_millis(99)), MIN_PEER_TIMEOUT);
        assert_eq!(peer_timeout(Duration::from_secs(3)), Duration::from_secs(3));
    }
}
