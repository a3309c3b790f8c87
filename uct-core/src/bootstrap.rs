//! The out-of-band bootstrap channel: a TCP connection two processes use to
//! swap addresses and rkeys before any transport is connected.
//!
//! Every frame is `"UCTB"`, version (u16), kind (u16), length (u32), then
//! the payload; all little-endian. Both sides send a hello first and refuse
//! a peer of another version. Reads and connects are bounded by a timeout;
//! a peer that sends garbage gets an error, never a panic.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

const MAGIC: [u8; 4] = *b"UCTB";
/// Protocol version; both sides must match.
pub const BOOTSTRAP_VERSION: u16 = 1;
/// Largest payload accepted by default.
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;
const HEADER_LEN: usize = 12;
const KIND_HELLO: u16 = 1;
const KIND_DATA: u16 = 2;

/// Errors of the bootstrap layer.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum BootstrapError {
    /// A socket call failed.
    #[error("bootstrap {what} failed: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The socket's error.
        #[source]
        source: crate::error::ErrorSource,
    },
    /// The peer did not answer in time.
    #[error("bootstrap {what} timed out after {timeout:?}; check that the peer is running and reachable, or raise UCT_BOOTSTRAP_TIMEOUT")]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long.
        timeout: Duration,
    },
    /// The peer's frames do not start with the protocol's magic.
    #[error("the bootstrap peer is not speaking the uct-rs bootstrap protocol (bad frame magic); check the host and port")]
    BadMagic,
    /// The peer speaks another protocol version.
    #[error("the bootstrap peer uses protocol version {theirs}, this side {ours}; run the same uct-rs version on both sides")]
    VersionMismatch {
        /// This side's version.
        ours: u16,
        /// The peer's version.
        theirs: u16,
    },
    /// A frame longer than the limit.
    #[error("the bootstrap peer sent a {len}-byte frame, more than the {max} allowed")]
    TooLarge {
        /// The length the frame header announced.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A frame kind this side does not expect here.
    #[error("the bootstrap peer sent an unexpected frame kind {0}")]
    UnexpectedKind(u16),
    /// The peer closed the connection.
    #[error("the bootstrap peer closed the connection")]
    Closed,
    /// A message body that does not decode.
    #[error("the bootstrap peer sent a message that does not decode: {0}")]
    Decode(String),
}

type Result<T> = std::result::Result<T, BootstrapError>;

fn io_err(what: &str, e: std::io::Error) -> BootstrapError {
    BootstrapError::Io {
        what: what.into(),
        source: e.into(),
    }
}

/// The accepting side.
pub struct BootstrapListener {
    listener: TcpListener,
    timeout: Duration,
}

impl BootstrapListener {
    /// Listens on `addr` (port 0 picks a free port).
    pub fn bind(addr: impl ToSocketAddrs, timeout: Duration) -> Result<Self> {
        let listener = TcpListener::bind(addr).map_err(|e| io_err("listen", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io_err("listen", e))?;
        Ok(BootstrapListener { listener, timeout })
    }

    /// The address the listener is bound to (with the port the OS chose).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(|e| io_err("listen", e))
    }

    /// Waits for one peer and completes the hello exchange.
    pub fn accept(&self) -> Result<BootstrapChannel> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    return BootstrapChannel::handshake(stream, self.timeout);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(BootstrapError::Timeout {
                            what: "accept".into(),
                            timeout: self.timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err("accept", e)),
            }
        }
    }
}

/// A connected bootstrap channel.
pub struct BootstrapChannel {
    stream: TcpStream,
    timeout: Duration,
    max_frame: usize,
}

