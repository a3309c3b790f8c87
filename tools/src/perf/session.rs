//! One side of a perftest run: the iface, the endpoint to the peer, the
//! send and receive buffers, and the peer's receive buffer and rkey, set up
//! over the bootstrap channel.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use uct_core::bootstrap::BootstrapChannel;
use uct_core::{
    Access, Caps, Endpoint, EpParams, Iface, IfaceParams, MdFlags, MemHandle, MemoryType, Registry,
    RemoteKey, RkeyBundle,
};

use super::error::{PerfError, Result};
use super::params::Params;

/// Active-message id perftest uses.
pub const AM_ID: u8 = 1;

/// What the active-message handler saw.
#[derive(Default)]
pub struct AmState {
    pub count: AtomicU64,
    /// Validation: the message size expected, and the first bad message.
    pub size: AtomicU64,
    pub validate: std::sync::atomic::AtomicBool,
    pub first_bad: Mutex<Option<(u64, String)>>,
}

/// The first messages of a run: the client's parameters, and the server's
/// answer. Public so that tests can play a client.
#[derive(Debug, Serialize, Deserialize)]
pub enum Hello {
    Params(Box<Params>),
    Accept,
    Refuse(String),
}

#[derive(Debug, Serialize, Deserialize)]
struct Setup {
    device_addr: Vec<u8>,
    iface_addr: Vec<u8>,
    ep_addr: Option<Vec<u8>>,
    recv_addr: u64,
    recv_len: u64,
    rkey: Vec<u8>,
}

/// Which end of the run this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Drives the test and measures.
    Client,
    /// Answers and confirms.
    Server,
}

/// One side, connected.
pub struct Session {
    pub params: Params,
    pub role: Role,
    pub iface: Box<dyn Iface>,
    pub ep: Box<dyn Endpoint>,
    pub send: MemHandle,
    pub recv: MemHandle,
    pub peer_addr: u64,
    pub peer_len: u64,
    pub peer_rkey: RemoteKey,
    pub ch: BootstrapChannel,
    pub am: Arc<AmState>,
    /// Validation's way to device memory (or to any memory, with
    /// `--stage-validation`).
    pub stage: Option<super::stage::Stage>,
    /// Turns of waiting loops, which pace the liveness probes.
    pub(crate) turns: u32,
    /// The server was told to spin through one-sided tests too.
    pub(crate) server_spin: bool,
    /// Host buffers registered with MDs that do not allocate.
    _buffers: Vec<Box<[u8]>>,
}

/// Opens `params.transport` here, checking what the run needs.
pub fn open_iface(reg: &Registry, params: &Params) -> Result<Box<dyn Iface>> {
    let res = reg
        .find_resource(&params.transport, params.device.as_deref())
        .map_err(|e| {
            let mut names: Vec<String> = reg
                .resources()
                .into_iter()
                .map(|r| r.tl.transport)
                .collect();
            names.dedup();
            PerfError::Usage(format!(
                "{e}; transports available here: {}",
                if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                }
            ))
        })?;
    let iface = res
        .component
        .open_iface(&res.md, &res.tl, &IfaceParams::default())?;
    for mem in [&params.mem_send, &params.mem_recv] {
        let mem_type = MemoryType::parse(mem).map_err(|e| PerfError::Usage(e.to_string()))?;
        // A NIC that could carry device memory, were its driver able to
        // import DMA-buf, is refused at registration with its own message.
        if !iface.attrs().mem_types.contains(&mem_type) && iface.md().refusal(mem_type).is_none() {
            return Err(PerfError::Usage(uct_core::memory::cannot_move(
                &params.transport,
                &iface.attrs().mem_types,
                mem_type,
            )));
        }
        if !mem_type.is_host_accessible()
            && matches!(
                params.test,
                super::params::TestKind::PutLat | super::params::TestKind::AmLat
            )
        {
            return Err(PerfError::Usage(format!(
                "{} writes and polls its buffers with the CPU, which cannot touch {mem_type} memory; use put_bw, get_bw, get_lat, am_bw or add_lat",
                params.test.name()
            )));
        }
    }
    Ok(iface)
}

