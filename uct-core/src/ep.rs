//! The endpoint: a connection to one peer iface or endpoint.

use crate::completion::{Completion, Status};
use crate::error::Result;
use crate::memory::Iov;
use crate::rkey::RemoteKey;

/// Atomic operand width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicValue {
    /// A 32-bit operand.
    U32(u32),
    /// A 64-bit operand.
    U64(u64),
}

impl AtomicValue {
    /// Its width in bytes.
    pub fn width(self) -> usize {
        match self {
            AtomicValue::U32(_) => 4,
            AtomicValue::U64(_) => 8,
        }
    }
    /// Its value widened to 64 bits.
    pub fn as_u64(self) -> u64 {
        match self {
            AtomicValue::U32(v) => v as u64,
            AtomicValue::U64(v) => v,
        }
    }
}

/// A fetching atomic operation; the old value is returned through the
/// completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchOp {
    /// Add `value`, return the old value.
    Add(AtomicValue),
    /// Store `value`, return the old value.
    Swap(AtomicValue),
    /// If the target equals `compare`, store `swap`; return the old value.
    CompareSwap {
        /// The value the target must hold.
        compare: AtomicValue,
        /// The value stored when it does.
        swap: AtomicValue,
    },
}

impl FetchOp {
    /// Width of the operands in bytes.
    pub fn width(self) -> usize {
        match self {
            FetchOp::Add(v) | FetchOp::Swap(v) => v.width(),
            FetchOp::CompareSwap { compare, .. } => compare.width(),
        }
    }
}

/// The transport an endpoint type belongs to, for the errors of default
/// methods (an endpoint does not know its transport's name): the type's name
/// without its path, generics and `Ep` suffix, lower-cased (`TcpEp` ->
/// `tcp`, `SelfEp` -> `self`).
fn transport_of<T: ?Sized>() -> String {
    let full = std::any::type_name::<T>();
    let path = full.split('<').next().unwrap_or(full);
    let name = path.rsplit("::").next().unwrap_or(path);
    let name = name
        .strip_suffix("Ep")
        .filter(|n| !n.is_empty())
        .unwrap_or(name);
    name.to_ascii_lowercase()
}

/// A connection. Every operation is non-blocking: see [`Status`].
///
/// `remote_addr` is the peer's address inside the region the rkey names
/// (a CPU address for host memory, a device VA for device memory).
pub trait Endpoint: Send {
    /// Writes `data` (at most `attrs().put.max_short` bytes) to the peer.
    fn put_short(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status>;

    /// Writes `data` through a bounce buffer; `data` may be reused when this
    /// returns. Returns Done or NoResource, never InProgress with a buffer
    /// still borrowed.
    fn put_bcopy(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status>;

    /// Writes the iov list without copying.
    fn put_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status>;

    /// Writes the iov list without copying, as [`put_zcopy`](Self::put_zcopy)
    /// (Done, InProgress or NoResource; NoResource posts nothing), then
    /// delivers `imm` to the target iface's immediate handler
    /// ([`Iface::set_imm_handler`](crate::Iface::set_imm_handler)) once the
    /// data is visible there. An empty iov (0 bytes) sends the immediate
    /// alone. Only where [`Caps::PUT_IMM`](crate::Caps::PUT_IMM) is
    /// advertised.
    ///
    /// The completion fires once the data has landed at the target (rc:
    /// the peer's acknowledgement; self: in the call; tcp: the target's
    /// answer), with the target's refusal if it refused the put; a refused
    /// put delivers no immediate. On tcp the target executes it only once
    /// it has connected an endpoint back to this iface (see
    /// [`Iface::set_imm_handler`](crate::Iface::set_imm_handler)): until
    /// then the put waits, and the endpoint fails after the peer timeout
    /// if the target never connects back.
    fn put_zcopy_imm(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        imm: u32,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let _ = (iov, remote_addr, rkey, imm, comp);
        Err(crate::UctError::unsupported(
            &transport_of::<Self>(),
            "put with immediate data (PUT_IMM)",
        ))
    }

    /// Reads `buf.len()` bytes at once; only where GET_SHORT is advertised.
    fn get_short(&mut self, buf: &mut [u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status>;

    /// Reads `len` bytes; they are delivered in `comp` as
    /// [`CompletionData::Bytes`](crate::CompletionData::Bytes).
    fn get_bcopy(
        &mut self,
        len: usize,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
    ) -> Result<Status>;

    /// Reads into the iov list without copying.
    fn get_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status>;

    /// Sends an active message of an 8-byte header and a short payload.
    fn am_short(&mut self, id: u8, header: u64, payload: &[u8]) -> Result<Status>;

    /// Sends an active message through a bounce buffer.
    fn am_bcopy(&mut self, id: u8, data: &[u8]) -> Result<Status>;

    /// Sends `header` followed by the iov list without copying the iov.
    fn am_zcopy(
        &mut self,
        id: u8,
        header: &[u8],
        iov: &[Iov<'_>],
        comp: Option<&Completion>,
    ) -> Result<Status>;

    /// Adds `value` to the remote word, without returning the old value.
    fn atomic_add(
        &mut self,
        value: AtomicValue,
        remote_addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Status>;

    /// A fetching atomic; the old value arrives in `comp`
    /// ([`Completion::value`]).
    fn atomic_fetch(
        &mut self,
        op: FetchOp,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
    ) -> Result<Status>;

    /// Completes every operation posted so far, remotely.
    fn flush(&mut self, comp: Option<&Completion>) -> Result<Status>;

    /// Orders operations posted after the fence after those before it.
    fn fence(&mut self) -> Result<Status>;

    /// This endpoint's address, for CONNECT_TO_EP transports.
    fn ep_address(&self) -> Result<Vec<u8>> {
        Err(crate::UctError::InvalidParam(
            "this transport connects to ifaces, not endpoints".into(),
        ))
    }

    /// Connects to a peer endpoint (CONNECT_TO_EP transports).
    fn connect_to_ep(&mut self, device_addr: &[u8], ep_addr: &[u8]) -> Result<()> {
        let _ = (device_addr, ep_addr);
        Err(crate::UctError::InvalidParam(
            "this transport connects to ifaces, not endpoints".into(),
        ))
    }

    /// Checks that the peer is alive, as UCX's `uct_ep_check`: returns
    /// [`EndpointFailed`](crate::UctError::EndpointFailed) (or the error
    /// that failed the endpoint) naming the peer once it is known dead, even
    /// with nothing outstanding. Cheap enough for every turn of a waiting
    /// loop: transports rate-limit the probe behind it (a pidfd poll for
    /// shared memory, the socket for tcp, a keepalive for rc) and find a dead
    /// peer within their `UCT_*_PEER_TIMEOUT`. Transports whose peer is this
    /// process answer `Ok`.
    fn check(&mut self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::transport_of;

    struct TcpEp;
    struct Ep;
    struct Wrapped<T>(T);

    #[test]
    fn transport_of_names_the_transport_from_the_endpoint_type() {
        assert_eq!(transport_of::<TcpEp>(), "tcp");
        assert_eq!(transport_of::<Ep>(), "ep");
        assert_eq!(transport_of::<Wrapped<TcpEp>>(), "wrapped");
    }
}
