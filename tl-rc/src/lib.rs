//! RC transport over verbs (issue: RDMA for real). Not built yet.
