//! The cma transport: put and get straight into a peer process's registered
//! memory with `process_vm_writev` / `process_vm_readv` (`vm.rs`),
//! no shared mapping and no copy in between. Before each access the
//! initiator reads the owner's registration record ([`records`]: state,
//! secret, range, rights) out of the owner's memory, so a freed region, a
//! forged key, an access outside the range or without the right is refused.
//! cma has no active messages and no atomics of its own.

pub mod component;
mod ep;
mod iface;
mod md;
pub mod records;
mod vm;

pub use iface::CmaIface;
pub use md::{CmaMd, CmaRkey, MD_NAME};
