//! Put and get at every size class, single buffers and iov lists.

use uct_core::{Access, Caps, Completion, CompletionData, Endpoint, Iov, RemoteKey, Status};

use super::{case, Case};
use crate::ensure;
use crate::pair::{pattern, Context, Pair, TestResult};
use crate::target::RemoteMem;

pub fn cases() -> Vec<Case> {
    vec![
        case("put_short", Caps::PUT_SHORT, put_short),
        case("put_bcopy", Caps::PUT_BCOPY, put_bcopy),
        case("put_zcopy", Caps::PUT_ZCOPY, put_zcopy),
        case("put_zcopy_iov", Caps::PUT_ZCOPY, put_zcopy_iov),
        case("get_short", Caps::GET_SHORT, get_short),
        case("get_bcopy", Caps::GET_BCOPY, get_bcopy),
        case("get_zcopy", Caps::GET_ZCOPY, get_zcopy),
        case("get_zcopy_iov", Caps::GET_ZCOPY, get_zcopy_iov),
    ]
}

/// Sizes to try up to `max`: 1, 8, a few in between and `max` itself.
fn sizes(max: usize, cap: usize) -> Vec<usize> {
    let max = max.min(cap);
    let mut list = vec![1, 8, 61, 4096, max / 2 + 3, max];
    list.retain(|&size| size >= 1 && size <= max);
    list.sort_unstable();
    list.dedup();
    list
}

/// Remote offset that is not aligned, to catch alignment assumptions.
const OFF: usize = 24 + 3;
/// Largest zero-copy size tried.
const ZCOPY_CAP: usize = 4 << 20;

pub(crate) fn check_remote(
    pair: &mut Pair,
    remote: &RemoteMem,
    at: usize,
    want: &[u8],
) -> TestResult {
    let got = pair.remote_read(remote, at, want.len())?;
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "{} bytes at the target differ from what was sent (first difference at byte {first})",
            want.len()
        ));
    }
    Ok(())
}

type BufferedPut =
    fn(&mut dyn Endpoint, &[u8], u64, &RemoteKey) -> Result<Status, uct_core::UctError>;

