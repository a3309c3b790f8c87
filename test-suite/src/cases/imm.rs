//! Puts with immediate data (`put_zcopy_imm`, where [`Caps::PUT_IMM`] is
//! advertised): the immediate reaches the target's handler once, after all
//! of its put's bytes (a large put too), in the order posted and in order
//! with active messages; a refused put delivers no immediate and fails as
//! a refused put does.
//!
//! The target connects back to the initiator first where a transport
//! connects either way (tcp): as on rc, whose immediates come over a
//! connection both sides made, a tcp iface delivers immediates only from
//! an iface it connected to.

use uct_core::{Access, Caps, Completion, Iov, MemHandle, Status, UctError};

use super::{case, Case};
use crate::ensure;
use crate::pair::{pattern, Context, Outcome, Pair, TestResult};
use crate::target::{RemoteMem, IMM_INBOX};

pub fn cases() -> Vec<Case> {
    let mut refused = case("put_imm_refused", Caps::PUT_IMM, put_imm_refused);
    // rc's NIC refuses with a failed connection, not one refused put.
    refused.soft_rkey = true;
    vec![
        case("put_imm_sizes", Caps::PUT_IMM, put_imm_sizes),
        case("put_imm_iov", Caps::PUT_IMM, put_imm_iov),
        case(
            "put_imm_order_with_ams",
            Caps::PUT_IMM.union(Caps::AM_SHORT),
            put_imm_order_with_ams,
        ),
        refused,
    ]
}

/// One immediate as the target recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Imm {
    imm: u32,
    len: usize,
    /// Active messages the target had received before it.
    ams_before: usize,
}

fn decode(entry: &[u8]) -> Result<Imm, String> {
    ensure!(
        entry.len() == 20,
        "an immediate record of {} bytes",
        entry.len()
    );
    let word = |at: usize| u64::from_le_bytes(entry[at..at + 8].try_into().unwrap_or([0; 8]));
    Ok(Imm {
        imm: u32::from_le_bytes(entry[..4].try_into().unwrap_or([0; 4])),
        len: word(4) as usize,
        ams_before: word(12) as usize,
    })
}

/// Listens for immediates, after connecting the target back where the
/// transport needs it (see the module's documentation).
fn prepare(pair: &mut Pair) -> TestResult {
    let caps = pair.caps();
    if caps.contains(Caps::CONNECT_TO_IFACE) && caps.contains(Caps::CONNECT_TO_EP) {
        pair.target.create_ep()?;
        let (dev, iface) = (pair.tx.device_address(), pair.tx.iface_address());
        pair.target.connect_ep(&dev, &iface)?;
    }
    pair.target.listen(IMM_INBOX)
}

