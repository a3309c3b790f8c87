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
//!
//! The design (object model, module ABI, memory safety across operations,
//! the trust model) is in `docs/design.md` at the root of the repository.
//!
//! # Example: a put over `self`
//!
//! An MD, an iface, an endpoint, a put and a flush, over the `self`
//! transport (loopback inside one process, always built in). Every other
//! transport is driven the same way; only the addresses travel between
//! processes (see [`bootstrap`]).
//!
//! ```
//! use uct_core::{Access, Completion, EpParams, MemoryType, Registry, RkeyBundle, Status};
//!
//! # fn main() -> uct_core::Result<()> {
//! let registry = Registry::global();
//! let resource = registry.find_resource("self", None)?;
//! let md = resource.md.clone();
//! let mut iface = resource
//!     .component
//!     .open_iface(&md, &resource.tl, &Default::default())?;
//!
//! // Memory a peer may write, and the rkey it needs for that: the packed
//! // bytes are what would be sent to the peer.
//! let target = md.alloc(4096, MemoryType::Host, Access::all())?;
//! let packed = RkeyBundle::single(md.pack_rkey(&target)?).pack()?;
//! let rkey = registry.unpack_rkey(&packed, md.name())?;
//!
//! // An endpoint to an iface by its addresses: here, the iface itself.
//! let mut ep = iface.create_ep(EpParams::ToIface {
//!     device_addr: iface.device_address(),
//!     iface_addr: iface.iface_address(),
//! })?;
//! while ep.put_bcopy(b"hello", target.addr() + 64, &rkey)? == Status::NoResource {
//!     iface.progress();
//! }
//!
//! // Flush: complete when every earlier put has landed at the target.
//! let flushed = Completion::new();
//! if ep.flush(Some(&flushed))? == Status::InProgress {
//!     while !flushed.is_complete() {
//!         iface.progress();
//!     }
//!     flushed.result()?;
//! }
//!
//! let at = target.host_ptr(64, 5)?;
//! // SAFETY: host_ptr checked that [64, 69) lies inside the allocation,
//! // which `target` keeps alive, and nothing writes it any more.
//! let landed = unsafe { std::slice::from_raw_parts(at, 5) };
//! assert_eq!(landed, b"hello");
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod atomic_ops;
pub mod bootstrap;
pub mod coarse_clock;
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
pub mod spin;

pub use completion::{Completion, CompletionData, Status};
pub use component::{BuiltinComponent, Component};
pub use config::{Config, ConfigKind, ConfigVar};
pub use ep::{AtomicValue, Endpoint, FetchOp};
pub use error::{ErrorSource, Result, UctError};
pub use iface::{
    AmHandler, AmHandlers, AmMessage, Caps, DeviceType, EpParams, Iface, IfaceAttrs, IfaceParams,
    ImmEvent, ImmHandler, ImmHandlerSlot, SizeLimits, TlResource,
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
