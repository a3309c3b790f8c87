//! The memory domain of tcp: not one of its own. The tcp component opens
//! uct-core's [`HostMd`] (host memory, registered in a region table), and
//! its ifaces execute the requests that arrive against that table.

use std::sync::Arc;

use uct_core::host_md::HostMd;

/// The memory domain's name (the component's too).
pub(crate) const MD_NAME: &str = "tcp";

/// A new host MD for component `component`.
pub(crate) fn open(component: &str) -> Arc<HostMd> {
    HostMd::new(component, MD_NAME)
}
