//! The driver's status codes (`CUresult`), each with its name and what to
//! do about it. The driver names codes itself (`cuGetErrorName`); this
//! table names the common ones even when the name cannot be asked (a code
//! seen before the library loaded, or a driver too old to know it), and
//! adds the advice the driver does not give.

/// A `CUresult` value, as the driver returns it.
pub type CuResult = i32;

pub const SUCCESS: CuResult = 0;
pub const INVALID_VALUE: CuResult = 1;
pub const OUT_OF_MEMORY: CuResult = 2;
pub const NOT_INITIALIZED: CuResult = 3;
pub const DEINITIALIZED: CuResult = 4;
pub const STUB_LIBRARY: CuResult = 34;
pub const DEVICE_UNAVAILABLE: CuResult = 46;
pub const NO_DEVICE: CuResult = 100;
pub const INVALID_DEVICE: CuResult = 101;
pub const DEVICE_NOT_LICENSED: CuResult = 102;
pub const INVALID_CONTEXT: CuResult = 201;
pub const MAP_FAILED: CuResult = 205;
pub const ECC_UNCORRECTABLE: CuResult = 214;
pub const CONTEXT_ALREADY_IN_USE: CuResult = 216;
pub const OPERATING_SYSTEM: CuResult = 304;
pub const INVALID_HANDLE: CuResult = 400;
pub const ILLEGAL_STATE: CuResult = 401;
pub const NOT_FOUND: CuResult = 500;
pub const NOT_READY: CuResult = 600;
pub const ILLEGAL_ADDRESS: CuResult = 700;
pub const LAUNCH_OUT_OF_RESOURCES: CuResult = 701;
pub const PRIMARY_CONTEXT_ACTIVE: CuResult = 708;
pub const CONTEXT_IS_DESTROYED: CuResult = 709;
pub const HOST_MEMORY_ALREADY_REGISTERED: CuResult = 712;
pub const HOST_MEMORY_NOT_REGISTERED: CuResult = 713;
pub const LAUNCH_FAILED: CuResult = 719;
pub const NOT_PERMITTED: CuResult = 800;
pub const NOT_SUPPORTED: CuResult = 801;
pub const SYSTEM_NOT_READY: CuResult = 802;
pub const SYSTEM_DRIVER_MISMATCH: CuResult = 803;
pub const COMPAT_NOT_SUPPORTED_ON_DEVICE: CuResult = 804;
pub const UNKNOWN: CuResult = 999;

/// (code, name, what to do).
const TABLE: &[(CuResult, &str, &str)] = &[
    (SUCCESS, "CUDA_SUCCESS", ""),
    (INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "an argument is outside what the driver accepts (a null or foreign pointer, a size of 0, a range that is not page-aligned or runs past its allocation)"),
    (OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "the GPU (or pinned host memory) is exhausted; free memory, allocate less, or check `nvidia-smi` for other processes holding it"),
    (NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "cuInit has not succeeded in this process; an earlier cuInit failure says why"),
    (DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "the driver is shutting down (the process is exiting); nothing more can be done with the GPU"),
    (STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "the libcuda.so.1 loaded is the CUDA toolkit's stub, not the driver's; install the NVIDIA driver, or point UCT_CUDA_LIB at the driver's libcuda.so.1"),
    (DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE", "the GPU is busy or unavailable (compute mode exclusive, or held by another process); check `nvidia-smi -q -d COMPUTE`"),
    (NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "the driver is installed but sees no GPU; check `nvidia-smi`, CUDA_VISIBLE_DEVICES, and that the nvidia kernel modules are loaded"),
    (INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "no GPU has that ordinal; `transport-info -d` lists cuda0, cuda1, ..."),
    (DEVICE_NOT_LICENSED, "CUDA_ERROR_DEVICE_NOT_LICENSED", "the GPU needs a license (vGPU) that this host does not have"),
    (INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "no usable context is current on this thread; a context destroyed by other code in this process would do this"),
    (MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "the driver could not map the memory; check the locked-memory limit (ulimit -l) and free host memory"),
    (ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE", "the GPU reported an uncorrectable ECC error; the GPU needs a reset (`nvidia-smi -r`) or service"),
    (CONTEXT_ALREADY_IN_USE, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "the context is current on another thread and the GPU is in an exclusive compute mode"),
    (OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "a system call the driver made failed; the kernel log (dmesg) says which"),
    (INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "a stream, event or context handle is not (or no longer) valid"),
    (ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the driver refused the call in its current state"),
    (NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "the driver does not know the name or symbol asked for"),
    (NOT_READY, "CUDA_ERROR_NOT_READY", "the work is still running (not an error when polling)"),
    (ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "a copy or kernel touched an address outside its allocation; the context is now unusable and the process must restart"),
    (LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "the GPU lacks the resources for the launch"),
    (PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "the primary context is already active with other flags"),
    (CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "the context was destroyed (by other code in this process, or cudaDeviceReset)"),
    (HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "the host range is already pinned (by this process's other code); it is used as it is"),
    (HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "the host range was not pinned, or was unpinned by other code"),
    (LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "earlier work on the GPU failed; the context is unusable and the process must restart"),
    (NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "the driver does not permit this here (a container without the needed capabilities, or an MPS client)"),
    (NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "the driver or GPU does not support this (DMA-buf export needs CUDA 11.7+, a data-center GPU and the open kernel modules, nvidia-open)"),
    (SYSTEM_NOT_READY, "CUDA_ERROR_SYSTEM_NOT_READY", "the system is not ready: on NVSwitch systems start nvidia-fabricmanager; check `nvidia-smi -q`"),
    (SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "libcuda.so.1 and the nvidia kernel module are of different versions; reinstall the driver, or reboot after an upgrade"),
    (COMPAT_NOT_SUPPORTED_ON_DEVICE, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "the forward-compatibility libcuda in use does not support this GPU; use the driver's own libcuda.so.1"),
    (UNKNOWN, "CUDA_ERROR_UNKNOWN", "the driver failed without saying why; the kernel log (dmesg, Xid lines) may"),
];

/// The name of a code this table knows.
pub fn name(code: CuResult) -> Option<&'static str> {
    TABLE
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, n, _)| *n)
}

