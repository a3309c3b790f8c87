//! The copies an iface has queued on its stream, in order, each with the
//! signal (an event recorded after it) that says when it is done, the
//! completions waiting for it, and the memory it touches, held until then.
//! One stream runs its copies in order, so only the oldest need be asked.
//!
//! The queue is logic without the driver: the signal is a trait, so that
//! the order of completions, flush and back-pressure are tested on any
//! host with a stand-in signal (a flag, not a CUDA simulator).

use std::collections::VecDeque;

use uct_core::{Completion, MemHandle, Status, UctError};

/// What a signal says about the work before it.
#[derive(Debug)]
pub enum Poll {
    /// Still running.
    Running,
    /// Finished.
    Done,
    /// The work failed, and nothing of it runs any more (the driver's
    /// sticky error: the context is unusable).
    Failed(UctError),
    /// The signal could not be asked (the context could not be entered, a
    /// transient driver error): the work may still be running, so its
    /// memory is kept and it is asked again at the next progress.
    Unknown(UctError),
}

/// When the work before it is done.
pub trait Signal {
    /// What the work before it is doing.
    fn poll(&self) -> Poll;
}

struct Pending<S> {
    signal: S,
    comps: Vec<Completion>,
    /// Local memory of the copy: kept until it is done.
    _hold: Vec<MemHandle>,
    /// An `Unknown` answer was logged for it already.
    warned: bool,
}

/// Copies in flight, oldest first.
pub struct OpQueue<S> {
    fifo: VecDeque<Pending<S>>,
    cap: usize,
}

