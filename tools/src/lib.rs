//! Shared code of the uct-rs command-line tools.

pub mod info;
pub mod text;

// Built-in transports register themselves with the registry when linked.
pub use md_gaudi;
pub use tl_sm;
pub use tl_tcp;
pub mod perf;
