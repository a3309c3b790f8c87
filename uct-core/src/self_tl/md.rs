//! The memory domain of `self`: not one of its own. A self component opens
//! uct-core's [`HostMd`] (host memory, registered in a region table), and
//! its ifaces execute every remote access against that table.

use std::sync::Arc;

use crate::host_md::HostMd;
use crate::md::MemoryDomain;

/// A new host MD named `md_name` for component `component`.
pub(super) fn open(component: &str, md_name: &str) -> Arc<HostMd> {
    HostMd::new(component, md_name)
}

/// `md` as the host MD of component `component`, or None when it is another
/// component's MD (which a self iface cannot use: it needs the region table).
pub(super) fn as_host_md<'md>(
    md: &'md Arc<dyn MemoryDomain>,
    component: &str,
) -> Option<&'md HostMd> {
    md.as_any()
        .downcast_ref::<HostMd>()
        .filter(|host| host.component() == component)
}
