//! A connected pair of ifaces of one transport, with helpers to allocate
//! memory, exchange rkeys through the full pack/unpack path, and drive
//! progress until something happens.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uct_core::memory::MemBacking;
use uct_core::{
    Access, Caps, Completion, Endpoint, EpParams, Iface, IfaceParams, MdFlags, MemHandle,
    MemRegion, MemoryDomain, MemoryType, Registry, RemoteKey, Resource, RkeyBundle, Status,
    UctError,
};

/// How long any wait in the suite may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// Sender and receiver ifaces of one transport, connected by `ep`.
pub struct Pair {
    pub reg: &'static Registry,
    pub resource: Resource,
    pub tx: Box<dyn Iface>,
    pub rx: Option<Box<dyn Iface>>,
    pub ep: Box<dyn Endpoint>,
    /// The receiver's endpoint back, for CONNECT_TO_EP transports.
    pub rx_ep: Option<Box<dyn Endpoint>>,
    /// Host buffers registered (not allocated) by an MD, kept alive here.
    buffers: Vec<Box<[u8]>>,
}

/// Test failure with a message.
pub type TestResult = Result<(), String>;

/// Turns any error into a test failure message with context.
pub trait Context<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: std::fmt::Display> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// Fails the test with a message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

impl Pair {
    /// Opens two ifaces of `resource` and connects an endpoint from the
    /// first to the second.
    pub fn new(reg: &'static Registry, resource: &Resource) -> Result<Pair, String> {
        let open = || {
            resource
                .component
                .open_iface(&resource.md, &resource.tl, &IfaceParams::default())
                .ctx("open iface")
        };
        let mut tx = open()?;
        let mut rx = open()?;
        let caps = tx.attrs().caps;
        let (ep, rx_ep) = if caps.contains(Caps::CONNECT_TO_IFACE) {
            let ep = tx
                .create_ep(EpParams::ToIface {
                    device_addr: rx.device_address(),
                    iface_addr: rx.iface_address(),
                })
                .ctx("create endpoint")?;
            (ep, None)
        } else {
            let mut a = tx.create_ep(EpParams::Unconnected).ctx("create endpoint")?;
            let mut b = rx.create_ep(EpParams::Unconnected).ctx("create endpoint")?;
            let (aa, ba) = (
                a.ep_address().ctx("ep address")?,
                b.ep_address().ctx("ep address")?,
            );
            a.connect_to_ep(&rx.device_address(), &ba).ctx("connect")?;
            b.connect_to_ep(&tx.device_address(), &aa).ctx("connect")?;
            (a, Some(b))
        };
        Ok(Pair {
            reg,
            resource: resource.clone(),
            tx,
            rx: Some(rx),
            ep,
            rx_ep,
            buffers: Vec::new(),
        })
    }

    pub fn caps(&self) -> Caps {
        self.tx.attrs().caps
    }

    pub fn attrs(&self) -> uct_core::IfaceAttrs {
        self.tx.attrs().clone()
    }

    pub fn rx(&mut self) -> &mut Box<dyn Iface> {
        self.rx.as_mut().expect("receiver iface is open")
    }

    fn md(&self) -> Arc<dyn MemoryDomain> {
        self.resource.md.clone()
    }

    /// Host memory of `len` bytes registered with the transport's MD.
    pub fn alloc(&mut self, len: usize, access: Access) -> Result<MemHandle, String> {
        let md = self.md();
        let attrs = md.attrs();
        if attrs.flags.contains(MdFlags::ALLOC) && attrs.alloc_mem_types.contains(&MemoryType::Host)
        {
            return md.alloc(len, MemoryType::Host, access).ctx("alloc");
        }
        let mut buf = vec![0u8; len.max(1)].into_boxed_slice();
        // SAFETY: the buffer is kept in `self.buffers` for the life of the
        // pair, which outlives every handle the test uses.
        let mem = unsafe { md.register(buf.as_mut_ptr(), len, access) }.ctx("register")?;
        self.buffers.push(buf);
        Ok(mem)
    }

