//! Components: the plugins that provide memory domains and transports.

use std::sync::Arc;

use crate::config::ConfigVar;
use crate::error::Result;
use crate::iface::{Iface, IfaceParams, TlResource};
use crate::md::MemoryDomain;
use crate::rkey::{RemoteKey, RkeyEntry};

/// A plugin: names its memory domains and transports, opens them, and
/// unpacks the rkeys its MDs pack (no open MD needed, as in UCX).
pub trait Component: Send + Sync {
    /// Short name, such as `self`, `sm`, `tcp`, `ib`.
    fn name(&self) -> &str;

    /// One line that says what it is.
    fn description(&self) -> &str;

    /// Transports this component provides when their devices are present.
    fn transport_names(&self) -> Vec<String>;

    /// Its configuration variables.
    fn config_table(&self) -> &'static [ConfigVar] {
        &[]
    }

    /// The memory domains present on this machine.
    fn md_names(&self) -> Result<Vec<String>>;

    /// Opens a memory domain by name. Opening the same name twice returns
    /// the same MD.
    fn open_md(&self, name: &str) -> Result<Arc<dyn MemoryDomain>>;

    /// The transports and devices an open MD of this component serves.
    fn tl_resources(&self, md: &Arc<dyn MemoryDomain>) -> Result<Vec<TlResource>>;

    /// Opens an iface of `resource` over `md`.
    fn open_iface(
        &self,
        md: &Arc<dyn MemoryDomain>,
        resource: &TlResource,
        params: &IfaceParams,
    ) -> Result<Box<dyn Iface>>;

    /// Unpacks an rkey entry packed by one of this component's MDs.
    fn unpack_rkey(&self, entry: &RkeyEntry) -> Result<RemoteKey>;
}

/// A component compiled into the program; `inventory::submit!` one to make
/// it found by the registry.
pub struct BuiltinComponent {
    /// Creates the component; called once per registry.
    pub create: fn() -> Arc<dyn Component>,
}

inventory::collect!(BuiltinComponent);
