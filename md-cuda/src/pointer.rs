//! What an address is, as the driver sees it (`cuPointerGetAttributes`):
//! not CUDA memory at all, pinned host memory, device memory of one GPU,
//! or managed memory. The decoding is here, apart from the driver, so that
//! every answer (including a host pointer's) is tested on any host.

use std::ffi::c_int;

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
/// drivers and with memory type 0 by newer ones: both mean "not CUDA
/// memory". Any other failure is the driver's (`Err` with the code).
pub fn decode(status: CuResult, slots: &[[u8; 8]; 5]) -> Result<PointerInfo, CuResult> {
    match status {
        result::SUCCESS => {}
        result::INVALID_VALUE => return Ok(PointerInfo::NOT_CUDA),
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
    fn other_failures_are_the_drivers() {
        let none = [[0u8; 8]; 5];
        assert_eq!(
            decode(result::NOT_INITIALIZED, &none),
            Err(result::NOT_INITIALIZED)
        );
        assert_eq!(
            decode(result::DEINITIALIZED, &none),
            Err(result::DEINITIALIZED)
        );
    }
}
