//! InfiniBand/RoCE memory domain over rdma-sys (issue: RDMA for real). Not built yet.
