//! The host memory domain: allocates and registers CPU memory for the
//! software transports. Every region is entered in a [`RegionTable`], so
//! remote accesses are checked against its range, rights and secret.

use std::any::Any;
use std::sync::Arc;

use crate::error::{Result, UctError};
use crate::host_alloc::HostAlloc;
use crate::md::{MdAttrs, MdFlags, MemInfo, MemoryDomain, RegCost};
use crate::memory::{Access, MemBacking, MemHandle, MemRegion, MemoryType};
use crate::region_table::{RegionTable, Registration, SoftRkey};
use crate::rkey::{decode_payload, encode_payload, RemoteKey, RkeyEntry};

/// A software MD over host memory.
pub struct HostMd {
    component: String,
    name: String,
    table: Arc<RegionTable>,
}

/// State of one host region: its registration, and its allocation when the
/// MD allocated it.
struct HostBacking {
    reg: Option<Registration>,
    alloc: Option<HostAlloc>,
}

// SAFETY: the allocation pointer is owned exclusively by this backing and is
// only freed in Drop; access to the memory itself is the region's contract.
unsafe impl Send for HostBacking {}
// SAFETY: `&HostBacking` exposes only the address and length, never the
// bytes, so sharing it cannot race; the bytes follow the region's contract.
unsafe impl Sync for HostBacking {}

impl MemBacking for HostBacking {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for HostBacking {
    fn drop(&mut self) {
        // Deregister first: this waits for remote accesses in flight, so no
        // peer touches the memory after it is freed.
        drop(self.reg.take());
        drop(self.alloc.take());
    }
}

impl HostMd {
    /// A host MD named `name` for `component`, with its own region table.
    pub fn new(component: &str, name: &str) -> Arc<HostMd> {
        Arc::new(HostMd {
            component: component.into(),
            name: name.into(),
            table: RegionTable::new(),
        })
    }

    /// `md` as a host MD of `component`, or None when it is another
    /// component's MD (which a software iface cannot use: it needs this
    /// MD's region table).
    pub fn of<'md>(md: &'md Arc<dyn MemoryDomain>, component: &str) -> Option<&'md HostMd> {
        md.as_any()
            .downcast_ref::<HostMd>()
            .filter(|host| host.component == component)
    }

    /// The regions registered here; software transports check remote
    /// accesses against it.
    pub fn table(&self) -> &Arc<RegionTable> {
        &self.table
    }

    /// The key of a region registered with this MD.
    pub fn soft_key(&self, mem: &MemHandle) -> Result<SoftRkey> {
        let b = mem
            .backing()
            .as_any()
            .downcast_ref::<HostBacking>()
            .filter(|_| mem.md_name() == self.name)
            .ok_or_else(|| {
                UctError::InvalidParam(format!(
                    "memory handle belongs to memory domain {}, not {}; register it with {}",
                    mem.md_name(),
                    self.name,
                    self.name
                ))
            })?;
        b.reg
            .as_ref()
            .map(|r| *r.key())
            .ok_or_else(|| UctError::InvalidParam("region is being deregistered".into()))
    }

    /// Unpacks a key packed by a host MD of `component`.
    pub fn unpack_rkey(component: &str, entry: &RkeyEntry) -> Result<RemoteKey> {
        if entry.component != component {
            return Err(UctError::RkeyMismatch {
                expected: format!("component {component}"),
                found: format!("component {}", entry.component),
            });
        }
        let key: SoftRkey = decode_payload(&entry.payload)?;
        if key.base.checked_add(key.len).is_none() {
            return Err(UctError::BadRkey(
                "region wraps around the address space".into(),
            ));
        }
        Ok(RemoteKey::new(component, entry.md.clone(), Box::new(key)))
    }
}

impl MemoryDomain for HostMd {
    fn name(&self) -> &str {
        &self.name
    }

    fn component(&self) -> &str {
        &self.component
    }

    fn attrs(&self) -> MdAttrs {
        MdAttrs {
            flags: MdFlags::ALLOC | MdFlags::REG | MdFlags::NEED_RKEY,
            alloc_mem_types: vec![MemoryType::Host],
            reg_mem_types: vec![MemoryType::Host],
            export_mem_types: vec![],
            detect_mem_types: vec![],
            max_alloc: isize::MAX as u64,
            rkey_packed_size: 48,
            reg_cost: RegCost {
                overhead_ns: 100.0,
                per_byte_ns: 0.0,
            },
            system_device: None,
        }
    }

