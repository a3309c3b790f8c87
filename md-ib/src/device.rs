//! What an RDMA device offers: its ports (state, link layer, active MTU, the
//! GID table with each entry's type), atomics, queue limits, and the PCI
//! address of the NIC for topology choices.

use std::sync::Arc;

use rdma_sys::*;
use uct_core::UctError;

use crate::error::VerbsError;
use crate::verbs::Context;

/// One GID table entry in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: [u8; 16],
    /// "RoCE v2", "IB/RoCE v1", or "unknown".
    pub kind: String,
}

impl GidEntry {
    /// An IPv4-mapped GID (::ffff:a.b.c.d), as RoCE v2 uses for IPv4.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.gid[..10].iter().all(|&b| b == 0) && self.gid[10] == 0xff && self.gid[11] == 0xff
    }

    pub fn is_roce_v2(&self) -> bool {
        self.kind == "RoCE v2"
    }

    /// The GID in the usual text form.
    pub fn text(&self) -> String {
        std::net::Ipv6Addr::from(self.gid).to_string()
    }
}

/// One port.
#[derive(Debug, Clone)]
pub struct PortInfo {
    pub num: u8,
    pub active: bool,
    pub ethernet: bool,
    /// Active MTU in bytes, and as the verbs enum.
    pub mtu_bytes: u32,
    pub mtu: ibv_mtu::Type,
    pub lid: u16,
    pub gids: Vec<GidEntry>,
}

/// One device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub name: String,
    pub ports: Vec<PortInfo>,
    /// PCI bus id of the NIC (sysfs), absent for software devices.
    pub pci: Option<String>,
    pub atomics: bool,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_rd_atomic: u32,
}

fn mtu_bytes(m: ibv_mtu::Type) -> u32 {
    match m {
        ibv_mtu::IBV_MTU_256 => 256,
        ibv_mtu::IBV_MTU_512 => 512,
        ibv_mtu::IBV_MTU_1024 => 1024,
        ibv_mtu::IBV_MTU_2048 => 2048,
        ibv_mtu::IBV_MTU_4096 => 4096,
        _ => 0,
    }
}

fn gid_kind(dev: &str, port: u8, index: u32) -> String {
    std::fs::read_to_string(format!(
        "/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{index}"
    ))
    .map(|s| s.trim().to_string())
    .unwrap_or_else(|_| "unknown".into())
}

fn pci_address(dev: &str) -> Option<String> {
    let link = std::fs::read_link(format!("/sys/class/infiniband/{dev}/device")).ok()?;
    let name = link.file_name()?.to_str()?.to_string();
    // A PCI function looks like 0000:3b:00.0.
    (name.len() == 12 && name.as_bytes()[4] == b':').then_some(name)
}

impl DeviceInfo {
    /// Queries an open device.
    pub fn query(ctx: &Arc<Context>) -> Result<DeviceInfo, VerbsError> {
        // SAFETY: ibv_device_attr is plain C data (integers and arrays of
        // them): all zeroes is a valid value.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open (the Arc keeps it so) and `attr` is a
        // writable struct of the type the call fills.
        let r = unsafe { ibv_query_device(ctx.as_ptr(), &mut attr) };
        if r != 0 {
            return Err(VerbsError::new("ibv_query_device", r).on(ctx.name()));
        }
        let mut ports = Vec::new();
        for num in 1..=attr.phys_port_cnt {
            // SAFETY: ibv_port_attr is plain C data: all zeroes is valid.
            let mut port_attr: ibv_port_attr = unsafe { std::mem::zeroed() };
            // SAFETY: `ctx` is open; the exported ibv_query_port fills the
            // compat prefix of the (larger) struct, which `port_attr` contains.
            let r = unsafe {
                ibv_query_port(
                    ctx.as_ptr(),
                    num,
                    &mut port_attr as *mut _ as *mut _compat_ibv_port_attr,
                )
            };
            if r != 0 {
                return Err(
                    VerbsError::new(format!("ibv_query_port({}, {num})", ctx.name()), r)
                        .on(ctx.name()),
                );
            }
            let mut gids = Vec::new();
            for index in 0..port_attr.gid_tbl_len.max(0) as u32 {
                // SAFETY: ibv_gid is a union of byte and integer arrays:
                // all zeroes is valid.
                let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
                // SAFETY: `ctx` is open, `num` is one of its ports and
                // `index` is below the port's GID table length; `gid` is a
                // writable GID.
                if unsafe { ibv_query_gid(ctx.as_ptr(), num, index as i32, &mut gid) } != 0 {
                    continue;
                }
                // SAFETY: every field of the union is plain bytes, so any
                // bit pattern is a valid `raw`.
                let raw = unsafe { gid.raw };
                if raw.iter().all(|&b| b == 0) {
                    continue;
                }
                gids.push(GidEntry {
                    index,
                    gid: raw,
                    kind: gid_kind(ctx.name(), num, index),
                });
            }
            ports.push(PortInfo {
                num,
                active: port_attr.state == ibv_port_state::IBV_PORT_ACTIVE,
                // IBV_LINK_LAYER_ETHERNET is 2 in verbs.h.
                ethernet: port_attr.link_layer == 2,
                mtu_bytes: mtu_bytes(port_attr.active_mtu),
                mtu: port_attr.active_mtu,
                lid: port_attr.lid,
                gids,
            });
        }
        Ok(DeviceInfo {
            name: ctx.name().to_string(),
            ports,
            pci: pci_address(ctx.name()),
            atomics: attr.atomic_cap != ibv_atomic_cap::IBV_ATOMIC_NONE,
            max_qp_wr: attr.max_qp_wr.max(0) as u32,
            max_sge: attr.max_sge.max(0) as u32,
            max_rd_atomic: attr.max_qp_rd_atom.max(0) as u32,
        })
    }
}

impl PortInfo {
    /// The GID to use: `configured` (UCT_IB_GID_INDEX) if given, else the
    /// first RoCE v2 IPv4-mapped one, else the first RoCE v2 one, else the
    /// first one.
    pub fn choose_gid(&self, configured: Option<u32>) -> Result<&GidEntry, UctError> {
        if let Some(i) = configured {
            return self.gids.iter().find(|g| g.index == i).ok_or_else(|| {
                UctError::InvalidParam(format!(
                    "UCT_IB_GID_INDEX={i} is not a GID in use on port {}; in use: {}",
                    self.num,
                    self.gids
                        .iter()
                        .map(|g| g.index.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            });
        }
        self.gids
            .iter()
            .find(|g| g.is_roce_v2() && g.is_ipv4_mapped())
            .or_else(|| self.gids.iter().find(|g| g.is_roce_v2()))
            .or_else(|| self.gids.first())
            .ok_or_else(|| UctError::NoDevice(format!("port {} has no GID in use", self.num)))
    }
}
