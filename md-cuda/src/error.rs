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
        "{device}: the range [{addr:#x}, +{len}) cannot be page-aligned inside the address space"
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
            CudaError::Managed { .. } | CudaError::ExportUnsupported { .. } => {
                UctError::MemoryTypeUnsupported {
                    mem_type: uct_core::MemoryType::Cuda,
                    owner: "md-cuda".into(),
                    hint: e.to_string(),
                }
            }
            _ => UctError::InvalidParam(e.to_string()),
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
}
