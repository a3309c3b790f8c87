//! The completion model: an operation is Done at once, InProgress (its
//! [`Completion`] fires later from `progress`), or refused with NoResource
//! (back-pressure: progress, then post again).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::UctError;

/// What posting an operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an operation may be InProgress or refused with NoResource"]
pub enum Status {
    /// Completed; local buffers may be reused and any result is already in
    /// the completion passed to the call.
    Done,
    /// Accepted; the completion passed to the call fires from `progress`.
    InProgress,
    /// Not accepted: the transport is out of send resources. Call
    /// `progress` and post again.
    NoResource,
}

/// Data an operation returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompletionData {
    /// Old value of a fetching atomic.
    Value(u64),
    /// Bytes read by a get (bcopy).
    Bytes(Vec<u8>),
}

type Callback = Box<dyn FnOnce(&Result<(), UctError>) + Send>;

/// What only the uncommon paths touch: an error, bytes read, a callback.
struct State {
    error: Option<UctError>,
    data: Option<CompletionData>,
    callback: Option<Callback>,
}

/// The common path (start, finish with success, poll, a fetched value)
/// takes no lock: each lock round trip was measured on rc's small
/// operations, where a completion is started and finished once per
/// operation.
struct Shared {
    /// Operations pending (the low 32 bits) and finished (the high 32,
    /// modulo 2^32), in one word: a finish is one atomic update. A caller
    /// that reads no pending (Acquire) sees what the finished operations
    /// stored before they finished (Release).
    counts: AtomicU64,
    /// Set, after the error is stored, once any operation failed: `result`
    /// locks only then.
    failed: AtomicBool,
    /// Whether a callback was given; fixed at creation, so that `finish`
    /// locks for it only when there is one.
    has_callback: bool,
    /// What the data is: [`NO_DATA`], [`VALUE`] (in `value`, outside the
    /// lock) or [`BYTES`] (in the state).
    kind: AtomicU8,
    value: AtomicU64,
    state: Mutex<State>,
}

/// The pending half of `Shared::counts`.
const PENDING: u64 = u32::MAX as u64;

const NO_DATA: u8 = 0;
const VALUE: u8 = 1;
const BYTES: u8 = 2;

/// A completion shared by the caller and the transport. One completion may
/// track several operations: it is complete when none is pending. The first
/// error is kept.
#[derive(Clone)]
pub struct Completion(Arc<Shared>);

impl Default for Completion {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Completion")
            .field("pending", &self.pending())
            .field("finished", &self.finished())
            .field("error", &s.error)
            .finish()
    }
}

impl Completion {
    /// A completion with nothing pending yet.
    pub fn new() -> Self {
        Self::create(None)
    }

    /// A completion that calls `f` once nothing is pending any more.
    pub fn with_callback(f: impl FnOnce(&Result<(), UctError>) + Send + 'static) -> Self {
        Self::create(Some(Box::new(f)))
    }

