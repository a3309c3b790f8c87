//! One non-blocking TCP connection: a queue of outgoing frames written with
//! `sendmsg` (header and user buffers gathered, no staging copy for zcopy;
//! a get's reply read from its region a chunk at a time, as the socket
//! takes it), and a receive buffer cut into frames. The receive buffer
//! holds a chunk, or the frame at its head once the link has checked that
//! frame's size; the replies queued to the peer are counted apart, so that
//! the link stops executing its requests while they wait.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{IpAddr, Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uct_core::{Completion, UctError};

use crate::outgoing::Outgoing;
pub use crate::outgoing::Payload;
use crate::sockopt::{
    delay_acks, owes_ack, send_owed_ack, set_linger_zero, set_peer_timeout, unconnected,
};
use crate::wire::{self, Header, Parsed};

/// Bytes a connection queues before senders get NoResource.
pub const SEND_QUEUE_LIMIT: usize = 8 << 20;
/// iovecs handed to one sendmsg.
const IOV_BATCH: usize = 64;
const READ_CHUNK: usize = 256 * 1024;

/// A connection and its queues.
pub struct Conn {
    stream: TcpStream,
    sendq: VecDeque<Outgoing>,
    queued: usize,
    /// Bytes of `queued` that answer the peer's requests, and how many
    /// frames.
    replies_queued: usize,
    reply_frames: usize,
    /// Replies whose data is still to be read from its region.
    unread_replies: usize,
    /// When the socket last took bytes, or the queue last became non-empty.
    last_sent: Instant,
    rbuf: Vec<u8>,
    rpos: usize,
    max_data: usize,
    /// Most bytes the receive buffer holds: one largest frame.
    rbuf_limit: usize,
    /// Length of the frame at the head of the receive buffer, once checked.
    expect: usize,
    /// Remembered: the kernel forgets it once the connection is reset.
    peer: String,
    peer_ip: Option<IpAddr>,
    /// Bytes read since the last [`send_owed_ack`](Self::send_owed_ack)
    /// or the last bytes written (which carry the ACK): the kernel may hold
    /// back the ACK of the last of them.
    read_since_ack: usize,
    /// Writes that took bytes, counted: the iface sends held-back ACKs
    /// after it wrote something (`Link::idle`).
    writes: u64,
    /// The iface's activity counter, bumped when a frame is queued, so
    /// that its next progress call scans its links (`quiet.rs`).
    activity: Option<Arc<AtomicU64>>,
}

impl Conn {
    /// Wraps a connected socket. `peer_timeout` bounds how long unacknowledged
    /// data and a silent peer are tolerated before the kernel reports an
    /// error (TCP_USER_TIMEOUT and keepalive).
    pub fn new(
        stream: TcpStream,
        max_data: usize,
        peer_timeout: Duration,
    ) -> Result<Conn, UctError> {
        stream
            .set_nonblocking(true)
            .map_err(|e| UctError::io("tcp: set non-blocking", e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| UctError::io("tcp: set TCP_NODELAY", e))?;
        set_peer_timeout(&stream, peer_timeout)?;
        delay_acks(stream.as_raw_fd());
        let peer_addr = stream.peer_addr().ok();
        let peer = peer_addr
            .map(|a| a.to_string())
            .unwrap_or_else(|| "an unknown peer".into());
        Ok(Conn {
            stream,
            sendq: VecDeque::new(),
            queued: 0,
            replies_queued: 0,
            reply_frames: 0,
            unread_replies: 0,
            last_sent: Instant::now(),
            rbuf: Vec::new(),
            rpos: 0,
            max_data,
            rbuf_limit: wire::PREFIX + wire::MAX_HEADER + max_data,
            expect: 0,
            peer,
            peer_ip: peer_addr.map(|a| a.ip()),
            read_since_ack: 0,
            writes: 0,
            activity: None,
        })
    }

    /// Counts the frames this connection queues in the iface's `activity`.
    pub fn report_activity_to(&mut self, activity: Arc<AtomicU64>) {
        self.activity = Some(activity);
    }

    /// The socket, for readiness polling.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.stream.as_raw_fd()
    }

    /// Whether frames wait to be written.
    pub fn wants_write(&self) -> bool {
        !self.sendq.is_empty()
    }

    pub fn peer(&self) -> String {
        self.peer.clone()
    }

