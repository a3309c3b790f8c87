//! The completion model: an operation is Done at once, InProgress (its
//! [`Completion`] fires later from `progress`), or refused with NoResource
//! (back-pressure: progress, then post again).

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
    pending: usize,
    finished: usize,
    error: Option<UctError>,
    data: Option<CompletionData>,
    callback: Option<Callback>,
}

/// A completion shared by the caller and the transport. One completion may
/// track several operations: it is complete when none is pending. The first
/// error is kept.
#[derive(Clone)]
pub struct Completion(Arc<Mutex<State>>);

impl Default for Completion {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Completion")
            .field("pending", &s.pending)
            .field("finished", &s.finished)
            .field("error", &s.error)
            .finish()
    }
}

impl Completion {
    /// A completion with nothing pending yet.
    pub fn new() -> Self {
        Completion(Arc::new(Mutex::new(State {
            pending: 0,
            finished: 0,
            error: None,
            data: None,
            callback: None,
        })))
    }

    /// A completion that calls `f` once nothing is pending any more.
    pub fn with_callback(f: impl FnOnce(&Result<(), UctError>) + Send + 'static) -> Self {
        let c = Self::new();
        c.lock().callback = Some(Box::new(f));
        c
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a callback panicked; the state is intact.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Transport side: an operation was accepted and will finish later.
    pub fn start(&self) {
        self.lock().pending += 1;
    }

    /// Transport side: stores data an operation returns (a fetched value,
    /// bytes read). Also used when the operation is Done at once.
    pub fn set_data(&self, data: CompletionData) {
        self.lock().data = Some(data);
    }

    /// Transport side: an operation accepted with [`start`](Self::start)
    /// finished.
    pub fn finish(&self, result: Result<(), UctError>) {
        let cb = {
            let mut s = self.lock();
            s.pending = s.pending.saturating_sub(1);
            s.finished += 1;
            if let Err(e) = result {
                s.error.get_or_insert(e);
            }
            if s.pending == 0 {
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
        self.lock().pending == 0
    }

    /// Operations still pending.
    pub fn pending(&self) -> usize {
        self.lock().pending
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
        self.lock().data.take()
    }

    /// The value of a fetching atomic, if it has arrived.
    pub fn value(&self) -> Option<u64> {
        match &self.lock().data {
            Some(CompletionData::Value(v)) => Some(*v),
            _ => None,
        }
    }
}
