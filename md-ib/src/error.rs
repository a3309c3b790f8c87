//! The error of the verbs layer: which call failed, with which errno, in
//! which QP transition, and what to do about it. Converted into
//! [`UctError`] at the component boundary, keeping itself as the source.

use std::fmt;
use std::io;

use uct_core::error::ErrorSource;
use uct_core::UctError;

/// Linux's ENOTSUPP (kernel-internal, 524): what some drivers return when
/// they cannot import a DMA-buf. libc has no constant for it.
pub const ENOTSUPP: i32 = 524;

/// A queue pair state, for naming the transition that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    Reset,
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    Error,
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Error => "ERR",
        })
    }
}

/// A failed verbs call.
#[derive(Debug, thiserror::Error)]
pub struct VerbsError {
    /// The device the call was made on ("verbs" when none is known).
    pub device: String,
    /// The call and its arguments, e.g. `ibv_modify_qp on QP 17`.
    pub call: String,
    /// The errno the call failed with.
    pub errno: i32,
    /// For `ibv_modify_qp`: the transition that failed.
    pub transition: Option<(QpState, QpState)>,
    /// The errno as an `io::Error`.
    #[source]
    pub source: io::Error,
}

/// The calling thread's errno, read now: call it right after the failed
/// verbs call, before anything that allocates (a `format!`) or makes
/// another call, either of which may change it.
pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl VerbsError {
    /// `call` failed with `errno`.
    pub fn new(call: impl Into<String>, errno: i32) -> Self {
        VerbsError {
            device: "verbs".into(),
            call: call.into(),
            errno,
            transition: None,
            source: io::Error::from_raw_os_error(errno),
        }
    }

    /// `call` failed with the calling thread's errno, which verbs calls
    /// that return a pointer set. Only where nothing ran since the call:
    /// an argument made with `format!` allocates first, which may change
    /// errno; there read [`errno`] first and use [`new`](Self::new).
    pub fn last(call: impl Into<String>) -> Self {
        let errno = errno();
        VerbsError::new(call, errno)
    }

    /// The same error, made on `device`.
    pub fn on(mut self, device: &str) -> Self {
        self.device = device.to_string();
        self
    }

    /// The same error, failing the QP transition `from -> to`.
    pub fn in_transition(mut self, from: QpState, to: QpState) -> Self {
        self.transition = Some((from, to));
        self
    }

    fn is_dmabuf_import(&self) -> bool {
        self.call.starts_with("ibv_reg_dmabuf_mr")
    }

    /// What to do about this error: depends on the errno, and for some
    /// errnos on the call or the transition.
    pub fn hint(&self) -> &'static str {
        let to_rtr = matches!(self.transition, Some((_, QpState::Rtr)));
        match self.errno {
            libc::ENOMEM => {
                "the locked-memory limit is too low for the NIC to pin this memory, or the device is out of resources; raise the memlock limit (ulimit -l unlimited, or memlock in /etc/security/limits.conf) or register less"
            }
            libc::EFAULT if self.is_dmabuf_import() => {
                "the NIC could not map the DMA-buf's pages: check that the offset and length lie inside the exported range, and that the exporter lets this NIC map its memory peer-to-peer (PCIe ACS, IOMMU settings)"
            }
            libc::EINVAL if self.is_dmabuf_import() => {
                "the driver refused the DMA-buf's offset, length, iova or access flags (a range that is not page-aligned or runs past the exported buffer, or rights the driver does not grant DMA-buf memory)"
            }
            libc::EINVAL if to_rtr => {
                "the peer's address does not fit this port: a GID or MTU mismatch (RoCE v1 against v2, IPv4 against IPv6), a wrong QP number, or UCT_IB_GID_INDEX names a GID of another type than the peer's"
            }
            libc::EINVAL if self.transition.is_some() => {
                "an attribute of this transition is outside what the device accepts (timeout, retry count, PSN, atomic depth)"
            }
            libc::EINVAL => "a parameter is outside what the device accepts",
            libc::ETIMEDOUT => {
                "the device or the peer did not answer in time; check that the peer is alive and the link is up"
            }
            libc::ENETUNREACH | libc::EHOSTUNREACH => {
                "no route to the peer: its GID is not reachable from this port (check the routes and VLAN of the RoCE netdev, and UCT_IB_GID_INDEX)"
            }
            libc::EPERM if self.is_dmabuf_import() => {
                "the NIC could not attach the DMA-buf, which happens when PCIe peer-to-peer between the NIC and the device is not allowed; disable ACS on the PCIe switches between them, or use a NIC and device under the same switch"
            }
            libc::EPERM | libc::EACCES => {
                "permission denied: check the permissions of /dev/infiniband/* for this user and the locked-memory limit (ulimit -l)"
            }
            libc::EOPNOTSUPP | ENOTSUPP if self.is_dmabuf_import() => {
                "the NIC driver or kernel cannot import this DMA-buf; check that the kernel has RDMA DMA-buf support (5.12 or later), rdma-core is 34 or later, the NIC's driver imports DMA-bufs (mlx5, efa, irdma, bnxt_re), and the exporting device's driver allows it (for NVIDIA GPUs: the open kernel modules, CUDA 11.7 or later)"
            }
            libc::EOPNOTSUPP | ENOTSUPP => "the device or its driver does not support this",
            libc::EAGAIN | libc::ENOBUFS => {
                "the device is out of resources for now; retry later or use shorter queues"
            }
            libc::ENODEV | libc::ENXIO => "the device went away (driver unloaded or port removed)",
            _ => "",
        }
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.call)?;
        if let Some((from, to)) = self.transition {
            write!(f, " ({from} -> {to})")?;
        }
        write!(f, " failed with {}", errno_text(self.errno))?;
        match self.hint() {
            "" => Ok(()),
            hint => write!(f, "; {hint}"),
        }
    }
}

