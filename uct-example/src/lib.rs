//! An example loadable module. It offers the same loopback as `self` under
//! the component name `example` and the transport name `loop`, proving
//! that a component in a `libuct_<name>.so` file is found, checked,
//! initialised and used like a built-in one, and logs through the host.
//!
//! The crate has the shape of every transport folder: `component.rs`,
//! `md.rs`, `iface.rs` and `ep.rs`; all but the component are uct-core's
//! `self` parts, reused under the names here.

pub mod component;
pub mod ep;
pub mod iface;
pub mod md;

uct_core::declare_module!(component::init);