/// What to do about a code; empty where there is nothing to add.
pub fn hint(code: CuResult) -> &'static str {
    TABLE
        .iter()
        .find(|(c, _, _)| *c == code)
        .map_or("", |(_, _, h)| *h)
}

/// A code as text: `CUDA_ERROR_NO_DEVICE (100)`; the driver's own name
/// (`driver_name`) where the table lacks it, else `CUresult 123`.
pub fn describe(code: CuResult, driver_name: Option<&str>) -> String {
    match name(code).or(driver_name) {
        Some(n) => format!("{n} ({code})"),
        None => format!("CUresult {code}"),
    }
}

/// Whether `code` leaves the context unusable (a "sticky" error): once the
/// driver reports one, no work of that context runs any more, so memory a
/// failed copy touched can be let go. Any other failure of a query (the
/// context could not be entered, the driver is busy) says nothing about the
/// copy, which may still be running.
pub fn is_sticky(code: CuResult) -> bool {
    matches!(
        code,
        ECC_UNCORRECTABLE
            | ILLEGAL_ADDRESS
            | 702 // LAUNCH_TIMEOUT
            | CONTEXT_IS_DESTROYED
            | 710 // ASSERT
            | 714
            ..=718 // HARDWARE_STACK_ERROR .. INVALID_PC
            | LAUNCH_FAILED
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_in_the_table_has_a_distinct_name_and_advice() {
        for (i, (code, n, h)) in TABLE.iter().enumerate() {
            assert!(n.starts_with("CUDA_"), "{n}");
            assert!(*code == SUCCESS || !h.is_empty(), "{n} has no advice");
            assert!(
                TABLE[i + 1..].iter().all(|(c, m, _)| c != code && m != n),
                "{n} ({code}) appears twice"
            );
        }
    }

    #[test]
    fn common_codes_are_named_with_their_numbers() {
        assert_eq!(describe(NO_DEVICE, None), "CUDA_ERROR_NO_DEVICE (100)");
        assert_eq!(describe(NOT_READY, None), "CUDA_ERROR_NOT_READY (600)");
        assert_eq!(
            describe(ILLEGAL_ADDRESS, Some("ignored")),
            "CUDA_ERROR_ILLEGAL_ADDRESS (700)"
        );
        assert!(hint(STUB_LIBRARY).contains("UCT_CUDA_LIB"));
        assert!(hint(NOT_SUPPORTED).contains("DMA-buf"));
    }

    #[test]
    fn unknown_codes_take_the_drivers_name_or_their_number() {
        assert_eq!(
            describe(905, Some("CUDA_ERROR_STREAM_CAPTURE_UNJOINED")),
            "CUDA_ERROR_STREAM_CAPTURE_UNJOINED (905)"
        );
        assert_eq!(describe(12345, None), "CUresult 12345");
        assert_eq!(hint(12345), "");
    }

    #[test]
    fn only_errors_that_end_the_context_are_sticky() {
        for code in [ILLEGAL_ADDRESS, LAUNCH_FAILED, ECC_UNCORRECTABLE, 716] {
            assert!(is_sticky(code), "{code}");
        }
        for code in [
            NOT_READY,
            INVALID_CONTEXT,
            NOT_INITIALIZED,
            INVALID_VALUE,
            UNKNOWN,
        ] {
            assert!(!is_sticky(code), "{code}");
        }
    }
}
