//! The cma transport: put and get straight into a peer process's registered
//! memory with `process_vm_writev` / `process_vm_readv` (`vm.rs`),
//! no shared mapping and no copy in between. Before each access the
//! initiator reads the owner's registration record ([`records`]: state,
//! secret, range, rights) out of the owner's sealed record table (`table.rs`),
//! so a freed region, a forged key, an access outside the range or without
//! the right is refused; deregistration waits for accesses in flight. The
//! endpoint watches the peer process (a pidfd), so a dead peer is an error
//! within milliseconds. cma has no active messages and no atomics of its own.
//!
//! These checks run in the initiator: they protect a process from a buggy,
//! stale or dead peer, not from a hostile process of the same user, which
//! can call process_vm_writev itself (see the design's trust model).

pub mod component;
mod ep;
mod iface;
mod md;
pub mod records;
mod table;
mod vm;

pub use iface::CmaIface;
pub use md::{CmaMd, CmaRkey, MD_NAME};
pub use table::SIZE as TABLE_SIZE;
