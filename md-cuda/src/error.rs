//! md-cuda's errors: a driver that cannot be loaded, every failed driver
//! call (its `CUresult` by name, and what to do), and every rule md-cuda
//! checks itself before the driver would answer a bare INVALID_VALUE.

use uct_core::error::ErrorSource;
use uct_core::UctError;

use crate::result::{self, CuResult};

/// A failure of md-cuda or of the CUDA driver underneath it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    #[error("cannot load {path}: {reason}; install the NVIDIA driver (it provides libcuda.so.1), or set UCT_CUDA_LIB to the library's path")]
    LibraryNotLoaded { path: String, reason: String },

    #[error("{path} has no symbol {symbol}; this NVIDIA driver is older than uct-rs supports (CUDA 11.7 or later, driver 515 or later)")]
    MissingSymbol { path: String, symbol: &'static str },

    #[error("{call} failed with {}{}", result::describe(*code, name.as_deref()), hint_of(*code))]
    Driver {
        /// The call and its arguments, e.g. `cuMemAlloc_v2(4096) on cuda0`.
        call: String,
        code: CuResult,
        /// The driver's own name for the code (`cuGetErrorName`).
        name: Option<String>,
    },

    #[error(
        "the CUDA driver loaded but found no GPU; check `nvidia-smi` and CUDA_VISIBLE_DEVICES"
    )]
    NoDevices,

    #[error("{device}: an allocation or registration of 0 bytes; ask for at least one byte")]
    ZeroSize { device: String },

    #[error("{device}: [{addr:#x}, +{len}) is not memory this memory domain allocated or registered; register it first")]
    NotOwned { device: String, addr: u64, len: u64 },

    #[error("{device}: {addr:#x} is memory of GPU {ordinal} (cuda{ordinal}); register it with that memory domain")]
    OtherDevice {
        device: String,
        addr: u64,
        ordinal: i32,
    },

    #[error("{device}: {addr:#x} is memory of GPU {ordinal}, which md-cuda did not open (its reason is logged, and `transport-info -d` lists the GPUs it has); it is not registered, as host memory or otherwise")]
    UnopenedDevice {
        device: String,
        addr: u64,
        ordinal: i32,
    },

    #[error("{device}: the CUDA driver calls {addr:#x} device memory but does not say {what} it belongs to, so its length cannot be checked; register a pointer from cudaMalloc / cuMemAlloc")]
    Unattributed {
        device: String,
        addr: u64,
        what: &'static str,
    },

    #[error("{device}: [{addr:#x}, +{len}) runs past the end of its CUDA allocation [{base:#x}, +{size}); register a range inside one allocation")]
    PastAllocation {
        device: String,
        addr: u64,
        len: u64,
        base: u64,
        size: u64,
    },

    #[error("{device}: {addr:#x} is CUDA managed (unified) memory, which md-cuda does not register; allocate it with cudaMalloc / cuMemAlloc instead")]
    Managed { device: String, addr: u64 },

    #[error("{device}: this GPU cannot export DMA-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0: it needs CUDA 11.7+, the open kernel modules (nvidia-open) and a data-center GPU); load nvidia_peermem for NICs to reach it instead")]
    ExportUnsupported { device: String },

    #[error(
        "{device}: the range [{addr:#x}, +{len}) cannot be page-aligned inside the address space; pass the device pointer and length of one allocation (from cudaMalloc / cuMemAlloc)"
    )]
    BadRange { device: String, addr: u64, len: u64 },
}

fn hint_of(code: CuResult) -> String {
    match result::hint(code) {
        "" => String::new(),
        h => format!("; {h}"),
    }
}

