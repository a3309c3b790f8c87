//! Bad input gets a named error and changes nothing: malformed rkeys,
//! out-of-range and unauthorised accesses, forged secrets, deregistered
//! regions, wrong memory types, misaligned atomics, oversized messages, a
//! peer that went away or died.

use uct_core::region_table::SoftRkey;
use uct_core::{
    Access, AtomicValue, Caps, Completion, Iov, MemoryType, RkeyBundle, RkeyEntry, UctError,
};

use super::{case, Case};
use crate::ensure;
use crate::pair::{fake_device_memory, pattern, Context, Pair, TestResult, WAIT};

pub fn cases() -> Vec<Case> {
    let mut cases = vec![
        case("bad_rkey_bytes", Caps::empty(), bad_rkey_bytes),
        case("out_of_range_put", Caps::PUT_BCOPY, out_of_range_put),
        case("out_of_range_get", Caps::GET_BCOPY, out_of_range_get),
        case(
            "read_only_region",
            Caps::PUT_BCOPY.union(Caps::GET_BCOPY),
            read_only_region,
        ),
        case("deregistered_region", Caps::PUT_BCOPY, deregistered_region),
        case("wrong_memory_type", Caps::PUT_ZCOPY, wrong_memory_type),
        case("misaligned_atomic", Caps::ATOMIC64, misaligned_atomic),
        case("oversized_short", Caps::PUT_SHORT, oversized_short),
        case("peer_closed", Caps::AM_BCOPY, peer_closed),
    ];
    let mut secret = case("wrong_secret", Caps::PUT_BCOPY, wrong_secret);
    secret.soft_rkey = true;
    cases.push(secret);
    let mut killed = case(
        "peer_killed",
        Caps::PUT_ZCOPY.union(Caps::FLUSH),
        peer_killed,
    );
    killed.two_process_only = true;
    cases.push(killed);
    cases
}

fn zeros(pair: &mut Pair, remote: &crate::target::RemoteMem) -> Result<bool, String> {
    Ok(pair
        .remote_read(remote, 0, remote.len)?
        .iter()
        .all(|&b| b == 0))
}

fn bad_rkey_bytes(pair: &mut Pair) -> TestResult {
    let remote = pair.remote(4096, Access::all_rights())?;
    let good = remote.rkey.clone();
    let md = pair.resource.md.name().to_string();
    // Truncations, flips and noise: each unpacks to a key or an error.
    let mut noise = 0xdead_beef_u64;
    for i in 0..2000usize {
        noise ^= noise << 13;
        noise ^= noise >> 7;
        noise ^= noise << 17;
        let mut bytes = good.clone();
        match i % 3 {
            0 => bytes.truncate(i % good.len()),
            1 => bytes[(noise as usize) % good.len()] ^= (noise >> 8) as u8 | 1,
            _ => bytes = pattern(i % 97, noise),
        }
        let _ = pair.reg.unpack_rkey(&bytes, &md);
    }
    let e = pair.reg.unpack_rkey(&good[..good.len() / 2], &md).err();
    ensure!(
        matches!(e, Some(UctError::BadRkey(_))),
        "half an rkey gave {e:?}, not BadRkey"
    );
    let e = pair.reg.unpack_rkey(&good, "no-such-md").err();
    ensure!(
        matches!(e, Some(UctError::RkeyMismatch { .. })),
        "an rkey asked for under another MD gave {e:?}, not RkeyMismatch"
    );
    Ok(())
}