    fn create(callback: Option<Callback>) -> Self {
        Completion(Arc::new(Shared {
            counts: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            has_callback: callback.is_some(),
            kind: AtomicU8::new(NO_DATA),
            value: AtomicU64::new(0),
            state: Mutex::new(State {
                error: None,
                data: None,
                callback,
            }),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a callback panicked; the state is intact.
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Transport side: an operation was accepted and will finish later.
    #[inline]
    pub fn start(&self) {
        // Never carries into the finished half: 2^32 operations cannot be
        // outstanding at once.
        self.0.counts.fetch_add(1, Ordering::Relaxed);
    }

    /// Transport side: stores data an operation returns (a fetched value,
    /// bytes read). Also used when the operation is Done at once.
    #[inline]
    pub fn set_data(&self, data: CompletionData) {
        match data {
            CompletionData::Value(v) => {
                self.0.value.store(v, Ordering::Relaxed);
                self.0.kind.store(VALUE, Ordering::Release);
            }
            bytes => self.set_bytes(bytes),
        }
    }

    fn set_bytes(&self, bytes: CompletionData) {
        let mut s = self.lock();
        s.data = Some(bytes);
        self.0.kind.store(BYTES, Ordering::Release);
    }

    /// Transport side: an operation accepted with [`start`](Self::start)
    /// finished.
    #[inline]
    pub fn finish(&self, result: Result<(), UctError>) {
        if let Err(e) = result {
            self.store_error(e);
        }
        // Saturating: a finish without a start leaves 0 pending, not a
        // wrapped count. AcqRel: what this operation stored is published
        // with the count, and the one that leaves none pending sees every
        // other's.
        let before = match self
            .0
            .counts
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                let (pending, finished) = (c & PENDING, c >> 32);
                Some(((finished + 1) << 32) | pending.saturating_sub(1))
            }) {
            Ok(c) | Err(c) => c & PENDING,
        };
        if before <= 1 && self.0.has_callback {
            self.call_back();
        }
    }

    /// Keeps the first error; `result` sees it once `failed` is set.
    #[cold]
    fn store_error(&self, e: UctError) {
        let mut s = self.lock();
        s.error.get_or_insert(e);
        self.0.failed.store(true, Ordering::Release);
    }

    /// Nothing is pending any more: the callback runs, once, outside the
    /// lock (it may look at this completion).
    fn call_back(&self) {
        let cb = self.lock().callback.take();
        if let Some(cb) = cb {
            cb(&self.result());
        }
    }

    /// Whether no operation is pending.
    #[inline]
    pub fn is_complete(&self) -> bool {
        self.pending() == 0
    }

    /// Operations still pending.
    #[inline]
    pub fn pending(&self) -> usize {
        // Acquire: a caller that sees 0 also sees what the finished
        // operations wrote (their error, their data).
        (self.0.counts.load(Ordering::Acquire) & PENDING) as usize
    }

    /// Operations finished so far, modulo 2^32.
    pub fn finished(&self) -> usize {
        (self.0.counts.load(Ordering::Acquire) >> 32) as usize
    }

    /// Ok, or the first error of the operations tracked.
    #[inline]
    pub fn result(&self) -> Result<(), UctError> {
        if !self.0.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.first_error()
    }

    #[cold]
    fn first_error(&self) -> Result<(), UctError> {
        match &self.lock().error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Takes the data an operation returned.
    pub fn take_data(&self) -> Option<CompletionData> {
        match self.0.kind.swap(NO_DATA, Ordering::Acquire) {
            VALUE => Some(CompletionData::Value(self.0.value.load(Ordering::Relaxed))),
            BYTES => self.lock().data.take(),
            _ => None,
        }
    }

    /// The value of a fetching atomic, if it has arrived.
    pub fn value(&self) -> Option<u64> {
        (self.0.kind.load(Ordering::Acquire) == VALUE).then(|| self.0.value.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn counts_keep_the_first_error_and_call_back_once_at_zero() {
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let c = Completion::with_callback(move |r| {
            assert!(matches!(r, Err(UctError::Canceled(m)) if m == "first"));
            seen.fetch_add(1, Ordering::SeqCst);
        });
        c.start();
        c.start();
        c.start();
        assert_eq!((c.pending(), c.finished()), (3, 0));
        c.finish(Ok(()));
        c.finish(Err(UctError::Canceled("first".into())));
        assert!(!c.is_complete());
        assert_eq!(calls.load(Ordering::SeqCst), 0, "called before zero");
        c.finish(Err(UctError::Canceled("second".into())));
        assert!(c.is_complete());
        assert_eq!(c.finished(), 3);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(matches!(c.result(), Err(UctError::Canceled(m)) if m == "first"));
        // A finish without a start neither wraps the count nor calls again.
        c.finish(Ok(()));
        assert_eq!((c.pending(), calls.load(Ordering::SeqCst)), (0, 1));
    }

    #[test]
    fn success_is_ok_and_data_is_taken_once() {
        let c = Completion::new();
        c.start();
        c.set_data(CompletionData::Value(7));
        c.finish(Ok(()));
        assert_eq!((c.result(), c.value()), (Ok(()), Some(7)));
        assert_eq!(c.take_data(), Some(CompletionData::Value(7)));
        assert_eq!(c.take_data(), None);
        c.set_data(CompletionData::Bytes(vec![1, 2]));
        assert_eq!(c.value(), None);
        assert_eq!(c.take_data(), Some(CompletionData::Bytes(vec![1, 2])));
    }

    /// Finishes from several threads: the callback runs once, after all of
    /// them, and sees the error one of them stored.
    #[test]
    fn concurrent_finishes_call_back_once_with_the_error() {
        const THREADS: usize = 4;
        const EACH: usize = 2_000;
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let c = Completion::with_callback(move |r| {
            assert!(r.is_err(), "the error stored before the last finish");
            seen.fetch_add(1, Ordering::SeqCst);
        });
        for _ in 0..THREADS * EACH {
            c.start();
        }
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        let r = if t == 0 && i == EACH / 2 {
                            Err(UctError::Canceled("one".into()))
                        } else {
                            Ok(())
                        };
                        c.finish(r);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a finishing thread panicked");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!((c.pending(), c.finished()), (0, THREADS * EACH));
    }
}