/// A buffer of `mem_type` for the transport: host memory from (or
/// registered with) the transport's MD, or device memory allocated by the
/// device's MD and registered with the transport's (a NIC imports its
/// DMA-buf).
pub fn alloc(
    reg: &Registry,
    iface: &dyn Iface,
    mem_type: MemoryType,
    len: usize,
    buffers: &mut Vec<Box<[u8]>>,
) -> Result<MemHandle> {
    let md = iface.md();
    if !mem_type.is_host_accessible() {
        let owner = reg
            .allocating_md(mem_type)
            .map_err(|e| PerfError::Usage(e.to_string()))?;
        let dev = owner.alloc(len, mem_type, Access::all_rights())?;
        log::info!(
            "perftest: {len} bytes of {mem_type} memory on {} at {:#x}",
            owner.name(),
            dev.addr()
        );
        return Ok(md.register_handle(&dev, Access::all_rights())?);
    }
    let attrs = md.attrs();
    if attrs.flags.contains(MdFlags::ALLOC) && attrs.alloc_mem_types.contains(&MemoryType::Host) {
        return Ok(md.alloc(len, MemoryType::Host, Access::all_rights())?);
    }
    let mut buf = vec![0u8; len].into_boxed_slice();
    // SAFETY: the buffer lives in the session as long as the handle.
    let mem = unsafe { md.register(buf.as_mut_ptr(), len, Access::all_rights()) }?;
    buffers.push(buf);
    Ok(mem)
}

/// How a server runs: what it lets a client ask of it, and how it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerOptions {
    /// The largest message size; each of the server's two buffers is at
    /// most this, rounded up to a page.
    pub max_size: usize,
    /// Progress in a busy loop through one-sided tests too, instead of
    /// sleeping where the transport needs no target progress
    /// (`--server-spin`; see `run::waits_passively`).
    pub spin: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_size: super::params::DEFAULT_MAX_SIZE,
            spin: false,
        }
    }
}

/// The largest bootstrap message a server takes: parameters, addresses and
/// rkeys are a few KiB.
const SERVER_MAX_FRAME: usize = 1 << 20;

/// The server's half of the agreement: the client's proposal, checked
/// against the server's own parameters and limits and against what its
/// transport carries, before anything is allocated. Refusals go back to
/// the client too.
fn agree_as_server(
    reg: &Registry,
    ours: &Params,
    options: &ServerOptions,
    ch: &mut BootstrapChannel,
) -> Result<(Params, Box<dyn Iface>)> {
    ch.set_max_frame(SERVER_MAX_FRAME);
    let theirs = match ch.recv_msg::<Hello>()? {
        Hello::Params(p) => *p,
        other => {
            return Err(PerfError::Protocol(format!(
                "expected parameters, got {other:?}"
            )))
        }
    };
    let mut refuse = |why: String| {
        let _ = ch.send_msg(&Hello::Refuse(why.clone()));
        PerfError::Refused(why)
    };
    if let Some(m) = theirs.mismatch(ours) {
        return Err(refuse(format!(
            "{m}; start both sides with the same -t, -d and -m"
        )));
    }
    theirs
        .within_limits(options.max_size)
        .map_err(&mut refuse)?;
    // The server opens its side before accepting, so that a transport it
    // lacks, or a size it cannot carry, is reported to the client.
    let iface = open_iface(reg, &theirs).map_err(|e| refuse(format!("on the server: {e}")))?;
    super::layout::check_sizes_in(iface.attrs(), &theirs)
        .map_err(|e| refuse(format!("on the server: {e}")))?;
    ch.send_msg(&Hello::Accept)?;
    Ok((theirs, iface))
}

impl Session {
    /// Agrees the parameters as the client (the server checks them against
    /// its own), opens the transport and connects both ways.
    pub fn open(
        reg: &Registry,
        params: &Params,
        ch: BootstrapChannel,
        role: Role,
    ) -> Result<Session> {
        Session::open_with(reg, params, ch, role, &ServerOptions::default())
    }

    /// [`Session::open`] as the server, with what it lets clients ask and how it waits.
    pub fn serve(
        reg: &Registry,
        params: &Params,
        ch: BootstrapChannel,
        options: &ServerOptions,
    ) -> Result<Session> {
        Session::open_with(reg, params, ch, Role::Server, options)
    }

