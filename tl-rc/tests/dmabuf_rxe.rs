//! A real DMA-buf (from vgem, the kernel's virtual GEM exporter) offered to
//! md-ib on a NIC that cannot import DMA-bufs (Soft-RoCE) is refused with a
//! message that says so, and such a NIC does not advertise REG_DMABUF.
//! Runs where an RDMA device and vgem exist. Inside scripts/rxe-vm
//! (`RXE_VM_DEVICE=rxe0`), or where `UCT_TEST_EXPECT` names rc, both are
//! expected: their absence fails the test. Elsewhere it is skipped, with the
//! reason; a skip or a NIC that imports DMA-bufs (nothing to refuse) is
//! reported as ignored, never as passed, whatever the flags.

use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use md_ib::verbs::Context;
use md_ib::IbMd;
use uct_core::{Access, MdFlags, MemoryDomain, UctError};

#[repr(C)]
#[derive(Default)]
struct CreateDumb {
    height: u32,
    width: u32,
    bpp: u32,
    flags: u32,
    handle: u32,
    pitch: u32,
    size: u64,
}

#[repr(C)]
#[derive(Default)]
struct PrimeHandle {
    handle: u32,
    flags: u32,
    fd: i32,
}

const DRM_IOCTL_MODE_CREATE_DUMB: libc::c_ulong = 0xC020_64B2;
const DRM_IOCTL_PRIME_HANDLE_TO_FD: libc::c_ulong = 0xC00C_642D;

/// The DRM node of vgem, if the module is loaded.
fn vgem_node() -> Option<std::path::PathBuf> {
    for e in std::fs::read_dir("/sys/class/drm").ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("card") || name.contains('-') {
            continue;
        }
        // vgem is a platform device named vgem (it may have no driver link).
        let dev = std::fs::read_link(e.path().join("device")).ok();
        let drv = std::fs::read_link(e.path().join("device/driver")).ok();
        if [dev, drv]
            .iter()
            .flatten()
            .any(|p| p.file_name().is_some_and(|d| d == "vgem"))
        {
            return Some(std::path::Path::new("/dev/dri").join(name));
        }
    }
    None
}

/// A 1 MiB dumb buffer from vgem, exported as a DMA-buf fd.
fn vgem_dmabuf() -> Result<(OwnedFd, u64), Failed> {
    let node = vgem_node().ok_or("vgem is not loaded")?;
    let card = OpenOptions::new().read(true).write(true).open(&node)?;
    let mut dumb = CreateDumb {
        height: 256,
        width: 1024,
        bpp: 32,
        ..Default::default()
    };
    // SAFETY: `card` is an open DRM fd (borrowed for the call) and `dumb` is
    // the drm_mode_create_dumb struct this ioctl reads and writes.
    if unsafe { libc::ioctl(card.as_raw_fd(), DRM_IOCTL_MODE_CREATE_DUMB, &mut dumb) } != 0 {
        return Err(format!(
            "DRM_IOCTL_MODE_CREATE_DUMB: {}",
            std::io::Error::last_os_error()
        )
        .into());
    }
    let mut prime = PrimeHandle {
        handle: dumb.handle,
        flags: (libc::O_RDWR | libc::O_CLOEXEC) as u32,
        fd: -1,
    };
    // SAFETY: `card` is an open DRM fd and `prime` is the drm_prime_handle
    // struct this ioctl reads and writes.
    if unsafe { libc::ioctl(card.as_raw_fd(), DRM_IOCTL_PRIME_HANDLE_TO_FD, &mut prime) } != 0
        || prime.fd < 0
    {
        return Err(format!(
            "DRM_IOCTL_PRIME_HANDLE_TO_FD: {}",
            std::io::Error::last_os_error()
        )
        .into());
    }
    // SAFETY: the ioctl succeeded and returned a new fd (checked >= 0)
    // that nothing else owns, so the OwnedFd may close it.
    Ok((unsafe { OwnedFd::from_raw_fd(prime.fd) }, dumb.size))
}

fn refused(dev: String) -> Result<Completion, Failed> {
    let md = IbMd::open("ib", &dev)?;
    if md.supports_dmabuf() {
        println!("dmabuf_rxe: {dev} imports DMA-bufs; nothing to refuse (not applicable)");
        return Ok(Completion::ignored_with(format!(
            "not applicable: {dev} imports DMA-bufs"
        )));
    }
    if md.attrs().flags.contains(MdFlags::REG_DMABUF) {
        return Err(format!("{dev} cannot import DMA-bufs but advertises REG_DMABUF").into());
    }
    let (fd, size) = vgem_dmabuf()?;
    let e = match md.register_dmabuf(fd.as_fd(), 0, size as usize, 0x1000_0000, Access::all()) {
        Ok(_) => return Err("a DMA-buf was registered on a NIC that cannot import them".into()),
        Err(e) => e,
    };
    let msg = e.to_string();
    if !matches!(e, UctError::Unsupported { .. })
        || !msg.contains("cannot import DMA-buf")
        || !msg.contains("mlx5")
    {
        return Err(format!("unexpected refusal: {msg}").into());
    }
    println!("dmabuf_rxe: {dev} refused the vgem DMA-buf: {msg}");
    Ok(Completion::Completed)
}

/// Whether this run expects rc, and so an RDMA device: inside scripts/rxe-vm
/// (which sets `RXE_VM_DEVICE`), or where `UCT_TEST_EXPECT` names rc.
fn rc_expected() -> bool {
    match std::env::var("UCT_TEST_EXPECT") {
        Ok(names) => names.split(',').any(|n| n.trim() == "rc"),
        Err(_) => std::env::var_os("RXE_VM_DEVICE").is_some(),
    }
}

fn main() {
    let args = Arguments::from_args();
    const NAME: &str = "vgem_dmabuf_refused_by_a_nic_without_dmabuf";
    let devices = Context::device_names();
    // Inside the VM the device is the one it brought up.
    let wanted = std::env::var("RXE_VM_DEVICE").ok();
    let device = match &wanted {
        Some(want) => devices.iter().find(|d| *d == want),
        None => devices.first(),
    };
    let absent = match (device, vgem_node()) {
        (Some(dev), Some(_)) => {
            let dev = dev.clone();
            let trial = Trial::ignorable_test(NAME, move || refused(dev));
            libtest_mimic::run(&args, vec![trial]).exit();
        }
        (None, _) => format!(
            "no RDMA device{} here (devices: {}; scripts/rxe-vm runs this with Soft-RoCE)",
            wanted.map(|w| format!(" {w}")).unwrap_or_default(),
            if devices.is_empty() {
                "none".to_string()
            } else {
                devices.join(", ")
            }
        ),
        (Some(_), None) => "vgem is not loaded (modprobe vgem)".to_string(),
    };
    let trial = if rc_expected() {
        println!("dmabuf_rxe: FAILED: this run expects rc, and {absent}");
        Trial::test(NAME, move || {
            Err(format!("this run expects rc, and {absent}").into())
        })
    } else {
        println!("dmabuf_rxe: SKIPPED: {absent}");
        Trial::ignorable_test(NAME, move || Ok(Completion::ignored_with(absent)))
    };
    libtest_mimic::run(&args, vec![trial]).exit();
}
