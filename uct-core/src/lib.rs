//! uct-core: the framework of uct-rs, a UCX-style pluggable transport layer.
//!
//! - [`Component`]s provide [`MemoryDomain`]s and transports; the
//!   [`Registry`] finds them, built in through `inventory` or loaded from
//!   `libuct_<name>.so` modules.
//! - An [`Iface`] is one transport on one device; an [`Endpoint`] connects
//!   it to a peer. Operations return [`Status`]: Done, InProgress (a
//!   [`Completion`] fires from `progress`) or NoResource.
//! - Remote memory is reached through rkeys ([`RkeyBundle`]).
//! - The `self` transport (loopback in one process) and the host memory MD
//!   live here; configuration, logging and the bootstrap channel too.

#![warn(missing_docs)]

pub mod atomic_ops;
pub mod bootstrap;
pub mod completion;
pub mod component;
pub mod config;
pub mod ep;
pub mod error;
pub mod host_alloc;
pub mod host_md;
pub mod iface;
pub mod logging;
pub mod md;
pub mod memory;
pub mod module_abi;
pub mod region_table;
pub mod registry;
pub mod rkey;
pub mod self_tl;

pub use completion::{Completion, CompletionData, Status};
pub use component::{BuiltinComponent, Component};
pub use config::{Config, ConfigKind, ConfigVar};
pub use ep::{AtomicValue, Endpoint, FetchOp};
pub use error::{ErrorSource, Result, UctError};
pub use iface::{
    AmHandler, AmHandlers, AmMessage, Caps, DeviceType, EpParams, Iface, IfaceAttrs, IfaceParams,
    SizeLimits, TlResource,
};
pub use md::{MdAttrs, MdFlags, MemInfo, MemoryDomain};
pub use memory::{Access, Iov, MemHandle, MemRegion, MemoryType};
pub use registry::{ModuleStatus, Registry, Resource};
pub use rkey::{RemoteKey, RkeyBundle, RkeyEntry};

/// Version of this crate.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

// Re-exported so `inventory::submit!` works in crates that only depend on
// uct-core.
pub use inventory;
