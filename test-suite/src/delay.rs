//! A test transport wrapper that delays and reorders puts, in the spirit of
//! quinn's in-memory pair: the ordering cases run over it, so that a flush
//! that completes early or a fence that does nothing makes them fail, even
//! where every real transport here is in order anyway.
//!
//! [`delayed`] wraps a pair's iface and endpoint. Puts are held; each
//! `progress` of the iface applies one, the newest held one first (so puts
//! land in the reverse of their order), but never one posted after a fence
//! before every put posted before it. A flush completes only once every put
//! posted before it has been applied and the wrapped endpoint's own flush
//! has completed. Other operations wait (NoResource) until nothing is held.
//! [`Faults`] break flush or fence on purpose.

use std::sync::{Arc, Mutex, MutexGuard};

use uct_core::region_table::SoftRkey;
use uct_core::{
    AmHandler, AtomicValue, Completion, Endpoint, EpParams, FetchOp, Iface, IfaceAttrs, Iov,
    MemHandle, MemoryDomain, RemoteKey, Result, Status, UctError,
};

use crate::pair::Pair;

/// Deliberate breakage, to show that the cases catch it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// A flush hands over to the wrapped endpoint at once, leaving held
    /// puts behind.
    pub early_flush: bool,
    /// A fence returns Done and orders nothing.
    pub ignore_fence: bool,
}

/// Replaces the pair's iface and endpoint by the delaying wrapper.
pub fn delayed(pair: Pair, faults: Faults) -> Pair {
    pair.wrap(|iface, ep| {
        let shared = Arc::new(Mutex::new(Held {
            ep,
            puts: Vec::new(),
            next_seq: 0,
            epoch: 0,
            applied_epoch: 0,
            inflight: Vec::new(),
            flushes: Vec::new(),
            deferred: None,
            faults,
        }));
        (
            Box::new(DelayIface {
                inner: iface,
                shared: shared.clone(),
            }),
            Box::new(DelayEp { shared }),
        )
    })
}

/// The bytes of a held put.
enum Data {
    Short(Vec<u8>),
    Bcopy(Vec<u8>),
    Zcopy(Vec<(MemHandle, usize, usize)>),
}

struct HeldPut {
    seq: u64,
    epoch: u64,
    data: Data,
    addr: u64,
    rkey: RemoteKey,
    comp: Option<Completion>,
}

struct PendingFlush {
    /// Puts with a lower sequence number go first.
    upto: u64,
    comp: Option<Completion>,
}

struct Held {
    ep: Box<dyn Endpoint>,
    puts: Vec<HeldPut>,
    next_seq: u64,
    /// Fences posted so far: the epoch of the next put.
    epoch: u64,
    /// The epoch of the last put applied.
    applied_epoch: u64,
    /// Operations of the wrapped endpoint still pending, with the
    /// completion to fire when they finish.
    inflight: Vec<(Completion, Option<Completion>)>,
    flushes: Vec<PendingFlush>,
    /// The first error of a put that had no completion to report it: the
    /// next flush reports it.
    deferred: Option<UctError>,
    faults: Faults,
}

/// A copy of a software rkey (host MDs: self, loop, tcp), which the
/// wrapper keeps until it applies the put.
fn copy_key(rkey: &RemoteKey) -> Result<RemoteKey> {
    let soft: SoftRkey = *rkey.downcast::<SoftRkey>(rkey.md())?;
    Ok(RemoteKey::new(rkey.component(), rkey.md(), Box::new(soft)))
}

impl Held {
    fn hold(
        &mut self,
        data: Data,
        addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let rkey = copy_key(rkey)?;
        let comp = comp.cloned();
        if let Some(comp) = &comp {
            comp.start();
        }
        self.puts.push(HeldPut {
            seq: self.next_seq,
            epoch: self.epoch,
            data,
            addr,
            rkey,
            comp: comp.clone(),
        });
        self.next_seq += 1;
        // A buffered put is done locally once copied; a zero-copy one
        // completes when it has been applied.
        Ok(if comp.is_some() {
            Status::InProgress
        } else {
            Status::Done
        })
    }

