//! The memory domain of tcp: not one of its own. The tcp component opens
//! uct-core's [`HostMd`] (host memory, registered in a region table), and
//! its ifaces execute the requests that arrive against that table.

use std::sync::Arc;

use uct_core::host_md::HostMd;
use uct_core::MemoryDomain;

/// The memory domain's name (the component's too).
pub(crate) const MD_NAME: &str = "tcp";

/// A new host MD for component `component`.
pub(crate) fn open(component: &str) -> Arc<HostMd> {
    HostMd::new(component, MD_NAME)
}

/// `md` as the host MD of component `component`, or None when it is another
/// component's MD (which a tcp iface cannot use: it needs the region table).
pub(crate) fn as_host_md<'md>(
    md: &'md Arc<dyn MemoryDomain>,
    component: &str,
) -> Option<&'md HostMd> {
    md.as_any()
        .downcast_ref::<HostMd>()
        .filter(|host| host.component() == component)
}
