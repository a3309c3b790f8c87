//! The posix memory domain: allocates memory as named shared-memory
//! segments, whose names travel in the rkey so that peers can map them.

use std::any::Any;
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
use crate::segment::{self, Mapping, View};

/// The memory domain's name.
pub const MD_NAME: &str = "posix";

/// What a posix rkey carries. It begins with a [`SoftRkey`], as every
/// software transport's rkey does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PosixRkey {
    /// Region id, secret, the owner's range and rights.
    pub soft: SoftRkey,
    /// Name of the segment to map.
    pub segment: String,
    /// The segment and its fixed header fields, once an endpoint has mapped
    /// it: later accesses through this key only check that it is alive.
    #[serde(skip)]
    pub(crate) mapping: OnceLock<(Arc<Mapping>, View)>,
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
    /// The posix MD of component `component`; removes the segments that
    /// dead processes left behind first.
    pub fn new(component: &'static str) -> Self {
        segment::remove_stale();
        PosixMd { component }
    }
}

/// An allocated segment: marked dead and unlinked when dropped.
struct PosixBacking {
    map: Mapping,
    name: String,
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
        segment::unlink(&self.name);
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
            max_alloc: 1 << 40,
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
        let name = format!(
            "/uct-posix-{}-{:016x}{:016x}",
            std::process::id(),
            crate::host::random_u64(),
            crate::host::random_u64()
        );
        let secret = crate::host::random_u64();
        let map = Mapping::create(&name, len, secret, access)?;
        let addr = map.data_ptr() as u64;
        let key = new_soft_key(secret, addr, len, access);
        // SAFETY: `map` is a live mapping of `len` data bytes at `addr`,
        // owned by the backing, so it stays mapped until the region drops.
        Ok(unsafe {
            MemRegion::new(
                addr,
                len,
                MemoryType::Host,
                access,
                MD_NAME,
                Box::new(PosixBacking { map, name, key }),
            )
        })
    }

    fn pack_rkey(&self, mem: &MemHandle) -> Result<RkeyEntry> {
        let backing = backing_of::<PosixBacking>(mem, MD_NAME, "allocate")?;
        Ok(RkeyEntry {
            component: self.component.into(),
            md: MD_NAME.into(),
            payload: encode_payload(&PosixRkey {
                soft: backing.key,
                segment: backing.name.clone(),
                mapping: OnceLock::new(),
            })?,
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