    fn alloc(&self, len: usize, mem_type: MemoryType, access: Access) -> Result<MemHandle> {
        if mem_type != MemoryType::Host {
            return Err(UctError::MemoryTypeUnsupported {
                mem_type,
                owner: format!("memory domain {}", self.name),
                hint: "it allocates host memory only; allocate device memory with the device's MD (gaudi0, ...)".into(),
            });
        }
        let mem = HostAlloc::new(len)?;
        let addr = mem.as_ptr() as u64;
        let reg = self.table.insert(addr, len as u64, access);
        // SAFETY: the allocation moves into the backing, which keeps it.
        Ok(unsafe {
            MemRegion::new(
                addr,
                len,
                MemoryType::Host,
                access,
                self.name.clone(),
                Box::new(HostBacking {
                    reg: Some(reg),
                    alloc: Some(mem),
                }),
            )
        })
    }

    unsafe fn register(&self, addr: *mut u8, len: usize, access: Access) -> Result<MemHandle> {
        if addr.is_null() {
            return Err(UctError::InvalidParam(
                "cannot register a null address".into(),
            ));
        }
        let reg = self.table.insert(addr as u64, len as u64, access);
        // SAFETY: forwarded contract of `register`.
        Ok(unsafe {
            MemRegion::new(
                addr as u64,
                len,
                MemoryType::Host,
                access,
                self.name.clone(),
                Box::new(HostBacking {
                    reg: Some(reg),
                    alloc: None,
                }),
            )
        })
    }

    fn query(&self, addr: u64, len: usize) -> Result<MemInfo> {
        let (base, rlen) = self
            .table
            .find_containing(addr)
            .filter(|(b, l)| addr.saturating_add(len as u64) <= b + l)
            .ok_or_else(|| {
                UctError::InvalidParam(format!(
                    "[{addr:#x}, +{len}) is not memory registered with {}",
                    self.name
                ))
            })?;
        Ok(MemInfo {
            mem_type: MemoryType::Host,
            base,
            len: rlen as usize,
            system_device: None,
            dmabuf: None,
        })
    }

    fn pack_rkey(&self, mem: &MemHandle) -> Result<RkeyEntry> {
        let key = self.soft_key(mem)?;
        Ok(RkeyEntry {
            component: self.component.clone(),
            md: self.name.clone(),
            payload: encode_payload(&key)?,
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rkey::RkeyBundle;

    #[test]
    fn alloc_pack_unpack() {
        let md = HostMd::new("self", "self");
        let mem = md.alloc(100, MemoryType::Host, Access::all()).unwrap();
        assert_eq!(mem.addr() % 4096, 0);
        mem.write(10, b"hello").unwrap();
        let mut out = [0u8; 5];
        mem.read(10, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        let bytes = RkeyBundle::single(md.pack_rkey(&mem).unwrap())
            .pack()
            .unwrap();
        let b = RkeyBundle::unpack(&bytes).unwrap();
        let rk = HostMd::unpack_rkey("self", b.find("self").unwrap()).unwrap();
        let k = rk.downcast::<SoftRkey>("self").unwrap();
        assert_eq!(k.base, mem.addr());
        assert_eq!(md.table().len(), 1);
        drop(mem);
        assert_eq!(md.table().len(), 0);
    }

    #[test]
    fn refuses_device_memory() {
        let md = HostMd::new("self", "self");
        let e = md
            .alloc(4096, MemoryType::Gaudi, Access::all())
            .unwrap_err();
        assert!(e.to_string().contains("gaudi"));
    }

    #[test]
    fn random_payloads_never_panic() {
        let mut x = 0x1234_5678_9abc_def0u64;
        for i in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = (x % 64) as usize;
            let payload: Vec<u8> = (0..n).map(|j| (x >> (j % 8 * 8)) as u8 ^ i as u8).collect();
            let e = RkeyEntry {
                component: "self".into(),
                md: "self".into(),
                payload,
            };
            let _ = HostMd::unpack_rkey("self", &e);
        }
    }
}
