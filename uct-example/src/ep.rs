//! The `loop` endpoint: uct-core's self endpoint; it reaches `loop` ifaces
//! of this process only.

pub use uct_core::self_tl::SelfEp;