impl CudaError {
    /// The `CUresult` of a failed driver call.
    pub fn code(&self) -> Option<CuResult> {
        match self {
            CudaError::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

impl From<CudaError> for UctError {
    fn from(e: CudaError) -> Self {
        match &e {
            CudaError::LibraryNotLoaded { .. }
            | CudaError::MissingSymbol { .. }
            | CudaError::NoDevices => UctError::NoDevice(e.to_string()),
            CudaError::Driver { code, .. } if *code == result::OUT_OF_MEMORY => {
                UctError::NoMemory(e.to_string())
            }
            CudaError::Driver { .. } => UctError::Device {
                device: "cuda".into(),
                message: e.to_string(),
                source: Some(ErrorSource::new(e)),
            },
            CudaError::UnopenedDevice { .. } => UctError::NoDevice(e.to_string()),
            // Device memory this MD knows and refuses as given: not
            // InvalidParam, which says "not mine" to memory-type detection
            // (transfer's Memory::register would take it for host memory).
            CudaError::Managed { .. }
            | CudaError::ExportUnsupported { .. }
            | CudaError::PastAllocation { .. }
            | CudaError::Unattributed { .. }
            | CudaError::BadRange { .. } => UctError::MemoryTypeUnsupported {
                mem_type: uct_core::MemoryType::Cuda,
                owner: "md-cuda".into(),
                hint: e.to_string(),
            },
            // Not this MD's memory (or a zero size): "not mine".
            CudaError::ZeroSize { .. }
            | CudaError::NotOwned { .. }
            | CudaError::OtherDevice { .. } => UctError::InvalidParam(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_driver_error_names_the_call_the_code_and_what_to_do() {
        let e = CudaError::Driver {
            call: "cuInit(0)".into(),
            code: result::NO_DEVICE,
            name: None,
        };
        let text = e.to_string();
        assert!(
            text.starts_with("cuInit(0) failed with CUDA_ERROR_NO_DEVICE (100); "),
            "{text}"
        );
        assert!(text.contains("nvidia-smi"), "{text}");
    }

    #[test]
    fn converts_into_uct_error_keeping_the_source() {
        let e = CudaError::Driver {
            call: "cuMemcpyAsync".into(),
            code: result::ILLEGAL_ADDRESS,
            name: None,
        };
        let uct: UctError = e.into();
        let cuda = uct
            .source()
            .and_then(|s| s.downcast_ref::<CudaError>())
            .expect("the CudaError is the source");
        assert_eq!(cuda.code(), Some(result::ILLEGAL_ADDRESS));
        let oom: UctError = CudaError::Driver {
            call: "cuMemAlloc_v2".into(),
            code: result::OUT_OF_MEMORY,
            name: None,
        }
        .into();
        assert!(matches!(oom, UctError::NoMemory(_)), "{oom:?}");
    }

    #[test]
    fn only_not_this_mds_memory_converts_to_invalid_param() {
        // InvalidParam is "not mine" to transfer's memory-type detection;
        // device memory this MD refuses must never read so.
        let device = || "cuda0".to_string();
        let not_mine = [
            CudaError::NotOwned {
                device: device(),
                addr: 1,
                len: 1,
            },
            CudaError::OtherDevice {
                device: device(),
                addr: 1,
                ordinal: 1,
            },
        ];
        for e in not_mine {
            assert!(matches!(UctError::from(e), UctError::InvalidParam(_)));
        }
        let refused = [
            CudaError::Managed {
                device: device(),
                addr: 1,
            },
            CudaError::PastAllocation {
                device: device(),
                addr: 1,
                len: 9,
                base: 0,
                size: 4,
            },
            CudaError::Unattributed {
                device: device(),
                addr: 1,
                what: "the allocation",
            },
            CudaError::UnopenedDevice {
                device: device(),
                addr: 1,
                ordinal: 3,
            },
            CudaError::BadRange {
                device: device(),
                addr: 1,
                len: 1,
            },
            CudaError::Driver {
                call: "cuPointerGetAttributes".into(),
                code: result::LAUNCH_FAILED,
                name: None,
            },
        ];
        for e in refused {
            let text = e.to_string();
            let uct = UctError::from(e);
            assert!(!matches!(uct, UctError::InvalidParam(_)), "{uct:?}");
            assert!(uct.to_string().contains(&text), "{uct}");
        }
    }
}