/// Posts a put with immediate data, retrying while NoResource; its
/// completion is returned unwaited.
fn post_imm(
    pair: &mut Pair,
    iov: &[Iov<'_>],
    addr: u64,
    rkey: &uct_core::RemoteKey,
    imm: u32,
) -> Result<Completion, String> {
    let comp = Completion::new();
    let t0 = std::time::Instant::now();
    loop {
        match pair
            .ep
            .put_zcopy_imm(iov, addr, rkey, imm, Some(&comp))
            .ctx("put_zcopy_imm")?
        {
            Status::NoResource => {
                pair.progress();
                ensure!(
                    t0.elapsed() < crate::pair::WAIT,
                    "put_zcopy_imm: NoResource for {:?}",
                    crate::pair::WAIT
                );
            }
            _ => return Ok(comp),
        }
    }
}

/// Waits for the next immediate and, the moment it is seen (before any
/// more progress, so that in one process nothing can land after it),
/// checks that `want` is in the target at `offset`.
fn next_imm_with_data(
    pair: &mut Pair,
    remote: &RemoteMem,
    offset: usize,
    want: &[u8],
) -> Result<Imm, String> {
    let t0 = std::time::Instant::now();
    while pair.target.inbox_len(IMM_INBOX)? == 0 {
        pair.progress();
        ensure!(
            t0.elapsed() < crate::pair::WAIT,
            "no immediate within {:?}",
            crate::pair::WAIT
        );
    }
    let got = pair.remote_read(remote, offset, want.len())?;
    let first = pair.target.take_some(IMM_INBOX, 1)?;
    let imm = decode(&first[0])?;
    ensure!(
        got == want,
        "immediate {} arrived before its {} bytes were all in place",
        imm.imm,
        want.len()
    );
    Ok(imm)
}

fn wait_ok(pair: &mut Pair, comp: &Completion, what: &str) -> TestResult {
    pair.wait_for(what, |_| Ok(comp.is_complete()))?;
    comp.result().ctx(what)
}

/// Local memory holding `data` at offset 0.
fn local_with(pair: &mut Pair, data: &[u8]) -> Result<MemHandle, String> {
    let mem = pair.alloc(data.len().max(1), Access::all_rights())?;
    mem.write(0, data).ctx("fill local")?;
    Ok(mem)
}

fn put_imm_sizes(pair: &mut Pair) -> TestResult {
    prepare(pair)?;
    // Up to a large put: many frames, reads or packets on the way.
    let large = pair.attrs().put.max_zcopy.min(8 << 20);
    let sizes = [0, 1, 64, 8192, 65536 + 3, large];
    let remote = pair.remote(large + 16, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    for (i, &len) in sizes.iter().enumerate() {
        let data = pattern(len, 4000 + i as u64);
        let local = local_with(pair, &data)?;
        let iov = [Iov::new(&local, 0, len)];
        let iov: &[Iov<'_>] = if len == 0 { &[] } else { &iov };
        let imm = 0xabcd_0000 + i as u32;
        let comp = post_imm(pair, iov, remote.addr + 8, &rkey, imm)?;
        let got = next_imm_with_data(pair, &remote, 8, &data)?;
        ensure!(
            (got.imm, got.len) == (imm, len),
            "a put of {len} bytes with immediate {imm:#x} arrived as immediate {:#x} of {} bytes",
            got.imm,
            got.len
        );
        wait_ok(pair, &comp, "put_zcopy_imm's completion")?;
        let guards = pair.remote_read(&remote, 0, 8)?;
        ensure!(
            guards == [0; 8],
            "a put with immediate data wrote before its address"
        );
    }
    let extra = pair.target.take_inbox(IMM_INBOX)?;
    ensure!(
        extra.is_empty(),
        "{} immediates more than sent",
        extra.len()
    );
    Ok(())
}

fn put_imm_iov(pair: &mut Pair) -> TestResult {
    prepare(pair)?;
    let attrs = pair.attrs();
    let pieces = attrs.put.max_iov.clamp(1, 3);
    let piece = (attrs.put.max_zcopy / pieces).min(4096);
    let mut want = Vec::new();
    let mut locals = Vec::new();
    for i in 0..pieces {
        let data = pattern(piece, 4100 + i as u64);
        let mem = pair.alloc(piece + 5, Access::all_rights())?;
        mem.write(5, &data).ctx("fill local")?;
        want.extend_from_slice(&data);
        locals.push(mem);
    }
    let iov: Vec<Iov> = locals.iter().map(|m| Iov::new(m, 5, piece)).collect();
    let remote = pair.remote(want.len(), Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let comp = post_imm(pair, &iov, remote.addr, &rkey, 77)?;
    let got = next_imm_with_data(pair, &remote, 0, &want)?;
    ensure!(
        (got.imm, got.len) == (77, want.len()),
        "a put of {pieces} pieces ({} bytes) arrived as immediate {} of {} bytes",
        want.len(),
        got.imm,
        got.len
    );
    wait_ok(pair, &comp, "put_zcopy_imm's completion")
}

/// Active message `i`, then put `i` with immediate `i`, for every `i`: the
/// target sees them alternate, and the immediates in order.
fn put_imm_order_with_ams(pair: &mut Pair) -> TestResult {
    prepare(pair)?;
    pair.target.listen(9)?;
    let n = 300;
    let remote = pair.remote(64, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let local = local_with(pair, &pattern(64, 4200))?;
    let mut comps = Vec::with_capacity(n);
    for i in 0..n {
        let comp = Completion::new();
        pair.post_wait("am_short", &comp, |ep, _| ep.am_short(9, i as u64, &[]))
            .ctx("am_short")?;
        let len = i % 65;
        let iov = [Iov::new(&local, 0, len)];
        let iov: &[Iov<'_>] = if len == 0 { &[] } else { &iov };
        comps.push(post_imm(pair, iov, remote.addr, &rkey, i as u32)?);
    }
    pair.wait_for("every immediate", |p| {
        Ok(p.target.inbox_len(IMM_INBOX)? >= n)
    })?;
    for comp in &comps {
        wait_ok(pair, comp, "put_zcopy_imm's completion")?;
    }
    let imms = pair.target.take_inbox(IMM_INBOX)?;
    ensure!(imms.len() == n, "{} immediates for {n} puts", imms.len());
    for (i, entry) in imms.iter().enumerate() {
        let got = decode(entry)?;
        ensure!(
            got == Imm {
                imm: i as u32,
                len: i % 65,
                ams_before: i + 1,
            },
            "immediate {i} arrived as {got:?}: out of order with the puts or the active messages"
        );
    }
    let ams = pair.target.take_inbox(9)?;
    ensure!(ams.len() == n, "{} active messages for {n}", ams.len());
    Ok(())
}

/// The error a put gets at `addr` through `rkey`: from its post, its
/// completion or the flush after it.
fn refusal(
    pair: &mut Pair,
    what: &str,
    with_imm: bool,
    local: &MemHandle,
    len: usize,
    addr: u64,
    rkey: &uct_core::RemoteKey,
) -> Result<UctError, String> {
    let iov = [Iov::new(local, 0, len)];
    pair.expect_failure(what, |ep, comp| {
        if with_imm {
            ep.put_zcopy_imm(&iov, addr, rkey, 0xdead, Some(comp))
        } else {
            ep.put_zcopy(&iov, addr, rkey, Some(comp))
        }
    })
}

/// A put with immediate data to a read-only region, past its region's end
/// or through the key of a freed region is refused with the error a plain
/// put gets there, changes nothing and delivers no immediate; the next
/// good one is the only immediate.
fn put_imm_refused(pair: &mut Pair) -> TestResult {
    prepare(pair)?;
    let region = 128 * 1024;
    let read_only = pair.remote(region, Access::remote_read_only())?;
    let ro_key = pair.rkey(&read_only)?;
    let open = pair.remote(region, Access::all_rights())?;
    let open_key = pair.rkey(&open)?;
    let freed = pair.remote(region, Access::all_rights())?;
    let freed_key = pair.rkey(&freed)?;
    pair.target.free(&freed)?;
    for len in [64, 64 * 1024] {
        let local = local_with(pair, &pattern(len, 4300))?;
        let cases = [
            ("read-only", read_only.addr, &ro_key),
            (
                "past the end",
                open.addr + (region - len / 2) as u64,
                &open_key,
            ),
            ("freed", freed.addr, &freed_key),
        ];
        for (what, addr, rkey) in cases {
            let plain = refusal(pair, what, false, &local, len, addr, rkey)?;
            let imm = refusal(pair, what, true, &local, len, addr, rkey)?;
            ensure!(
                std::mem::discriminant(&imm) == std::mem::discriminant(&plain),
                "{what}, {len} bytes: put_zcopy_imm refused with {imm}, put_zcopy with {plain}"
            );
        }
    }
    for (what, remote) in [("read-only", &read_only), ("open", &open)] {
        let got = pair.remote_read(remote, 0, region)?;
        ensure!(
            got.iter().all(|&b| b == 0),
            "a refused put changed the {what} region"
        );
    }
    // The connection still works, and only the good put's immediate comes.
    let local = local_with(pair, &pattern(16, 4301))?;
    let comp = post_imm(pair, &[Iov::new(&local, 0, 16)], open.addr, &open_key, 5)?;
    let got = next_imm_with_data(pair, &open, 0, &pattern(16, 4301))?;
    wait_ok(pair, &comp, "the good put_zcopy_imm")?;
    ensure!(
        got.imm == 5,
        "immediate {:#x} came first: a refused put delivered its immediate",
        got.imm
    );
    let flushed = pair.flush_outcome();
    ensure!(
        matches!(flushed, Outcome::Done),
        "the flush after the refusals: {flushed:?}"
    );
    let extra = pair.target.take_inbox(IMM_INBOX)?;
    ensure!(
        extra.is_empty(),
        "{} immediates of refused puts arrived",
        extra.len()
    );
    Ok(())
}
