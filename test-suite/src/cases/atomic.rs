//! Atomics, 32- and 64-bit: add, fetch-add, swap, compare-and-swap.

use uct_core::{Access, AtomicValue, Caps, Completion, FetchOp, RemoteKey};

use super::{case, Case};
use crate::ensure;
use crate::pair::{Context, Pair, TestResult};
use crate::target::RemoteMem;

pub fn cases() -> Vec<Case> {
    vec![
        case("atomic32", Caps::ATOMIC32, |p| atomics(p, 4)),
        case("atomic64", Caps::ATOMIC64, |p| atomics(p, 8)),
    ]
}

fn val(width: usize, v: u64) -> AtomicValue {
    if width == 4 {
        AtomicValue::U32(v as u32)
    } else {
        AtomicValue::U64(v)
    }
}

fn read(p: &mut Pair, remote: &RemoteMem, at: usize, width: usize) -> Result<u64, String> {
    let mut b = [0u8; 8];
    b[..width].copy_from_slice(&p.remote_read(remote, at, width)?);
    Ok(u64::from_le_bytes(b))
}

fn fetch(p: &mut Pair, op: FetchOp, addr: u64, rkey: &RemoteKey) -> Result<u64, String> {
    let c = Completion::new();
    p.post_wait("atomic fetch", &c, |ep, c| {
        ep.atomic_fetch(op, addr, rkey, c)
    })
    .ctx("atomic")?;
    c.value()
        .ok_or_else(|| "fetching atomic returned no value".to_string())
}

fn atomics(p: &mut Pair, w: usize) -> TestResult {
    let remote = p.remote(64, Access::all_rights())?;
    let rkey = p.rkey(&remote)?;
    let at = 16usize;
    let addr = remote.addr + at as u64;
    let mask = if w == 4 { u32::MAX as u64 } else { u64::MAX };
    let start = 0xfff0_0000_0000_0005u64 & mask;
    p.remote_write(&remote, at, &start.to_le_bytes()[..w])?;

    let c = Completion::new();
    p.post_wait("atomic add", &c, |ep, _| {
        ep.atomic_add(val(w, 10), addr, &rkey)
    })
    .ctx("atomic add")?;
    p.flush().ctx("flush")?;
    ensure!(
        read(p, &remote, at, w)? == (start + 10) & mask,
        "add: target holds the wrong sum"
    );

    let old = fetch(p, FetchOp::Add(val(w, 7)), addr, &rkey)?;
    ensure!(old == (start + 10) & mask, "fetch-add returned {old:#x}");
    ensure!(
        read(p, &remote, at, w)? == (start + 17) & mask,
        "fetch-add: wrong sum"
    );

    // Wrap-around stays within the width.
    // Without swap (verbs has none), compare-and-swap stores all ones.
    let op = if p.caps().contains(Caps::ATOMIC_SWAP) {
        FetchOp::Swap(val(w, mask))
    } else {
        FetchOp::CompareSwap {
            compare: val(w, (start + 17) & mask),
            swap: val(w, mask),
        }
    };
    let old = fetch(p, op, addr, &rkey)?;
    ensure!(old == (start + 17) & mask, "swap returned {old:#x}");
    let old = fetch(p, FetchOp::Add(val(w, 2)), addr, &rkey)?;
    ensure!(old == mask, "fetch-add after swap returned {old:#x}");
    ensure!(
        read(p, &remote, at, w)? == 1,
        "add did not wrap at {w} bytes"
    );

    // Compare-and-swap: a miss leaves the target alone, a hit replaces it.
    let miss = FetchOp::CompareSwap {
        compare: val(w, 99),
        swap: val(w, 55),
    };
    ensure!(
        fetch(p, miss, addr, &rkey)? == 1,
        "failed cswap returned the wrong old value"
    );
    ensure!(
        read(p, &remote, at, w)? == 1,
        "failed cswap changed the target"
    );
    let hit = FetchOp::CompareSwap {
        compare: val(w, 1),
        swap: val(w, 55),
    };
    ensure!(
        fetch(p, hit, addr, &rkey)? == 1,
        "cswap returned the wrong old value"
    );
    ensure!(read(p, &remote, at, w)? == 55, "cswap did not store");

    // Neighbouring bytes are untouched.
    let around = p.remote_read(&remote, 0, 64)?;
    ensure!(
        around[..at]
            .iter()
            .chain(&around[at + w..])
            .all(|&b| b == 0),
        "atomic wrote outside its {w} bytes"
    );
    Ok(())
}
