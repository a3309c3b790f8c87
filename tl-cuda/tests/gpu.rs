//! cuda_copy and md-cuda on a real GPU: what the "On an H100"
//! checks ask of md-cuda and the transport, in one process. Needs the
//! NVIDIA driver and a GPU; where there is none (CI, most machines here)
//! every case is reported as ignored with the reason, by name, never as
//! passed. Where `UCT_TEST_EXPECT` names cuda, a missing GPU fails them.
//!
//! `scripts/cuda-h100` builds this binary in release mode and runs it on
//! the H100 machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion as TestCompletion, Failed, Trial};
use md_cuda::CudaMd;
use uct_core::{
    Access, Completion, Component, EpParams, Iface, IfaceParams, Iov, MdFlags, MemHandle,
    MemoryDomain, MemoryType, RkeyBundle, Status,
};
use uct_cuda::CudaComponent;

const MIB: usize = 1 << 20;

fn component() -> &'static CudaComponent {
    static C: std::sync::OnceLock<CudaComponent> = std::sync::OnceLock::new();
    C.get_or_init(CudaComponent::new)
}

fn gpu0() -> Result<Arc<CudaMd>, Failed> {
    Ok(component().mds()?[0].clone())
}

/// Progresses `iface` until `comp` completes, for at most 60 s.
fn wait(iface: &mut dyn Iface, st: Status, comp: &Completion) -> Result<(), Failed> {
    let t0 = Instant::now();
    if st == Status::InProgress {
        while !comp.is_complete() {
            iface.progress();
            if t0.elapsed() > Duration::from_secs(60) {
                return Err("a copy did not complete in 60 s".into());
            }
        }
    }
    comp.result()?;
    Ok(())
}

fn list_gpus() -> Result<TestCompletion, Failed> {
    for md in component().mds()? {
        let dev = md.device();
        println!(
            "gpu: {}: {} at {}, {} bytes, DMA-buf export {}",
            dev.name,
            dev.model,
            dev.bus_id,
            dev.total_mem,
            if dev.dmabuf {
                "supported"
            } else {
                "NOT supported"
            }
        );
        if dev.model.is_empty() || dev.total_mem == 0 || dev.bus_id.len() < 12 {
            return Err(format!("{}: incomplete identity: {dev:?}", dev.name).into());
        }
        let flags = md.attrs().flags;
        if flags.contains(MdFlags::EXPORT_DMABUF) != dev.dmabuf {
            return Err("EXPORT_DMABUF disagrees with the device attribute".into());
        }
    }
    Ok(TestCompletion::Completed)
}

/// The exporter of a DMA-buf fd, from /proc/self/fdinfo.
fn exporter(fd: i32) -> Result<String, Failed> {
    fdinfo_field(fd, "exp_name:")
}

/// A field of /proc/self/fdinfo/`fd` (a DMA-buf's `exp_name:`, `size:`).
fn fdinfo_field(fd: i32, field: &str) -> Result<String, Failed> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("/proc/self/fdinfo/{fd} has no {field}:\n{info}").into())
}

/// Exports `mem` (device memory of `md`) as a DMA-buf: fdinfo names the
/// exporter and the size the answer says the fd covers.
fn export(md: &CudaMd, mem: &MemHandle) -> Result<(), Failed> {
    use std::os::fd::AsRawFd;
    let info = mem
        .query_owner()
        .ok_or("device memory answers no query")??;
    let (fd, offset) = info.dmabuf.ok_or("no DMA-buf in the answer")?;
    let name = exporter(fd.as_raw_fd())?;
    // MemInfo's contract: base and len are what the fd covers.
    if info.base + offset != mem.addr() || info.len < mem.len() {
        return Err(format!(
            "base {:#x} + offset {offset} is not the buffer at {:#x}, or len {} is short",
            info.base,
            mem.addr(),
            info.len
        )
        .into());
    }
    let size = fdinfo_field(fd.as_raw_fd(), "size:")?;
    if size != info.len.to_string() {
        return Err(format!("fdinfo says size {size}, the answer len {}", info.len).into());
    }
    println!(
        "gpu: {} MiB at {:#x} exported as fd {} of {size} bytes (offset {offset}), exporter {name}",
        mem.len() / MIB,
        mem.addr(),
        fd.as_raw_fd()
    );
    if offset != mem.addr() % md_cuda::export::host_page_size() {
        return Err(format!("offset {offset} for a buffer at {:#x}", mem.addr()).into());
    }
    // A buffer 100 bytes into the allocation: the page around it, offset 100.
    // SAFETY: device memory of `mem`, which outlives the registration.
    let inner = unsafe { md.register((mem.addr() + 4096 + 100) as *mut u8, 8192, Access::all()) }?;
    let info = inner.query_owner().ok_or("no answer")??;
    let (fd2, offset2) = info.dmabuf.ok_or("no DMA-buf")?;
    if offset2 != 100 {
        return Err(format!("sub-buffer exported at offset {offset2}, not 100").into());
    }
    exporter(fd2.as_raw_fd())?;
    Ok(())
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(2654435761) ^ seed) as u8)
        .collect()
}