/// Put short and put bcopy: the same checks at every size up to `max`.
fn put_buffered(pair: &mut Pair, what: &str, max: usize, seed: u64, op: BufferedPut) -> TestResult {
    let remote = pair.remote(max + OFF, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for (i, len) in sizes(max, 1 << 20).into_iter().enumerate() {
        let data = pattern(len, seed + i as u64);
        let addr = remote.addr + OFF as u64;
        let comp = Completion::new();
        pair.post_wait(what, &comp, |ep, _| op(ep, &data, addr, &rkey))
            .ctx(what)?;
        pair.flush().ctx("flush")?;
        check_remote(pair, &remote, OFF, &data)?;
    }
    Ok(())
}

fn put_short(pair: &mut Pair) -> TestResult {
    let max = pair.attrs().put.max_short;
    put_buffered(pair, "put_short", max, 0, |ep, d, a, k| {
        ep.put_short(d, a, k)
    })
}

fn put_bcopy(pair: &mut Pair) -> TestResult {
    let max = pair.attrs().put.max_bcopy;
    put_buffered(pair, "put_bcopy", max, 100, |ep, d, a, k| {
        ep.put_bcopy(d, a, k)
    })
}

fn put_zcopy(pair: &mut Pair) -> TestResult {
    let max = pair.attrs().put.max_zcopy.min(ZCOPY_CAP);
    let local = pair.alloc(max, Access::all_rights())?;
    let remote = pair.remote(max + OFF, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for (i, len) in sizes(max, ZCOPY_CAP).into_iter().enumerate() {
        let data = pattern(len, 200 + i as u64);
        local.write(0, &data).ctx("fill local")?;
        let addr = remote.addr + OFF as u64;
        let comp = Completion::new();
        pair.post_wait("put_zcopy", &comp, |ep, comp| {
            ep.put_zcopy(&[Iov::new(&local, 0, len)], addr, &rkey, Some(comp))
        })
        .ctx("put_zcopy")?;
        pair.flush().ctx("flush")?;
        check_remote(pair, &remote, OFF, &data)?;
    }
    Ok(())
}

/// Pieces of different handles and offsets gathered into one remote range.
fn put_zcopy_iov(pair: &mut Pair) -> TestResult {
    let pieces = pair.attrs().put.max_iov.clamp(1, 4);
    let piece = 1000;
    let locals: Vec<_> = (0..pieces)
        .map(|_| pair.alloc(piece + 7, Access::all_rights()))
        .collect::<Result<_, _>>()?;
    let mut want = Vec::new();
    for (i, local) in locals.iter().enumerate() {
        let piece_data = pattern(piece, 300 + i as u64);
        local.write(7, &piece_data).ctx("fill local")?;
        want.extend_from_slice(&piece_data);
    }
    let remote = pair.remote(want.len() + OFF, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let iov: Vec<Iov> = locals
        .iter()
        .map(|local| Iov::new(local, 7, piece))
        .collect();
    let addr = remote.addr + OFF as u64;
    let comp = Completion::new();
    pair.post_wait("put_zcopy iov", &comp, |ep, comp| {
        ep.put_zcopy(&iov, addr, &rkey, Some(comp))
    })
    .ctx("put_zcopy")?;
    pair.flush().ctx("flush")?;
    check_remote(pair, &remote, OFF, &want)
}

fn get_short(pair: &mut Pair) -> TestResult {
    let max = pair.attrs().get.max_short;
    let remote = pair.remote(max + OFF, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for (i, len) in sizes(max, usize::MAX).into_iter().enumerate() {
        let data = pattern(len, 400 + i as u64);
        pair.remote_write(&remote, OFF, &data)?;
        let mut buf = vec![0u8; len];
        let addr = remote.addr + OFF as u64;
        let comp = Completion::new();
        pair.post_wait("get_short", &comp, |ep, _| {
            ep.get_short(&mut buf, addr, &rkey)
        })
        .ctx("get_short")?;
        ensure!(buf == data, "get_short of {len} bytes returned other bytes");
    }
    Ok(())
}

fn get_bcopy(pair: &mut Pair) -> TestResult {
    let max = pair.attrs().get.max_bcopy;
    let remote = pair.remote(max + OFF, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for (i, len) in sizes(max, 1 << 20).into_iter().enumerate() {
        let data = pattern(len, 500 + i as u64);
        pair.remote_write(&remote, OFF, &data)?;
        let addr = remote.addr + OFF as u64;
        let comp = Completion::new();
        pair.post_wait("get_bcopy", &comp, |ep, comp| {
            ep.get_bcopy(len, addr, &rkey, comp)
        })
        .ctx("get_bcopy")?;
        match comp.take_data() {
            Some(CompletionData::Bytes(b)) => {
                ensure!(b == data, "get_bcopy of {len} bytes returned other bytes")
            }
            other => return Err(format!("get_bcopy delivered {other:?}, not bytes")),
        }
    }
    Ok(())
}

fn get_zcopy(pair: &mut Pair) -> TestResult {
    let max = pair.attrs().get.max_zcopy.min(ZCOPY_CAP);
    let local = pair.alloc(max, Access::all_rights())?;
    let remote = pair.remote(max + OFF, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for (i, len) in sizes(max, ZCOPY_CAP).into_iter().enumerate() {
        let data = pattern(len, 600 + i as u64);
        pair.remote_write(&remote, OFF, &data)?;
        let addr = remote.addr + OFF as u64;
        let comp = Completion::new();
        pair.post_wait("get_zcopy", &comp, |ep, comp| {
            ep.get_zcopy(&[Iov::new(&local, 0, len)], addr, &rkey, Some(comp))
        })
        .ctx("get_zcopy")?;
        let mut got = vec![0u8; len];
        local.read(0, &mut got).ctx("read local")?;
        ensure!(got == data, "get_zcopy of {len} bytes returned other bytes");
    }
    Ok(())
}

fn get_zcopy_iov(pair: &mut Pair) -> TestResult {
    let pieces = pair.attrs().get.max_iov.clamp(1, 4);
    let piece = 777;
    let remote = pair.remote(pieces * piece + OFF, Access::all_rights())?;
    let data = pattern(pieces * piece, 700);
    pair.remote_write(&remote, OFF, &data)?;
    let rkey = pair.rkey(&remote)?;
    let locals: Vec<_> = (0..pieces)
        .map(|_| pair.alloc(piece + 5, Access::all_rights()))
        .collect::<Result<_, _>>()?;
    let iov: Vec<Iov> = locals
        .iter()
        .map(|local| Iov::new(local, 5, piece))
        .collect();
    let addr = remote.addr + OFF as u64;
    let comp = Completion::new();
    pair.post_wait("get_zcopy iov", &comp, |ep, comp| {
        ep.get_zcopy(&iov, addr, &rkey, Some(comp))
    })
    .ctx("get_zcopy")?;
    for (i, local) in locals.iter().enumerate() {
        let mut got = vec![0u8; piece];
        local.read(5, &mut got).ctx("read local")?;
        ensure!(
            got == data[i * piece..(i + 1) * piece],
            "iov piece {i} of get_zcopy holds other bytes"
        );
    }
    Ok(())
}
