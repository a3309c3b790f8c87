//! The posix transport: memory in sealed memfd segments
//! ([`crate::segment`]) that peers on the same host open through the
//! owner's pid and descriptor in the rkey; put and get are copies into the
//! mapped segment after the owner's header is checked; active messages go
//! through the receiver's lock-free ring ([`fifo`]); atomics work on the
//! mapping.

mod cache;
pub mod component;
mod ep;
pub mod fifo;
mod health;
pub mod ident;
mod iface;
mod md;

pub use iface::{PosixIface, RingAddress};
pub use md::{PosixMd, PosixRkey, MD_NAME};
