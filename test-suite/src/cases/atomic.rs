//! Atomics, 32- and 64-bit: add, fetch-add, swap, compare-and-swap.

use uct_core::{Access, AtomicValue, Caps, Completion, FetchOp, RemoteKey};

use super::{case, Case};
use crate::ensure;
use crate::pair::{Context, Pair, TestResult};
use crate::target::RemoteMem;

pub fn cases() -> Vec<Case> {
    vec![
        case("atomic32", Caps::ATOMIC32, |pair| atomics(pair, 4)),
        case("atomic64", Caps::ATOMIC64, |pair| atomics(pair, 8)),
    ]
}

fn val(width: usize, value: u64) -> AtomicValue {
    if width == 4 {
        AtomicValue::U32(value as u32)
    } else {
        AtomicValue::U64(value)
    }
}

fn read(pair: &mut Pair, remote: &RemoteMem, at: usize, width: usize) -> Result<u64, String> {
    let mut word = [0u8; 8];
    word[..width].copy_from_slice(&pair.remote_read(remote, at, width)?);
    Ok(u64::from_le_bytes(word))
}

fn fetch(pair: &mut Pair, op: FetchOp, addr: u64, rkey: &RemoteKey) -> Result<u64, String> {
    let comp = Completion::new();
    pair.post_wait("atomic fetch", &comp, |ep, comp| {
        ep.atomic_fetch(op, addr, rkey, comp)
    })
    .ctx("atomic")?;
    comp.value()
        .ok_or_else(|| "fetching atomic returned no value".to_string())
}

fn atomics(pair: &mut Pair, width: usize) -> TestResult {
    let remote = pair.remote(64, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let at = 16usize;
    let addr = remote.addr + at as u64;
    let mask = if width == 4 {
        u32::MAX as u64
    } else {
        u64::MAX
    };
    let start = 0xfff0_0000_0000_0005u64 & mask;
    pair.remote_write(&remote, at, &start.to_le_bytes()[..width])?;

    let comp = Completion::new();
    pair.post_wait("atomic add", &comp, |ep, _| {
        ep.atomic_add(val(width, 10), addr, &rkey)
    })
    .ctx("atomic add")?;
    pair.flush().ctx("flush")?;
    ensure!(
        read(pair, &remote, at, width)? == (start + 10) & mask,
        "add: target holds the wrong sum"
    );

    let old = fetch(pair, FetchOp::Add(val(width, 7)), addr, &rkey)?;
    ensure!(old == (start + 10) & mask, "fetch-add returned {old:#x}");
    ensure!(
        read(pair, &remote, at, width)? == (start + 17) & mask,
        "fetch-add: wrong sum"
    );

    // Wrap-around stays within the width.
    // Without swap (verbs has none), compare-and-swap stores all ones.
    let op = if pair.caps().contains(Caps::ATOMIC_SWAP) {
        FetchOp::Swap(val(width, mask))
    } else {
        FetchOp::CompareSwap {
            compare: val(width, (start + 17) & mask),
            swap: val(width, mask),
        }
    };
    let old = fetch(pair, op, addr, &rkey)?;
    ensure!(old == (start + 17) & mask, "swap returned {old:#x}");
    let old = fetch(pair, FetchOp::Add(val(width, 2)), addr, &rkey)?;
    ensure!(old == mask, "fetch-add after swap returned {old:#x}");
    ensure!(
        read(pair, &remote, at, width)? == 1,
        "add did not wrap at {width} bytes"
    );

    // Compare-and-swap: a miss leaves the target alone, a hit replaces it.
    let miss = FetchOp::CompareSwap {
        compare: val(width, 99),
        swap: val(width, 55),
    };
    ensure!(
        fetch(pair, miss, addr, &rkey)? == 1,
        "failed cswap returned the wrong old value"
    );
    ensure!(
        read(pair, &remote, at, width)? == 1,
        "failed cswap changed the target"
    );
    let hit = FetchOp::CompareSwap {
        compare: val(width, 1),
        swap: val(width, 55),
    };
    ensure!(
        fetch(pair, hit, addr, &rkey)? == 1,
        "cswap returned the wrong old value"
    );
    ensure!(read(pair, &remote, at, width)? == 55, "cswap did not store");

    // Neighbouring bytes are untouched.
    let around = pair.remote_read(&remote, 0, 64)?;
    ensure!(
        around[..at]
            .iter()
            .chain(&around[at + width..])
            .all(|&b| b == 0),
        "atomic wrote outside its {width} bytes"
    );
    Ok(())
}