    /// The IP the connection comes from.
    pub fn peer_ip(&self) -> Option<IpAddr> {
        self.peer_ip
    }

    /// Bytes of replies to the peer's requests not yet written.
    pub fn replies_queued(&self) -> usize {
        self.replies_queued
    }

    /// Reply frames not yet all written.
    pub fn reply_frames(&self) -> usize {
        self.reply_frames
    }

    /// Whether a reply's data is still to be read from its region: the
    /// requests after it must wait, so that none of them changes what it
    /// reads.
    pub fn reading_replies(&self) -> bool {
        self.unread_replies > 0
    }

    /// How long the peer has taken none of the bytes queued for it; None
    /// with nothing queued.
    pub fn stalled_for(&self) -> Option<Duration> {
        (!self.sendq.is_empty()).then(|| self.last_sent.elapsed())
    }

    /// When the socket last took bytes, or the queue last became non-empty.
    pub fn last_sent(&self) -> Instant {
        self.last_sent
    }

    /// Notes that a frame joins the queue.
    fn enqueue(&mut self, outgoing: Outgoing) {
        if let Some(activity) = &self.activity {
            activity.fetch_add(1, Ordering::Release);
        }
        if self.sendq.is_empty() {
            self.last_sent = Instant::now();
        }
        self.queued += outgoing.total;
        if outgoing.reply {
            self.replies_queued += outgoing.total;
            self.reply_frames += 1;
            self.unread_replies += usize::from(outgoing.unread());
        }
        self.sendq.push_back(outgoing);
    }

    /// Bytes received and not yet consumed.
    pub fn buffered(&self) -> usize {
        self.rbuf.len() - self.rpos
    }

    /// Queues the answer to a request of the peer; it is written with the
    /// next `write_out`.
    pub fn queue_reply(&mut self, header: &Header, payload: Payload) -> Result<(), UctError> {
        let data_len = payload.len();
        let head = wire::encode(header, data_len)?;
        let total = head.len() + data_len;
        self.enqueue(Outgoing {
            head,
            payload,
            written: 0,
            total,
            comp: None,
            reply: true,
        });
        Ok(())
    }

    /// Ends a connection that failed, now, not when the last endpoint
    /// holding the link is dropped, and abortively: the kernel drops what
    /// it still holds for the peer and resets the connection (SO_LINGER 0).
    /// A plain close would send that on for up to the peer timeout after
    /// this side gave up on it: a put landing after its re-post elsewhere
    /// (transfer's rails), over data written since. The socket is swapped
    /// for an unconnected one, which the failed link keeps until dropped;
    /// dropping a link that did not fail closes it plainly.
    pub fn abort(&mut self) {
        match unconnected() {
            Ok(spare) => {
                let failed = std::mem::replace(&mut self.stream, spare);
                set_linger_zero(&failed);
                drop(failed);
            }
            // Out of descriptors: it ends now all the same, and is reset
            // when dropped.
            Err(e) => {
                log::debug!(
                    "tcp: no socket to swap in ({e}); the failed connection is reset when dropped"
                );
                set_linger_zero(&self.stream);
                let _ = self.stream.shutdown(Shutdown::Both);
            }
        }
    }

    /// Whether the peer is gone with nothing left to read from it: it
    /// closed the connection (a process that dies closes its sockets) or
    /// the connection failed. The error names the peer. One poll, no read.
    pub fn peer_gone(&self) -> Option<UctError> {
        let mut pfd = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one initialised pollfd, exclusively borrowed for the call;
        // poll writes only its revents field.
        let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
        if ready <= 0 {
            return None;
        }
        if pfd.revents & libc::POLLERR != 0 {
            let e = self
                .stream
                .take_error()
                .ok()
                .flatten()
                .unwrap_or_else(|| std::io::Error::from(ErrorKind::ConnectionReset));
            return Some(peer_error("connection", &self.peer, e));
        }
        let hung_up = pfd.revents & (libc::POLLHUP | libc::POLLRDHUP) != 0;
        // What it sent before it went is still delivered by progress.
        if hung_up && self.unread() == 0 && self.buffered() == 0 {
            return Some(UctError::EndpointFailed(format!(
                "tcp peer {} closed the connection (its process exited or closed its iface)",
                self.peer
            )));
        }
        None
    }

