//! The cuda_copy transport, after UCX's: put and get zero-copy between host
//! and CUDA memory inside one process, as `cuMemcpyAsync` on a stream,
//! completed from an event queried in `progress`. With md-cuda it makes the
//! `cuda` component that the loadable module `libuct_cuda.so` carries, so
//! that the core and the tools never link (or need) the CUDA driver.
//!
//! The files, as in every transport: `component.rs`, `md.rs` (md-cuda's
//! MD), `iface.rs`, `ep.rs`; and `queue.rs` (copies in flight and their
//! completions, without the driver), `addr.rs` (addresses: this process
//! and an iface id).

pub mod addr;
pub mod component;
mod ep;
pub mod iface;
pub mod md;
pub mod queue;

use std::sync::Arc;

use uct_core::Component;

pub use component::CudaComponent;
pub use ep::CudaCopyEp;
pub use iface::{CudaCopyIface, TRANSPORT};

fn init() -> Vec<Arc<dyn Component>> {
    vec![Arc::new(CudaComponent::new())]
}

uct_core::declare_module!(init);