impl BootstrapChannel {
    /// Connects to a listener, retrying until `timeout` (the peer may not be
    /// listening yet).
    pub fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> Result<Self> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| io_err("address lookup", e))?
            .collect();
        if addrs.is_empty() {
            return Err(io_err(
                "address lookup",
                std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
            ));
        }
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        loop {
            for a in &addrs {
                let left = deadline.saturating_duration_since(Instant::now());
                match TcpStream::connect_timeout(a, left.max(Duration::from_millis(1))) {
                    Ok(s) => return Self::handshake(s, timeout),
                    Err(e) => last = format!("{a}: {e}"),
                }
            }
            if Instant::now() >= deadline {
                return Err(BootstrapError::Timeout {
                    what: format!("connect ({last})"),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn handshake(stream: TcpStream, timeout: Duration) -> Result<Self> {
        stream
            .set_nonblocking(false)
            .map_err(|e| io_err("setup", e))?;
        // Latency of small exchanges matters more than throughput here.
        let _ = stream.set_nodelay(true);
        let mut ch = BootstrapChannel {
            stream,
            timeout,
            max_frame: DEFAULT_MAX_FRAME,
        };
        ch.write_frame(KIND_HELLO, &[])?;
        let (kind, _) = ch.read_frame()?;
        if kind != KIND_HELLO {
            return Err(BootstrapError::UnexpectedKind(kind));
        }
        Ok(ch)
    }

    /// Sets the largest payload accepted from the peer.
    pub fn set_max_frame(&mut self, max: usize) {
        self.max_frame = max;
    }

    /// The peer's address, when the socket still knows it.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.stream.peer_addr().ok()
    }

    fn write_frame(&mut self, kind: u16, payload: &[u8]) -> Result<()> {
        let len = u32::try_from(payload.len()).map_err(|_| BootstrapError::TooLarge {
            len: payload.len(),
            max: u32::MAX as usize,
        })?;
        let mut hdr = [0u8; HEADER_LEN];
        hdr[..4].copy_from_slice(&MAGIC);
        hdr[4..6].copy_from_slice(&BOOTSTRAP_VERSION.to_le_bytes());
        hdr[6..8].copy_from_slice(&kind.to_le_bytes());
        hdr[8..12].copy_from_slice(&len.to_le_bytes());
        self.stream
            .set_write_timeout(Some(self.timeout))
            .map_err(|e| io_err("send", e))?;
        let r = self
            .stream
            .write_all(&hdr)
            .and_then(|_| self.stream.write_all(payload));
        r.map_err(|e| self.map_io("send", e))
    }

    fn map_io(&self, what: &str, e: std::io::Error) -> BootstrapError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => BootstrapError::Timeout {
                what: what.into(),
                timeout: self.timeout,
            },
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::ConnectionAborted => BootstrapError::Closed,
            _ => io_err(what, e),
        }
    }

    fn read_exact_by(&mut self, buf: &mut [u8], deadline: Instant) -> Result<()> {
        let mut at = 0;
        while at < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(BootstrapError::Timeout {
                    what: "receive".into(),
                    timeout: self.timeout,
                });
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| io_err("receive", e))?;
            match self.stream.read(&mut buf[at..]) {
                Ok(0) => return Err(BootstrapError::Closed),
                Ok(n) => at += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.map_io("receive", e)),
            }
        }
        Ok(())
    }

    fn read_frame(&mut self) -> Result<(u16, Vec<u8>)> {
        let deadline = Instant::now() + self.timeout;
        let mut hdr = [0u8; HEADER_LEN];
        self.read_exact_by(&mut hdr, deadline)?;
        if hdr[..4] != MAGIC {
            return Err(BootstrapError::BadMagic);
        }
        let version = u16::from_le_bytes([hdr[4], hdr[5]]);
        if version != BOOTSTRAP_VERSION {
            return Err(BootstrapError::VersionMismatch {
                ours: BOOTSTRAP_VERSION,
                theirs: version,
            });
        }
        let kind = u16::from_le_bytes([hdr[6], hdr[7]]);
        let len = u32::from_le_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]) as usize;
        if len > self.max_frame {
            return Err(BootstrapError::TooLarge {
                len,
                max: self.max_frame,
            });
        }
        let mut payload = vec![0u8; len];
        self.read_exact_by(&mut payload, deadline)?;
        Ok((kind, payload))
    }

    /// Sends one message.
    pub fn send(&mut self, payload: &[u8]) -> Result<()> {
        self.write_frame(KIND_DATA, payload)
    }

    /// Receives one message, waiting at most the channel's timeout.
    pub fn recv(&mut self) -> Result<Vec<u8>> {
        let (kind, payload) = self.read_frame()?;
        if kind != KIND_DATA {
            return Err(BootstrapError::UnexpectedKind(kind));
        }
        Ok(payload)
    }

    /// Sends a value encoded with postcard.
    pub fn send_msg<T: Serialize>(&mut self, value: &T) -> Result<()> {
        let bytes =
            postcard::to_stdvec(value).map_err(|e| BootstrapError::Decode(e.to_string()))?;
        self.send(&bytes)
    }

    /// Receives a value encoded with postcard.
    pub fn recv_msg<T: DeserializeOwned>(&mut self) -> Result<T> {
        let bytes = self.recv()?;
        let (v, rest) = postcard::take_from_bytes::<T>(&bytes)
            .map_err(|e| BootstrapError::Decode(e.to_string()))?;
        if !rest.is_empty() {
            return Err(BootstrapError::Decode(format!(
                "{} trailing bytes",
                rest.len()
            )));
        }
        Ok(v)
    }

    /// Sends ours, returns theirs.
    pub fn exchange<T: Serialize + DeserializeOwned>(&mut self, ours: &T) -> Result<T> {
        self.send_msg(ours)?;
        self.recv_msg()
    }

    /// Whether a message (or a close) is waiting, after at most `timeout`.
    /// Lets a caller interleave other work with listening.
    pub fn poll_readable(&self, timeout: Duration) -> Result<bool> {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for a socket this channel owns.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(io_err("poll", e));
        }
        Ok(r > 0)
    }

    /// Waits until both sides reach this point.
    pub fn barrier(&mut self) -> Result<()> {
        self.send(b"barrier")?;
        let got = self.recv()?;
        if got != b"barrier" {
            return Err(BootstrapError::Decode("expected a barrier message".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn exchange_between_threads() {
        let l = BootstrapListener::bind("127.0.0.1:0", T).unwrap();
        let addr = l.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            let mut c = BootstrapChannel::connect(addr, T).unwrap();
            let got: (u32, Vec<u8>) = c.exchange(&(7u32, vec![1u8, 2, 3])).unwrap();
            c.barrier().unwrap();
            got
        });
        let mut s = l.accept().unwrap();
        let got: (u32, Vec<u8>) = s.exchange(&(9u32, vec![4u8])).unwrap();
        s.barrier().unwrap();
        assert_eq!(got, (7, vec![1, 2, 3]));
        assert_eq!(h.join().unwrap(), (9, vec![4]));
    }

    #[test]
    fn garbage_peer_gets_an_error() {
        let l = BootstrapListener::bind("127.0.0.1:0", Duration::from_secs(2)).unwrap();
        let addr = l.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n garbage garbage");
            std::thread::sleep(Duration::from_millis(200));
        });
        assert_eq!(l.accept().err(), Some(BootstrapError::BadMagic));
        h.join().unwrap();
    }

    #[test]
    fn oversized_and_wrong_version_frames_are_refused() {
        for (version, len, want_too_large) in
            [(BOOTSTRAP_VERSION, u32::MAX, true), (99u16, 0, false)]
        {
            let l = BootstrapListener::bind("127.0.0.1:0", Duration::from_secs(2)).unwrap();
            let addr = l.local_addr().unwrap();
            let h = std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                let mut f = MAGIC.to_vec();
                f.extend_from_slice(&version.to_le_bytes());
                f.extend_from_slice(&KIND_HELLO.to_le_bytes());
                f.extend_from_slice(&len.to_le_bytes());
                let _ = s.write_all(&f);
                std::thread::sleep(Duration::from_millis(200));
            });
            let err = l.accept().err().unwrap();
            if want_too_large {
                assert!(matches!(err, BootstrapError::TooLarge { .. }), "{err}");
            } else {
                assert!(
                    matches!(err, BootstrapError::VersionMismatch { theirs: 99, .. }),
                    "{err}"
                );
            }
            h.join().unwrap();
        }
    }

    #[test]
    fn silent_peer_times_out() {
        let l = BootstrapListener::bind("127.0.0.1:0", Duration::from_millis(300)).unwrap();
        let addr = l.local_addr().unwrap();
        let _s = TcpStream::connect(addr).unwrap();
        let t0 = Instant::now();
        assert!(matches!(l.accept(), Err(BootstrapError::Timeout { .. })));
        assert!(t0.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn undecodable_message_is_an_error() {
        let l = BootstrapListener::bind("127.0.0.1:0", T).unwrap();
        let addr = l.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            let mut c = BootstrapChannel::connect(addr, T).unwrap();
            c.send(&[0xff; 3]).unwrap();
        });
        let mut s = l.accept().unwrap();
        let r: Result<(u64, String)> = s.recv_msg();
        assert!(matches!(r, Err(BootstrapError::Decode(_))));
        h.join().unwrap();
    }
}
