//! The `self` transport: loopback inside one process. Endpoints reach ifaces
//! of the same process; remote accesses go through the target MD's region
//! table like those of any software transport; active messages, and the
//! immediates of puts with immediate data, are queued to the target iface
//! and delivered by its `progress`.
//!
//! [`SelfComponent::new`] takes the names to use, so a loadable module can
//! offer the same loopback under other names (see the `uct-example` crate).
//!
//! The folder has the shape of every transport: `component.rs` (the
//! component), `md.rs` (its memory domain: uct-core's host MD), `iface.rs`
//! and `ep.rs`.

mod component;
mod ep;
mod iface;
mod md;

pub use component::SelfComponent;
pub use ep::SelfEp;
pub use iface::{SelfIface, SELF_AM_QUEUE_LEN, SELF_IMM_QUEUE_LEN};

#[cfg(test)]
mod tests;
