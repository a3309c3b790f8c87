//! The session's buffers and operations as the measurement loops use them:
//! bytes of the send and receive buffers (directly, or through staging for
//! memory the CPU cannot touch), progress until something holds, and
//! posting a put, get or active message until the transport accepts it.
//! Every loop here probes the peer's liveness and has a deadline.

use std::time::{Duration, Instant};

use uct_core::{Completion, Endpoint, Iov, MemHandle, Status};

use super::error::{PerfError, Result};
use super::params::{Layout, Op};
use super::pattern::pattern_into;
use super::session::{Session, AM_ID};

/// One of the session's two buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Buffer {
    /// What this side sends (and where gets land).
    Send,
    /// What the peer writes into.
    Recv,
}

impl Buffer {
    fn handle(self, session: &Session) -> MemHandle {
        match self {
            Buffer::Send => session.send.clone(),
            Buffer::Recv => session.recv.clone(),
        }
    }
}

/// The 8 bytes at `offset` of the receive buffer, little-endian; 0 when the
/// buffer is not host memory.
pub(super) fn read_recv_u64(session: &Session, offset: usize) -> u64 {
    match session.recv.host_ptr(offset, 8) {
        // SAFETY: host_ptr checked that these 8 bytes lie inside the live
        // host memory of the receive buffer, which the session owns; the
        // peer may write it at any time, hence the volatile read; read as
        // bytes, so alignment does not matter.
        Ok(ptr) => u64::from_le_bytes(unsafe { std::ptr::read_volatile(ptr as *const [u8; 8]) }),
        Err(_) => 0,
    }
}

/// The first `len` bytes of a session buffer, when it is host memory.
pub(super) fn host_bytes(mem: &MemHandle, len: usize) -> &[u8] {
    match mem.host_ptr(0, len) {
        // SAFETY: host_ptr checked that `len` bytes from the start lie
        // inside the handle's live host memory, which lives as long as the
        // borrowed handle; the peer may write it, as with any RDMA buffer.
        Ok(ptr) => unsafe { std::slice::from_raw_parts(ptr, len) },
        Err(_) => &[],
    }
}

/// Runs `f` on the first `len` bytes of a session buffer (on nothing when
/// it is not host memory).
pub(super) fn with_host_bytes_mut<R>(
    mem: &MemHandle,
    len: usize,
    f: impl FnOnce(&mut [u8]) -> R,
) -> R {
    match mem.host_ptr(0, len) {
        // SAFETY: host_ptr checked that `len` bytes from the start lie
        // inside the handle's live host memory; only this thread writes
        // it, and the slice lives only during `f`.
        Ok(ptr) => f(unsafe { std::slice::from_raw_parts_mut(ptr, len) }),
        Err(_) => f(&mut []),
    }
}

/// Turns of a waiting or posting loop between two liveness probes of the
/// endpoint. The transports rate-limit their probe by time, which costs a
/// clock read per call; counting turns here keeps that read off most turns
/// of the loops being measured. A turn is at least a progress call, so the
/// probe still runs every few microseconds. (Every 64 turns, the clock read
/// was 6% of a posix 8 KiB am_lat round trip.)
pub(super) const CHECK_EVERY: u32 = 1024;

/// How long a wait may go on while the peer looks alive: the bound on
/// every wait (a dead peer ends it within the transport's peer timeout).
pub(super) const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// Counts one turn of a loop; every [`CHECK_EVERY`]-th turn asks the
/// endpoint whether the peer is alive (`Endpoint::check`).
#[inline]
pub(super) fn probe(ep: &mut dyn Endpoint, turns: &mut u32) -> Result<()> {
    *turns = turns.wrapping_add(1);
    if turns.is_multiple_of(CHECK_EVERY) {
        return check(ep);
    }
    Ok(())
}

/// The probe itself, out of line: the loops that count turns stay small.
#[cold]
#[inline(never)]
fn check(ep: &mut dyn Endpoint) -> Result<()> {
    Ok(ep.check()?)
}

/// [`probe`] on the session's endpoint.
#[inline]
pub(super) fn alive(session: &mut Session) -> Result<()> {
    probe(session.ep.as_mut(), &mut session.turns)
}

/// The deadline of one wait. Its clock starts on the wait's 4096th turn,
/// so that the short waits of a measured loop never read it.
pub(super) struct Deadline<'a> {
    what: &'a str,
    turns: u32,
    since: Option<Instant>,
}

