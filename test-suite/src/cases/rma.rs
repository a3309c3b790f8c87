//! Put and get at every size class, single buffers and iov lists.

use uct_core::{
    Access, Caps, Completion, CompletionData, Endpoint, Iov, MemHandle, RemoteKey, Status,
};

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
/// A capability advertised with a largest size of 0 is a transport bug,
/// not a loop with nothing to do: it fails.
fn sizes(what: &str, max: usize, cap: usize) -> Result<Vec<usize>, String> {
    let max = max.min(cap);
    let mut list = vec![1, 8, 61, 4096, max / 2 + 3, max];
    list.retain(|&size| size >= 1 && size <= max);
    list.sort_unstable();
    list.dedup();
    ensure!(
        !list.is_empty(),
        "{what} is advertised, but with a largest size of 0: nothing could be tried"
    );
    Ok(list)
}

/// Remote offset that is not aligned, to catch alignment assumptions. The
/// bytes before it are guard bytes.
const OFF: usize = 24 + 3;
/// Guard bytes after every remote range a put writes.
const GUARD: usize = 32;
/// What guard bytes hold: a put that strays into them changes them.
const GUARD_BYTE: u8 = 0xa5;
/// Largest zero-copy size tried.
const ZCOPY_CAP: usize = 4 << 20;

/// What the target holds around the range a get reads: not
/// [`GUARD_BYTE`], so that a get that reads and writes past its range
/// changes the local guard bytes.
const AROUND_GET: u8 = 0x5a;
/// Local offset of a get's destination: unaligned, after guard bytes.
const LOCAL_OFF: usize = GUARD + 5;

/// Fills the bytes around `[at, at + len)` of `remote` (up to [`GUARD`]
/// each side, within the region) with `byte`.
fn fill_around(pair: &mut Pair, remote: &RemoteMem, at: usize, len: usize, byte: u8) -> TestResult {
    let before = at.min(GUARD);
    pair.remote_write(remote, at - before, &vec![byte; before])?;
    let after = remote.len.saturating_sub(at + len).min(GUARD);
    pair.remote_write(remote, at + len, &vec![byte; after])
}

/// Fills the bytes around `[at, at + len)` of `remote` (up to [`GUARD`]
/// each side, within the region) with [`GUARD_BYTE`].
pub(crate) fn set_guards(pair: &mut Pair, remote: &RemoteMem, at: usize, len: usize) -> TestResult {
    fill_around(pair, remote, at, len, GUARD_BYTE)
}

/// Fills `[at - GUARD, at + len + GUARD)` of a get's local destination
/// with [`GUARD_BYTE`]: the destination itself too, so that stale bytes of
/// an earlier get are not taken for this one's.
fn set_local_guards(local: &MemHandle, at: usize, len: usize) -> TestResult {
    local
        .write(at - GUARD, &vec![GUARD_BYTE; GUARD + len + GUARD])
        .ctx("fill the local guard bytes")
}

/// Checks that a get of `want.len()` bytes left `want` at `at` of `local`,
/// and the [`GUARD`] bytes on either side as [`set_local_guards`] wrote
/// them.
fn check_local(what: &str, local: &MemHandle, at: usize, want: &[u8]) -> TestResult {
    let len = want.len();
    let mut seen = vec![0u8; GUARD + len + GUARD];
    local.read(at - GUARD, &mut seen).ctx("read local")?;
    if let Some(first) = seen[GUARD..GUARD + len]
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
    {
        return Err(format!(
            "{what} of {len} bytes returned other bytes (first difference at byte {first})"
        ));
    }
    if let Some(i) = seen[..GUARD].iter().rposition(|&b| b != GUARD_BYTE) {
        return Err(format!(
            "{what} of {len} bytes changed local memory {} bytes before its destination",
            GUARD - i
        ));
    }
    if let Some(i) = seen[GUARD + len..].iter().position(|&b| b != GUARD_BYTE) {
        return Err(format!(
            "{what} of {len} bytes changed local memory {} bytes after its destination",
            i + 1
        ));
    }
    Ok(())
}

/// Checks that the target holds `want` at `at`, and that the guard bytes
/// [`set_guards`] wrote around it are untouched.
pub(crate) fn check_remote(
    pair: &mut Pair,
    remote: &RemoteMem,
    at: usize,
    want: &[u8],
) -> TestResult {
    let before = at.min(GUARD);
    let after = remote.len.saturating_sub(at + want.len()).min(GUARD);
    ensure!(
        before > 0 && after > 0,
        "the test leaves no guard bytes around [{at}, {}) of a {}-byte region",
        at + want.len(),
        remote.len
    );
    let seen = pair.remote_read(remote, at - before, before + want.len() + after)?;
    let got = &seen[before..before + want.len()];
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "{} bytes at the target differ from what was sent (first difference at byte {first})",
            want.len()
        ));
    }
    if let Some(i) = seen[..before].iter().rposition(|&b| b != GUARD_BYTE) {
        return Err(format!(
            "a put of {} bytes changed the target {} bytes before its range",
            want.len(),
            before - i
        ));
    }
    if let Some(i) = seen[before + want.len()..]
        .iter()
        .position(|&b| b != GUARD_BYTE)
    {
        return Err(format!(
            "a put of {} bytes changed the target {} bytes after its range",
            want.len(),
            i + 1
        ));
    }
    Ok(())
}

