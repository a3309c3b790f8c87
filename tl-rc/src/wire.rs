//! What rc puts on the wire: the device, iface and endpoint addresses peers
//! exchange, and the layout of the immediate data of a send. Decoding takes
//! bytes from a peer: it never panics, and names what is wrong.

/// Length of a device address: GID (16), LID (2, little-endian), path MTU
/// as the verbs enum (1).
pub const DEVICE_ADDRESS_LEN: usize = 19;
/// Length of an iface address: rc connects endpoint to endpoint, so none.
pub const IFACE_ADDRESS_LEN: usize = 0;
/// Length of an endpoint address: QP number and first PSN, each 4 bytes
/// little-endian.
pub const EP_ADDRESS_LEN: usize = 8;

/// The verbs MTU enum's range: IBV_MTU_256 (1) to IBV_MTU_4096 (5).
pub const MTU_MIN: u8 = 1;
/// See [`MTU_MIN`].
pub const MTU_MAX: u8 = 5;

/// QP numbers and PSNs are 24 bits.
const MAX_24: u32 = 0xff_ffff;

/// Immediate of the empty sends a flush used before it signalled the tail
/// with a zero-length RDMA write; the receiver still drops them.
pub const NOP_IMM: u32 = 0xff;

/// A malformed address or immediate from a peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("not an rc device address ({len} bytes, expected {DEVICE_ADDRESS_LEN})")]
    DeviceAddressLength { len: usize },
    #[error("not an rc device address: path MTU code {0} is not one of 1 (256) to 5 (4096)")]
    Mtu(u8),
    #[error("not an rc iface address ({len} bytes; rc has none)")]
    IfaceAddressLength { len: usize },
    #[error("not an rc endpoint address ({len} bytes, expected {EP_ADDRESS_LEN})")]
    EpAddressLength { len: usize },
    #[error("not an rc endpoint address: QP number {0:#x} is wider than 24 bits")]
    Qpn(u32),
    #[error("not an rc endpoint address: PSN {0:#x} is wider than 24 bits")]
    Psn(u32),
    #[error("immediate data {0:#x} is neither an active message id nor a flush")]
    Immediate(u32),
}

impl From<WireError> for uct_core::UctError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Immediate(_) => uct_core::UctError::Protocol(e.to_string()),
            _ => uct_core::UctError::InvalidParam(e.to_string()),
        }
    }
}

/// Where a port is: what a peer needs to build a path to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAddress {
    pub gid: [u8; 16],
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// The port's active MTU, as the verbs enum (1..=5).
    pub mtu: u8,
}

impl DeviceAddress {
    /// The address's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(DEVICE_ADDRESS_LEN);
        out.extend_from_slice(&self.gid);
        out.extend_from_slice(&self.lid.to_le_bytes());
        out.push(self.mtu);
        out
    }

    /// Reads an address a peer sent.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let bytes: &[u8; DEVICE_ADDRESS_LEN] = bytes
            .try_into()
            .map_err(|_| WireError::DeviceAddressLength { len: bytes.len() })?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[..16]);
        let mtu = bytes[18];
        if !(MTU_MIN..=MTU_MAX).contains(&mtu) {
            return Err(WireError::Mtu(mtu));
        }
        Ok(DeviceAddress {
            gid,
            lid: u16::from_le_bytes([bytes[16], bytes[17]]),
            mtu,
        })
    }
}

/// Checks an iface address: rc has none, so it must be empty.
pub fn decode_iface_address(bytes: &[u8]) -> Result<(), WireError> {
    if bytes.len() != IFACE_ADDRESS_LEN {
        return Err(WireError::IfaceAddressLength { len: bytes.len() });
    }
    Ok(())
}

/// Which QP to connect to, and the PSN its first send carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpAddress {
    pub qpn: u32,
    pub psn: u32,
}

impl EpAddress {
    /// The address's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(EP_ADDRESS_LEN);
        out.extend_from_slice(&self.qpn.to_le_bytes());
        out.extend_from_slice(&self.psn.to_le_bytes());
        out
    }

    /// Reads an address a peer sent.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let bytes: &[u8; EP_ADDRESS_LEN] = bytes
            .try_into()
            .map_err(|_| WireError::EpAddressLength { len: bytes.len() })?;
        let qpn = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let psn = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        if qpn > MAX_24 {
            return Err(WireError::Qpn(qpn));
        }
        if psn > MAX_24 {
            return Err(WireError::Psn(psn));
        }
        Ok(EpAddress { qpn, psn })
    }
}

/// What a send's immediate data says (host order; verbs carries it in
/// network order, which the I/O layer converts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Immediate {
    /// An active message with this id; the payload is the message.
    ActiveMessage(u8),
    /// An empty send that made a flush's completion visible (a peer of an
    /// earlier build sends one); dropped.
    Nop,
}

impl Immediate {
    /// The immediate's value, in host order.
    pub fn encode(self) -> u32 {
        match self {
            Immediate::ActiveMessage(id) => u32::from(id),
            Immediate::Nop => NOP_IMM,
        }
    }

