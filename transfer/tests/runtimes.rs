//! The futures under tokio and under `futures::executor::block_on`: plain
//! `std::future::Future`s woken by the progress thread, with no runtime of
//! their own.

mod common;

use common::{pair, TRANSPORTS};
use uct_transfer::{Memory, MemoryType, Progress, RemoteBuffer, Transport};

const LEN: usize = 64 << 10;

fn buffers(a: &Transport, b: &Transport) -> (Memory, Memory, RemoteBuffer) {
    let src = Memory::alloc(a, MemoryType::Host, LEN).unwrap();
    let dst = Memory::alloc(b, MemoryType::Host, LEN).unwrap();
    let remote = RemoteBuffer::parse(&dst.remote_key()).unwrap();
    (src, dst, remote)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_tokio_writes_and_waits_are_awaited_across_tasks() {
    for tl in TRANSPORTS {
        let (a, b) = pair(tl, Progress::Thread);
        let (src, dst, remote) = buffers(&a, &b);
        src.write_bytes(0, &[0x5a; LEN]).unwrap();
        let b = std::sync::Arc::new(b);
        // The receiver waits in its own task.
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move {
                let mut tags = Vec::new();
                for _ in 0..8 {
                    tags.push(b.wait_for_write().await.unwrap().tag);
                }
                tags
            })
        };
        let a = std::sync::Arc::new(a);
        let writes: Vec<_> = (0..8u32)
            .map(|i| {
                let (a, src, remote) = (a.clone(), src.clone(), remote.clone());
                tokio::spawn(async move {
                    let n = LEN / 8;
                    let at = i as usize * n;
                    a.write_tagged(&src.view(at, n).unwrap(), &remote.slice(at, n).unwrap(), i)
                        .await
                })
            })
            .collect();
        for w in writes {
            tokio::time::timeout(common::LIMIT, w)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
        }
        let mut tags = tokio::time::timeout(common::LIMIT, waiter)
            .await
            .unwrap()
            .unwrap();
        tags.sort_unstable();
        assert_eq!(tags, (0..8).collect::<Vec<_>>(), "{tl}");
        let mut got = vec![0u8; LEN];
        dst.read_bytes(0, &mut got).unwrap();
        assert!(got.iter().all(|&x| x == 0x5a), "{tl}");
    }
}

#[test]
fn under_futures_block_on_a_batch_and_a_read() {
    for tl in TRANSPORTS {
        let (a, b) = pair(tl, Progress::Thread);
        let (src, dst, remote) = buffers(&a, &b);
        src.write_bytes(0, &[7; LEN]).unwrap();
        let batch: Vec<_> = (0..4)
            .map(|i| uct_transfer::BatchWrite {
                local: src.view(i * LEN / 4, LEN / 4).unwrap(),
                remote: remote.slice(i * LEN / 4, LEN / 4).unwrap(),
                notify: (i == 3).then_some(99),
            })
            .collect();
        futures::executor::block_on(a.write_batch(&batch)).unwrap();
        let n = futures::executor::block_on(b.wait_for_write()).unwrap();
        assert_eq!((n.tag, n.len), (99, LEN / 4), "{tl}");
        let back = Memory::alloc(&a, MemoryType::Host, LEN).unwrap();
        futures::executor::block_on(a.read(&back.whole(), &remote)).unwrap();
        let mut got = vec![0u8; LEN];
        back.read_bytes(0, &mut got).unwrap();
        assert!(got.iter().all(|&x| x == 7), "{tl}");
        let mut landed = vec![0u8; LEN];
        dst.read_bytes(0, &mut landed).unwrap();
        assert_eq!(landed, got, "{tl}");
        futures::executor::block_on(a.flush()).unwrap();
    }
}
