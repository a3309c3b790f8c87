//! CUDA memory domain of uct-rs over the CUDA driver API, loaded at run
//! time with libloading: nothing links libcuda, so everything builds and
//! runs without the NVIDIA driver, and says why CUDA is absent.
//!
//! One MD per GPU (`cuda0`, `cuda1`, ...): model, memory size, PCI bus id
//! and DMA-buf export support; device allocation (`cuMemAlloc`), pinned
//! host allocation and registration (`cuMemHostRegister`), registration of
//! device pointers the application already has, DMA-buf export of the
//! page-aligned range around a buffer with its offset
//! (`cuMemGetHandleForAddressRange`, answered by `query`, which is what
//! md-ib registers), and memory-type detection of any pointer
//! (`cuPointerGetAttributes`). Every `CUresult` is named, with what to do.
//!
//! The component that carries these MDs, with the cuda_copy transport, is
//! the loadable module `libuct_cuda.so` (crate tl-cuda).
//!
//! Files: `driver.rs` (the bindings), `result.rs` (CUresult names),
//! `error.rs`, `device.rs` (a GPU and its primary context), `md.rs`,
//! `backing.rs` (what a handle holds), `export.rs` (the export range),
//! `pointer.rs` (pointer attributes), `stream.rs` (streams and events).

pub mod backing;
pub mod device;
pub mod driver;
pub mod error;
pub mod export;
pub mod md;
pub mod pointer;
pub mod result;
pub mod stream;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use uct_core::config::{Config, ConfigKind, ConfigVar};
use uct_core::region_table::RegionTable;

pub use backing::{CudaBacking, Shared};
pub use device::Device;
pub use driver::Driver;
pub use error::CudaError;
pub use md::CudaMd;
pub use stream::{Event, Stream};

/// The component's name (and so its variables' prefix, `UCT_CUDA_`).
pub const COMPONENT: &str = "cuda";

/// md-cuda's configuration.
pub const CUDA_CONFIG: &[ConfigVar] = &[
    ConfigVar {
        name: "UCT_CUDA_LIB",
        default: driver::DEFAULT_LIB,
        kind: ConfigKind::String,
        doc: "The CUDA driver library md-cuda loads at run time: a file name searched by the dynamic loader, or a path. Nothing links it; without it the cuda memory domains are listed as not available, with the loader's reason.",
    },
    ConfigVar {
        name: "UCT_CUDA_DMABUF_PCIE",
        default: "n",
        kind: ConfigKind::Bool,
        doc: "Export DMA-bufs of CUDA memory with CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE first (then without it, if the driver refuses): for systems where the NIC must reach the GPU over PCIe rather than a C2C link.",
    },
];

/// The library and export setting from `UCT_CUDA_*`.
pub fn configured() -> (PathBuf, bool) {
    let (cfg, errors) = Config::from_env_lenient(&[(COMPONENT, CUDA_CONFIG)]);
    for e in errors {
        log::error!("{e}; using its default");
    }
    let lib = PathBuf::from(cfg.get_str("UCT_CUDA_LIB").unwrap_or(driver::DEFAULT_LIB));
    let pcie = cfg.get_bool("UCT_CUDA_DMABUF_PCIE").unwrap_or(false);
    (lib, pcie)
}

/// Loads the driver at `path`, initialises it and opens every GPU, in
/// ordinal order: one MD each, sharing one region table.
pub fn open_devices(path: &Path, dmabuf_pcie: bool) -> Result<Vec<Arc<CudaMd>>, CudaError> {
    let drv = Arc::new(Driver::load(path)?);
    drv.init()?;
    let count = drv.device_count()?;
    if count <= 0 {
        return Err(CudaError::NoDevices);
    }
    let version = drv.version().unwrap_or(0);
    log::debug!(
        "cuda: {} (CUDA {}.{}), {count} GPU(s)",
        path.display(),
        version / 1000,
        version % 1000 / 10
    );
    let (devices, failed) = usable((0..count).map(|i| (i, Device::open(drv.clone(), i))));
    if devices.is_empty() {
        // Every GPU failed: the first one's reason says why.
        return Err(failed.into_iter().next().unwrap_or(CudaError::NoDevices));
    }
    let devices: Vec<Arc<Device>> = devices.into_iter().map(Arc::new).collect();
    let shared = Arc::new(Shared {
        devices: devices.clone(),
        table: RegionTable::new(),
        dmabuf_pcie,
    });
    Ok(devices
        .into_iter()
        .map(|d| Arc::new(CudaMd::new(COMPONENT, d, shared.clone())))
        .collect())
}

/// The GPUs that opened; each that did not is logged with its reason and
/// skipped, so that one failing GPU does not hide the others (its memory
/// is then refused by name: [`CudaError::UnopenedDevice`]).
fn usable<D>(
    opened: impl IntoIterator<Item = (i32, Result<D, CudaError>)>,
) -> (Vec<D>, Vec<CudaError>) {
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    for (ordinal, r) in opened {
        match r {
            Ok(d) => ok.push(d),
            Err(e) => {
                log::warn!("cuda: GPU {ordinal} (cuda{ordinal}) skipped: {e}");
                failed.push(e);
            }
        }
    }
    (ok, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_that_fails_to_open_is_skipped_and_the_others_stay() {
        let broken = || CudaError::Driver {
            call: "cuDeviceGetName(device 1)".into(),
            code: result::DEVICE_UNAVAILABLE,
            name: None,
        };
        let (ok, failed) = usable([(0, Ok("cuda0")), (1, Err(broken())), (2, Ok("cuda2"))]);
        assert_eq!(ok, ["cuda0", "cuda2"]);
        assert_eq!(failed.len(), 1);
        let (ok, failed) = usable::<&str>([(0, Err(broken()))]);
        assert!(ok.is_empty());
        assert!(
            failed[0].to_string().contains("cuDeviceGetName"),
            "{:?}",
            failed[0]
        );
    }

    #[test]
    fn a_missing_driver_is_named_with_the_loaders_reason() {
        let e = open_devices(Path::new("/nonexistent/libcuda.so.1"), false).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, CudaError::LibraryNotLoaded { .. }), "{e:?}");
        assert!(text.contains("/nonexistent/libcuda.so.1"), "{text}");
        assert!(text.contains("No such file"), "{text}");
        assert!(text.contains("UCT_CUDA_LIB"), "{text}");
        let uct: uct_core::UctError = e.into();
        assert!(matches!(uct, uct_core::UctError::NoDevice(_)), "{uct:?}");
    }

    #[test]
    fn a_library_that_is_not_the_driver_is_refused_by_symbol() {
        // libc loads, but has no cuInit.
        let e = open_devices(Path::new("libc.so.6"), false).unwrap_err();
        match e {
            CudaError::MissingSymbol { symbol, .. } => assert_eq!(symbol, "cuInit"),
            other => panic!("expected a missing symbol, got {other:?}"),
        }
    }
}