impl<S: Signal> OpQueue<S> {
    /// At most `cap` operations in flight.
    pub fn new(cap: usize) -> Self {
        OpQueue {
            fifo: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// Whether another operation must wait (NoResource).
    pub fn is_full(&self) -> bool {
        self.fifo.len() >= self.cap
    }

    /// Operations in flight.
    pub fn len(&self) -> usize {
        self.fifo.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.fifo.is_empty()
    }

    /// Adds an operation just queued on the stream, `signal` recorded
    /// after it; `comp` (started here) fires when it is done.
    pub fn push(&mut self, signal: S, comp: Option<&Completion>, hold: Vec<MemHandle>) {
        let comps = comp
            .map(|c| {
                c.start();
                vec![c.clone()]
            })
            .unwrap_or_default();
        self.fifo.push_back(Pending {
            signal,
            comps,
            _hold: hold,
            warned: false,
        });
    }

    /// Done at once when nothing is in flight; otherwise `comp` fires with
    /// the newest operation, after every earlier one (the stream's order).
    pub fn flush(&mut self, comp: Option<&Completion>) -> Status {
        let Some(last) = self.fifo.back_mut() else {
            return Status::Done;
        };
        if let Some(c) = comp {
            c.start();
            last.comps.push(c.clone());
        }
        Status::InProgress
    }

    /// Takes the operations that are done, oldest first, and hands their
    /// signals to `recycle`. Their completions fire when the caller calls
    /// [`Done::complete`], after letting go of its locks: a completion's
    /// callback may post again, and releasing memory may wait for a lock
    /// a poster holds.
    ///
    /// An operation whose signal cannot be asked stays (with its memory)
    /// and is asked again next time: letting its memory go while the copy
    /// may still run would free memory under a DMA.
    pub fn take_done(&mut self, mut recycle: impl FnMut(S)) -> Vec<Done> {
        let mut done = Vec::new();
        while let Some(front) = self.fifo.front_mut() {
            let result = match front.signal.poll() {
                Poll::Running => break,
                Poll::Done => Ok(()),
                Poll::Failed(e) => Err(e),
                Poll::Unknown(e) => {
                    if !front.warned {
                        front.warned = true;
                        log::warn!(
                            "cuda_copy: cannot tell whether a copy is done ({e}); it and its memory stay queued, asked again at each progress"
                        );
                    }
                    break;
                }
            };
            let Some(p) = self.fifo.pop_front() else {
                break;
            };
            if result.is_ok() {
                recycle(p.signal);
            }
            done.push(Done {
                comps: p.comps,
                result,
                _hold: p._hold,
            });
        }
        done
    }

    /// Takes every operation, to be ended with `result`: the iface is
    /// going away. `copies_over` says whether nothing of them can run any
    /// more (the stream was waited for, or its context failed for good);
    /// otherwise their memory is leaked, never let go under a copy that
    /// may still run.
    pub fn drain(&mut self, result: Result<(), UctError>, copies_over: bool) -> Vec<Done> {
        let leaked = self.fifo.iter().map(|p| p._hold.len()).sum::<usize>();
        if !copies_over && leaked > 0 {
            log::error!(
                "cuda_copy: {leaked} memory handle(s) of copies that may still run are leaked (not freed under the copy)"
            );
        }
        self.fifo
            .drain(..)
            .map(|p| {
                let mut hold = p._hold;
                if !copies_over {
                    hold.drain(..).for_each(std::mem::forget);
                }
                Done {
                    comps: p.comps,
                    result: result.clone(),
                    _hold: hold,
                }
            })
            .collect()
    }
}

/// An operation taken from the queue, to be completed.
pub struct Done {
    comps: Vec<Completion>,
    result: Result<(), UctError>,
    _hold: Vec<MemHandle>,
}

impl Done {
    /// Fires its completions, then lets go of its memory.
    pub fn complete(self) {
        for c in &self.comps {
            c.finish(self.result.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A stand-in signal: done when its flag is set.
    #[derive(Clone)]
    struct Flag(Rc<Cell<u8>>);

    const RUNNING: u8 = 0;
    const DONE: u8 = 1;
    const FAILED: u8 = 2;

    impl Flag {
        fn new() -> Self {
            Flag(Rc::new(Cell::new(RUNNING)))
        }
        fn set(&self, v: u8) {
            self.0.set(v);
        }
    }

    const UNKNOWN: u8 = 3;

    impl Signal for Flag {
        fn poll(&self) -> Poll {
            match self.0.get() {
                RUNNING => Poll::Running,
                DONE => Poll::Done,
                UNKNOWN => Poll::Unknown(UctError::Device {
                    device: "cuda0".into(),
                    message: "cuCtxSetCurrent failed with CUDA_ERROR_INVALID_CONTEXT (201)".into(),
                    source: None,
                }),
                _ => Poll::Failed(UctError::Device {
                    device: "cuda0".into(),
                    message: "cuEventQuery failed with CUDA_ERROR_ILLEGAL_ADDRESS (700)".into(),
                    source: None,
                }),
            }
        }
    }

    struct NoBacking;

    impl uct_core::memory::MemBacking for NoBacking {
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    /// A handle standing in for a copy's device memory: its strong count
    /// says whether the queue still holds it.
    fn device_memory() -> MemHandle {
        // SAFETY: device memory (not host-accessible): nothing reads or
        // writes it through the address.
        unsafe {
            uct_core::MemRegion::new(
                0x7f00_0000_0000,
                4096,
                uct_core::MemoryType::Cuda,
                uct_core::Access::all(),
                "cuda0",
                Box::new(NoBacking),
            )
        }
    }

    fn progress(q: &mut OpQueue<Flag>, recycle: impl FnMut(Flag)) -> usize {
        let done = q.take_done(recycle);
        let n = done.len();
        done.into_iter().for_each(Done::complete);
        n
    }

    #[test]
    fn completions_fire_in_order_and_only_when_done() {
        let mut q = OpQueue::new(8);
        let (a, b) = (Flag::new(), Flag::new());
        let (ca, cb) = (Completion::new(), Completion::new());
        q.push(a.clone(), Some(&ca), vec![]);
        q.push(b.clone(), Some(&cb), vec![]);
        assert_eq!(progress(&mut q, |_| {}), 0);
        // The newer one done first is not reported before the older.
        b.set(DONE);
        assert_eq!(progress(&mut q, |_| {}), 0);
        assert!(!cb.is_complete());
        a.set(DONE);
        let mut recycled = 0;
        assert_eq!(progress(&mut q, |_| recycled += 1), 2);
        assert_eq!(recycled, 2);
        assert!(ca.is_complete() && cb.is_complete());
        assert!(ca.result().is_ok() && q.is_empty());
    }

    #[test]
    fn flush_is_done_at_once_when_idle_and_after_the_newest_otherwise() {
        let mut q: OpQueue<Flag> = OpQueue::new(8);
        assert_eq!(q.flush(Some(&Completion::new())), Status::Done);
        let a = Flag::new();
        q.push(a.clone(), None, vec![]);
        let f = Completion::new();
        assert_eq!(q.flush(Some(&f)), Status::InProgress);
        progress(&mut q, |_| {});
        assert!(!f.is_complete());
        a.set(DONE);
        progress(&mut q, |_| {});
        assert!(f.is_complete() && f.result().is_ok());
    }

    #[test]
    fn a_full_queue_asks_for_back_pressure() {
        let mut q = OpQueue::new(2);
        let flags = [Flag::new(), Flag::new()];
        for f in &flags {
            assert!(!q.is_full());
            q.push(f.clone(), None, vec![]);
        }
        assert!(q.is_full());
        flags[0].set(DONE);
        progress(&mut q, |_| {});
        assert!(!q.is_full());
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn a_failed_copy_fails_its_completion_and_its_flush() {
        let mut q = OpQueue::new(4);
        let a = Flag::new();
        let (c, f) = (Completion::new(), Completion::new());
        q.push(a.clone(), Some(&c), vec![]);
        let _ = q.flush(Some(&f));
        a.set(FAILED);
        let mut recycled = 0;
        assert_eq!(progress(&mut q, |_| recycled += 1), 1);
        assert_eq!(recycled, 0, "a failed event is not reused");
        let e = c.result().unwrap_err().to_string();
        assert!(e.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
        assert!(f.result().is_err());
    }

    #[test]
    fn drain_ends_everything_in_flight() {
        let mut q = OpQueue::new(4);
        let c = Completion::new();
        q.push(Flag::new(), Some(&c), vec![]);
        let done = q.drain(
            Err(UctError::Canceled("the cuda_copy iface was closed".into())),
            true,
        );
        assert!(
            !c.is_complete(),
            "completions fire only when the caller completes them"
        );
        done.into_iter().for_each(Done::complete);
        assert!(c.is_complete() && c.result().is_err());
        assert!(q.is_empty());
    }

    #[test]
    fn a_copy_whose_signal_cannot_be_asked_keeps_its_memory_and_stays() {
        let mut q = OpQueue::new(4);
        let (a, mem, c) = (Flag::new(), device_memory(), Completion::new());
        q.push(a.clone(), Some(&c), vec![mem.clone()]);
        a.set(UNKNOWN);
        for _ in 0..3 {
            assert_eq!(progress(&mut q, |_| {}), 0);
        }
        assert_eq!(q.len(), 1, "the copy may still run: it stays queued");
        assert_eq!(std::sync::Arc::strong_count(&mem), 2, "its memory is held");
        assert!(!c.is_complete());
        // Asked again once the driver answers.
        a.set(DONE);
        assert_eq!(progress(&mut q, |_| {}), 1);
        assert!(c.result().is_ok());
        assert_eq!(std::sync::Arc::strong_count(&mem), 1, "let go once done");
    }

    #[test]
    fn a_failed_copy_lets_its_memory_go() {
        let mut q = OpQueue::new(4);
        let (a, mem) = (Flag::new(), device_memory());
        q.push(a.clone(), None, vec![mem.clone()]);
        a.set(FAILED);
        assert_eq!(progress(&mut q, |_| {}), 1);
        assert_eq!(std::sync::Arc::strong_count(&mem), 1);
    }

    #[test]
    fn a_drain_with_copies_that_may_run_leaks_their_memory() {
        let mut q = OpQueue::new(4);
        let mem = device_memory();
        q.push(Flag::new(), None, vec![mem.clone()]);
        let closed = || Err(UctError::Canceled("closed".into()));
        q.drain(closed(), false)
            .into_iter()
            .for_each(Done::complete);
        assert_eq!(
            std::sync::Arc::strong_count(&mem),
            2,
            "never let go under a copy that may run"
        );
        q.push(Flag::new(), None, vec![mem.clone()]);
        q.drain(closed(), true).into_iter().for_each(Done::complete);
        assert_eq!(std::sync::Arc::strong_count(&mem), 2, "only the leak left");
    }
}