impl<'a> Deadline<'a> {
    pub(super) fn new(what: &'a str) -> Self {
        Deadline {
            what,
            turns: 0,
            since: None,
        }
    }

    /// Counts a turn; an error once the wait has lasted [`WAIT_LIMIT`].
    #[inline]
    pub(super) fn tick(&mut self) -> Result<()> {
        self.turns = self.turns.wrapping_add(1);
        if self.turns.is_multiple_of(4096) {
            let since = *self.since.get_or_insert_with(Instant::now);
            if since.elapsed() > WAIT_LIMIT {
                return Err(PerfError::Protocol(format!(
                    "no progress for {} s waiting for {}, though the peer looks alive; it is stuck or overloaded",
                    WAIT_LIMIT.as_secs(),
                    self.what
                )));
            }
        }
        Ok(())
    }
}

/// Progresses until `done`, probing the peer's liveness, within
/// [`WAIT_LIMIT`]. The probe runs even when `done` holds at once, so that
/// loops whose operations complete at once (puts into a dead peer's
/// shared memory) still notice it.
pub(super) fn spin(
    session: &mut Session,
    what: &str,
    mut done: impl FnMut(&Session) -> bool,
) -> Result<()> {
    let mut deadline = Deadline::new(what);
    loop {
        alive(session)?;
        if done(session) {
            return Ok(());
        }
        // PAUSE when progress found nothing: a tight loop of loads that
        // the peer's write ends was measured slower without it, likely
        // the pipeline flush when that write lands (docs/perf-notes.md);
        // none where a PAUSE is dear (under an emulator: uct_core::spin).
        if session.iface.progress() == 0 {
            uct_core::spin::relax();
        }
        deadline.tick()?;
    }
}

/// Posts with `op` until it is accepted.
pub(super) fn post(
    session: &mut Session,
    mut op: impl FnMut(&mut dyn Endpoint) -> uct_core::Result<Status>,
) -> Result<Status> {
    let mut deadline = Deadline::new("room to post");
    loop {
        match op(session.ep.as_mut())? {
            Status::NoResource => {
                session.iface.progress();
                alive(session)?;
                deadline.tick()?;
            }
            status => return Ok(status),
        }
    }
}

/// Progresses until `comp` fires; its error, if any.
pub(super) fn wait(session: &mut Session, comp: &Completion, what: &str) -> Result<()> {
    spin(session, what, |_| comp.is_complete())?;
    comp.result().map_err(PerfError::from)
}

/// Flushes the endpoint and waits for the flush.
pub(super) fn flush(session: &mut Session) -> Result<()> {
    let comp = Completion::new();
    if post(session, |ep| ep.flush(Some(&comp)))? == Status::InProgress {
        wait(session, &comp, "flush")?;
    }
    Ok(())
}

/// One put or AM of `size` bytes with `layout`, from the send buffer to the
/// peer's receive buffer. Done or InProgress (the completion, if given,
/// fires later).
#[inline]
pub(super) fn post_data(
    session: &mut Session,
    layout: Layout,
    size: usize,
    comp: Option<&Completion>,
) -> Result<()> {
    // The first try is all a bandwidth run usually needs; retrying, with
    // its progress, probe and deadline, is kept out of this path.
    if try_post_data(session, layout, size, comp)? == Status::NoResource {
        return retry_post_data(session, layout, size, comp);
    }
    Ok(())
}

/// [`post_data`] after the transport said NoResource.
#[cold]
#[inline(never)]
fn retry_post_data(
    session: &mut Session,
    layout: Layout,
    size: usize,
    comp: Option<&Completion>,
) -> Result<()> {
    let mut deadline = Deadline::new("room to post");
    loop {
        session.iface.progress();
        alive(session)?;
        deadline.tick()?;
        if try_post_data(session, layout, size, comp)? != Status::NoResource {
            return Ok(());
        }
    }
}

