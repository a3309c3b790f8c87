//! The `example` memory domain: uct-core's host MD
//! ([`HostMd`](uct_core::host_md::HostMd)) under this name, opened by the
//! component on first use.

/// The memory domain's name.
pub const MD_NAME: &str = "example";
