//! The posix memory domain: allocates memory as sealed memfd segments
//! ([`crate::segment`]), which peers open through the owner's pid and
//! descriptor number in the rkey.

use std::any::Any;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use uct_core::md::{MdAttrs, MdFlags, RegCost};
use uct_core::memory::MemBacking;
use uct_core::region_table::SoftRkey;
use uct_core::rkey::encode_payload;
use uct_core::{
    Access, MemHandle, MemRegion, MemoryDomain, MemoryType, Result, RkeyEntry, UctError,
};

use crate::rkey::{backing_of, new_soft_key, SmRkey};
use crate::segment::{Mapping, Peers, View};

/// The memory domain's name.
pub const MD_NAME: &str = "posix";

/// What a posix rkey carries. It begins with a [`SoftRkey`], as every
/// software transport's rkey does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PosixRkey {
    /// Region id, secret, the owner's range and rights.
    pub soft: SoftRkey,
    /// The owner's pid.
    pub pid: u32,
    /// The owner's descriptor of the segment: peers open
    /// `/proc/<pid>/fd/<fd>`. Descriptor numbers are reused, so the region
    /// id (in the segment's header too) tells this segment from a later one.
    pub fd: u32,
    /// The segment and its fixed header fields, once an endpoint has mapped
    /// it: later accesses through this key only check that it is alive.
    #[serde(skip)]
    pub(crate) mapping: OnceLock<(Arc<Mapping>, View)>,
    /// Set once an endpoint found the region freed: a freed region never
    /// comes back (its descriptor was closed; a later segment there has
    /// another random id), so later uses fail at once instead of opening
    /// the file again.
    #[serde(skip)]
    pub(crate) freed: OnceLock<()>,
}

impl SmRkey for PosixRkey {
    fn soft(&self) -> &SoftRkey {
        &self.soft
    }
}

/// The posix memory domain: allocates shared-memory segments.
pub struct PosixMd {
    component: &'static str,
}

impl PosixMd {
    /// The posix MD of component `component`. (Its segments are memfds,
    /// which vanish with their last user: nothing is left to clean up.)
    pub fn new(component: &'static str) -> Self {
        PosixMd { component }
    }
}

/// An allocated segment: marked dead when dropped, then unmapped and its
/// descriptor closed. Memory no peer may reach has no descriptor: it is
/// private anonymous memory, which no process can open through `/proc`.
struct PosixBacking {
    map: Mapping,
    fd: Option<OwnedFd>,
    key: SoftRkey,
}

impl MemBacking for PosixBacking {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for PosixBacking {
    fn drop(&mut self) {
        // Peers that still map it see it dead before it goes away.
        self.map.mark_dead();
    }
}

impl MemoryDomain for PosixMd {
    fn name(&self) -> &str {
        MD_NAME
    }

    fn component(&self) -> &str {
        self.component
    }

    fn attrs(&self) -> MdAttrs {
        MdAttrs {
            flags: MdFlags::ALLOC | MdFlags::NEED_RKEY,
            alloc_mem_types: vec![MemoryType::Host],
            reg_mem_types: vec![],
            export_mem_types: vec![],
            detect_mem_types: vec![],
            max_alloc: crate::segment::MAX_PEER_DATA as u64,
            rkey_packed_size: 96,
            reg_cost: RegCost {
                overhead_ns: 20_000.0,
                per_byte_ns: 0.0,
            },
            system_device: None,
        }
    }

    fn alloc(&self, len: usize, mem_type: MemoryType, access: Access) -> Result<MemHandle> {
        if mem_type != MemoryType::Host {
            return Err(UctError::MemoryTypeUnsupported {
                mem_type,
                owner: "memory domain posix".into(),
                hint: "it allocates host shared memory only; device memory needs an RDMA NIC with DMA-buf support".into(),
            });
        }
        let secret = crate::host::random_u64();
        let key = new_soft_key(secret, 0, len, access);
        let remote = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        let (map, fd) = if access.intersects(remote) {
            let (map, fd) = Mapping::create(
                "uct-posix",
                len,
                (secret, key.region_id),
                access,
                Peers::for_access(access),
            )?;
            (map, Some(fd))
        } else {
            (Mapping::anonymous(len, secret, access)?, None)
        };
        let addr = map.data_ptr() as u64;
        let key = SoftRkey { base: addr, ..key };
        // SAFETY: `map` is a live mapping of `len` data bytes at `addr`,
        // owned by the backing, so it stays mapped until the region drops.
        Ok(unsafe {
            MemRegion::new(
                addr,
                len,
                MemoryType::Host,
                access,
                MD_NAME,
                Box::new(PosixBacking { map, fd, key }),
            )
        })
    }

    fn pack_rkey(&self, mem: &MemHandle) -> Result<RkeyEntry> {
        let backing = backing_of::<PosixBacking>(mem, MD_NAME, "allocate")?;
        let Some(fd) = &backing.fd else {
            return Err(UctError::InvalidParam(format!(
                "posix: this memory was allocated with {} and no remote right, so no peer may \
                 reach it and it has no rkey; allocate it with REMOTE_READ, REMOTE_WRITE or \
                 REMOTE_ATOMIC to share it",
                backing.key.access
            )));
        };
        Ok(RkeyEntry {
            component: self.component.into(),
            md: MD_NAME.into(),
            payload: encode_payload(&PosixRkey {
                soft: backing.key,
                pid: std::process::id(),
                fd: fd.as_raw_fd() as u32,
                mapping: OnceLock::new(),
                freed: OnceLock::new(),
            })?,
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