    /// Bytes the kernel holds for us to read.
    fn unread(&self) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int at the pointer, a live local.
        let status = unsafe { libc::ioctl(self.stream.as_raw_fd(), libc::FIONREAD, &mut n) };
        if status == 0 {
            n.max(0) as usize
        } else {
            // Unknown: assume something is there and let progress read it.
            1
        }
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Whether the send queue is over its limit.
    pub fn is_full(&self) -> bool {
        self.queued >= SEND_QUEUE_LIMIT
    }

    /// Queues a frame and writes what the socket takes. Returns true when
    /// the whole frame is already written (`comp` is then not started).
    pub fn send(
        &mut self,
        header: &Header,
        payload: Payload,
        comp: Option<&Completion>,
    ) -> Result<bool, UctError> {
        let data_len = payload.len();
        let head = wire::encode(header, data_len)?;
        let total = head.len() + data_len;
        self.enqueue(Outgoing {
            head,
            payload,
            written: 0,
            total,
            comp: None,
            reply: false,
        });
        self.write_out()?;
        if self.sendq.is_empty() {
            return Ok(true);
        }
        if let (Some(comp), Some(last)) = (comp, self.sendq.back_mut()) {
            comp.start();
            last.comp = Some(comp.clone());
        }
        Ok(false)
    }

