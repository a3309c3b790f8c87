//! The dispatcher thread: between the transport's progress thread, which
//! must never wait for the GIL, and Python.
//!
//! - An asyncio await's waker only sends its `Pending` here; this thread
//!   attaches to Python and runs its callbacks, which wake the awaiting
//!   task through its event loop (`call_soon_threadsafe`); the task polls.
//! - An operation whose `Pending` was dropped before it resolved comes here
//!   as an orphan, with the application's buffers it uses: they are
//!   released once the operation resolved (a future resolves only once no
//!   transport touches its memory any more), never before.
//!
//! The thread starts on first use and lives as long as the process.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Wake, Waker};

use pyo3::Python;

use crate::hold::Held;
use crate::pending::{fire, BoxFuture, Inner};

/// An operation nobody awaits any more, and the memory it still uses.
pub struct Orphan {
    /// The operation's future.
    pub fut: BoxFuture,
    /// The application's memory it uses.
    pub holds: Vec<Held>,
}

/// What the dispatcher is asked to do.
pub enum Job {
    /// Its waker fired: run its callbacks.
    Wake(Weak<Inner>),
    /// Keep this until it resolves.
    Orphan(Orphan),
    /// The orphan with this number was woken.
    OrphanWoken(u64),
}

/// The dispatcher's queue, and the process that started its thread: a
/// child forked after the parent started it has no such thread (fork
/// copies only the forking one), so it starts its own.
static SENDER: Mutex<Option<(u32, Sender<Job>)>> = Mutex::new(None);

/// A new dispatcher thread and its queue, or None if it cannot start.
fn start() -> Option<Sender<Job>> {
    let (tx, rx) = channel();
    std::thread::Builder::new()
        .name("uct-rs-dispatch".into())
        .spawn(move || run(rx))
        .ok()
        .map(|_| tx)
}

/// Hands `job` to the dispatcher thread, starting it on first use (and
/// again in a forked child).
pub fn send(job: Job) {
    let pid = std::process::id();
    let sender = {
        let mut slot = SENDER
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if slot.as_ref().is_none_or(|(owner, _)| *owner != pid) {
            *slot = start().map(|tx| (pid, tx));
        }
        slot.as_ref().map(|(_, tx)| tx.clone())
    };
    let refused = match sender {
        Some(tx) => tx.send(job).err().map(|e| e.0),
        None => Some(job),
    };
    if let Some(Job::Orphan(orphan)) = refused {
        // No dispatcher (it could not start): the memory stays held for
        // good rather than be released under a transfer.
        std::mem::forget(orphan.holds);
    }
}

/// Wakes an orphan: asks the dispatcher to poll it again.
struct OrphanWake(u64);

impl Wake for OrphanWake {
    fn wake(self: Arc<Self>) {
        send(Job::OrphanWoken(self.0));
    }
}

/// Polls an orphan; whether it resolved.
fn poll_orphan(id: u64, orphan: &mut Orphan) -> bool {
    let waker = Waker::from(Arc::new(OrphanWake(id)));
    matches!(
        orphan.fut.as_mut().poll(&mut Context::from_waker(&waker)),
        Poll::Ready(_)
    )
}

fn run(jobs: Receiver<Job>) {
    let mut orphans: HashMap<u64, Orphan> = HashMap::new();
    let mut next = 0u64;
    for job in jobs {
        // A panic in one job must not end the thread: every later await
        // would hang.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match job {
            Job::Wake(weak) => {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let callbacks = inner.take_all_callbacks();
                if !callbacks.is_empty() {
                    // None only while the interpreter shuts down: then
                    // nobody awaits any more.
                    let _ = Python::try_attach(|py| fire(py, callbacks));
                }
            }
            Job::Orphan(mut orphan) => {
                next += 1;
                if !poll_orphan(next, &mut orphan) {
                    orphans.insert(next, orphan);
                }
            }
            Job::OrphanWoken(id) => {
                if let Some(orphan) = orphans.get_mut(&id) {
                    if poll_orphan(id, orphan) {
                        // Its buffers are released here (attached to
                        // Python), the transport done with them.
                        orphans.remove(&id);
                    }
                }
            }
        }));
    }
}