/// Writes a pattern to `dev` (device memory of `md`) H2D and reads it back
/// D2H through cuda_copy; every byte is verified.
fn copy_both_ways(md: &Arc<CudaMd>, dev: &MemHandle) -> Result<(), Failed> {
    let dmd: Arc<dyn MemoryDomain> = md.clone();
    let res = component().tl_resources(&dmd)?.remove(0);
    let mut iface = component().open_iface(&dmd, &res, &IfaceParams::default())?;
    let mut ep = iface.create_ep(EpParams::ToIface {
        device_addr: iface.device_address(),
        iface_addr: iface.iface_address(),
    })?;
    let len = dev.len();
    let src = md.alloc(len, MemoryType::Host, Access::all())?;
    let back = md.alloc(len, MemoryType::Host, Access::all())?;
    let want = pattern(len, 0x5a);
    src.write(0, &want)?;
    let packed = RkeyBundle::single(md.pack_rkey(dev)?).pack()?;
    let bundle = RkeyBundle::unpack(&packed)?;
    let rkey = component().unpack_rkey(bundle.find(md.name())?)?;
    let t0 = Instant::now();
    let put = Completion::new();
    let st = ep.put_zcopy(&[Iov::whole(&src)], dev.addr(), &rkey, Some(&put))?;
    wait(iface.as_mut(), st, &put)?;
    let h2d = t0.elapsed();
    let t1 = Instant::now();
    let get = Completion::new();
    let st = ep.get_zcopy(&[Iov::whole(&back)], dev.addr(), &rkey, Some(&get))?;
    wait(iface.as_mut(), st, &get)?;
    let d2h = t1.elapsed();
    let got = back.to_vec()?;
    if let Some(i) = (0..len).find(|&i| got[i] != want[i]) {
        return Err(format!(
            "byte {i} read back as {:#x}, written {:#x}",
            got[i], want[i]
        )
        .into());
    }
    println!(
        "gpu: {} MiB at {:#x} H2D {:.1} ms, D2H {:.1} ms, every byte verified",
        len / MIB,
        dev.addr(),
        h2d.as_secs_f64() * 1e3,
        d2h.as_secs_f64() * 1e3
    );
    Ok(())
}

/// The case: one 256 MiB buffer, exported as a DMA-buf, then
/// written H2D and read back D2H through cuda_copy, every byte verified.
fn export_and_copy_256mib() -> Result<TestCompletion, Failed> {
    let md = gpu0()?;
    let mem = md.alloc(256 * MIB, MemoryType::Cuda, Access::all())?;
    export(&md, &mem)?;
    copy_both_ways(&md, &mem)?;
    Ok(TestCompletion::Completed)
}

fn detection() -> Result<TestCompletion, Failed> {
    let md = gpu0()?;
    let mem = md.alloc(4 * MIB, MemoryType::Cuda, Access::all())?;
    let t = md.detect_mem_type(mem.addr() + 1000, 1000)?;
    if t != MemoryType::Cuda {
        return Err(format!("device memory detected as {t}").into());
    }
    let host = vec![0u8; 4096];
    let t = md.detect_mem_type(host.as_ptr() as u64, host.len())?;
    if t != MemoryType::Host {
        return Err(format!("a Vec detected as {t}").into());
    }
    // cuMemAlloc rounds up to its own granularity: past that is refused.
    let info = md.pointer_info(mem.addr())?;
    let (base, size) = info.range.ok_or("the driver gave no allocation range")?;
    if md.detect_mem_type(base, size as usize + 1).is_ok() {
        return Err("a range past the allocation was accepted".into());
    }
    println!("gpu: {:#x} detected as cuda of {}", mem.addr(), md.name());
    Ok(TestCompletion::Completed)
}

fn expected() -> bool {
    std::env::var("UCT_TEST_EXPECT").is_ok_and(|names| {
        names
            .split(',')
            .any(|n| matches!(n.trim(), "cuda" | "cuda_copy"))
    })
}

fn main() {
    let args = Arguments::from_args();
    type Case = fn() -> Result<TestCompletion, Failed>;
    let cases: [(&str, Case); 3] = [
        (
            "gpus_are_listed_with_model_memory_bus_id_and_dmabuf",
            list_gpus,
        ),
        (
            "one_256mib_buffer_exported_in_fdinfo_then_h2d_d2h_every_byte",
            export_and_copy_256mib,
        ),
        ("device_and_host_pointers_are_detected", detection),
    ];
    let absent = component().mds().err().map(|e| e.to_string());
    let trials = cases
        .into_iter()
        .map(|(name, case)| match &absent {
            None => Trial::ignorable_test(name, case),
            Some(why) if expected() => {
                println!("gpu: FAILED {name}: this run expects cuda, and {why}");
                let why = why.clone();
                Trial::test(name, move || {
                    Err(format!("this run expects cuda: {why}").into())
                })
            }
            Some(why) => {
                println!("gpu: SKIPPED {name}: no GPU here: {why}");
                let why = format!("no GPU here: {why}");
                Trial::ignorable_test(name, move || Ok(TestCompletion::ignored_with(why)))
            }
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