fn out_of_range_put(pair: &mut Pair) -> TestResult {
    let remote = pair.remote(4096, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let data = pattern(64, 1);
    for addr in [
        remote.addr + 4096 - 32,
        remote.addr - 64,
        remote.addr + (1 << 40),
    ] {
        let e =
            pair.expect_failure("out-of-range put", |ep, _| ep.put_bcopy(&data, addr, &rkey))?;
        ensure!(
            matches!(e, UctError::OutOfRange { .. }),
            "out-of-range put gave: {e}"
        );
    }
    ensure!(zeros(pair, &remote)?, "a refused put changed the region");
    Ok(())
}

fn out_of_range_get(pair: &mut Pair) -> TestResult {
    let remote = pair.remote(4096, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let addr = remote.addr + 4000;
    let e = pair.expect_failure("out-of-range get", |ep, comp| {
        ep.get_bcopy(200, addr, &rkey, comp)
    })?;
    ensure!(
        matches!(e, UctError::OutOfRange { .. }),
        "out-of-range get gave: {e}"
    );
    Ok(())
}

fn read_only_region(pair: &mut Pair) -> TestResult {
    let remote = pair.remote(4096, Access::remote_read_only())?;
    let data = pattern(4096, 7);
    pair.remote_write(&remote, 0, &data)?;
    let rkey = pair.rkey(&remote)?;
    let addr = remote.addr;
    let e = pair.expect_failure("put to read-only", |ep, _| {
        ep.put_bcopy(&[0u8; 32], addr, &rkey)
    })?;
    ensure!(
        matches!(e, UctError::AccessDenied { .. }),
        "write to a read-only region gave: {e}"
    );
    ensure!(
        pair.remote_read(&remote, 0, 4096)? == data,
        "a refused put changed the region"
    );
    let comp = Completion::new();
    pair.post_wait("get from read-only", &comp, |ep, comp| {
        ep.get_bcopy(32, addr, &rkey, comp)
    })
    .ctx("get from a read-only region must work")?;
    Ok(())
}

/// Software rkey payloads start with a [`SoftRkey`]; this flips its secret
/// and keeps the rest.
fn forge_secret(packed: &[u8], md: &str) -> Result<Vec<u8>, String> {
    let bundle = RkeyBundle::unpack(packed).ctx("unpack")?;
    let entry = bundle.find(md).ctx("find")?.clone();
    let (mut key, rest) = postcard::take_from_bytes::<SoftRkey>(&entry.payload).ctx("decode")?;
    key.secret ^= 0x5a5a;
    let mut payload = uct_core::rkey::encode_payload(&key).ctx("encode")?;
    payload.extend_from_slice(rest);
    RkeyBundle::single(RkeyEntry { payload, ..entry })
        .pack()
        .ctx("pack")
}

/// Whether a packed rkey's entry for `md` begins with a software key.
fn is_soft_key(packed: &[u8], md: &str) -> bool {
    RkeyBundle::unpack(packed)
        .ok()
        .and_then(|b| {
            b.find(md)
                .ok()
                .map(|e| postcard::take_from_bytes::<SoftRkey>(&e.payload).is_ok())
        })
        .unwrap_or(false)
}

fn wrong_secret(pair: &mut Pair) -> TestResult {
    let remote = pair.remote(4096, Access::all_rights())?;
    let bytes = forge_secret(&remote.rkey, pair.resource.md.name())?;
    let rkey = pair
        .reg
        .unpack_rkey(&bytes, pair.resource.md.name())
        .ctx("unpack")?;
    let addr = remote.addr;
    let e = pair.expect_failure("put with forged secret", |ep, _| {
        ep.put_bcopy(&[1u8; 8], addr, &rkey)
    })?;
    ensure!(
        matches!(e, UctError::BadSecret),
        "a forged secret gave: {e}"
    );
    ensure!(zeros(pair, &remote)?, "forged put changed the region");
    Ok(())
}

fn deregistered_region(pair: &mut Pair) -> TestResult {
    let remote = pair.remote(4096, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let addr = remote.addr;
    let soft = is_soft_key(&remote.rkey, pair.resource.md.name());
    pair.target.free(&remote)?;
    let e = pair.expect_failure("put to deregistered", |ep, _| {
        ep.put_bcopy(&[1u8; 8], addr, &rkey)
    })?;
    if soft {
        // The software target knows the region is gone and says so.
        ensure!(
            matches!(e, UctError::NoSuchRegion { .. }),
            "access to a deregistered region gave: {e}"
        );
    } else {
        // A NIC reports a remote access error on the endpoint, naming the
        // work completion status.
        ensure!(
            matches!(e, UctError::EndpointFailed(_)),
            "access to a deregistered region gave: {e}"
        );
        ensure!(
            e.to_string().contains("work completion status"),
            "the endpoint error does not name the work completion status: {e}"
        );
    }
    Ok(())
}

fn wrong_memory_type(pair: &mut Pair) -> TestResult {
    if pair.attrs().mem_types.contains(&MemoryType::Gaudi) {
        return Ok(());
    }
    let remote = pair.remote(4096, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let dev = fake_device_memory(MemoryType::Gaudi);
    let addr = remote.addr;
    let e = pair.expect_failure("put from gaudi memory", |ep, comp| {
        ep.put_zcopy(&[Iov::new(&dev, 0, 64)], addr, &rkey, Some(comp))
    })?;
    ensure!(
        matches!(
            e,
            UctError::MemoryTypeUnsupported {
                mem_type: MemoryType::Gaudi,
                ..
            }
        ),
        "gaudi memory on a host-only transport gave: {e}"
    );
    ensure!(
        e.to_string().contains("gaudi"),
        "the error does not name the memory type: {e}"
    );
    Ok(())
}

fn misaligned_atomic(pair: &mut Pair) -> TestResult {
    let remote = pair.remote(64, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let addr = remote.addr + 3;
    let e = pair.expect_failure("misaligned atomic", |ep, _| {
        ep.atomic_add(AtomicValue::U64(1), addr, &rkey)
    })?;
    ensure!(
        matches!(e, UctError::Misaligned { .. }),
        "misaligned atomic gave: {e}"
    );
    Ok(())
}

fn oversized_short(pair: &mut Pair) -> TestResult {
    let max = pair.attrs().put.max_short;
    let remote = pair.remote(max + 64, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let data = vec![1u8; max + 1];
    let e = pair
        .ep
        .put_short(&data, remote.addr, &rkey)
        .err()
        .ok_or("a put_short over max_short was accepted")?;
    ensure!(
        matches!(e, UctError::InvalidParam(_)),
        "oversized put_short gave: {e}"
    );
    Ok(())
}

/// Closing the target iface makes operations fail with an error, without
/// hangs.
fn peer_closed(pair: &mut Pair) -> TestResult {
    pair.target.close()?;
    let comp = Completion::new();
    let outcome = pair.post_wait("am to closed peer", &comp, |ep, _| {
        ep.am_bcopy(1, &[0u8; 8])
    });
    let outcome = outcome.and_then(|_| pair.flush());
    ensure!(
        outcome.is_err(),
        "operations on an endpoint whose peer closed still succeed"
    );
    Ok(())
}

/// The target process is killed in the middle of a stream of puts: the
/// pending operations and the flush after them fail with an error, in
/// bounded time.
fn peer_killed(pair: &mut Pair) -> TestResult {
    let piece = 64 << 10;
    let local = pair.alloc(piece, Access::all_rights())?;
    let remote = pair.remote(16 * piece, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let comp = Completion::new();
    let t0 = std::time::Instant::now();
    let mut failed_at_post = None;
    for i in 0..64usize {
        if i == 16 {
            ensure!(pair.target.kill()?, "the target has no process to kill");
        }
        let iov = [Iov::new(&local, 0, piece)];
        let addr = remote.addr + ((i % 16) * piece) as u64;
        match pair.ep.put_zcopy(&iov, addr, &rkey, Some(&comp)) {
            Ok(_) => {}
            Err(e) => {
                failed_at_post = Some(e);
                break;
            }
        }
        pair.progress();
    }
    let flushed = pair.flush();
    ensure!(
        failed_at_post.is_some() || flushed.is_err(),
        "puts and flush to a killed peer all succeeded"
    );
    let fired = comp.clone();
    pair.wait_for("pending puts after the peer died", |_| {
        Ok(fired.is_complete())
    })?;
    ensure!(t0.elapsed() < WAIT, "failure took {:?}", t0.elapsed());
    Ok(())
}