    /// One round of progress: finished inner operations, one held put, and
    /// the flushes that may now go on.
    fn step(&mut self) -> usize {
        let mut events = 0;
        self.inflight.retain(|(inner, outer)| {
            if !inner.is_complete() {
                return true;
            }
            if let Some(outer) = outer {
                outer.finish(inner.result());
            }
            events += 1;
            false
        });
        events += self.apply_one();
        events + self.start_flushes()
    }

    /// Applies the newest held put of the oldest epoch still held.
    fn apply_one(&mut self) -> usize {
        let Some(epoch) = self.puts.iter().map(|put| put.epoch).min() else {
            return 0;
        };
        if epoch > self.applied_epoch {
            // Everything before the fence has been applied: order the
            // wrapped endpoint too.
            match self.ep.fence() {
                Ok(Status::NoResource) => return 0,
                Ok(_) => self.applied_epoch = epoch,
                Err(e) => {
                    self.deferred.get_or_insert(e);
                    self.applied_epoch = epoch;
                }
            }
        }
        let Some(at) = self.puts.iter().rposition(|put| put.epoch == epoch) else {
            return 0;
        };
        let put = self.puts.remove(at);
        let inner = Completion::new();
        let posted = match &put.data {
            Data::Short(bytes) => self.ep.put_short(bytes, put.addr, &put.rkey),
            Data::Bcopy(bytes) => self.ep.put_bcopy(bytes, put.addr, &put.rkey),
            Data::Zcopy(pieces) => {
                let iov: Vec<Iov> = pieces
                    .iter()
                    .map(|(mem, offset, len)| Iov::new(mem, *offset, *len))
                    .collect();
                self.ep.put_zcopy(&iov, put.addr, &put.rkey, Some(&inner))
            }
        };
        match posted {
            Ok(Status::NoResource) => {
                self.puts.insert(at, put);
                return 0;
            }
            Ok(Status::Done) => {
                if let Some(comp) = &put.comp {
                    comp.finish(Ok(()));
                }
            }
            Ok(Status::InProgress) => self.inflight.push((inner, put.comp)),
            Err(e) => match &put.comp {
                Some(comp) => comp.finish(Err(e)),
                None => {
                    self.deferred.get_or_insert(e);
                }
            },
        }
        1
    }

    /// Starts the wrapped endpoint's flush for each flush whose puts have
    /// all been applied and completed.
    fn start_flushes(&mut self) -> usize {
        let mut events = 0;
        while let Some(flush) = self.flushes.first() {
            let upto = flush.upto;
            if self.puts.iter().any(|put| put.seq < upto) || !self.inflight.is_empty() {
                break;
            }
            let inner = Completion::new();
            let outer = self.flushes[0].comp.clone();
            if let Some(e) = self.deferred.take() {
                finish(outer, Err(e));
                self.flushes.remove(0);
                events += 1;
                continue;
            }
            match self.ep.flush(Some(&inner)) {
                Ok(Status::NoResource) => break,
                Ok(Status::Done) => finish(outer, Ok(())),
                Ok(Status::InProgress) => self.inflight.push((inner, outer)),
                Err(e) => finish(outer, Err(e)),
            }
            self.flushes.remove(0);
            events += 1;
        }
        events
    }
}

fn finish(comp: Option<Completion>, result: std::result::Result<(), UctError>) {
    if let Some(comp) = comp {
        comp.finish(result);
    }
}

/// The wrapped iface: its `progress` also drives the held puts.
struct DelayIface {
    inner: Box<dyn Iface>,
    shared: Arc<Mutex<Held>>,
}

/// The wrapped endpoint: holds puts, orders fences and flushes.
struct DelayEp {
    shared: Arc<Mutex<Held>>,
}

impl DelayEp {
    fn held(&self) -> MutexGuard<'_, Held> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forwards an operation the wrapper does not hold, once nothing is
    /// held (until then: NoResource, which makes the caller progress).
    fn forward(&mut self, op: impl FnOnce(&mut dyn Endpoint) -> Result<Status>) -> Result<Status> {
        let mut held = self.held();
        if !held.puts.is_empty() {
            return Ok(Status::NoResource);
        }
        op(held.ep.as_mut())
    }
}

