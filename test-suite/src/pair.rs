//! A connected pair: an initiator iface with an endpoint to a target iface
//! of the same transport. The target is in this process or in a child
//! process (see [`crate::target`]); cases see no difference.

use std::time::{Duration, Instant};

use uct_core::memory::MemBacking;
use uct_core::{
    Access, Caps, Completion, Endpoint, EpParams, Iface, IfaceParams, MdFlags, MemHandle,
    MemRegion, MemoryType, Registry, RemoteKey, Resource, Status, UctError,
};

use crate::target::{InProcess, RemoteMem, Spawned, Target};

/// How long any wait in the suite may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// Where the target iface runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    InProcess,
    TwoProcesses,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::InProcess => "1proc",
            Mode::TwoProcesses => "2proc",
        }
    }
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

/// How an operation ended, as the transport reported it: the harness never
/// turns its own wait into an error of the transport's.
#[derive(Debug)]
pub enum Outcome {
    /// Done at once, or its completion fired without an error.
    Done,
    /// Refused when posted, or its completion fired with an error.
    Failed(UctError),
    /// Neither, after [`WAIT`].
    Pending,
}

/// Initiator, endpoint and target.
pub struct Pair {
    pub reg: &'static Registry,
    pub resource: Resource,
    pub mode: Mode,
    pub tx: Box<dyn Iface>,
    pub ep: Box<dyn Endpoint>,
    pub target: Box<dyn Target>,
    /// Host buffers registered (not allocated) by the MD, kept alive here.
    buffers: Vec<Box<[u8]>>,
}

impl Pair {
    /// Opens the initiator iface and the target (here or in a child), and
    /// connects an endpoint from the first to the second.
    pub fn new(reg: &'static Registry, resource: &Resource, mode: Mode) -> Result<Pair, String> {
        let open = || {
            resource
                .component
                .open_iface(&resource.md, &resource.tl, &IfaceParams::default())
                .ctx("open iface")
        };
        let mut tx = open()?;
        let mut target: Box<dyn Target> = match mode {
            Mode::InProcess => Box::new(InProcess::new(open()?)),
            Mode::TwoProcesses => {
                Box::new(Spawned::spawn(&resource.tl.transport, &resource.tl.device)?)
            }
        };
        let ep = if tx.attrs().caps.contains(Caps::CONNECT_TO_IFACE) {
            tx.create_ep(EpParams::ToIface {
                device_addr: target.device_address(),
                iface_addr: target.iface_address(),
            })
            .ctx("create endpoint")?
        } else {
            let mut ep = tx.create_ep(EpParams::Unconnected).ctx("create endpoint")?;
            let theirs = target.create_ep()?;
            ep.connect_to_ep(&target.device_address(), &theirs)
                .ctx("connect")?;
            target.connect_ep(&tx.device_address(), &ep.ep_address().ctx("ep address")?)?;
            ep
        };
        Ok(Pair {
            reg,
            resource: resource.clone(),
            mode,
            tx,
            ep,
            target,
            buffers: Vec::new(),
        })
    }

    /// The same pair with its initiator iface and endpoint replaced by what
    /// `wrap` makes of them (a test wrapper around them, see
    /// [`crate::delay`]).
    pub fn wrap(
        mut self,
        wrap: impl FnOnce(Box<dyn Iface>, Box<dyn Endpoint>) -> (Box<dyn Iface>, Box<dyn Endpoint>),
    ) -> Pair {
        let (tx, ep) = wrap(self.tx, self.ep);
        self.tx = tx;
        self.ep = ep;
        self
    }

    pub fn caps(&self) -> Caps {
        self.tx.attrs().caps
    }

    pub fn attrs(&self) -> uct_core::IfaceAttrs {
        self.tx.attrs().clone()
    }

