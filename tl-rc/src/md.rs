//! The memory domain rc uses: md-ib's, one per RDMA device (host and
//! DMA-buf registration, rkeys). It lives in md-ib so that other verbs
//! transports can share it.

pub use md_ib::{IbMd as RcMd, IbRkey};
