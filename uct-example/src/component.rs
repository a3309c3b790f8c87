//! The `example` component: uct-core's loopback component
//! ([`SelfComponent`]) under this module's names.

use std::sync::Arc;

use uct_core::self_tl::SelfComponent;
use uct_core::Component;

use crate::{iface, md};

/// The component's name, as `transport-info` and `UCT_MODULES` see it.
pub const COMPONENT_NAME: &str = "example";

/// The module's entry point: logs through the host's logger and returns the
/// one component.
pub fn init() -> Vec<Arc<dyn Component>> {
    log::info!("example module initialised (host logger in use)");
    vec![Arc::new(SelfComponent::new(
        COMPONENT_NAME,
        md::MD_NAME,
        iface::TRANSPORT_NAME,
        "example loadable module: loopback inside one process",
    ))]
}
