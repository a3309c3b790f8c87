//! The transfer API in one process, over self, posix and tcp.

mod common;

use common::{pair, within, TRANSPORTS};
use uct_transfer::{Memory, MemoryType, Progress, RemoteBuffer};

#[test]
fn ping_pong_over_every_transport() {
    for tl in TRANSPORTS {
        for progress in [Progress::Thread, Progress::Manual] {
            let (server, client) = pair(tl, progress);
            let drive = if progress == Progress::Manual {
                vec![&server, &client]
            } else {
                vec![]
            };
            let len = 8192;
            let smem = Memory::alloc(&server, MemoryType::Host, len).unwrap();
            let cmem = Memory::alloc(&client, MemoryType::Host, len).unwrap();
            let s_remote = RemoteBuffer::parse(&smem.remote_key()).unwrap();
            let c_remote = RemoteBuffer::parse(&cmem.remote_key()).unwrap();
            smem.write_bytes(0, &vec![0xab; len]).unwrap();
            // ping: server -> client
            let w = server.write(&smem.whole(), &c_remote, true);
            let n = within("client's wait", &drive, client.wait_for_write()).unwrap();
            within("server's write", &drive, w).unwrap();
            assert_eq!(n.len, len, "{tl}");
            let mut got = vec![0; len];
            cmem.read_bytes(0, &mut got).unwrap();
            assert!(got.iter().all(|&b| b == 0xab), "{tl}: ping data");
            // pong: client -> server, tagged
            cmem.write_bytes(0, &vec![0xcd; len]).unwrap();
            let w = client.write_tagged(&cmem.whole(), &s_remote, 42);
            let n = within("server's wait", &drive, server.wait_for_write()).unwrap();
            within("client's write", &drive, w).unwrap();
            assert_eq!((n.len, n.tag), (len, 42), "{tl}");
            smem.read_bytes(0, &mut got).unwrap();
            assert!(got.iter().all(|&b| b == 0xcd), "{tl}: pong data");
            // read back
            let r = client.read(
                &cmem.view(0, 100).unwrap(),
                &s_remote.slice(0, 100).unwrap(),
            );
            cmem.write_bytes(0, &[0; 100]).unwrap();
            within("client's read", &drive, r).unwrap();
            eprintln!("{tl} {progress:?}: ok");
        }
    }
}