    /// Sends a frame whose data the caller lends only for this call: with
    /// nothing queued it goes out with one sendmsg and no copy; whatever the
    /// socket does not take is copied into the queue.
    pub fn send_borrowed(&mut self, header: &Header, parts: &[&[u8]]) -> Result<(), UctError> {
        let data_len: usize = parts.iter().map(|p| p.len()).sum();
        if !self.sendq.is_empty() || parts.len() > 7 {
            let mut data = Vec::with_capacity(data_len);
            for p in parts {
                data.extend_from_slice(p);
            }
            self.send(header, Payload::Bytes(data), None)?;
            return Ok(());
        }
        let mut head = [0u8; 256];
        let head_len = wire::encode_into(header, data_len, &mut head)?;
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 8];
        iov[0] = libc::iovec {
            iov_base: head.as_mut_ptr() as *mut libc::c_void,
            iov_len: head_len,
        };
        for (i, p) in parts.iter().enumerate() {
            iov[i + 1] = libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            };
        }
        let total = head_len + data_len;
        // SAFETY: msghdr is plain data; zeroed is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = (parts.len() + 1) as _;
        let sent = loop {
            // SAFETY: `msg` names parts.len() + 1 <= 8 initialised iovecs of
            // `iov`, which point at the head_len encoded bytes of `head` and at the
            // caller's slices, all borrowed for this call; sendmsg only
            // reads them. MSG_NOSIGNAL avoids SIGPIPE.
            let n = unsafe {
                libc::sendmsg(
                    self.stream.as_raw_fd(),
                    &msg,
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                break n as usize;
            }
            let e = std::io::Error::last_os_error();
            match e.kind() {
                ErrorKind::WouldBlock => break 0,
                ErrorKind::Interrupted => continue,
                _ => return Err(peer_error("send", &self.peer(), e)),
            }
        };
        if sent > 0 {
            self.wrote();
        }
        if sent == total {
            return Ok(());
        }
        // Queue the rest, copied.
        let mut rest = Vec::with_capacity(total - sent);
        let mut skip = sent;
        for piece in std::iter::once(&head[..head_len]).chain(parts.iter().copied()) {
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            rest.extend_from_slice(&piece[skip..]);
            skip = 0;
        }
        let len = rest.len();
        self.enqueue(Outgoing {
            head: rest,
            payload: Payload::None,
            written: 0,
            total: len,
            comp: None,
            reply: false,
        });
        Ok(())
    }

    /// Writes queued frames until the socket would block, reading a get
    /// reply's next chunk from its region when the last one is written (a
    /// region that became unreadable meanwhile is an error: the reply
    /// cannot be finished).
    pub fn write_out(&mut self) -> Result<usize, UctError> {
        let mut total = 0usize;
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(IOV_BATCH);
        while let Some(front) = self.sendq.front_mut() {
            if front.refill()? {
                self.unread_replies = self.unread_replies.saturating_sub(1);
            }
            iov.clear();
            for outgoing in self.sendq.iter() {
                let whole = outgoing.pieces(&mut iov);
                if iov.len() >= IOV_BATCH || !whole {
                    break;
                }
            }
            iov.truncate(IOV_BATCH);
            if iov.is_empty() {
                break;
            }
            // SAFETY: msghdr is plain data; zeroed is a valid empty header.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = iov.len() as _;
            // SAFETY: `msg` names the iov.len() iovecs of `iov`, which lives
            // across the call; each points into a buffer owned by the queue
            // (header, bytes) or into a live memory handle it holds, within
            // its length; sendmsg only reads them. MSG_NOSIGNAL turns a
            // closed peer into EPIPE, not SIGPIPE.
            let n = unsafe {
                libc::sendmsg(
                    self.stream.as_raw_fd(),
                    &msg,
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    ErrorKind::WouldBlock => break,
                    ErrorKind::Interrupted => continue,
                    _ => return Err(peer_error("send", &self.peer(), e)),
                }
            }
            let mut sent = n as usize;
            total += sent;
            if sent > 0 {
                self.wrote();
            }
            self.queued = self.queued.saturating_sub(sent);
            while sent > 0 {
                let Some(front) = self.sendq.front_mut() else {
                    break;
                };
                let left = front.total - front.written;
                if front.reply {
                    self.replies_queued = self.replies_queued.saturating_sub(left.min(sent));
                }
                if sent >= left {
                    sent -= left;
                    self.pop_written();
                } else {
                    front.written += sent;
                    sent = 0;
                }
            }
            // Zero-length frames are complete at once.
            while self.sendq.front().is_some_and(|o| o.total == o.written) {
                self.pop_written();
            }
        }
        Ok(total)
    }

    /// The socket took bytes: the peer is taking them, and they carry the
    /// ACK of what was read.
    fn wrote(&mut self) {
        self.last_sent = Instant::now();
        self.read_since_ack = 0;
        self.writes = self.writes.wrapping_add(1);
        if let Some(activity) = &self.activity {
            activity.fetch_add(1, Ordering::Release);
        }
    }

    /// Writes that took bytes so far (wrapping).
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// Drops the written frame at the head of the queue, firing its
    /// completion.
    fn pop_written(&mut self) {
        let Some(outgoing) = self.sendq.pop_front() else {
            return;
        };
        if outgoing.reply {
            self.reply_frames = self.reply_frames.saturating_sub(1);
        }
        if let Some(comp) = outgoing.comp {
            comp.finish(Ok(()));
        }
    }

    /// Reads what has arrived into the receive buffer, without zeroing it
    /// first, while it holds less than READ_CHUNK bytes, or less than the
    /// frame at its head once the link has checked that frame's size
    /// ([`expect_frame`](Self::expect_frame)): what a peer makes us buffer
    /// is bounded by what its frames may carry, never by what it sends.
    /// Returns true when it stopped for lack of room (the socket may hold
    /// more). An orderly close or a reset is an error.
    pub fn read_in(&mut self) -> Result<bool, UctError> {
        loop {
            if self.rpos > 0 && self.rpos == self.rbuf.len() {
                self.rbuf.clear();
                self.rpos = 0;
            }
            let limit = self.expect.max(READ_CHUNK).min(self.rbuf_limit);
            let room = limit.saturating_sub(self.buffered());
            if room == 0 {
                return Ok(true);
            }
            if self.rbuf.capacity() - self.rbuf.len() < room {
                if self.rpos > 0 {
                    self.rbuf.drain(..self.rpos);
                    self.rpos = 0;
                }
                // Exact, so that the buffer never doubles past the limit.
                if self.rbuf.capacity() - self.rbuf.len() < room {
                    self.rbuf.reserve_exact(room);
                }
            }
            let spare = (self.rbuf.capacity() - self.rbuf.len()).min(room);
            let at = self.rbuf.len();
            // SAFETY: `spare` bytes past the length are allocated; recv
            // writes at most that many and we extend the length only by what
            // it wrote.
            let n = unsafe {
                libc::recv(
                    self.stream.as_raw_fd(),
                    self.rbuf.as_mut_ptr().add(at) as *mut libc::c_void,
                    spare,
                    libc::MSG_DONTWAIT,
                )
            };
            match n {
                0 => {
                    return Err(UctError::EndpointFailed(format!(
                        "tcp peer {} closed the connection",
                        self.peer()
                    )))
                }
                n if n > 0 => {
                    self.read_since_ack = self.read_since_ack.saturating_add(n as usize);
                    // SAFETY: recv initialised n bytes past `at`.
                    unsafe { self.rbuf.set_len(at + n as usize) };
                    if (n as usize) < spare {
                        return Ok(false);
                    }
                }
                _ => {
                    let e = std::io::Error::last_os_error();
                    match e.kind() {
                        ErrorKind::WouldBlock => return Ok(false),
                        ErrorKind::Interrupted => {}
                        _ => return Err(peer_error("receive", &self.peer(), e)),
                    }
                }
            }
        }
    }

    /// The frame at the head of the receive buffer, `total` bytes long, was
    /// checked and may be buffered whole.
    pub fn expect_frame(&mut self, total: usize) {
        self.expect = total.min(self.rbuf_limit);
    }

    /// Looks at the next frame in the receive buffer.
    pub fn peek(&self) -> Result<Parsed, String> {
        wire::parse(&self.rbuf[self.rpos..], self.max_data)
    }

    /// Received bytes at `at` (relative to the next frame).
    pub fn data(&self, at: usize, len: usize) -> &[u8] {
        &self.rbuf[self.rpos + at..self.rpos + at + len]
    }

    /// Drops `n` bytes of the next frame from the receive buffer.
    pub fn consume(&mut self, n: usize) {
        self.expect = 0;
        self.rpos = (self.rpos + n).min(self.rbuf.len());
        if self.rpos == self.rbuf.len() {
            self.rbuf.clear();
            self.rpos = 0;
        }
    }

    /// Reads at most `buf.len()` bytes into `buf`. Ok(0) means nothing is
    /// there now.
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<usize, UctError> {
        // SAFETY: `buf` is an exclusive borrow of buf.len() writable bytes.
        unsafe { self.recv_into(buf.as_mut_ptr(), buf.len()) }
    }

    /// Reads at most `len` bytes straight into `dst` (a large put's target).
    /// Ok(0) means nothing is there now.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes for the whole call, and
    /// nothing else may read or write them meanwhile.
    pub unsafe fn recv_into(&mut self, dst: *mut u8, len: usize) -> Result<usize, UctError> {
        loop {
            // SAFETY: the caller guarantees `len` writable bytes at `dst`;
            // recv writes at most `len` bytes there.
            let n = unsafe {
                libc::recv(
                    self.stream.as_raw_fd(),
                    dst as *mut libc::c_void,
                    len,
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                self.read_since_ack = self.read_since_ack.saturating_add(n as usize);
                return Ok(n as usize);
            }
            if n == 0 && len > 0 {
                return Err(UctError::EndpointFailed(format!(
                    "tcp peer {} closed the connection",
                    self.peer()
                )));
            }
            let e = std::io::Error::last_os_error();
            match e.kind() {
                ErrorKind::WouldBlock => return Ok(0),
                ErrorKind::Interrupted => {}
                _ => return Err(peer_error("receive", &self.peer(), e)),
            }
        }
    }

    /// Sends the ACK held back for what was read (see
    /// [`delay_acks`](crate::sockopt::delay_acks)), if anything was read
    /// since the last call or write: for a link with nothing to do, once
    /// this side has answered on another link, so that the ACK is off the
    /// path of the answer (a one-way stream is left to the kernel's ACKs).
    /// Not after more than [`SKIP_ACK_ABOVE`](crate::sockopt::SKIP_ACK_ABOVE)
    /// bytes read (see there).
    pub fn send_owed_ack(&mut self) {
        if owes_ack(std::mem::take(&mut self.read_since_ack)) {
            send_owed_ack(self.stream.as_raw_fd());
        }
    }

    /// Fails every queued frame's completion.
    pub fn fail_queued(&mut self, err: &UctError) {
        for outgoing in self.sendq.drain(..) {
            if let Some(comp) = outgoing.comp {
                comp.finish(Err(err.clone()));
            }
        }
        self.queued = 0;
        self.replies_queued = 0;
        self.reply_frames = 0;
        self.unread_replies = 0;
    }
}

fn peer_error(what: &str, peer: &str, e: std::io::Error) -> UctError {
    UctError::EndpointFailed(format!("tcp {what} to {peer} failed: {e}"))
}