impl From<VerbsError> for UctError {
    fn from(e: VerbsError) -> Self {
        UctError::Device {
            device: e.device.clone(),
            message: e.to_string(),
            source: Some(ErrorSource::new(e)),
        }
    }
}

/// The symbolic name of an errno, where it is one verbs calls return.
pub fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ENOSPC => "ENOSPC",
        libc::ERANGE => "ERANGE",
        libc::ENOSYS => "ENOSYS",
        libc::EPROTO => "EPROTO",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ENETDOWN => "ENETDOWN",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ENOBUFS => "ENOBUFS",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        ENOTSUPP => "ENOTSUPP",
        _ => return None,
    })
}

/// An errno as text: its name, number and description, e.g.
/// `ENOTSUPP (524, operation not supported)`; never "Unknown error".
pub fn errno_text(errno: i32) -> String {
    let description = match errno {
        ENOTSUPP => "operation not supported".to_string(),
        _ => {
            let text = io::Error::from_raw_os_error(errno).to_string();
            // "Invalid argument (os error 22)" -> "invalid argument".
            let text = text.split(" (os error").next().unwrap_or("").to_string();
            if text.starts_with("Unknown error") {
                String::new()
            } else {
                let mut chars = text.chars();
                chars.next().map_or(String::new(), |first| {
                    first.to_lowercase().chain(chars).collect()
                })
            }
        }
    };
    match (errno_name(errno), description.is_empty()) {
        (Some(name), false) => format!("{name} ({errno}, {description})"),
        (Some(name), true) => format!("{name} ({errno})"),
        (None, false) => format!("errno {errno} ({description})"),
        (None, true) => format!("errno {errno}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn enotsupp_is_named_never_unknown() {
        let e = VerbsError::new("ibv_reg_dmabuf_mr(fd 7, 4096 bytes)", ENOTSUPP);
        let text = e.to_string();
        assert!(text.contains("ENOTSUPP (524"), "{text}");
        assert!(!text.contains("Unknown error"), "{text}");
        assert!(text.contains("cannot import this DMA-buf"), "{text}");
        assert!(
            text.contains("5.12") && text.contains("rdma-core"),
            "{text}"
        );
        // The errno text alone never falls back to strerror's wording.
        assert_eq!(
            errno_text(ENOTSUPP),
            "ENOTSUPP (524, operation not supported)"
        );
    }

    #[test]
    fn efault_and_einval_on_dmabuf_import_say_what_to_check() {
        let f = VerbsError::new("ibv_reg_dmabuf_mr(fd 7)", libc::EFAULT).to_string();
        assert!(
            f.contains("EFAULT (14") && f.contains("peer-to-peer"),
            "{f}"
        );
        let i = VerbsError::new("ibv_reg_dmabuf_mr(fd 7)", libc::EINVAL).to_string();
        assert!(
            i.contains("EINVAL (22") && i.contains("page-aligned"),
            "{i}"
        );
        // Elsewhere EINVAL keeps its general hint.
        let other = VerbsError::new("ibv_create_cq", libc::EINVAL).to_string();
        assert!(!other.contains("DMA-buf"), "{other}");
    }

    #[test]
    fn eopnotsupp_on_dmabuf_import_names_the_driver_or_kernel() {
        let e = VerbsError::new("ibv_reg_dmabuf_mr(fd 7)", libc::EOPNOTSUPP);
        assert!(e.to_string().contains("NIC driver or kernel"), "{e}");
        let other = VerbsError::new("ibv_create_qp", libc::EOPNOTSUPP);
        assert!(!other.to_string().contains("DMA-buf"), "{other}");
    }

    #[test]
    fn enomem_names_the_locked_memory_limit() {
        let e = VerbsError::new("ibv_reg_mr of 4096 bytes on rxe0", libc::ENOMEM);
        let text = e.to_string();
        assert!(text.contains("ENOMEM (12"), "{text}");
        assert!(
            text.contains("ulimit -l") && text.contains("memlock"),
            "{text}"
        );
    }

    #[test]
    fn einval_on_rtr_names_gid_and_mtu() {
        let e = VerbsError::new("ibv_modify_qp on QP 17", libc::EINVAL)
            .in_transition(QpState::Init, QpState::Rtr);
        let text = e.to_string();
        assert!(text.contains("INIT -> RTR"), "{text}");
        assert!(text.contains("GID or MTU mismatch"), "{text}");
        assert!(text.contains("UCT_IB_GID_INDEX"), "{text}");
        let rts = VerbsError::new("ibv_modify_qp on QP 17", libc::EINVAL)
            .in_transition(QpState::Rtr, QpState::Rts);
        assert!(!rts.to_string().contains("GID"), "{rts}");
        assert!(rts.to_string().contains("RTR -> RTS"), "{rts}");
    }

    #[test]
    fn timeouts_routes_and_permissions_have_their_own_hints() {
        let t = VerbsError::new("ibv_modify_qp", libc::ETIMEDOUT).to_string();
        assert!(t.contains("ETIMEDOUT") && t.contains("in time"), "{t}");
        let r = VerbsError::new("ibv_modify_qp", libc::ENETUNREACH).to_string();
        assert!(r.contains("ENETUNREACH") && r.contains("no route"), "{r}");
        for errno in [libc::EPERM, libc::EACCES] {
            let p = VerbsError::new("ibv_open_device", errno).to_string();
            assert!(
                p.contains("/dev/infiniband") && p.contains("ulimit -l"),
                "{p}"
            );
        }
        let p2p = VerbsError::new("ibv_reg_dmabuf_mr(fd 3)", libc::EPERM).to_string();
        assert!(p2p.contains("peer-to-peer"), "{p2p}");
    }

    #[test]
    fn unknown_errnos_print_by_number() {
        assert_eq!(errno_text(9999), "errno 9999");
        assert!(errno_text(libc::EINVAL).starts_with("EINVAL (22, invalid argument"));
    }

    #[test]
    fn converts_into_uct_error_keeping_the_source() {
        let e = VerbsError::new("ibv_modify_qp on QP 5", libc::EINVAL)
            .on("rxe0")
            .in_transition(QpState::Init, QpState::Rtr);
        let uct: UctError = e.into();
        let UctError::Device {
            device, message, ..
        } = &uct
        else {
            panic!("not a device error: {uct:?}");
        };
        assert_eq!(device, "rxe0");
        assert!(message.contains("INIT -> RTR"), "{message}");
        // UctError's source is the VerbsError itself.
        let verbs = uct
            .source()
            .and_then(|source| source.downcast_ref::<VerbsError>())
            .expect("the source is the VerbsError");
        assert_eq!(verbs.errno, libc::EINVAL);
        assert_eq!(verbs.transition, Some((QpState::Init, QpState::Rtr)));
        // The chain goes on to the errno itself.
        let io = verbs.source().expect("io source");
        assert_eq!(
            io.downcast_ref::<io::Error>()
                .and_then(io::Error::raw_os_error),
            Some(libc::EINVAL)
        );
    }
}