    /// Reads the immediate of a received send (in host order). Ids that no
    /// handler can have are left to the handler table to drop.
    pub fn decode(value: u32) -> Result<Self, WireError> {
        match value {
            NOP_IMM => Ok(Immediate::Nop),
            id @ 0..=0xfe => Ok(Immediate::ActiveMessage(id as u8)),
            other => Err(WireError::Immediate(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small xorshift: random bytes without a dependency.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn bytes(&mut self, len: usize) -> Vec<u8> {
            (0..len).map(|_| self.next() as u8).collect()
        }
    }

    fn device() -> DeviceAddress {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 0, 0, 2]);
        DeviceAddress {
            gid,
            lid: 0x1234,
            mtu: 3,
        }
    }

    #[test]
    fn device_address_round_trips() {
        let addr = device();
        let bytes = addr.encode();
        assert_eq!(bytes.len(), DEVICE_ADDRESS_LEN);
        assert_eq!(&bytes[16..18], &[0x34, 0x12], "LID is little-endian");
        assert_eq!(DeviceAddress::decode(&bytes), Ok(addr));
    }

    #[test]
    fn device_address_refuses_wrong_length_and_mtu() {
        let bytes = device().encode();
        assert_eq!(
            DeviceAddress::decode(&bytes[..18]),
            Err(WireError::DeviceAddressLength { len: 18 })
        );
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            DeviceAddress::decode(&longer),
            Err(WireError::DeviceAddressLength { len: 20 })
        );
        for mtu in [0u8, 6, 0xff] {
            let mut bad = bytes.clone();
            bad[18] = mtu;
            assert_eq!(DeviceAddress::decode(&bad), Err(WireError::Mtu(mtu)));
        }
        let e: uct_core::UctError = WireError::DeviceAddressLength { len: 3 }.into();
        assert!(
            e.to_string().contains("not an rc device address (3 bytes"),
            "{e}"
        );
    }

    #[test]
    fn ep_address_round_trips_and_checks_24_bits() {
        let addr = EpAddress {
            qpn: 0x11,
            psn: 0xab_cdef,
        };
        let bytes = addr.encode();
        assert_eq!(bytes, [0x11, 0, 0, 0, 0xef, 0xcd, 0xab, 0]);
        assert_eq!(EpAddress::decode(&bytes), Ok(addr));
        let mut wide = bytes.clone();
        wide[3] = 1;
        assert_eq!(EpAddress::decode(&wide), Err(WireError::Qpn(0x0100_0011)));
        let mut wide = bytes;
        wide[7] = 0x80;
        assert_eq!(EpAddress::decode(&wide), Err(WireError::Psn(0x80ab_cdef)));
        assert_eq!(
            EpAddress::decode(&[1, 2, 3]),
            Err(WireError::EpAddressLength { len: 3 })
        );
    }

    #[test]
    fn iface_address_is_empty() {
        assert_eq!(decode_iface_address(&[]), Ok(()));
        assert_eq!(
            decode_iface_address(&[0]),
            Err(WireError::IfaceAddressLength { len: 1 })
        );
    }

    #[test]
    fn immediate_layout() {
        for id in [0u8, 1, 31, 0xfe] {
            let imm = Immediate::ActiveMessage(id);
            assert_eq!(imm.encode(), u32::from(id));
            assert_eq!(Immediate::decode(imm.encode()), Ok(imm));
        }
        assert_eq!(Immediate::Nop.encode(), 0xff);
        assert_eq!(Immediate::decode(0xff), Ok(Immediate::Nop));
        for bad in [0x100u32, 0xff00_0000, u32::MAX] {
            assert_eq!(Immediate::decode(bad), Err(WireError::Immediate(bad)));
        }
        let e: uct_core::UctError = WireError::Immediate(0x100).into();
        assert!(matches!(e, uct_core::UctError::Protocol(_)), "{e:?}");
    }

    /// Random, truncated and bit-flipped inputs: every decoder answers,
    /// never panics, and accepts exactly what it can re-encode.
    #[test]
    fn decoders_never_panic_on_garbage() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let good_dev = device().encode();
        let good_ep = EpAddress { qpn: 7, psn: 9 }.encode();
        for round in 0..20_000 {
            let input = match round % 4 {
                0 => {
                    let len = (rng.next() % 40) as usize;
                    rng.bytes(len)
                }
                1 => {
                    let cut = (rng.next() as usize) % (good_dev.len() + 1);
                    good_dev[..cut].to_vec()
                }
                2 => {
                    let mut flipped = good_dev.clone();
                    let bit = (rng.next() as usize) % (flipped.len() * 8);
                    flipped[bit / 8] ^= 1 << (bit % 8);
                    flipped
                }
                _ => {
                    let mut flipped = good_ep.clone();
                    let bit = (rng.next() as usize) % (flipped.len() * 8);
                    flipped[bit / 8] ^= 1 << (bit % 8);
                    flipped
                }
            };
            if let Ok(dev) = DeviceAddress::decode(&input) {
                assert_eq!(dev.encode(), input);
            }
            if let Ok(ep) = EpAddress::decode(&input) {
                assert_eq!(ep.encode(), input);
            }
            let _ = decode_iface_address(&input);
            let imm = rng.next() as u32;
            if let Ok(decoded) = Immediate::decode(imm) {
                assert_eq!(decoded.encode(), imm);
            }
        }
    }
}
