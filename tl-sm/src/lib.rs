//! Intra-node transports: `posix` (shared-memory segments and a lock-free
//! receive ring) and `cma` (process_vm_readv/writev). Both reach processes
//! on this host only, and move host memory only.
//!
//! One component, `sm` ([`component.rs`](component)), serves both; each
//! transport's folder has the shape of every transport: `component.rs` (its
//! part of the sm component), `md.rs`, `iface.rs`, `ep.rs`, then the pieces
//! named for what they are. What both share is here: [`host`] (boot id,
//! pids), [`segment`] (shared-memory segments) and `rkey.rs`.

pub mod cma;
pub mod component;
pub mod host;
pub mod posix;
mod rkey;
pub mod segment;

pub use component::SmComponent;
