//! The futures under tokio and under `futures::executor::block_on`, with
//! the peer in another process answering each notified write with one of
//! its own (`echo`).

use std::future::Future;
use std::sync::{mpsc, Arc};

use libtest_mimic::Failed;
use uct_transfer::{BatchWrite, Memory, MemoryType};

use crate::child::ECHO_TAG;
use crate::common::{fill_of, LIMIT};
use crate::peer::Served;
use crate::{received_as_expected, sent_as_expected};

/// The writes of these scenarios: region `i` of `REGION` bytes, filled
/// with `fill_of(i)`, tagged `i`.
const REGION: usize = 8 << 10;
const REGIONS: usize = 8;

/// Checks that our region `i` holds what the peer's echo wrote.
fn echoed(mem: &Memory, i: usize) -> Result<(), String> {
    let mut got = vec![0u8; REGION];
    mem.read_bytes(i * REGION, &mut got)
        .map_err(|e| e.to_string())?;
    if got.iter().any(|&b| b != !fill_of(i)) {
        return Err(format!("region {i} does not hold the peer's echo"));
    }
    Ok(())
}

/// A tokio runtime of two workers in the parent: eight writes, each
/// `.await`ed in its own task, and the peer's eight answers awaited in
/// another.
pub fn under_tokio(tl: &str) -> Result<(), Failed> {
    let mut s = Served::connected(tl)?;
    for i in 0..REGIONS {
        s.mem.write_bytes(i * REGION, &[fill_of(i); REGION])?;
    }
    s.peer.say(&format!("echo {REGIONS}"))?;
    let t = Arc::new(s.t);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()?;
    let (mem, remote) = (s.mem.clone(), s.remote.clone());
    let (waiter_t, writer_t) = (t.clone(), t.clone());
    let mut notes = rt.block_on(async move {
        let waiter = tokio::spawn(async move {
            let mut notes = Vec::new();
            for _ in 0..REGIONS {
                let n = waiter_t.wait_for_write().await?;
                notes.push((n.tag, n.len));
            }
            Ok::<_, uct_transfer::TransferError>(notes)
        });
        let writes: Vec<_> = (0..REGIONS)
            .map(|i| {
                let (t, mem, remote) = (writer_t.clone(), mem.clone(), remote.clone());
                tokio::spawn(async move {
                    let at = i * REGION;
                    let (view, to) = (mem.view(at, REGION)?, remote.slice(at, REGION)?);
                    t.write_tagged(&view, &to, i as u32).await
                })
            })
            .collect();
        for w in writes {
            tokio::time::timeout(LIMIT, w)
                .await
                .map_err(|_| format!("a write: no result within {LIMIT:?}"))?
                .map_err(|e| format!("a writer task: {e}"))?
                .map_err(|e| format!("a write: {e}"))?;
        }
        tokio::time::timeout(LIMIT, waiter)
            .await
            .map_err(|_| format!("the echoes: none within {LIMIT:?}"))?
            .map_err(|e| format!("the waiting task: {e}"))?
            .map_err(|e| format!("a wait: {e}"))
    })?;
    notes.sort_unstable();
    let want: Vec<_> = (0..REGIONS as u32)
        .map(|i| (i + ECHO_TAG, REGION))
        .collect();
    assert_eq!(notes, want, "{tl}: the echoes' notifications");
    for i in 0..REGIONS {
        echoed(&s.mem, i)?;
    }
    s.peer.expect("ok")?;
    s.peer.ask(&format!("received {REGIONS}"), "ok")?;
    sent_as_expected(tl, &t, REGIONS as u64)?;
    received_as_expected(tl, &t, REGIONS as u64)?;
    s.peer.say("quit")?;
    Ok(())
}

/// Runs `fut` under `futures::executor::block_on` on a thread of its own,
/// within [`LIMIT`].
fn block_on_within<F>(what: &str, fut: F) -> Result<F::Output, String>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(futures::executor::block_on(fut));
    });
    rx.recv_timeout(LIMIT)
        .map_err(|_| format!("{what}: no result within {LIMIT:?}"))
}

/// Under `futures::executor::block_on`: a batch of four writes notified
/// once, the peer's answer awaited, its memory read back, a flush.
pub fn under_block_on(tl: &str) -> Result<(), Failed> {
    let mut s = Served::connected(tl)?;
    let batch = (0..4)
        .map(|i| {
            s.mem.write_bytes(i * REGION, &[fill_of(i); REGION])?;
            Ok(BatchWrite {
                local: s.mem.view(i * REGION, REGION)?,
                remote: s.remote.slice(i * REGION, REGION)?,
                notify: (i == 3).then_some(3),
            })
        })
        .collect::<Result<Vec<_>, uct_transfer::TransferError>>()?;
    s.peer.say("echo 1")?;
    block_on_within("the batch", s.t.write_batch(&batch))??;
    let n = block_on_within("the echo", s.t.wait_for_write())??;
    assert_eq!((n.tag, n.len), (3 + ECHO_TAG, REGION), "{tl}");
    echoed(&s.mem, 3)?;
    s.peer.expect("ok")?;
    let back = Memory::alloc(&s.t, MemoryType::Host, 4 * REGION)?;
    let from = s.remote.slice(0, 4 * REGION)?;
    block_on_within("a read", s.t.read(&back.whole(), &from))??;
    for i in 0..4 {
        let mut got = vec![0u8; REGION];
        back.read_bytes(i * REGION, &mut got)?;
        let want = if i == 3 { !fill_of(i) } else { fill_of(i) };
        assert!(got.iter().all(|&b| b == want), "{tl}: region {i} read back");
    }
    block_on_within("a flush", s.t.flush())??;
    s.peer.ask("received 1", "ok")?;
    s.peer.say("quit")?;
    Ok(())
}
