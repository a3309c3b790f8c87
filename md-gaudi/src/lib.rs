//! Gaudi memory domain of uct-rs over hl-thunk, loaded at run time.
//!
//! The component `gaudi` has one MD per device (`gaudi0`, `gaudi1`, ...) and
//! no transport of its own: Gaudi HBM reaches the network through an RDMA
//! NIC that imports its DMA-buf (md-ib's `register_handle`). The library is
//! `libhl-thunk.so`, or whatever `UCT_GAUDI_HLTHUNK_LIB` names (the test
//! suite's simulator, `libhlthunk_sim.so`, is a test double).

pub mod device;
pub mod error;
pub mod hlthunk;
pub mod md;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use uct_core::config::{Config, ConfigKind, ConfigVar};
use uct_core::{
    BuiltinComponent, Component, Iface, IfaceParams, MemoryDomain, RemoteKey, Result, RkeyEntry,
    TlResource, UctError,
};

pub use device::Device;
pub use error::GaudiError;
pub use hlthunk::{AllocHandle, DeviceFd, DeviceVa, HlThunk};
pub use md::GaudiMd;

const NAME: &str = "gaudi";

pub const GAUDI_CONFIG: &[ConfigVar] = &[ConfigVar {
    name: "UCT_GAUDI_HLTHUNK_LIB",
    default: hlthunk::DEFAULT_LIB,
    kind: ConfigKind::String,
    doc: "The hl-thunk library md-gaudi loads: a file name searched by the dynamic loader, or a path. Point it at the test suite's libhlthunk_sim.so to run against the simulator (a test double).",
}];

/// The library path from `UCT_GAUDI_HLTHUNK_LIB`.
pub fn configured_library() -> PathBuf {
    let (cfg, errors) = Config::from_env_lenient(&[(NAME, GAUDI_CONFIG)]);
    for e in errors {
        log::error!("{e}; using its default");
    }
    PathBuf::from(
        cfg.get_str("UCT_GAUDI_HLTHUNK_LIB")
            .unwrap_or(hlthunk::DEFAULT_LIB),
    )
}

/// Loads hl-thunk and opens every device, in device order.
pub fn open_devices(path: &std::path::Path) -> std::result::Result<Vec<Arc<GaudiMd>>, GaudiError> {
    let lib = Arc::new(HlThunk::load(path)?);
    let count = lib.device_count();
    if count <= 0 {
        return Err(GaudiError::NoDevices);
    }
    let sim = lib.simulator().map(str::to_string);
    if let Some(s) = &sim {
        log::info!(
            "gaudi: {} is {s}; its devices are simulated",
            path.display()
        );
    }
    // Open by bus id where sysfs lists the cards, so that gaudi<N> is
    // accel<N>; otherwise (older drivers, the simulator) take each next
    // free device.
    let sysfs = device::sysfs_bus_ids(std::path::Path::new("/sys"));
    let by_bus = sysfs.len() == count as usize;
    let mut out = Vec::new();
    for i in 0..count as usize {
        let (bus, kind) = match sysfs.get(i).filter(|_| by_bus) {
            Some((b, t)) => (Some(b.as_str()), t.clone()),
            None => (None, None),
        };
        let dev = Device::open(lib.clone(), i, bus, kind)?;
        out.push(Arc::new(GaudiMd::new(NAME, dev, sim.clone())));
    }
    Ok(out)
}

/// The gaudi component: memory domains only.
pub struct GaudiComponent {
    mds: OnceLock<std::result::Result<Vec<Arc<GaudiMd>>, String>>,
}

impl GaudiComponent {
    fn mds(&self) -> Result<&[Arc<GaudiMd>]> {
        self.mds
            .get_or_init(|| open_devices(&configured_library()).map_err(|e| e.to_string()))
            .as_deref()
            .map_err(|e| UctError::Device {
                device: "hl-thunk".into(),
                message: e.clone(),
                source: None,
            })
    }
}

impl Component for GaudiComponent {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "Intel Gaudi HBM over hl-thunk: alloc, map, DMA-buf export, memory query (no transport; a DMA-buf NIC carries it)"
    }

    fn transport_names(&self) -> Vec<String> {
        vec![]
    }

    fn config_table(&self) -> &'static [ConfigVar] {
        GAUDI_CONFIG
    }

    fn md_names(&self) -> Result<Vec<String>> {
        Ok(self.mds()?.iter().map(|m| m.name().to_string()).collect())
    }

    fn open_md(&self, name: &str) -> Result<Arc<dyn MemoryDomain>> {
        let mds = self.mds()?;
        mds.iter()
            .find(|m| m.name() == name)
            .map(|m| m.clone() as Arc<dyn MemoryDomain>)
            .ok_or_else(|| {
                UctError::NoDevice(format!(
                    "component gaudi has {}, not {name}",
                    mds.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
                ))
            })
    }

    fn tl_resources(&self, _md: &Arc<dyn MemoryDomain>) -> Result<Vec<TlResource>> {
        Ok(vec![])
    }

    fn open_iface(
        &self,
        _md: &Arc<dyn MemoryDomain>,
        resource: &TlResource,
        _params: &IfaceParams,
    ) -> Result<Box<dyn Iface>> {
        Err(UctError::NoTransport(format!(
            "{} (component gaudi has no transport; use rc on a NIC with DMA-buf support)",
            resource.transport
        )))
    }

    fn unpack_rkey(&self, entry: &RkeyEntry) -> Result<RemoteKey> {
        Err(UctError::RkeyMismatch {
            expected: "an rkey of a NIC's memory domain".into(),
            found: format!(
                "memory domain {} of component gaudi, which packs none",
                entry.md
            ),
        })
    }
}

fn create() -> Arc<dyn Component> {
    Arc::new(GaudiComponent {
        mds: OnceLock::new(),
    })
}

inventory::submit! {
    BuiltinComponent { create }
}
