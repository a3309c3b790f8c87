//! The two ways a NIC reaches device memory, and which this host offers:
//! a DMA-buf the device's MD exports (`ibv_reg_dmabuf_mr`), or a kernel
//! peer-memory client that lets `ibv_reg_mr` take the device pointer
//! itself (`nvidia_peermem` for CUDA memory). md-ib knows memory types,
//! not their owners: the only thing it knows of CUDA is the name of the
//! module that serves its memory type.

use std::path::Path;

use uct_core::MemoryType;

use crate::error::ENOTSUPP;

/// The kernel modules that let `ibv_reg_mr` register a device pointer of
/// `mem_type`, the one to load first: for CUDA, `nvidia_peermem` (in the
/// NVIDIA driver since 465) and `nv_peer_mem` (Mellanox's older,
/// separate module, still on hosts with older stacks).
pub fn modules_for(mem_type: MemoryType) -> &'static [&'static str] {
    match mem_type {
        MemoryType::Cuda => &["nvidia_peermem", "nv_peer_mem"],
        _ => &[],
    }
}

/// The kernel module to load for `mem_type`, where there is one.
pub fn module_for(mem_type: MemoryType) -> Option<&'static str> {
    modules_for(mem_type).first().copied()
}

/// Whether kernel module `name` is loaded, as `/sys/module/<name>` under
/// `sys` (`/sys` on a host) says.
pub fn module_loaded(sys: &Path, name: &str) -> bool {
    sys.join("module").join(name).is_dir()
}

/// The peer-memory module for `mem_type` that is loaded here, if any.
pub fn loaded_for(mem_type: MemoryType) -> Option<&'static str> {
    loaded_under(Path::new("/sys"), mem_type)
}

/// As [`loaded_for`], with `/sys` at `sys`.
pub fn loaded_under(sys: &Path, mem_type: MemoryType) -> Option<&'static str> {
    modules_for(mem_type)
        .iter()
        .copied()
        .find(|m| module_loaded(sys, m))
}

/// Errnos of `ibv_reg_dmabuf_mr` (or of the export before it) after which
/// the peer-memory path is worth trying: the NIC driver or kernel cannot
/// import the DMA-buf (EOPNOTSUPP, ENOTSUPP), or refuses this exporter's
/// buffer (EINVAL, EFAULT), as users of UCX, NIXL and libfabric saw.
pub fn falls_back_after(errno: i32) -> bool {
    matches!(
        errno,
        libc::EOPNOTSUPP | ENOTSUPP | libc::EINVAL | libc::EFAULT
    )
}

/// How a registration of device memory reached the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegPath {
    /// `ibv_reg_dmabuf_mr` of the owner's DMA-buf.
    DmaBuf,
    /// `ibv_reg_mr` of the device pointer, through a peer-memory module.
    PeerMem(&'static str),
}

impl std::fmt::Display for RegPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegPath::DmaBuf => f.write_str("DMA-buf (ibv_reg_dmabuf_mr)"),
            RegPath::PeerMem(m) => write!(f, "ibv_reg_mr of the device pointer through {m}"),
        }
    }
}

/// The registration paths a NIC offers device memory, for
/// `transport-info`: `dmabuf` is whether its driver imports DMA-bufs,
/// `peer` the peer-memory modules loaded here.
pub fn describe(dmabuf: bool, peer: &[&str]) -> String {
    let dmabuf = if dmabuf {
        "DMA-buf import (ibv_reg_dmabuf_mr)"
    } else {
        "no DMA-buf import"
    };
    if peer.is_empty() {
        format!("device memory: {dmabuf}; peer memory: none loaded (nvidia_peermem or nv_peer_mem)")
    } else {
        format!(
            "device memory: {dmabuf}; peer memory: {} loaded (ibv_reg_mr of device pointers)",
            peer.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_memory_is_served_by_nvidia_peermem_and_nothing_else_is() {
        assert_eq!(module_for(MemoryType::Cuda), Some("nvidia_peermem"));
        assert_eq!(module_for(MemoryType::Gaudi), None);
        assert_eq!(module_for(MemoryType::Host), None);
    }

    #[test]
    fn either_nvidia_peermem_or_the_older_nv_peer_mem_serves_cuda_memory() {
        let root = std::env::temp_dir().join(format!("md-ib-nvpeer-{}", std::process::id()));
        std::fs::create_dir_all(root.join("module")).unwrap();
        assert_eq!(loaded_under(&root, MemoryType::Cuda), None);
        std::fs::create_dir_all(root.join("module/nv_peer_mem")).unwrap();
        assert_eq!(loaded_under(&root, MemoryType::Cuda), Some("nv_peer_mem"));
        std::fs::create_dir_all(root.join("module/nvidia_peermem")).unwrap();
        assert_eq!(
            loaded_under(&root, MemoryType::Cuda),
            Some("nvidia_peermem")
        );
        assert_eq!(loaded_under(&root, MemoryType::Gaudi), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_module_is_loaded_when_sys_module_lists_it() {
        let root = std::env::temp_dir().join(format!("md-ib-peermem-{}", std::process::id()));
        std::fs::create_dir_all(root.join("module/nvidia_peermem")).unwrap();
        assert!(module_loaded(&root, "nvidia_peermem"));
        assert!(!module_loaded(&root, "ib_core"));
        std::fs::remove_dir_all(&root).unwrap();
        assert!(!module_loaded(&root, "nvidia_peermem"));
    }

    #[test]
    fn the_fallback_follows_the_errnos_users_hit() {
        for e in [libc::EOPNOTSUPP, ENOTSUPP, libc::EINVAL, libc::EFAULT] {
            assert!(falls_back_after(e), "{e}");
        }
        for e in [libc::ENOMEM, libc::EPERM, libc::EACCES, libc::EBADF, 0] {
            assert!(!falls_back_after(e), "{e}");
        }
    }

    #[test]
    fn the_paths_are_described_for_transport_info() {
        let both = describe(true, &["nvidia_peermem"]);
        assert!(both.contains("ibv_reg_dmabuf_mr"), "{both}");
        assert!(
            both.contains("peer memory: nvidia_peermem loaded"),
            "{both}"
        );
        let none = describe(false, &[]);
        assert!(none.contains("no DMA-buf import"), "{none}");
        assert!(
            none.contains("none loaded (nvidia_peermem or nv_peer_mem)"),
            "{none}"
        );
    }
}