    /// Local host memory registered with the transport's MD.
    pub fn alloc(&mut self, len: usize, access: Access) -> Result<MemHandle, String> {
        let md = self.resource.md.clone();
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

    /// Target memory.
    pub fn remote(&mut self, len: usize, access: Access) -> Result<RemoteMem, String> {
        self.target.alloc(len, access)
    }

    /// Unpacks a target region's rkey through the registry, as a peer does.
    pub fn rkey(&self, mem: &RemoteMem) -> Result<RemoteKey, String> {
        self.reg
            .unpack_rkey(&mem.rkey, self.resource.md.name())
            .ctx("unpack rkey")
    }

    pub fn remote_read(
        &mut self,
        mem: &RemoteMem,
        offset: usize,
        len: usize,
    ) -> Result<Vec<u8>, String> {
        self.target.read(mem, offset, len)
    }

    pub fn remote_write(&mut self, mem: &RemoteMem, offset: usize, data: &[u8]) -> TestResult {
        self.target.write(mem, offset, data)
    }

    /// Progress on both sides once.
    pub fn progress(&mut self) -> usize {
        self.tx.progress() + self.target.progress()
    }

    /// Progresses until `done` says so or the suite's timeout.
    pub fn wait_for(
        &mut self,
        what: &str,
        mut done: impl FnMut(&mut Pair) -> Result<bool, String>,
    ) -> TestResult {
        let t0 = Instant::now();
        while !done(self)? {
            self.progress();
            if t0.elapsed() > WAIT {
                return Err(format!("timed out after {WAIT:?} waiting for {what}"));
            }
        }
        Ok(())
    }

    /// Waits until `n` active messages with `id` have arrived.
    pub fn wait_inbox(&mut self, id: u8, n: usize) -> TestResult {
        self.wait_for(&format!("{n} active messages on id {id}"), |p| {
            Ok(p.target.inbox_len(id)? >= n)
        })
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
        while !comp.is_complete() {
            self.progress();
            if t0.elapsed() > WAIT {
                return Err(UctError::Timeout(format!(
                    "{what}: not complete after {WAIT:?}"
                )));
            }
        }
        comp.result()
    }

    /// Posts with `op` (progressing and retrying while NoResource) and waits
    /// up to [`WAIT`] for `comp`: how the transport said it ended.
    pub fn post_outcome(
        &mut self,
        comp: &Completion,
        mut op: impl FnMut(&mut dyn Endpoint, &Completion) -> Result<Status, UctError>,
    ) -> Outcome {
        let t0 = Instant::now();
        loop {
            match op(self.ep.as_mut(), comp) {
                Err(e) => return Outcome::Failed(e),
                Ok(Status::Done) => return Outcome::Done,
                Ok(Status::InProgress) => break,
                Ok(Status::NoResource) => {
                    self.progress();
                    if t0.elapsed() > WAIT {
                        return Outcome::Pending;
                    }
                }
            }
        }
        while !comp.is_complete() {
            self.progress();
            if t0.elapsed() > WAIT {
                return Outcome::Pending;
            }
        }
        match comp.result() {
            Ok(()) => Outcome::Done,
            Err(e) => Outcome::Failed(e),
        }
    }

    /// Flushes the endpoint: how the transport said the flush ended.
    pub fn flush_outcome(&mut self) -> Outcome {
        let comp = Completion::new();
        self.post_outcome(&comp, |ep, c| ep.flush(Some(c)))
    }

    /// Flushes the endpoint and waits.
    pub fn flush(&mut self) -> Result<(), UctError> {
        let comp = Completion::new();
        self.post_wait("flush", &comp, |ep, c| ep.flush(Some(c)))
    }

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

/// A pattern that differs per size and seed, so stale data is caught.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
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
    // SAFETY: the region is device memory (callers pass a non-host type),
    // so nothing accesses its address from the CPU.
    unsafe {
        MemRegion::new(
            0x1000_0000,
            4096,
            mem_type,
            Access::all(),
            "fake-device",
            Box::new(NoBacking),
        )
    }
}
