//! The rc iface: one port of one device. Endpoints connect endpoint to
//! endpoint (QP number and PSN); `progress` polls their completion queues
//! and delivers active messages.

use std::sync::{Arc, Mutex, Weak};

use md_ib::{GidEntry, IbMd, PortInfo};
use rdma_sys::ibv_mtu;
use uct_core::{
    AmHandler, AmMessage, Caps, Endpoint, EpParams, Iface, IfaceAttrs, MemoryDomain, MemoryType,
    Result, SizeLimits, UctError,
};

use crate::ep::{EpInner, Local, RcEp, MAX_IOV, SEG};

const AM_IDS: usize = uct_core::iface::AM_ID_MAX;

/// Queue settings of an iface.
#[derive(Debug, Clone, Copy)]
pub struct Queues {
    pub tx: u32,
    pub rx: u32,
    pub peer_timeout: std::time::Duration,
}

/// An rc iface.
pub struct RcIface {
    md: Arc<dyn MemoryDomain>,
    ib: Arc<IbMd>,
    dev: String,
    port: PortInfo,
    gid: GidEntry,
    attrs: IfaceAttrs,
    handlers: Vec<Option<AmHandler>>,
    eps: Vec<Weak<Mutex<EpInner>>>,
    queues: Queues,
    ams: Vec<(u8, usize, usize)>,
    scratch: Vec<Arc<Mutex<EpInner>>>,
}

/// GID (16 bytes), LID (2, little-endian), MTU enum (1).
pub(crate) fn parse_device_address(a: &[u8]) -> Option<([u8; 16], u16, ibv_mtu::Type)> {
    if a.len() != 19 {
        return None;
    }
    let gid: [u8; 16] = a[..16].try_into().ok()?;
    let lid = u16::from_le_bytes([a[16], a[17]]);
    let mtu = a[18] as ibv_mtu::Type;
    (ibv_mtu::IBV_MTU_256..=ibv_mtu::IBV_MTU_4096)
        .contains(&mtu)
        .then_some((gid, lid, mtu))
}

impl RcIface {
    pub(crate) fn open(
        md: Arc<dyn MemoryDomain>,
        ib: Arc<IbMd>,
        port_num: u8,
        gid_index: Option<u32>,
        queues: Queues,
    ) -> Result<RcIface> {
        let info = ib.info();
        let port = info
            .ports
            .iter()
            .find(|p| p.num == port_num)
            .cloned()
            .ok_or_else(|| UctError::NoDevice(format!("{}:{port_num}", info.name)))?;
        if !port.active {
            return Err(UctError::NoDevice(format!(
                "{}:{port_num} is not active",
                info.name
            )));
        }
        let gid = port.choose_gid(gid_index)?.clone();
        log::debug!(
            "rc {}:{port_num}: GID index {} ({}, {})",
            info.name,
            gid.index,
            gid.text(),
            gid.kind
        );
        // What the NIC inlines, learned from a throwaway QP.
        let max_short = {
            let cq = crate::qp::Cq::new(ib.pd().context(), 4)?;
            crate::qp::Qp::new(ib.pd(), &cq, port_num, 4, 4, 1)?.max_inline as usize
        };
        let max_iov = (info.max_sge as usize).clamp(1, MAX_IOV);
        let mut caps = Caps::PUT_BCOPY
            | Caps::PUT_ZCOPY
            | Caps::GET_BCOPY
            | Caps::GET_ZCOPY
            | Caps::AM
            | Caps::FLUSH
            | Caps::FENCE
            | Caps::CONNECT_TO_EP
            | Caps::ERRHANDLE_PEER_FAILURE;
        if info.atomics {
            caps |= Caps::ATOMIC64;
        }
        if max_short > 0 {
            caps |= Caps::PUT_SHORT;
        }
        let mut mem_types = vec![MemoryType::Host];
        if ib.supports_dmabuf() {
            mem_types.extend([MemoryType::Gaudi, MemoryType::Cuda, MemoryType::DmaBuf]);
        }
        let attrs = IfaceAttrs {
            caps,
            put: SizeLimits {
                max_short,
                max_bcopy: SEG,
                min_zcopy: 0,
                max_zcopy: 1 << 30,
                max_iov,
            },
            get: SizeLimits {
                max_short: 0,
                max_bcopy: SEG,
                min_zcopy: 0,
                max_zcopy: 1 << 30,
                max_iov,
            },
            am: SizeLimits {
                max_short: SEG,
                max_bcopy: SEG,
                min_zcopy: 0,
                max_zcopy: SEG,
                max_iov: max_iov - 1,
            },
            max_am_header: 128,
            mem_types,
            latency_ns: 1500.0,
            bandwidth_bps: 12.5e9,
            overhead_ns: 50.0,
            iface_addr_len: 0,
            device_addr_len: 19,
            ep_addr_len: 8,
        };
        Ok(RcIface {
            md,
            dev: format!("{}:{port_num}", info.name),
            ib,
            port,
            gid,
            attrs,
            handlers: (0..AM_IDS).map(|_| None).collect(),
            eps: Vec::new(),
            queues,
            ams: Vec::new(),
            scratch: Vec::new(),
        })
    }
}

