//! md-gaudi's errors: every hl-thunk failure, and every driver rule a call
//! would break, has its own variant that says what to do.

use std::io;

use uct_core::UctError;

/// A failure of md-gaudi or of hl-thunk underneath it.
#[derive(Debug, thiserror::Error)]
pub enum GaudiError {
    #[error("cannot load {path}: {reason}; install the Habana driver stack (libhl-thunk.so) or set UCT_GAUDI_HLTHUNK_LIB to the library's path")]
    LibraryNotLoaded { path: String, reason: String },

    #[error("{path} has no symbol {symbol}; it is not an hl-thunk this build supports (use hl-thunk 1.x or later)")]
    MissingSymbol { path: String, symbol: &'static str },

    #[error("hl-thunk found no Gaudi device; check that the habanalabs driver is loaded (/dev/accel/accel*) and that `hl-smi` lists the cards")]
    NoDevices,

    #[error("hlthunk_open({target}) failed: {err}; the device may be open in another process (EBUSY) or its driver not loaded (ENODEV)")]
    OpenFailed { target: String, err: io::Error },

    #[error("{device}: {call} failed: {err}")]
    Driver {
        device: String,
        call: &'static str,
        err: io::Error,
    },

    #[error("{device}: an allocation of 0 bytes was asked for; allocate at least one byte")]
    ZeroSize { device: String },

    #[error(
        "{device}: page size {page_size} is not a power of two; pass 0 for the driver's default"
    )]
    BadPageSize { device: String, page_size: u64 },

    #[error("{device}: cannot allocate {requested} bytes: the device has {dram_size} bytes of DRAM and {in_use} in use; free memory or allocate less")]
    DramExhausted {
        device: String,
        requested: u64,
        dram_size: u64,
        in_use: u64,
    },

    #[error("{device}: DMA-buf export flags must be exactly O_RDWR|O_CLOEXEC ({expected:#x}), got {flags:#x} (hl-thunk refuses any other with EINVAL)")]
    ExportFlags {
        device: String,
        flags: u32,
        expected: u32,
    },

    #[error("{device}: DMA-buf export {what} {value:#x} is not a multiple of the page size ({page}); align it")]
    ExportMisaligned {
        device: String,
        what: &'static str,
        value: u64,
        page: u64,
    },

    #[error("{device}: DMA-buf export of {size} bytes at offset {offset} runs past the end of the {mapping_len}-byte mapping; export a range inside it")]
    ExportOutOfBounds {
        device: String,
        offset: u64,
        size: u64,
        mapping_len: u64,
    },

    #[error("{device}: {addr:#x} is not a live mapping of this device; use an address this device's map returned and has not unmapped")]
    NotMapped { device: String, addr: u64 },

    #[error("{device}: DMA-buf export of 0 bytes; export at least one page")]
    ExportEmpty { device: String },

    #[error("{device}: {addr:#x} cannot be unmapped while a DMA-buf exported from it is open (the driver refuses with EINVAL); close every fd of the DMA-buf and deregister every NIC registration of it first")]
    StillExported { device: String, addr: u64 },

    #[error("{device}: handle {handle:#x} is not a live allocation of this device; use a handle this device's alloc returned and has not freed")]
    NoSuchHandle { device: String, handle: u64 },

    #[error("{device}: handle {handle:#x} is still mapped; unmap it before freeing")]
    StillMapped { device: String, handle: u64 },

    #[error("{device}: [{addr:#x}, +{len}) is not inside memory this MD allocated")]
    NotOwned { device: String, addr: u64, len: u64 },
}

pub type Result<T, E = GaudiError> = std::result::Result<T, E>;

impl From<GaudiError> for UctError {
    fn from(e: GaudiError) -> Self {
        match e {
            GaudiError::LibraryNotLoaded { .. }
            | GaudiError::MissingSymbol { .. }
            | GaudiError::NoDevices
            | GaudiError::OpenFailed { .. } => UctError::NoDevice(e.to_string()),
            GaudiError::DramExhausted { .. } => UctError::NoMemory(e.to_string()),
            GaudiError::ZeroSize { .. }
            | GaudiError::BadPageSize { .. }
            | GaudiError::ExportFlags { .. }
            | GaudiError::ExportMisaligned { .. }
            | GaudiError::ExportOutOfBounds { .. }
            | GaudiError::ExportEmpty { .. }
            | GaudiError::StillExported { .. }
            | GaudiError::NotMapped { .. }
            | GaudiError::NoSuchHandle { .. }
            | GaudiError::StillMapped { .. }
            | GaudiError::NotOwned { .. } => UctError::InvalidParam(e.to_string()),
            GaudiError::Driver { device, call, err } => UctError::Device {
                device,
                message: format!("{call} failed: {err}"),
                source: Some(err.into()),
            },
        }
    }
}