    fn open_with(
        reg: &Registry,
        params: &Params,
        mut ch: BootstrapChannel,
        role: Role,
        options: &ServerOptions,
    ) -> Result<Session> {
        // The wait loops' spin hint is timed now, outside what they time.
        uct_core::spin::use_pause();
        let (params, mut iface) = match role {
            Role::Client => {
                ch.send_msg(&Hello::Params(Box::new(params.clone())))?;
                match ch.recv_msg::<Hello>()? {
                    Hello::Accept => (params.clone(), open_iface(reg, params)?),
                    Hello::Refuse(why) => return Err(PerfError::Refused(why)),
                    other => {
                        return Err(PerfError::Protocol(format!(
                            "expected accept, got {other:?}"
                        )))
                    }
                }
            }
            Role::Server => agree_as_server(reg, params, options, &mut ch)?,
        };
        let caps = iface.attrs().caps;
        let len = params.buffer_len().ok_or_else(|| {
            PerfError::Usage("the sizes asked do not fit in memory; use smaller -s".into())
        })?;
        let mut buffers = Vec::new();
        let mem_type = |m: &str| MemoryType::parse(m).map_err(|e| PerfError::Usage(e.to_string()));
        let send = alloc(
            reg,
            iface.as_ref(),
            mem_type(&params.mem_send)?,
            len,
            &mut buffers,
        )?;
        let recv = alloc(
            reg,
            iface.as_ref(),
            mem_type(&params.mem_recv)?,
            len,
            &mut buffers,
        )?;
        let md = iface.md().clone();
        let rkey = RkeyBundle::single(md.pack_rkey(&recv)?).pack()?;
        let by_iface = caps.contains(Caps::CONNECT_TO_IFACE);
        let mut pending_ep = if by_iface {
            None
        } else {
            Some(iface.create_ep(EpParams::Unconnected)?)
        };
        let ours = Setup {
            device_addr: iface.device_address(),
            iface_addr: iface.iface_address(),
            ep_addr: pending_ep.as_ref().map(|e| e.ep_address()).transpose()?,
            recv_addr: recv.addr(),
            recv_len: recv.len() as u64,
            rkey,
        };
        ch.send_msg(&ours)?;
        let theirs: Setup = ch.recv_msg()?;
        // The client connects first; the server then finds that connection
        // and answers over it (transports that share one connection per
        // pair of ifaces, such as tcp, then carry both directions on it).
        let connect = |iface: &mut Box<dyn Iface>,
                       pending: Option<Box<dyn Endpoint>>|
         -> Result<Box<dyn Endpoint>> {
            match pending {
                None => Ok(iface.create_ep(EpParams::ToIface {
                    device_addr: theirs.device_addr.clone(),
                    iface_addr: theirs.iface_addr.clone(),
                })?),
                Some(mut ep) => {
                    let addr = theirs.ep_addr.as_deref().ok_or_else(|| {
                        PerfError::Protocol("the peer sent no endpoint address".into())
                    })?;
                    ep.connect_to_ep(&theirs.device_addr, addr)?;
                    Ok(ep)
                }
            }
        };
        let ep = match role {
            Role::Client => {
                let ep = connect(&mut iface, pending_ep.take())?;
                ch.barrier()?;
                ep
            }
            Role::Server => {
                ch.barrier()?;
                connect(&mut iface, pending_ep.take())?
            }
        };
        let peer_rkey = reg.unpack_rkey(&theirs.rkey, md.name())?;
        let am = Arc::new(AmState::default());
        if caps.intersects(Caps::AM) {
            let am_state = am.clone();
            iface.set_am_handler(
                AM_ID,
                Box::new(move |msg| {
                    // Only this iface's progress (one thread) counts: a
                    // plain store is enough and cheaper than an atomic add.
                    let seen = am_state.count.load(Ordering::Relaxed);
                    am_state.count.store(seen + 1, Ordering::Release);
                    if am_state.validate.load(Ordering::Relaxed) {
                        let size = am_state.size.load(Ordering::Relaxed) as usize;
                        if let Some(why) = super::pattern::check_pattern(msg.data, size, seen) {
                            am_state
                                .first_bad
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .get_or_insert((seen, why));
                        }
                    }
                }),
            )?;
        }
        let needs_stage = params.validate
            && (params.stage_validation
                || !send.mem_type().is_host_accessible()
                || !recv.mem_type().is_host_accessible());
        let stage = if needs_stage {
            Some(super::stage::Stage::open(
                reg,
                &mut iface,
                len,
                &[&send, &recv],
            )?)
        } else {
            None
        };
        // Both sides connected before either starts.
        ch.barrier()?;
        Ok(Session {
            params,
            role,
            iface,
            ep,
            send,
            recv,
            peer_addr: theirs.recv_addr,
            peer_len: theirs.recv_len,
            peer_rkey,
            ch,
            am,
            stage,
            turns: 0,
            server_spin: role == Role::Server && options.spin,
            _buffers: buffers,
        })
    }
}