type BufferedPut =
    fn(&mut dyn Endpoint, &[u8], u64, &RemoteKey) -> Result<Status, uct_core::UctError>;

/// Put short and put bcopy: the same checks at every size up to `max`.
fn put_buffered(pair: &mut Pair, what: &str, max: usize, seed: u64, op: BufferedPut) -> TestResult {
    let sizes = sizes(what, max, 1 << 20)?;
    let remote = pair.remote(max + OFF + GUARD, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for (i, len) in sizes.into_iter().enumerate() {
        let data = pattern(len, seed + i as u64);
        set_guards(pair, &remote, OFF, len)?;
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
    let sizes = sizes("put_zcopy", max, ZCOPY_CAP)?;
    let local = pair.alloc(max, Access::all_rights())?;
    let remote = pair.remote(max + OFF + GUARD, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for (i, len) in sizes.into_iter().enumerate() {
        let data = pattern(len, 200 + i as u64);
        local.write(0, &data).ctx("fill local")?;
        set_guards(pair, &remote, OFF, len)?;
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
    let remote = pair.remote(want.len() + OFF + GUARD, Access::all_rights())?;
    set_guards(pair, &remote, OFF, want.len())?;
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
    let sizes = sizes("get_short", max, usize::MAX)?;
    let remote = pair.remote(max + OFF, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for (i, len) in sizes.into_iter().enumerate() {
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
    let sizes = sizes("get_bcopy", max, 1 << 20)?;
    let remote = pair.remote(max + OFF + GUARD, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for (i, len) in sizes.into_iter().enumerate() {
        let data = pattern(len, 500 + i as u64);
        pair.remote_write(&remote, OFF, &data)?;
        fill_around(pair, &remote, OFF, len, AROUND_GET)?;
        let addr = remote.addr + OFF as u64;
        let comp = Completion::new();
        pair.post_wait("get_bcopy", &comp, |ep, comp| {
            ep.get_bcopy(len, addr, &rkey, comp)
        })
        .ctx("get_bcopy")?;
        // The bytes come back in a buffer of their own: one longer than
        // asked for is a get that read past its range.
        match comp.take_data() {
            Some(CompletionData::Bytes(b)) => {
                ensure!(
                    b.len() == len,
                    "get_bcopy of {len} bytes delivered {} bytes",
                    b.len()
                );
                ensure!(b == data, "get_bcopy of {len} bytes returned other bytes")
            }
            other => return Err(format!("get_bcopy delivered {other:?}, not bytes")),
        }
    }
    Ok(())
}

/// Gets into local memory surrounded by guard bytes, from target memory
/// surrounded by other bytes: a get that writes past its destination, or
/// reads past its source, changes the guards.
fn get_zcopy(pair: &mut Pair) -> TestResult {
    let max = pair.attrs().get.max_zcopy.min(ZCOPY_CAP);
    let sizes = sizes("get_zcopy", max, ZCOPY_CAP)?;
    let local = pair.alloc(LOCAL_OFF + max + GUARD, Access::all_rights())?;
    let remote = pair.remote(max + OFF + GUARD, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for (i, len) in sizes.into_iter().enumerate() {
        let data = pattern(len, 600 + i as u64);
        pair.remote_write(&remote, OFF, &data)?;
        fill_around(pair, &remote, OFF, len, AROUND_GET)?;
        set_local_guards(&local, LOCAL_OFF, len)?;
        let addr = remote.addr + OFF as u64;
        let comp = Completion::new();
        pair.post_wait("get_zcopy", &comp, |ep, comp| {
            ep.get_zcopy(&[Iov::new(&local, LOCAL_OFF, len)], addr, &rkey, Some(comp))
        })
        .ctx("get_zcopy")?;
        check_local("get_zcopy", &local, LOCAL_OFF, &data)?;
    }
    Ok(())
}

/// As get_zcopy, scattered into pieces of several handles, each with its
/// own guard bytes.
fn get_zcopy_iov(pair: &mut Pair) -> TestResult {
    let pieces = pair.attrs().get.max_iov.clamp(1, 4);
    let piece = 777;
    let remote = pair.remote(pieces * piece + OFF + GUARD, Access::all_rights())?;
    let data = pattern(pieces * piece, 700);
    pair.remote_write(&remote, OFF, &data)?;
    fill_around(pair, &remote, OFF, data.len(), AROUND_GET)?;
    let rkey = pair.rkey(&remote)?;
    let locals: Vec<_> = (0..pieces)
        .map(|_| pair.alloc(LOCAL_OFF + piece + GUARD, Access::all_rights()))
        .collect::<Result<_, _>>()?;
    for local in &locals {
        set_local_guards(local, LOCAL_OFF, piece)?;
    }
    let iov: Vec<Iov> = locals
        .iter()
        .map(|local| Iov::new(local, LOCAL_OFF, piece))
        .collect();
    let addr = remote.addr + OFF as u64;
    let comp = Completion::new();
    pair.post_wait("get_zcopy iov", &comp, |ep, comp| {
        ep.get_zcopy(&iov, addr, &rkey, Some(comp))
    })
    .ctx("get_zcopy")?;
    for (i, local) in locals.iter().enumerate() {
        check_local(
            &format!("iov piece {i} of get_zcopy"),
            local,
            LOCAL_OFF,
            &data[i * piece..(i + 1) * piece],
        )?;
    }
    Ok(())
}
