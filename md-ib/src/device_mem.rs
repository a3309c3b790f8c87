//! Device memory (Gaudi HBM, CUDA memory) registered with the NIC: through
//! the DMA-buf its owner exports (`ibv_reg_dmabuf_mr`, iova = the device
//! address), or, where that fails with EOPNOTSUPP, ENOTSUPP, EINVAL or
//! EFAULT (or the NIC imports no DMA-buf, or the owner exports none) and
//! a peer-memory module serves the memory type (`nvidia_peermem`),
//! through `ibv_reg_mr` of the device pointer. Which path was taken is
//! logged; a refusal names the errno and says what to check.

use std::os::fd::AsFd;

use rdma_sys::ibv_reg_mr;
use uct_core::{Access, MemHandle, MemoryType, Result, UctError};

use crate::error::{errno, VerbsError, ENOTSUPP};
use crate::md::{verbs_access, IbBacking, IbMd, DMABUF_NICS};
use crate::peermem::{self, RegPath};
use crate::verbs::Mr;

/// Why the DMA-buf path did not register, and whether the peer-memory
/// path is worth trying after it.
struct Refused {
    error: UctError,
    fallback: bool,
}

impl Refused {
    fn retry(error: UctError) -> Self {
        Refused {
            error,
            fallback: true,
        }
    }
}

/// `e` with advice to load `module` appended, where it has room for it.
fn suggest_module(e: UctError, module: &str) -> UctError {
    let more = format!(
        "; or load {module} (modprobe {module}), with which the NIC registers the device pointer through ibv_reg_mr"
    );
    match e {
        UctError::MemoryTypeUnsupported {
            mem_type,
            owner,
            hint,
        } => UctError::MemoryTypeUnsupported {
            mem_type,
            owner,
            hint: hint + &more,
        },
        UctError::Device {
            device,
            message,
            source,
        } => UctError::Device {
            device,
            message: message + &more,
            source,
        },
        other => other,
    }
}

impl IbMd {
    /// Registers `mem`, device memory of another MD.
    pub(crate) fn register_device(&self, mem: &MemHandle, access: Access) -> Result<MemHandle> {
        let name = &self.info().name;
        if name.starts_with("mlx5") && std::env::var("MLX5_SCATTER_TO_CQE").as_deref() != Ok("0") {
            // mlx5 may scatter small responses into the CQE and have the CPU
            // copy them into the buffer, which is device memory here.
            log::warn!(
                "{name}: registering {} memory with MLX5_SCATTER_TO_CQE unset; set MLX5_SCATTER_TO_CQE=0 so that small RDMA Read responses are not copied by the CPU",
                mem.mem_type()
            );
        }
        let refused = match self.via_dmabuf(mem, access) {
            Ok(mr) => return Ok(self.device_handle(mr, mem, access, RegPath::DmaBuf)),
            Err(r) => r,
        };
        match (refused.fallback, peermem::loaded_for(mem.mem_type())) {
            (true, Some(module)) => {
                log::warn!(
                    "{name}: {}; registering through {module} instead",
                    refused.error
                );
                let mr = self.via_peer_memory(mem, access).map_err(|e| {
                    UctError::from(e.on(name)).context_for_peer(module, &refused.error)
                })?;
                Ok(self.device_handle(mr, mem, access, RegPath::PeerMem(module)))
            }
            (true, None) => Err(match peermem::module_for(mem.mem_type()) {
                Some(module) => suggest_module(refused.error, module),
                None => refused.error,
            }),
            (false, _) => Err(refused.error),
        }
    }

    fn device_handle(&self, mr: Mr, mem: &MemHandle, access: Access, path: RegPath) -> MemHandle {
        log::info!(
            "{}: {} bytes of {} memory at {:#x} (from {}) registered through {path}",
            self.info().name,
            mem.len(),
            mem.mem_type(),
            mem.addr(),
            mem.md_name()
        );
        let backing = IbBacking::of_owner(mr, mem.clone());
        // SAFETY: device memory (never dereferenced by the CPU), kept
        // alive by `mem`, which the backing holds until after the MR.
        unsafe { self.handle(backing, mem.addr(), mem.len(), mem.mem_type(), access) }
    }

