//! The `loop` iface: uct-core's self iface under the transport name `loop`.

pub use uct_core::self_tl::SelfIface;

/// The transport's name.
pub const TRANSPORT_NAME: &str = "loop";
