//! The self component: one host MD and one transport on one device
//! (`memory`), under the names it is given; built in as `self`.

use std::sync::{Arc, OnceLock};

use super::iface::SelfIface;
use super::md;
use crate::component::{BuiltinComponent, Component};
use crate::error::{Result, UctError};
use crate::host_md::HostMd;
use crate::iface::{DeviceType, Iface, IfaceParams, TlResource};
use crate::md::MemoryDomain;
use crate::rkey::{RemoteKey, RkeyEntry};

/// A loopback component: one host MD and one transport on one device.
pub struct SelfComponent {
    name: &'static str,
    md_name: &'static str,
    tl_name: &'static str,
    description: &'static str,
    md: OnceLock<Arc<HostMd>>,
}

impl SelfComponent {
    /// A loopback component named `name`, with memory domain `md_name` and
    /// transport `tl_name`; `description` is what `transport-info` shows.
    /// The built-in one is `self` for all three names.
    pub fn new(
        name: &'static str,
        md_name: &'static str,
        tl_name: &'static str,
        description: &'static str,
    ) -> Self {
        SelfComponent {
            name,
            md_name,
            tl_name,
            description,
            md: OnceLock::new(),
        }
    }

    fn host_md(&self) -> Arc<HostMd> {
        self.md
            .get_or_init(|| md::open(self.name, self.md_name))
            .clone()
    }
}

impl Component for SelfComponent {
    fn name(&self) -> &str {
        self.name
    }

    fn description(&self) -> &str {
        self.description
    }

    fn transport_names(&self) -> Vec<String> {
        vec![self.tl_name.to_string()]
    }

    fn md_names(&self) -> Result<Vec<String>> {
        Ok(vec![self.md_name.to_string()])
    }

    fn open_md(&self, name: &str) -> Result<Arc<dyn MemoryDomain>> {
        if name != self.md_name {
            return Err(UctError::NoDevice(format!(
                "component {} has memory domain {}, not {name}",
                self.name, self.md_name
            )));
        }
        Ok(self.host_md())
    }

    fn tl_resources(&self, md: &Arc<dyn MemoryDomain>) -> Result<Vec<TlResource>> {
        if md.component() != self.name {
            return Ok(vec![]);
        }
        Ok(vec![TlResource {
            transport: self.tl_name.to_string(),
            device: "memory".to_string(),
            device_type: DeviceType::SelfLoop,
            system_device: None,
        }])
    }

    fn open_iface(
        &self,
        md: &Arc<dyn MemoryDomain>,
        resource: &TlResource,
        _params: &IfaceParams,
    ) -> Result<Box<dyn Iface>> {
        if resource.transport != self.tl_name {
            return Err(UctError::NoTransport(resource.transport.clone()));
        }
        let host = HostMd::of(md, self.name).ok_or_else(|| {
            UctError::InvalidParam(format!(
                "transport {} needs memory domain {}, got {}",
                self.tl_name,
                self.md_name,
                md.name()
            ))
        })?;
        Ok(Box::new(SelfIface::new(
            self.tl_name,
            md.clone(),
            host.table().clone(),
        )))
    }

    fn unpack_rkey(&self, entry: &RkeyEntry) -> Result<RemoteKey> {
        HostMd::unpack_rkey(self.name, entry)
    }
}

fn create_builtin() -> Arc<dyn Component> {
    Arc::new(SelfComponent::new(
        "self",
        "self",
        "self",
        "loopback inside one process",
    ))
}

inventory::submit! {
    BuiltinComponent { create: create_builtin }
}