/// One attempt at [`post_data`].
#[inline]
fn try_post_data(
    session: &mut Session,
    layout: Layout,
    size: usize,
    comp: Option<&Completion>,
) -> Result<Status> {
    let test = session.params.test;
    // Borrow the fields apart: no handle clones on the hot path.
    let Session {
        ep,
        send,
        peer_rkey: rkey,
        peer_addr: addr,
        ..
    } = session;
    let addr = *addr;
    let data = host_bytes(send, size);
    let status = match (test.op(), layout) {
        (Op::Put, Layout::Short) => ep.put_short(data, addr, rkey),
        (Op::Put, Layout::Bcopy) => ep.put_bcopy(data, addr, rkey),
        (Op::Put, Layout::Zcopy) => ep.put_zcopy(&[Iov::new(send, 0, size)], addr, rkey, comp),
        // The first 8 bytes travel as the header.
        (Op::Am, Layout::Short) => {
            let mut header = [0u8; 8];
            header[..size.min(8)].copy_from_slice(&data[..size.min(8)]);
            ep.am_short(AM_ID, u64::from_le_bytes(header), &data[8.min(size)..])
        }
        (Op::Am, Layout::Bcopy) => ep.am_bcopy(AM_ID, data),
        (Op::Am, Layout::Zcopy) => ep.am_zcopy(AM_ID, &[], &[Iov::new(send, 0, size)], comp),
        _ => {
            return Err(PerfError::Protocol(
                "post_data is for puts and active messages".into(),
            ))
        }
    }?;
    Ok(status)
}

/// One get of `size` bytes into the send buffer.
pub(super) fn post_get(
    session: &mut Session,
    layout: Layout,
    size: usize,
    comp: &Completion,
) -> Result<Status> {
    // The first try is all a bandwidth run usually needs; retrying, with
    // its progress, probe and deadline, is kept out of this path.
    let status = try_post_get(session, layout, size, comp)?;
    if status == Status::NoResource {
        return retry_post_get(session, layout, size, comp);
    }
    Ok(status)
}

/// [`post_get`] after the transport said NoResource.
#[cold]
#[inline(never)]
fn retry_post_get(
    session: &mut Session,
    layout: Layout,
    size: usize,
    comp: &Completion,
) -> Result<Status> {
    let mut deadline = Deadline::new("room to post a get");
    loop {
        session.iface.progress();
        alive(session)?;
        deadline.tick()?;
        let status = try_post_get(session, layout, size, comp)?;
        if status != Status::NoResource {
            return Ok(status);
        }
    }
}

/// One attempt at [`post_get`].
#[inline]
fn try_post_get(
    session: &mut Session,
    layout: Layout,
    size: usize,
    comp: &Completion,
) -> Result<Status> {
    // Borrow the fields apart: no handle clones on the hot path (an Arc
    // clone and drop per get cost two thirds of an 8 B get_bw loop).
    let Session {
        ep,
        send,
        peer_rkey: rkey,
        peer_addr: addr,
        ..
    } = session;
    let addr = *addr;
    Ok(match layout {
        Layout::Short => {
            let ep = ep.as_mut();
            with_host_bytes_mut(send, size, |bytes| ep.get_short(bytes, addr, rkey))
        }
        Layout::Bcopy => ep.get_bcopy(size, addr, rkey, comp),
        Layout::Zcopy => ep.get_zcopy(&[Iov::new(send, 0, size)], addr, rkey, Some(comp)),
    }?)
}

/// Whether validation reaches `mem` through the staging endpoint.
pub(super) fn is_staged(session: &Session, mem: &MemHandle) -> bool {
    session.stage.is_some()
        && (session.params.stage_validation || !mem.mem_type().is_host_accessible())
}

/// The first `len` bytes of a session buffer, for validation.
pub(super) fn read_buffer(session: &mut Session, which: Buffer, len: usize) -> Result<Vec<u8>> {
    let mem = which.handle(session);
    if is_staged(session, &mem) {
        if let Some(stage) = session.stage.as_mut() {
            return stage.read(session.iface.as_mut(), &mem, len);
        }
    }
    Ok(host_bytes(&mem, len).to_vec())
}

/// Writes the first `len` bytes of a session buffer with `f`.
pub(super) fn write_buffer(
    session: &mut Session,
    which: Buffer,
    len: usize,
    f: impl FnOnce(&mut [u8]),
) -> Result<()> {
    let mem = which.handle(session);
    if is_staged(session, &mem) {
        if let Some(stage) = session.stage.as_mut() {
            return stage.write(session.iface.as_mut(), &mem, len, f);
        }
    }
    with_host_bytes_mut(&mem, len, f);
    Ok(())
}

/// Fills the send buffer for iteration `iter` (validation only).
pub(super) fn fill_send(session: &mut Session, size: usize, iter: u64) -> Result<()> {
    let corrupt = session.params.inject_corruption == Some(iter);
    write_buffer(session, Buffer::Send, size, |bytes| {
        pattern_into(bytes, iter);
        if corrupt && !bytes.is_empty() {
            // Testing aid: this transfer is corrupted on purpose.
            bytes[size / 2] ^= 0x5a;
        }
    })
}