    /// Packs `mem`'s rkey as a peer would receive it.
    pub fn packed_rkey(&self, mem: &MemHandle) -> Result<Vec<u8>, String> {
        let entry = self.md().pack_rkey(mem).ctx("pack rkey")?;
        RkeyBundle::single(entry).pack().ctx("pack bundle")
    }

    /// Packs and unpacks `mem`'s rkey through the registry.
    pub fn rkey(&self, mem: &MemHandle) -> Result<RemoteKey, String> {
        let bytes = self.packed_rkey(mem)?;
        self.reg
            .unpack_rkey(&bytes, self.md().name())
            .ctx("unpack rkey")
    }

    /// Progress on both sides once.
    pub fn progress(&mut self) -> usize {
        let mut n = self.tx.progress();
        if let Some(rx) = self.rx.as_mut() {
            n += rx.progress();
        }
        n
    }

    /// Progresses until `done()` or the suite's timeout.
    pub fn progress_until(&mut self, what: &str, mut done: impl FnMut() -> bool) -> TestResult {
        let t0 = Instant::now();
        while !done() {
            if self.progress() == 0 {
                std::hint::spin_loop();
            }
            if t0.elapsed() > WAIT {
                return Err(format!("timed out after {WAIT:?} waiting for {what}"));
            }
        }
        Ok(())
    }

    /// Posts with `op`, progressing and retrying on NoResource; waits for
    /// `comp` when the operation is InProgress. Errors come back as errors.
    pub fn post_wait(
        &mut self,
        what: &str,
        comp: &Completion,
        mut op: impl FnMut(&mut dyn Endpoint, &Completion) -> Result<Status, UctError>,
    ) -> Result<(), UctError> {
        let t0 = Instant::now();
        loop {
            match op(self.ep.as_mut(), comp)? {
                Status::Done => return Ok(()),
                Status::InProgress => break,
                Status::NoResource => {
                    self.progress();
                    if t0.elapsed() > WAIT {
                        return Err(UctError::Timeout(format!(
                            "{what}: NoResource for {WAIT:?}"
                        )));
                    }
                }
            }
        }
        let c = comp.clone();
        self.progress_until(what, || c.is_complete())
            .map_err(UctError::Timeout)?;
        comp.result()
    }

    /// Flushes the endpoint and waits.
    pub fn flush(&mut self) -> Result<(), UctError> {
        let comp = Completion::new();
        self.post_wait("flush", &comp, |ep, c| ep.flush(Some(c)))
    }
}

/// A pattern that differs per size and seed, so stale data is caught.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A memory handle that claims to be device memory, to check that
/// transports refuse memory types they cannot touch.
pub fn fake_device_memory(mem_type: MemoryType) -> MemHandle {
    struct NoBacking;
    impl MemBacking for NoBacking {
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }
    MemRegion::new(
        0x1000_0000,
        4096,
        mem_type,
        Access::all(),
        "fake-device",
        Box::new(NoBacking),
    )
}

/// Collects what an active-message handler receives.
pub type Inbox = Arc<Mutex<Vec<(u8, Vec<u8>)>>>;

/// Installs a handler for `id` on the receiver that stores messages.
pub fn inbox(pair: &mut Pair, id: u8) -> Result<Inbox, String> {
    let inbox: Inbox = Arc::default();
    let sink = inbox.clone();
    pair.rx()
        .set_am_handler(
            id,
            Box::new(move |m| {
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((m.id, m.data.to_vec()))
            }),
        )
        .ctx("set AM handler")?;
    Ok(inbox)
}

/// Number of messages in an inbox.
pub fn count(inbox: &Inbox) -> usize {
    inbox.lock().unwrap_or_else(|p| p.into_inner()).len()
}

impl Pair {
    /// Posts an operation that must fail: the error comes back from the
    /// post, from its completion, or from the flush after it.
    pub fn expect_failure(
        &mut self,
        what: &str,
        op: impl FnMut(&mut dyn Endpoint, &Completion) -> Result<Status, UctError>,
    ) -> Result<UctError, String> {
        let comp = Completion::new();
        match self.post_wait(what, &comp, op) {
            Err(e) => Ok(e),
            Ok(()) => match self.flush() {
                Err(e) => Ok(e),
                Ok(()) => Err(format!("{what} succeeded, but it must fail")),
            },
        }
    }
}
