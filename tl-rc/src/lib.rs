//! The RC transport over verbs, and the `ib` component (md-ib + rc) that the
//! loadable module `libuct_ib.so` carries, so that nothing else links
//! libibverbs.
//!
//! The files, as in every transport: `component.rs` (the component and its
//! configuration), `md.rs` (the memory domain), `iface.rs`, `ep.rs`; and
//! for rc: `tx.rs` (the send side as a state machine without verbs),
//! `keepalive.rs` (when to probe the peer and when to give it up),
//! `port_watch.rs` (whether the port is still up: a link that goes down
//! fails the endpoints on it),
//! `conn.rs` (the endpoint's verbs I/O and completions; `conn/recv.rs` its
//! receive side: active messages and immediates), `post.rs` (building
//! each kind of work request), `qp.rs` (completion queues and
//! queue pairs, public so that tests can play a hostile peer with raw
//! verbs) and `wire.rs` (addresses and immediate data).

pub mod component;
mod conn;
mod ep;
pub mod iface;
pub mod keepalive;
pub mod md;
pub mod port_watch;
mod post;
pub mod qp;
pub mod tx;
pub mod wire;

use std::sync::Arc;

use uct_core::Component;

pub use component::{IbComponent, IB_CONFIG};
pub use iface::RcIface;

fn init() -> Vec<Arc<dyn Component>> {
    vec![Arc::new(IbComponent::new())]
}

uct_core::declare_module!(init);
