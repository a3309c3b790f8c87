//! The memory domain cuda_copy runs over: md-cuda's, one per GPU (device
//! and pinned host memory, registration, DMA-buf export, detection). It
//! lives in md-cuda so that other CUDA transports can share it.

pub use md_cuda::CudaMd;