impl Iface for RcIface {
    fn transport(&self) -> &str {
        "rc"
    }

    fn device(&self) -> &str {
        &self.dev
    }

    fn attrs(&self) -> &IfaceAttrs {
        &self.attrs
    }

    fn md(&self) -> &Arc<dyn MemoryDomain> {
        &self.md
    }

    fn device_address(&self) -> Vec<u8> {
        let mut a = self.gid.gid.to_vec();
        a.extend_from_slice(&self.port.lid.to_le_bytes());
        a.push(self.port.mtu as u8);
        a
    }

    fn iface_address(&self) -> Vec<u8> {
        Vec::new()
    }

    fn is_reachable(&self, device_addr: &[u8], _iface_addr: &[u8]) -> bool {
        parse_device_address(device_addr).is_some()
    }

    fn create_ep(&mut self, params: EpParams) -> Result<Box<dyn Endpoint>> {
        if !matches!(params, EpParams::Unconnected) {
            return Err(UctError::InvalidParam(
                "rc connects endpoint to endpoint: create with EpParams::Unconnected, swap ep_address() with the peer, then connect_to_ep".into(),
            ));
        }
        let inner = Arc::new(Mutex::new(EpInner::new(
            &self.ib,
            self.port.num,
            &self.dev,
            self.queues.tx,
            self.queues.rx,
            self.queues.peer_timeout,
        )?));
        self.eps.retain(|w| w.strong_count() > 0);
        self.eps.push(Arc::downgrade(&inner));
        let local = Local {
            port: self.port.num,
            gid_index: self.gid.index,
            ethernet: self.port.ethernet,
            mtu: self.port.mtu,
            rd_atomic: self.ib.info().max_rd_atomic.clamp(1, 16) as u8,
            max_short: self.attrs.put.max_short,
        };
        Ok(Box::new(RcEp::new(inner, self.ib.clone(), local)))
    }

    fn set_am_handler(&mut self, id: u8, handler: AmHandler) -> Result<()> {
        let slot = self.handlers.get_mut(id as usize).ok_or_else(|| {
            UctError::InvalidParam(format!("active message id {id} is not below {AM_IDS}"))
        })?;
        *slot = Some(handler);
        Ok(())
    }

    fn progress(&mut self) -> usize {
        let mut n = 0;
        let mut eps = std::mem::take(&mut self.scratch);
        eps.clear();
        self.eps.retain(|w| match w.upgrade() {
            Some(e) => {
                eps.push(e);
                true
            }
            None => false,
        });
        for e in &eps {
            let mut g = e.lock().unwrap_or_else(|p| p.into_inner());
            n += g.progress();
            if g.ams.is_empty() {
                continue;
            }
            self.ams.clear();
            self.ams.extend(g.ams.drain(..));
            let recv = g.recv_buffer().clone();
            // Handlers run outside the endpoint's lock (they may send),
            // reading each message in place in its receive segment.
            drop(g);
            for &(id, seg, len) in &self.ams {
                let data = match recv.host_ptr(seg * SEG, len) {
                    // SAFETY: the segment is not posted to the NIC until it
                    // is reposted below, and `recv` keeps it alive.
                    Ok(p) => unsafe { std::slice::from_raw_parts(p as *const u8, len) },
                    Err(_) => &[],
                };
                match self.handlers.get_mut(id as usize).and_then(Option::as_mut) {
                    Some(h) => h(AmMessage { id, data }),
                    None => log::warn!(
                        "rc {}: dropped active message {id} ({len} bytes): no handler set",
                        self.dev
                    ),
                }
            }
            let mut g = e.lock().unwrap_or_else(|p| p.into_inner());
            for &(_, seg, _) in &self.ams {
                g.repost(seg);
            }
        }
        eps.clear();
        self.scratch = eps;
        n
    }
}
