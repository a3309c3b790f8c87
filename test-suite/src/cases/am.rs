//! Active messages: short, bcopy, zcopy; order; several ids.

use uct_core::{Access, Caps, Completion, Iov};

use super::{case, Case};
use crate::ensure;
use crate::pair::{pattern, Context, Pair, TestResult};

pub fn cases() -> Vec<Case> {
    vec![
        case("am_short", Caps::AM_SHORT, am_short),
        case("am_bcopy", Caps::AM_BCOPY, am_bcopy),
        case("am_zcopy", Caps::AM_ZCOPY, am_zcopy),
        case("am_order", Caps::AM_SHORT, am_order),
        case("am_ids", Caps::AM_BCOPY, am_ids),
    ]
}

/// Waits for exactly one message on `id` and returns it.
fn one(pair: &mut Pair, id: u8) -> Result<Vec<u8>, String> {
    pair.wait_inbox(id, 1)?;
    let mut messages = pair.target.take_inbox(id)?;
    ensure!(
        messages.len() == 1,
        "{} messages arrived on id {id}, 1 was sent",
        messages.len()
    );
    Ok(messages.remove(0))
}

fn am_short(pair: &mut Pair) -> TestResult {
    let max = pair.attrs().am.max_short;
    ensure!(
        max >= 8,
        "am max_short {max} leaves no room for the 8-byte header"
    );
    pair.target.listen(3)?;
    for (i, len) in [0usize, 1, 8, (max - 8) / 2, max - 8]
        .into_iter()
        .enumerate()
    {
        let payload = pattern(len, 1000 + i as u64);
        let header = 0x1122_3344_5566_7700u64 + i as u64;
        let comp = Completion::new();
        pair.post_wait("am_short", &comp, |ep, _| ep.am_short(3, header, &payload))
            .ctx("am_short")?;
        let data = one(pair, 3)?;
        ensure!(
            data.len() == 8 + len,
            "received {} bytes, sent 8 + {len}",
            data.len()
        );
        ensure!(
            data[..8] == header.to_le_bytes(),
            "header changed in transit"
        );
        ensure!(
            data[8..] == payload[..],
            "payload of {len} bytes changed in transit"
        );
    }
    Ok(())
}

fn am_bcopy(pair: &mut Pair) -> TestResult {
    let max = pair.attrs().am.max_bcopy;
    pair.target.listen(5)?;
    for (i, len) in [1usize, 100, 4096, max / 2, max].into_iter().enumerate() {
        let data = pattern(len, 1100 + i as u64);
        let comp = Completion::new();
        pair.post_wait("am_bcopy", &comp, |ep, _| ep.am_bcopy(5, &data))
            .ctx("am_bcopy")?;
        let got = one(pair, 5)?;
        ensure!(
            got == data,
            "am_bcopy of {len} bytes arrived changed ({} bytes)",
            got.len()
        );
    }
    Ok(())
}

fn am_zcopy(pair: &mut Pair) -> TestResult {
    let attrs = pair.attrs();
    pair.target.listen(7)?;
    let header = pattern(attrs.max_am_header.min(32), 1200);
    let pieces = attrs.am.max_iov.clamp(1, 3);
    let piece = ((attrs.am.max_zcopy - header.len()) / pieces).min(8192);
    let locals: Vec<_> = (0..pieces)
        .map(|_| pair.alloc(piece + 3, Access::all_rights()))
        .collect::<Result<_, _>>()?;
    let mut want = header.clone();
    for (i, local) in locals.iter().enumerate() {
        let piece_data = pattern(piece, 1300 + i as u64);
        local.write(3, &piece_data).ctx("fill local")?;
        want.extend_from_slice(&piece_data);
    }
    let iov: Vec<Iov> = locals
        .iter()
        .map(|local| Iov::new(local, 3, piece))
        .collect();
    let comp = Completion::new();
    pair.post_wait("am_zcopy", &comp, |ep, comp| {
        ep.am_zcopy(7, &header, &iov, Some(comp))
    })
    .ctx("am_zcopy")?;
    let got = one(pair, 7)?;
    ensure!(
        got == want,
        "am_zcopy of {} bytes arrived changed ({} bytes)",
        want.len(),
        got.len()
    );
    Ok(())
}

/// Messages on one endpoint arrive in the order sent.
fn am_order(pair: &mut Pair) -> TestResult {
    pair.target.listen(1)?;
    let count = 2000u64;
    for seq in 0..count {
        let comp = Completion::new();
        pair.post_wait("am_short", &comp, |ep, _| ep.am_short(1, seq, &[]))
            .ctx("am_short")?;
    }
    pair.wait_inbox(1, count as usize)?;
    for (i, d) in pair.target.take_inbox(1)?.into_iter().enumerate() {
        let seq = u64::from_le_bytes(
            d.get(..8)
                .and_then(|b| b.try_into().ok())
                .ok_or("short message")?,
        );
        ensure!(seq == i as u64, "message {seq} arrived in position {i}");
    }
    Ok(())
}

/// Each id reaches its own handler.
fn am_ids(pair: &mut Pair) -> TestResult {
    let ids = [0u8, 9, 31];
    for &id in &ids {
        pair.target.listen(id)?;
    }
    for &id in &ids {
        let comp = Completion::new();
        pair.post_wait("am_bcopy", &comp, |ep, _| ep.am_bcopy(id, &[id; 16]))
            .ctx("am_bcopy")?;
    }
    for &id in &ids {
        let data = one(pair, id)?;
        ensure!(data == [id; 16], "handler of id {id} got another message");
    }
    Ok(())
}
