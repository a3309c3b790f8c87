//! Intra-node transports: posix shared memory and cma (issue: transports that work everywhere). Not built yet.
