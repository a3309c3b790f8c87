//! Intra-node transports: `posix` (shared-memory segments and a lock-free
//! receive ring) and `cma` (process_vm_readv/writev). Both reach processes
//! on this host only, and move host memory only.

pub mod cma;
pub mod host;
pub mod posix;

use std::sync::{Arc, OnceLock};

use uct_core::{
    BuiltinComponent, Component, DeviceType, Iface, IfaceParams, MemoryDomain, RemoteKey, Result,
    RkeyEntry, TlResource, UctError,
};

const NAME: &str = "sm";

/// The sm component: memory domains posix and cma, one transport each.
pub struct SmComponent {
    posix: OnceLock<Arc<posix::PosixMd>>,
    cma: OnceLock<Arc<cma::CmaMd>>,
}

impl Component for SmComponent {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "shared memory on this host: posix segments, cma (process_vm_readv/writev)"
    }

    fn transport_names(&self) -> Vec<String> {
        vec!["posix".into(), "cma".into()]
    }

    fn md_names(&self) -> Result<Vec<String>> {
        Ok(vec![posix::MD_NAME.into(), cma::MD_NAME.into()])
    }

    fn open_md(&self, name: &str) -> Result<Arc<dyn MemoryDomain>> {
        match name {
            posix::MD_NAME => Ok(self
                .posix
                .get_or_init(|| Arc::new(posix::PosixMd::new(NAME)))
                .clone()),
            cma::MD_NAME => Ok(self
                .cma
                .get_or_init(|| Arc::new(cma::CmaMd::new(NAME)))
                .clone()),
            other => Err(UctError::NoDevice(format!(
                "component sm has memory domains posix and cma, not {other}"
            ))),
        }
    }

    fn tl_resources(&self, md: &Arc<dyn MemoryDomain>) -> Result<Vec<TlResource>> {
        if md.component() != NAME {
            return Ok(vec![]);
        }
        Ok(vec![TlResource {
            transport: md.name().to_string(),
            device: "memory".into(),
            device_type: DeviceType::SharedMemory,
            system_device: None,
        }])
    }

    fn open_iface(
        &self,
        md: &Arc<dyn MemoryDomain>,
        resource: &TlResource,
        _params: &IfaceParams,
    ) -> Result<Box<dyn Iface>> {
        if md.component() != NAME || md.name() != resource.transport {
            return Err(UctError::InvalidParam(format!(
                "transport {} needs memory domain {}, got {}",
                resource.transport,
                resource.transport,
                md.name()
            )));
        }
        match resource.transport.as_str() {
            "posix" => Ok(Box::new(posix::PosixIface::open(md.clone())?)),
            "cma" => Ok(Box::new(cma::CmaIface::open(md.clone()))),
            other => Err(UctError::NoTransport(other.into())),
        }
    }

    fn unpack_rkey(&self, entry: &RkeyEntry) -> Result<RemoteKey> {
        match entry.md.as_str() {
            posix::MD_NAME => posix::PosixMd::unpack_rkey(NAME, entry),
            cma::MD_NAME => cma::CmaMd::unpack_rkey(NAME, entry),
            other => Err(UctError::RkeyMismatch {
                expected: "memory domain posix or cma".into(),
                found: format!("memory domain {other}"),
            }),
        }
    }
}

fn create() -> Arc<dyn Component> {
    Arc::new(SmComponent {
        posix: OnceLock::new(),
        cma: OnceLock::new(),
    })
}

inventory::submit! {
    BuiltinComponent { create }
}
