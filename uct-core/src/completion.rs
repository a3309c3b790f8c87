//! The completion model: an operation is Done at once, InProgress (its
//! [`Completion`] fires later from `progress`), or refused with NoResource
//! (back-pressure: progress, then post again).

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
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

struct State {
    finished: usize,
    error: Option<UctError>,
    data: Option<CompletionData>,
    callback: Option<Callback>,
}

struct Shared {
    /// Operations pending, outside the lock: a bandwidth loop reads it
    /// once per operation (a lock there cost a fifth of an 8 B get).
    /// Changed only under the lock, so that `finish` sees its own result.
    pending: AtomicUsize,
    /// What the data is: [`NO_DATA`], [`VALUE`] (in `value`, outside the
    /// lock: a fetching atomic's result costs two lock round trips
    /// otherwise) or [`BYTES`] (in the state).
    kind: AtomicU8,
    value: AtomicU64,
    state: Mutex<State>,
}

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
            .field("finished", &s.finished)
            .field("error", &s.error)
            .finish()
    }
}

impl Completion {
    /// A completion with nothing pending yet.
    pub fn new() -> Self {
        Completion(Arc::new(Shared {
            pending: AtomicUsize::new(0),
            kind: AtomicU8::new(NO_DATA),
            value: AtomicU64::new(0),
            state: Mutex::new(State {
                finished: 0,
                error: None,
                data: None,
                callback: None,
            }),
        }))
    }

    /// A completion that calls `f` once nothing is pending any more.
    pub fn with_callback(f: impl FnOnce(&Result<(), UctError>) + Send + 'static) -> Self {
        let c = Self::new();
        c.lock().callback = Some(Box::new(f));
        c
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a callback panicked; the state is intact.
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Transport side: an operation was accepted and will finish later.
    pub fn start(&self) {
        let _s = self.lock();
        self.0.pending.fetch_add(1, Ordering::Release);
    }

    /// Transport side: stores data an operation returns (a fetched value,
    /// bytes read). Also used when the operation is Done at once.
    pub fn set_data(&self, data: CompletionData) {
        match data {
            CompletionData::Value(v) => {
                self.0.value.store(v, Ordering::Relaxed);
                self.0.kind.store(VALUE, Ordering::Release);
            }
            bytes => {
                let mut s = self.lock();
                s.data = Some(bytes);
                self.0.kind.store(BYTES, Ordering::Release);
            }
        }
    }

    /// Transport side: an operation accepted with [`start`](Self::start)
    /// finished.
    pub fn finish(&self, result: Result<(), UctError>) {
        let cb = {
            let mut s = self.lock();
            let left = self.0.pending.load(Ordering::Relaxed).saturating_sub(1);
            self.0.pending.store(left, Ordering::Release);
            s.finished += 1;
            if let Err(e) = result {
                s.error.get_or_insert(e);
            }
            if left == 0 {
                s.callback.take()
            } else {
                None
            }
        };
        if let Some(cb) = cb {
            cb(&self.result());
        }
    }

    /// Whether no operation is pending.
    pub fn is_complete(&self) -> bool {
        self.pending() == 0
    }

    /// Operations still pending.
    pub fn pending(&self) -> usize {
        // Acquire: a caller that sees 0 also sees what the finished
        // operations wrote (their error, their data).
        self.0.pending.load(Ordering::Acquire)
    }

    /// Operations finished so far.
    pub fn finished(&self) -> usize {
        self.lock().finished
    }

    /// Ok, or the first error of the operations tracked.
    pub fn result(&self) -> Result<(), UctError> {
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