    /// The owner's DMA-buf, registered with iova = the device address, so
    /// that work requests and rkeys use device addresses.
    fn via_dmabuf(&self, mem: &MemHandle, access: Access) -> std::result::Result<Mr, Refused> {
        let info = match mem.query_owner() {
            Some(Ok(info)) => info,
            Some(Err(e)) => return Err(Refused::retry(e)),
            None => {
                return Err(Refused::retry(UctError::MemoryTypeUnsupported {
                    mem_type: mem.mem_type(),
                    owner: format!("memory domain {}", self.info().name),
                    hint: format!(
                        "its owner ({}) exports no DMA-buf for it; allocate it with an MD that can export DMA-buf",
                        mem.md_name()
                    ),
                }))
            }
        };
        if !self.supports_dmabuf() {
            return Err(Refused::retry(self.dmabuf_refusal(mem.mem_type())));
        }
        let (fd, offset) = info.dmabuf.ok_or_else(|| {
            Refused::retry(UctError::MemoryTypeUnsupported {
                mem_type: mem.mem_type(),
                owner: format!("memory domain {}", self.info().name),
                hint: format!("its owner ({}) gave no DMA-buf fd for it", mem.md_name()),
            })
        })?;
        let mr = self
            .try_reg_dmabuf(fd.as_fd(), offset, mem.len(), mem.addr(), access)
            .map_err(|e| self.refused_import(mem.mem_type(), e))?;
        // The MR holds its own reference on the DMA-buf; our fd can go.
        drop(fd);
        Ok(mr)
    }

    /// A failed `ibv_reg_dmabuf_mr`, by errno name, with what to check.
    fn refused_import(&self, mem_type: MemoryType, e: VerbsError) -> Refused {
        let fallback = peermem::falls_back_after(e.errno);
        let e = e.on(&self.info().name);
        let error = if e.errno == libc::EOPNOTSUPP || e.errno == ENOTSUPP {
            UctError::MemoryTypeUnsupported {
                mem_type,
                owner: format!("NIC {}", self.info().name),
                hint: format!("{e}; use a NIC that can: {DMABUF_NICS}"),
            }
        } else {
            e.into()
        };
        Refused { error, fallback }
    }

    /// `ibv_reg_mr` of the device pointer, which a peer-memory module
    /// (nvidia_peermem) resolves to the device's pages.
    fn via_peer_memory(
        &self,
        mem: &MemHandle,
        access: Access,
    ) -> std::result::Result<Mr, VerbsError> {
        // SAFETY: the PD is live (self holds it). The address is device
        // memory of `mem`, which the new handle's backing keeps allocated
        // until after the MR is deregistered; the peer-memory module pins
        // it for the NIC, and the CPU never touches it.
        let mr_ptr = unsafe {
            ibv_reg_mr(
                self.pd().as_ptr(),
                mem.addr() as *mut libc::c_void,
                mem.len().max(1),
                verbs_access(access),
            )
        };
        // Read before anything (the message's format!) can change it.
        let errno = errno();
        // SAFETY: `mr_ptr` is null or an MR just registered on our PD that
        // nothing else owns.
        unsafe {
            Mr::from_raw(mr_ptr, self.pd(), errno, || {
                format!(
                    "ibv_reg_mr of {} bytes of {} memory at {:#x} (peer memory)",
                    mem.len(),
                    mem.mem_type(),
                    mem.addr()
                )
            })
        }
    }
}

/// Both failures, when the fallback failed too.
trait PeerContext {
    fn context_for_peer(self, module: &str, first: &UctError) -> UctError;
}

impl PeerContext for UctError {
    fn context_for_peer(self, module: &str, first: &UctError) -> UctError {
        match self {
            UctError::Device {
                device,
                message,
                source,
            } => UctError::Device {
                device,
                message: format!(
                    "{message} (through {module}, after the DMA-buf path failed: {first})"
                ),
                source,
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_module_is_suggested_in_the_refusal() {
        let e = UctError::MemoryTypeUnsupported {
            mem_type: MemoryType::Cuda,
            owner: "NIC mlx5_0".into(),
            hint: "ibv_reg_dmabuf_mr(...) failed with ENOTSUPP (524, operation not supported)"
                .into(),
        };
        let text = suggest_module(e, "nvidia_peermem").to_string();
        assert!(text.contains("ENOTSUPP (524"), "{text}");
        assert!(text.contains("modprobe nvidia_peermem"), "{text}");
        assert!(!text.contains("Unknown error"), "{text}");
    }

    #[test]
    fn a_failed_fallback_names_both_paths() {
        let first = UctError::Device {
            device: "mlx5_0".into(),
            message: "ibv_reg_dmabuf_mr failed with EFAULT (14, bad address)".into(),
            source: None,
        };
        let second: UctError = VerbsError::new("ibv_reg_mr of 4096 bytes", libc::EINVAL)
            .on("mlx5_0")
            .into();
        let text = second
            .context_for_peer("nvidia_peermem", &first)
            .to_string();
        assert!(
            text.contains("ibv_reg_mr") && text.contains("EINVAL"),
            "{text}"
        );
        assert!(
            text.contains("through nvidia_peermem") && text.contains("EFAULT"),
            "{text}"
        );
    }
}
