//! The memory domain of `self`: not one of its own. A self component opens
//! uct-core's [`HostMd`] (host memory, registered in a region table), and
//! its ifaces execute every remote access against that table.

use std::sync::Arc;

use crate::host_md::HostMd;

/// A new host MD named `md_name` for component `component`.
pub(super) fn open(component: &str, md_name: &str) -> Arc<HostMd> {
    HostMd::new(component, md_name)
}
