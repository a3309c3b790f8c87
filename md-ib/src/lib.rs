//! InfiniBand/RoCE memory domain over rdma-sys: devices, ports and GIDs,
//! protection domains, registration of host memory (`ibv_reg_mr`) and of
//! DMA-buf fds (`ibv_reg_dmabuf_mr`); device memory through its owner's
//! DMA-buf or a peer-memory module (`device_mem.rs`, `peermem.rs`); rkeys.
//! It links libibverbs, so it is used only inside the loadable `ib`
//! module (built by tl-rc).

pub mod device;
mod device_mem;
pub mod error;
pub mod md;
pub mod peermem;
pub mod verbs;

pub use device::{DeviceInfo, GidEntry, PortInfo};
pub use error::{QpState, VerbsError};
pub use md::{IbBacking, IbMd, IbRkey, DMABUF_NICS};
