//! An example loadable module. It offers the same loopback as `self` under
//! the component name `example` and the transport name `loop`, proving
//! that a component in a `libuct_<name>.so` file is found, checked,
//! initialised and used like a built-in one, and logs through the host.

use std::sync::Arc;

use uct_core::self_tl::SelfComponent;
use uct_core::Component;

fn init() -> Vec<Arc<dyn Component>> {
    log::info!("example module initialised (host logger in use)");
    vec![Arc::new(SelfComponent::new(
        "example",
        "example",
        "loop",
        "example loadable module: loopback inside one process",
    ))]
}

uct_core::declare_module!(init);
