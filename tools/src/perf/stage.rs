//! Staging for memory the CPU cannot touch (Gaudi HBM): validation writes
//! a pattern into a host buffer and puts it into device memory over the
//! transport, and reads device memory back with a get into the host buffer.
//! Both go over a loopback endpoint of the session's own iface, so the data
//! goes host -> device -> host through the NIC, as it would for a user.

use uct_core::{
    Caps, Completion, Endpoint, EpParams, Iface, Iov, MemHandle, MemoryType, Registry, RemoteKey,
    RkeyBundle, Status,
};

use super::error::{PerfError, Result};

/// A host buffer and a loopback endpoint, with rkeys to the session's
/// device buffers.
pub struct Stage {
    host: MemHandle,
    ep: Box<dyn Endpoint>,
    /// The other half of a loopback pair on CONNECT_TO_EP transports.
    _peer: Option<Box<dyn Endpoint>>,
    keys: Vec<(u64, RemoteKey)>,
    /// Host memory registered with MDs that do not allocate.
    _buffers: Vec<Box<[u8]>>,
}

impl Stage {
    /// Opens staging of up to `len` bytes for `bufs` (the device buffers).
    pub fn open(
        reg: &Registry,
        iface: &mut Box<dyn Iface>,
        len: usize,
        bufs: &[&MemHandle],
    ) -> Result<Stage> {
        let mut buffers = Vec::new();
        let host = super::session::alloc(reg, iface.as_ref(), MemoryType::Host, len, &mut buffers)?;
        let md = iface.md().clone();
        let mut keys = Vec::new();
        for b in bufs {
            let packed = RkeyBundle::single(md.pack_rkey(b)?).pack()?;
            keys.push((b.addr(), reg.unpack_rkey(&packed, md.name())?));
        }
        let dev = iface.device_address();
        let (ep, peer) = if iface.attrs().caps.contains(Caps::CONNECT_TO_IFACE) {
            let ep = iface.create_ep(EpParams::ToIface {
                device_addr: dev,
                iface_addr: iface.iface_address(),
            })?;
            (ep, None)
        } else {
            let mut ep = iface.create_ep(EpParams::Unconnected)?;
            let mut peer = iface.create_ep(EpParams::Unconnected)?;
            let (ep_addr, peer_addr) = (ep.ep_address()?, peer.ep_address()?);
            ep.connect_to_ep(&dev, &peer_addr)?;
            peer.connect_to_ep(&dev, &ep_addr)?;
            (ep, Some(peer))
        };
        Ok(Stage {
            host,
            ep,
            _peer: peer,
            keys,
            _buffers: buffers,
        })
    }
}

fn key_of<'a>(keys: &'a [(u64, RemoteKey)], mem: &MemHandle) -> Result<&'a RemoteKey> {
    {
        keys.iter()
            .find(|(a, _)| *a == mem.addr())
            .map(|(_, k)| k)
            .ok_or_else(|| PerfError::Protocol("no staging key for this buffer".into()))
    }
}

/// Posts `op` until the transport takes it, then waits for its completion.
fn post_and_wait(
    iface: &mut dyn Iface,
    mut op: impl FnMut(&Completion) -> uct_core::Result<Status>,
) -> Result<()> {
    let comp = Completion::new();
    // The staging endpoint's peer is this iface: no liveness to probe,
    // only a deadline.
    let t0 = std::time::Instant::now();
    let st = loop {
        match op(&comp)? {
            Status::NoResource => {
                iface.progress();
                if t0.elapsed() > std::time::Duration::from_secs(30) {
                    return Err(PerfError::Protocol(
                        "a staging transfer found no room to post in 30 s".into(),
                    ));
                }
            }
            st => break st,
        }
    };
    if st == Status::InProgress {
        while !comp.is_complete() {
            iface.progress();
            if t0.elapsed() > std::time::Duration::from_secs(30) {
                return Err(PerfError::Protocol(
                    "a staging transfer did not complete in 30 s".into(),
                ));
            }
        }
    }
    comp.result()?;
    Ok(())
}

impl Stage {
    fn check_len(&self, len: usize) -> Result<()> {
        if len > self.host.len() {
            return Err(PerfError::Usage(format!(
                "staging holds {} bytes, {len} asked",
                self.host.len()
            )));
        }
        Ok(())
    }

    /// Writes `len` bytes made by `fill` into `mem` at offset 0.
    pub fn write(
        &mut self,
        iface: &mut dyn Iface,
        mem: &MemHandle,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<()> {
        self.check_len(len)?;
        let mut bytes = vec![0u8; len];
        fill(&mut bytes);
        self.host.write(0, &bytes)?;
        let key = key_of(&self.keys, mem)?;
        let (ep, host) = (&mut self.ep, &self.host);
        post_and_wait(iface, |comp| {
            ep.put_zcopy(&[Iov::new(host, 0, len)], mem.addr(), key, Some(comp))
        })?;
        post_and_wait(iface, |comp| ep.flush(Some(comp)))
    }

    /// Reads `len` bytes of `mem` at offset 0.
    pub fn read(&mut self, iface: &mut dyn Iface, mem: &MemHandle, len: usize) -> Result<Vec<u8>> {
        self.check_len(len)?;
        let key = key_of(&self.keys, mem)?;
        let (ep, host) = (&mut self.ep, &self.host);
        post_and_wait(iface, |comp| {
            ep.get_zcopy(&[Iov::new(host, 0, len)], mem.addr(), key, Some(comp))
        })?;
        let mut bytes = vec![0u8; len];
        self.host.read(0, &mut bytes)?;
        Ok(bytes)
    }
}
