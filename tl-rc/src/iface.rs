//! The rc iface: one port of one device. Endpoints connect endpoint to
//! endpoint (QP number and PSN); `progress` polls their completion queues
//! and delivers active messages and the immediates of puts with immediate
//! data.

use std::sync::{Arc, Mutex, Weak};

use md_ib::{GidEntry, IbMd, PortInfo};
use uct_core::iface::AmHandlers;
use uct_core::{
    AmHandler, Caps, Endpoint, EpParams, Iface, IfaceAttrs, ImmHandler, ImmHandlerSlot,
    MemoryDomain, MemoryType, Result, SizeLimits, UctError,
};

use crate::conn::{Connection, Queues, Received, MAX_IOV, MAX_ZCOPY, SEG};
use crate::ep::{RcEp, MAX_AM_HEADER};
use crate::port_watch::PortWatch;
use crate::qp::LocalPath;
use crate::wire::{self, DeviceAddress};

/// An rc iface.
pub struct RcIface {
    md: Arc<dyn MemoryDomain>,
    ib: Arc<IbMd>,
    /// Whether the port is still up: endpoints fail when it goes down.
    watch: Arc<PortWatch>,
    dev: String,
    port: PortInfo,
    gid: GidEntry,
    attrs: IfaceAttrs,
    handlers: AmHandlers,
    imm: ImmHandlerSlot,
    /// The endpoints' connections, polled by `progress`.
    conns: Vec<Weak<Mutex<Connection>>>,
    queues: Queues,
    /// Reused list of active messages and immediates to deliver.
    received: Vec<Received>,
}

impl RcIface {
    pub(crate) fn open(
        md: Arc<dyn MemoryDomain>,
        (ib, watch): (Arc<IbMd>, Arc<PortWatch>),
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
            let probe = crate::qp::Qp::new(ib.pd(), &cq, port_num, 4, 4, 1)?;
            probe.max_inline as usize
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
            | Caps::ERRHANDLE_PEER_FAILURE
            | Caps::PUT_IMM
            // RDMA writes, reads and atomics, and a flush's zero-length
            // write: the target's NIC answers them.
            | Caps::PASSIVE_TARGET;
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
                max_zcopy: MAX_ZCOPY,
                max_iov,
            },
            get: SizeLimits {
                max_short: 0,
                max_bcopy: SEG,
                min_zcopy: 0,
                max_zcopy: MAX_ZCOPY,
                max_iov,
            },
            am: SizeLimits {
                max_short: SEG,
                max_bcopy: SEG,
                min_zcopy: 0,
                max_zcopy: SEG,
                max_iov: max_iov - 1,
            },
            max_am_header: MAX_AM_HEADER,
            mem_types,
            latency_ns: 1500.0,
            bandwidth_bps: 12.5e9,
            overhead_ns: 50.0,
            iface_addr_len: wire::IFACE_ADDRESS_LEN,
            device_addr_len: wire::DEVICE_ADDRESS_LEN,
            ep_addr_len: wire::EP_ADDRESS_LEN,
        };
        let dev = format!("{}:{port_num}", info.name);
        Ok(RcIface {
            md,
            handlers: AmHandlers::new(format!("rc {dev}")),
            imm: ImmHandlerSlot::new(format!("rc {dev}")),
            dev,
            ib,
            watch,
            port,
            gid,
            attrs,
            conns: Vec::new(),
            queues,
            received: Vec::new(),
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
        DeviceAddress {
            gid: self.gid.gid,
            lid: self.port.lid,
            mtu: self.port.mtu as u8,
        }
        .encode()
    }

    fn iface_address(&self) -> Vec<u8> {
        Vec::new()
    }

    fn is_reachable(&self, device_addr: &[u8], iface_addr: &[u8]) -> bool {
        DeviceAddress::decode(device_addr).is_ok() && wire::decode_iface_address(iface_addr).is_ok()
    }

    fn create_ep(&mut self, params: EpParams) -> Result<Box<dyn Endpoint>> {
        if !matches!(params, EpParams::Unconnected) {
            return Err(UctError::InvalidParam(
                "rc connects endpoint to endpoint: create with EpParams::Unconnected, swap ep_address() with the peer, then connect_to_ep".into(),
            ));
        }
        let conn = Arc::new(Mutex::new(Connection::new(
            &self.ib,
            (self.port.num, &self.watch),
            &self.dev,
            self.queues,
        )?));
        self.conns.retain(|w| w.strong_count() > 0);
        self.conns.push(Arc::downgrade(&conn));
        let local = LocalPath {
            port: self.port.num,
            gid_index: self.gid.index,
            ethernet: self.port.ethernet,
            mtu: self.port.mtu,
            rd_atomic: self.ib.info().max_rd_atomic.clamp(1, 16) as u8,
        };
        let max_short = self.attrs.put.max_short;
        Ok(Box::new(RcEp::new(conn, self.ib.clone(), local, max_short)))
    }

    fn set_am_handler(&mut self, id: u8, handler: AmHandler) -> Result<()> {
        self.handlers.set(id, handler)
    }

    fn set_imm_handler(&mut self, handler: ImmHandler) -> Result<()> {
        self.imm.set(handler);
        Ok(())
    }

    fn progress(&mut self) -> usize {
        let mut count = 0;
        let mut gone = false;
        // By index, one upgrade each: no list is rebuilt per call (endpoints
        // are created only through `&mut self`, so none is added meanwhile).
        for at in 0..self.conns.len() {
            let Some(conn) = self.conns[at].upgrade() else {
                gone = true;
                continue;
            };
            let mut guard = conn.lock().unwrap_or_else(|p| p.into_inner());
            count += guard.progress();
            if guard.received.is_empty() {
                continue;
            }
            // Swapped, not copied: the connection keeps the emptied list.
            self.received.clear();
            std::mem::swap(&mut self.received, &mut guard.received);
            let (recv_host, recv_len) = guard.recv_window();
            // Handlers run outside the connection's lock (they may send),
            // in the order the receives completed.
            drop(guard);
            for got in &self.received {
                match *got {
                    Received::Am { id, seg, len } => {
                        let inside = seg
                            .checked_mul(SEG)
                            .and_then(|at| at.checked_add(len))
                            .is_some_and(|end| end <= recv_len);
                        let data = if inside {
                            // SAFETY: [seg * SEG, +len) lies inside the
                            // receive buffers (checked just above), which
                            // `conn` keeps alive (a connection never
                            // replaces them); the NIC does not write the
                            // segment until it is reposted below, after the
                            // handler returned.
                            unsafe {
                                std::slice::from_raw_parts(
                                    (recv_host + seg * SEG) as *const u8,
                                    len,
                                )
                            }
                        } else {
                            &[]
                        };
                        self.handlers.deliver(id, data);
                    }
                    // The write's data was placed before its receive
                    // completed (RC), so it is visible to the handler.
                    Received::Imm { event, .. } => {
                        self.imm.deliver(event);
                    }
                }
            }
            let mut guard = conn.lock().unwrap_or_else(|p| p.into_inner());
            for got in &self.received {
                guard.repost(got.seg());
            }
        }
        if gone {
            self.conns.retain(|w| w.strong_count() > 0);
        }
        count
    }
}