impl Iface for DelayIface {
    fn transport(&self) -> &str {
        self.inner.transport()
    }
    fn device(&self) -> &str {
        self.inner.device()
    }
    fn attrs(&self) -> &IfaceAttrs {
        self.inner.attrs()
    }
    fn md(&self) -> &Arc<dyn MemoryDomain> {
        self.inner.md()
    }
    fn device_address(&self) -> Vec<u8> {
        self.inner.device_address()
    }
    fn iface_address(&self) -> Vec<u8> {
        self.inner.iface_address()
    }
    fn is_reachable(&self, device_addr: &[u8], iface_addr: &[u8]) -> bool {
        self.inner.is_reachable(device_addr, iface_addr)
    }
    fn create_ep(&mut self, params: EpParams) -> Result<Box<dyn Endpoint>> {
        self.inner.create_ep(params)
    }
    fn set_am_handler(&mut self, id: u8, handler: AmHandler) -> Result<()> {
        self.inner.set_am_handler(id, handler)
    }
    fn progress(&mut self) -> usize {
        let events = self.inner.progress();
        events + self.shared.lock().unwrap_or_else(|e| e.into_inner()).step()
    }
}

impl Endpoint for DelayEp {
    fn put_short(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        self.held()
            .hold(Data::Short(data.to_vec()), remote_addr, rkey, None)
    }

    fn put_bcopy(&mut self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        self.held()
            .hold(Data::Bcopy(data.to_vec()), remote_addr, rkey, None)
    }

    fn put_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        let pieces = iov
            .iter()
            .map(|piece| (piece.mem.clone(), piece.offset, piece.len))
            .collect();
        // Without a completion of the caller's, one of the wrapper's own
        // keeps the put pending until it is applied.
        let own = Completion::new();
        self.held().hold(
            Data::Zcopy(pieces),
            remote_addr,
            rkey,
            Some(comp.unwrap_or(&own)),
        )
    }

    fn get_short(&mut self, buf: &mut [u8], remote_addr: u64, rkey: &RemoteKey) -> Result<Status> {
        self.forward(|ep| ep.get_short(buf, remote_addr, rkey))
    }

    fn get_bcopy(
        &mut self,
        len: usize,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
    ) -> Result<Status> {
        self.forward(|ep| ep.get_bcopy(len, remote_addr, rkey, comp))
    }

    fn get_zcopy(
        &mut self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Completion>,
    ) -> Result<Status> {
        self.forward(|ep| ep.get_zcopy(iov, remote_addr, rkey, comp))
    }

    fn am_short(&mut self, id: u8, header: u64, payload: &[u8]) -> Result<Status> {
        self.forward(|ep| ep.am_short(id, header, payload))
    }

    fn am_bcopy(&mut self, id: u8, data: &[u8]) -> Result<Status> {
        self.forward(|ep| ep.am_bcopy(id, data))
    }

    fn am_zcopy(
        &mut self,
        id: u8,
        header: &[u8],
        iov: &[Iov<'_>],
        comp: Option<&Completion>,
    ) -> Result<Status> {
        self.forward(|ep| ep.am_zcopy(id, header, iov, comp))
    }

    fn atomic_add(
        &mut self,
        value: AtomicValue,
        remote_addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Status> {
        self.forward(|ep| ep.atomic_add(value, remote_addr, rkey))
    }

    fn atomic_fetch(
        &mut self,
        op: FetchOp,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: &Completion,
    ) -> Result<Status> {
        self.forward(|ep| ep.atomic_fetch(op, remote_addr, rkey, comp))
    }

    fn flush(&mut self, comp: Option<&Completion>) -> Result<Status> {
        let mut held = self.held();
        if held.faults.early_flush {
            return held.ep.flush(comp);
        }
        if let Some(comp) = comp {
            comp.start();
        }
        let upto = held.next_seq;
        held.flushes.push(PendingFlush {
            upto,
            comp: comp.cloned(),
        });
        Ok(Status::InProgress)
    }

    fn fence(&mut self) -> Result<Status> {
        let mut held = self.held();
        if !held.faults.ignore_fence {
            held.epoch += 1;
        }
        Ok(Status::Done)
    }

    fn ep_address(&self) -> Result<Vec<u8>> {
        self.held().ep.ep_address()
    }

    fn connect_to_ep(&mut self, device_addr: &[u8], ep_addr: &[u8]) -> Result<()> {
        self.held().ep.connect_to_ep(device_addr, ep_addr)
    }
}
