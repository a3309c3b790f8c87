//! The `cuda` component: one memory domain per GPU (md-cuda) and the
//! cuda_copy transport on each. Without the CUDA driver its memory domains
//! are absent with the loader's reason, which `transport-info -a` shows.

use std::sync::{Arc, OnceLock};

use md_cuda::{CudaMd, COMPONENT, CUDA_CONFIG};
use uct_core::config::ConfigVar;
use uct_core::region_table::SoftRkey;
use uct_core::rkey::decode_payload;
use uct_core::{
    Component, DeviceType, Iface, IfaceParams, MemoryDomain, RemoteKey, Result, RkeyEntry,
    TlResource, UctError,
};

use crate::iface::{CudaCopyIface, TRANSPORT};

/// The cuda component.
pub struct CudaComponent {
    mds: OnceLock<std::result::Result<Vec<Arc<CudaMd>>, String>>,
}

impl Default for CudaComponent {
    fn default() -> Self {
        Self::new()
    }
}

impl CudaComponent {
    /// The component; the driver is loaded when its MDs are first asked
    /// for (`UCT_CUDA_LIB`).
    pub fn new() -> Self {
        CudaComponent {
            mds: OnceLock::new(),
        }
    }

    /// Every GPU's MD, or why there is none.
    pub fn mds(&self) -> Result<&[Arc<CudaMd>]> {
        self.mds
            .get_or_init(|| {
                let (lib, pcie) = md_cuda::configured();
                md_cuda::open_devices(&lib, pcie).map_err(|e| e.to_string())
            })
            .as_deref()
            .map_err(|e| UctError::Device {
                device: "cuda driver".into(),
                message: e.clone(),
                source: None,
            })
    }

    fn cuda_md(&self, name: &str) -> Result<&Arc<CudaMd>> {
        let mds = self.mds()?;
        mds.iter().find(|m| m.name() == name).ok_or_else(|| {
            UctError::NoDevice(format!(
                "component cuda has {}, not {name}",
                mds.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
            ))
        })
    }
}

impl Component for CudaComponent {
    fn name(&self) -> &str {
        COMPONENT
    }

    fn description(&self) -> &str {
        "NVIDIA GPUs over the CUDA driver API (loaded at run time): memory domains per GPU (alloc, registration, DMA-buf export, detection), cuda_copy transport"
    }

    fn transport_names(&self) -> Vec<String> {
        vec![TRANSPORT.into()]
    }

    fn config_table(&self) -> &'static [ConfigVar] {
        CUDA_CONFIG
    }

    fn md_names(&self) -> Result<Vec<String>> {
        Ok(self.mds()?.iter().map(|m| m.name().to_string()).collect())
    }

    fn open_md(&self, name: &str) -> Result<Arc<dyn MemoryDomain>> {
        Ok(self.cuda_md(name)?.clone())
    }

    fn tl_resources(&self, md: &Arc<dyn MemoryDomain>) -> Result<Vec<TlResource>> {
        if md.component() != COMPONENT {
            return Ok(vec![]);
        }
        let cuda = self.cuda_md(md.name())?;
        Ok(vec![TlResource {
            transport: TRANSPORT.into(),
            device: cuda.name().to_string(),
            device_type: DeviceType::Accelerator,
            system_device: Some(cuda.device().bus_id.clone()),
        }])
    }

    fn open_iface(
        &self,
        md: &Arc<dyn MemoryDomain>,
        resource: &TlResource,
        _params: &IfaceParams,
    ) -> Result<Box<dyn Iface>> {
        if resource.transport != TRANSPORT {
            return Err(UctError::NoTransport(format!(
                "{} (component cuda has {TRANSPORT} only)",
                resource.transport
            )));
        }
        let cuda = self.cuda_md(md.name())?;
        Ok(Box::new(CudaCopyIface::open(md.clone(), cuda)?))
    }

    fn unpack_rkey(&self, entry: &RkeyEntry) -> Result<RemoteKey> {
        unpack_rkey(entry)
    }
}

/// Unpacks a key packed by a cuda MD; needs no open MD (nor a driver).
pub fn unpack_rkey(entry: &RkeyEntry) -> Result<RemoteKey> {
    if entry.component != COMPONENT {
        return Err(UctError::RkeyMismatch {
            expected: format!("component {COMPONENT}"),
            found: format!("component {}", entry.component),
        });
    }
    let key: SoftRkey = decode_payload(&entry.payload)?;
    if key.base.checked_add(key.len).is_none() {
        return Err(UctError::BadRkey(
            "region wraps around the address space".into(),
        ));
    }
    Ok(RemoteKey::new(COMPONENT, entry.md.clone(), Box::new(key)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use uct_core::rkey::encode_payload;
    use uct_core::Access;

    #[test]
    fn keys_of_other_components_and_garbage_are_refused() {
        let key = SoftRkey {
            region_id: 1,
            secret: 2,
            base: 0x1000,
            len: 4096,
            access: Access::all(),
        };
        let entry = RkeyEntry {
            component: COMPONENT.into(),
            md: "cuda0".into(),
            payload: encode_payload(&key).unwrap(),
        };
        let rk = unpack_rkey(&entry).unwrap();
        assert_eq!(rk.downcast::<SoftRkey>("cuda0").unwrap(), &key);
        let other = RkeyEntry {
            component: "self".into(),
            ..entry.clone()
        };
        assert!(matches!(
            unpack_rkey(&other),
            Err(UctError::RkeyMismatch { .. })
        ));
        let wrapping = RkeyEntry {
            payload: encode_payload(&SoftRkey {
                base: u64::MAX,
                ..key
            })
            .unwrap(),
            ..entry.clone()
        };
        assert!(matches!(unpack_rkey(&wrapping), Err(UctError::BadRkey(_))));
        for n in 0..entry.payload.len() {
            let cut = RkeyEntry {
                payload: entry.payload[..n].to_vec(),
                ..entry.clone()
            };
            assert!(unpack_rkey(&cut).is_err());
        }
    }
}
