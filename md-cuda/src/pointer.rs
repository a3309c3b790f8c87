//! What an address is, as the driver sees it (`cuPointerGetAttributes`):
//! not CUDA memory at all, pinned host memory, device memory of one GPU,
//! or managed memory. The decoding is here, apart from the driver, so that
//! every answer (including a host pointer's) is tested on any host.

use std::ffi::c_int;

use crate::error::CudaError;
use crate::result::{self, CuResult};

/// CU_POINTER_ATTRIBUTE_MEMORY_TYPE (a CUmemorytype, unsigned int).
pub const ATTR_MEMORY_TYPE: c_int = 2;
/// CU_POINTER_ATTRIBUTE_IS_MANAGED (a bool).
pub const ATTR_IS_MANAGED: c_int = 8;
/// CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL (an int).
pub const ATTR_DEVICE_ORDINAL: c_int = 9;
/// CU_POINTER_ATTRIBUTE_RANGE_START_ADDR (a CUdeviceptr).
pub const ATTR_RANGE_START_ADDR: c_int = 11;
/// CU_POINTER_ATTRIBUTE_RANGE_SIZE (a size_t).
pub const ATTR_RANGE_SIZE: c_int = 12;

/// The attributes asked, in the order [`decode`] reads them.
pub const ATTRS: [c_int; 5] = [
    ATTR_MEMORY_TYPE,
    ATTR_IS_MANAGED,
    ATTR_DEVICE_ORDINAL,
    ATTR_RANGE_START_ADDR,
    ATTR_RANGE_SIZE,
];

/// CUmemorytype values.
pub const MEMORYTYPE_HOST: u32 = 1;
pub const MEMORYTYPE_DEVICE: u32 = 2;
pub const MEMORYTYPE_ARRAY: u32 = 3;
pub const MEMORYTYPE_UNIFIED: u32 = 4;

/// What kind of memory an address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointerKind {
    /// The driver does not know it: ordinary host memory.
    NotCuda,
    /// Host memory the driver pinned (cuMemHostAlloc, cuMemHostRegister).
    PinnedHost,
    /// Device memory of one GPU.
    Device,
    /// Managed (unified) memory.
    Managed,
}

/// The driver's answer about one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerInfo {
    pub kind: PointerKind,
    /// The GPU it belongs to, for device memory.
    pub ordinal: Option<i32>,
    /// The allocation it lies in, `(start, size)`, where the driver says.
    pub range: Option<(u64, u64)>,
}

impl PointerInfo {
    const NOT_CUDA: PointerInfo = PointerInfo {
        kind: PointerKind::NotCuda,
        ordinal: None,
        range: None,
    };
}

fn u32_of(slot: &[u8; 8]) -> u32 {
    u32::from_ne_bytes([slot[0], slot[1], slot[2], slot[3]])
}

/// Decodes `cuPointerGetAttributes(ATTRS)`: its status and the slots.
/// A host pointer is answered with CUDA_ERROR_INVALID_VALUE by older
/// drivers and with memory type 0 by newer ones; CUDA_ERROR_INVALID_CONTEXT
/// comes where the process has no context at all, and so no device
/// memory (every allocation lives in a context): all three mean "not CUDA
/// memory". Any other failure is the driver's (`Err` with the code), and
/// says nothing about the address.
pub fn decode(status: CuResult, slots: &[[u8; 8]; 5]) -> Result<PointerInfo, CuResult> {
    match status {
        result::SUCCESS => {}
        result::INVALID_VALUE | result::INVALID_CONTEXT => return Ok(PointerInfo::NOT_CUDA),
        other => return Err(other),
    }
    let memory_type = u32_of(&slots[0]);
    let managed = slots[1][0] != 0;
    let ordinal = u32_of(&slots[2]) as i32;
    let start = u64::from_ne_bytes(slots[3]);
    let size = u64::from_ne_bytes(slots[4]);
    let range = (size > 0).then_some((start, size));
    let kind = match memory_type {
        _ if managed => PointerKind::Managed,
        MEMORYTYPE_UNIFIED => PointerKind::Managed,
        MEMORYTYPE_DEVICE => PointerKind::Device,
        MEMORYTYPE_HOST => PointerKind::PinnedHost,
        // 0 (unknown to the driver), arrays (not addressable memory).
        _ => return Ok(PointerInfo::NOT_CUDA),
    };
    Ok(PointerInfo {
        kind,
        ordinal: (kind == PointerKind::Device && ordinal >= 0).then_some(ordinal),
        range,
    })
}

