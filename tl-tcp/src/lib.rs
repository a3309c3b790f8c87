//! The tcp transport: active messages, and put, get and atomics carried as
//! messages that the target executes in its `progress`, every access checked
//! against the target's region table (range, rights, secret). A put with
//! immediate data (`put_zcopy_imm`) is one frame: the target writes the
//! data after the same checks, then hands the immediate to its immediate
//! handler in order with the link's active messages, and answers, so that
//! the put completes once it has landed (or with the target's refusal, in
//! which case no immediate was delivered). Runs on any network interface,
//! loopback included.
//!
//! The crate has the shape of every transport folder: `component.rs` (the
//! component and its configuration), `md.rs` (its memory domain: uct-core's
//! host MD), `iface.rs` and `ep.rs`; then the pieces named for what they
//! are: `devices.rs` (network interfaces), `address.rs`, `conn.rs` (one
//! socket), `dial.rs` (connecting from the iface's address), `link.rs`
//! (one connection between two ifaces), `hello.rs` (who
//! is on the other end of a link), `outgoing.rs` (the frames a connection
//! sends), `sockopt.rs` (its timeouts), `pending.rs` (the requests this
//! side sent and their answers), `execute.rs` (the target's side of each
//! request), `arrivals.rs` (active messages and immediates on their way
//! to the handlers) and `wire.rs` (the frame format).
//!
//! `address` and `wire` are public so that tests and the adversary suite
//! speak the real format; they are not an API for applications.

pub mod address;
mod arrivals;
mod component;
mod conn;
pub mod devices;
mod dial;
mod direct;
mod ep;
mod execute;
mod hello;
mod iface;
mod link;
mod md;
mod outgoing;
mod pending;
mod quiet;
mod sockopt;
pub mod wire;

pub use component::{TcpComponent, TCP_CONFIG};
pub use iface::TcpIface;