/// Whose memory an address is, from one GPU's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Host memory (pinned or not): no GPU's.
    Host,
    /// Device memory of this GPU, and the range lies inside one allocation.
    This,
}

/// What GPU `me` (named `device`) makes of `info` for `[addr, +len)`,
/// where `opened` are the ordinals md-cuda has an MD for. Device memory
/// is this GPU's only inside an allocation whose range the driver gave;
/// another opened GPU's memory is [`CudaError::OtherDevice`] (that GPU's
/// MD claims it); managed memory, memory of a GPU md-cuda did not open,
/// and device memory the driver cannot place are refused, by name.
pub fn owner(
    info: &PointerInfo,
    addr: u64,
    len: u64,
    device: &str,
    me: i32,
    opened: &[i32],
) -> Result<Owner, CudaError> {
    let device = || device.to_string();
    match info.kind {
        PointerKind::NotCuda | PointerKind::PinnedHost => return Ok(Owner::Host),
        PointerKind::Managed => {
            return Err(CudaError::Managed {
                device: device(),
                addr,
            })
        }
        PointerKind::Device => {}
    }
    let ordinal = info.ordinal.ok_or_else(|| CudaError::Unattributed {
        device: device(),
        addr,
        what: "the GPU",
    })?;
    if ordinal != me {
        return Err(if opened.contains(&ordinal) {
            CudaError::OtherDevice {
                device: device(),
                addr,
                ordinal,
            }
        } else {
            CudaError::UnopenedDevice {
                device: device(),
                addr,
                ordinal,
            }
        });
    }
    let (base, size) = info.range.ok_or_else(|| CudaError::Unattributed {
        device: device(),
        addr,
        what: "the allocation",
    })?;
    let inside = addr >= base
        && addr
            .checked_add(len)
            .is_some_and(|end| end <= base.saturating_add(size));
    if !inside {
        return Err(CudaError::PastAllocation {
            device: device(),
            addr,
            len,
            base,
            size,
        });
    }
    Ok(Owner::This)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(memory_type: u32, managed: bool, ordinal: i32, start: u64, size: u64) -> [[u8; 8]; 5] {
        let mut s = [[0u8; 8]; 5];
        s[0][..4].copy_from_slice(&memory_type.to_ne_bytes());
        s[1][0] = managed as u8;
        s[2][..4].copy_from_slice(&ordinal.to_ne_bytes());
        s[3] = start.to_ne_bytes();
        s[4] = size.to_ne_bytes();
        s
    }

    #[test]
    fn host_pointers_are_not_cuda_memory_whichever_way_the_driver_says_so() {
        let none = [[0u8; 8]; 5];
        assert_eq!(
            decode(result::INVALID_VALUE, &none).unwrap().kind,
            PointerKind::NotCuda
        );
        assert_eq!(
            decode(result::SUCCESS, &none).unwrap().kind,
            PointerKind::NotCuda
        );
        let array = slots(MEMORYTYPE_ARRAY, false, 0, 0, 0);
        assert_eq!(
            decode(result::SUCCESS, &array).unwrap().kind,
            PointerKind::NotCuda
        );
    }

    #[test]
    fn device_memory_carries_its_gpu_and_allocation() {
        let s = slots(MEMORYTYPE_DEVICE, false, 1, 0x7f00_0020_0000, 1 << 28);
        let info = decode(result::SUCCESS, &s).unwrap();
        assert_eq!(info.kind, PointerKind::Device);
        assert_eq!(info.ordinal, Some(1));
        assert_eq!(info.range, Some((0x7f00_0020_0000, 1 << 28)));
    }

    #[test]
    fn pinned_and_managed_memory_are_told_apart() {
        let pinned = decode(
            result::SUCCESS,
            &slots(MEMORYTYPE_HOST, false, -1, 0x1000, 4096),
        );
        assert_eq!(pinned.unwrap().kind, PointerKind::PinnedHost);
        assert_eq!(pinned.unwrap().ordinal, None);
        let unified = decode(result::SUCCESS, &slots(MEMORYTYPE_UNIFIED, false, 0, 0, 0));
        assert_eq!(unified.unwrap().kind, PointerKind::Managed);
        // Managed memory may report DEVICE with the managed flag set.
        let flagged = decode(result::SUCCESS, &slots(MEMORYTYPE_DEVICE, true, 0, 0, 0));
        assert_eq!(flagged.unwrap().kind, PointerKind::Managed);
    }

    #[test]
    fn no_context_in_the_process_means_no_device_memory() {
        let none = [[0u8; 8]; 5];
        assert_eq!(
            decode(result::INVALID_CONTEXT, &none).unwrap().kind,
            PointerKind::NotCuda
        );
    }

    #[test]
    fn other_failures_are_the_drivers() {
        let none = [[0u8; 8]; 5];
        for code in [
            result::LAUNCH_FAILED,
            result::ILLEGAL_ADDRESS,
            result::UNKNOWN,
        ] {
            assert_eq!(decode(code, &none), Err(code));
        }
        assert_eq!(
            decode(result::NOT_INITIALIZED, &none),
            Err(result::NOT_INITIALIZED)
        );
        assert_eq!(
            decode(result::DEINITIALIZED, &none),
            Err(result::DEINITIALIZED)
        );
    }

    const BASE: u64 = 0x7f00_0020_0000;

    fn device(ordinal: Option<i32>, range: Option<(u64, u64)>) -> PointerInfo {
        PointerInfo {
            kind: PointerKind::Device,
            ordinal,
            range,
        }
    }

    fn own(info: &PointerInfo, addr: u64, len: u64) -> Result<Owner, CudaError> {
        owner(info, addr, len, "cuda0", 0, &[0, 1])
    }

    #[test]
    fn host_memory_is_no_gpus_and_this_gpus_memory_is_its_own() {
        for kind in [PointerKind::NotCuda, PointerKind::PinnedHost] {
            let info = PointerInfo {
                kind,
                ..PointerInfo::NOT_CUDA
            };
            assert_eq!(own(&info, 0x1000, 4096).unwrap(), Owner::Host);
        }
        let info = device(Some(0), Some((BASE, 1 << 20)));
        assert_eq!(own(&info, BASE, 1 << 20).unwrap(), Owner::This);
        assert_eq!(own(&info, BASE + 4096, 4096).unwrap(), Owner::This);
    }

    #[test]
    fn a_range_past_its_allocation_or_with_no_known_allocation_is_refused() {
        let info = device(Some(0), Some((BASE, 1 << 20)));
        let past = own(&info, BASE + 4096, 1 << 20).unwrap_err();
        assert!(matches!(past, CudaError::PastAllocation { .. }), "{past:?}");
        let wraps = own(&info, BASE, u64::MAX).unwrap_err();
        assert!(
            matches!(wraps, CudaError::PastAllocation { .. }),
            "{wraps:?}"
        );
        let unknown = own(&device(Some(0), None), BASE, 1).unwrap_err();
        assert!(
            matches!(
                unknown,
                CudaError::Unattributed {
                    what: "the allocation",
                    ..
                }
            ),
            "{unknown:?}"
        );
        let nobody = own(&device(None, Some((BASE, 4096))), BASE, 1).unwrap_err();
        assert!(
            matches!(
                nobody,
                CudaError::Unattributed {
                    what: "the GPU",
                    ..
                }
            ),
            "{nobody:?}"
        );
    }

    #[test]
    fn another_gpus_memory_is_its_md_s_and_an_unopened_gpus_is_refused() {
        let theirs = device(Some(1), Some((BASE, 4096)));
        let e = own(&theirs, BASE, 4096).unwrap_err();
        assert!(
            matches!(e, CudaError::OtherDevice { ordinal: 1, .. }),
            "{e:?}"
        );
        let unopened = device(Some(2), Some((BASE, 4096)));
        let e = own(&unopened, BASE, 4096).unwrap_err();
        assert!(
            matches!(e, CudaError::UnopenedDevice { ordinal: 2, .. }),
            "{e:?}"
        );
    }

    #[test]
    fn managed_memory_is_refused_by_name() {
        let managed = PointerInfo {
            kind: PointerKind::Managed,
            ordinal: None,
            range: Some((BASE, 4096)),
        };
        let e = own(&managed, BASE, 4096).unwrap_err();
        assert!(matches!(e, CudaError::Managed { .. }), "{e:?}");
        assert!(e.to_string().contains("managed"), "{e}");
    }
}
