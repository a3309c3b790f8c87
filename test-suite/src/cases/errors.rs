//! Bad input gets a named error and changes nothing: malformed rkeys,
//! out-of-range and unauthorised accesses, forged secrets, deregistered
//! regions, wrong memory types, misaligned atomics, oversized messages, a
//! peer that went away or died.

use uct_core::region_table::SoftRkey;
use uct_core::{
    Access, AtomicValue, Caps, Completion, IfaceAttrs, Iov, MemoryType, RkeyBundle, RkeyEntry,
    Status, UctError,
};

use super::{case, check_applies, delivery_needs_target, Case};
use crate::ensure;
use crate::pair::{fake_device_memory, pattern, Context, Outcome, Pair, TestResult, WAIT};

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
        Case {
            applies: Some(wrong_memory_type_applies),
            ..case("wrong_memory_type", Caps::PUT_ZCOPY, wrong_memory_type)
        },
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

/// Device memory types: a host-only transport must refuse each.
const DEVICE_TYPES: [MemoryType; 3] = [MemoryType::Gaudi, MemoryType::Cuda, MemoryType::DmaBuf];

/// A device memory type the transport says it cannot touch.
fn refused_type(attrs: &IfaceAttrs) -> Option<MemoryType> {
    DEVICE_TYPES
        .into_iter()
        .find(|mem_type| !attrs.mem_types.contains(mem_type))
}

fn wrong_memory_type_applies(attrs: &IfaceAttrs) -> Option<String> {
    match refused_type(attrs) {
        Some(_) => None,
        None => Some(format!(
            "the transport touches every device memory type ({}): nothing to refuse",
            DEVICE_TYPES.map(MemoryType::name).join(", ")
        )),
    }
}

fn wrong_memory_type(pair: &mut Pair) -> TestResult {
    check_applies(wrong_memory_type_applies, pair)?;
    let mem_type = refused_type(pair.tx.attrs()).ok_or("no memory type to refuse")?;
    let remote = pair.remote(4096, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let dev = fake_device_memory(mem_type);
    let addr = remote.addr;
    let e = pair.expect_failure(&format!("put from {mem_type} memory"), |ep, comp| {
        ep.put_zcopy(&[Iov::new(&dev, 0, 64)], addr, &rkey, Some(comp))
    })?;
    ensure!(
        matches!(e, UctError::MemoryTypeUnsupported { mem_type: refused, .. } if refused == mem_type),
        "{mem_type} memory on a transport that does not list it gave: {e}"
    );
    ensure!(
        e.to_string().contains(mem_type.name()),
        "the error does not name the memory type {mem_type}: {e}"
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

/// The error kinds a transport reports for a peer that closed or died:
/// EndpointFailed (posix, self, tcp, rc), Canceled (tcp: operations
/// pending on a connection that closed), Io (a socket error), Timeout (the
/// transport's own peer timeout, UCT_*_PEER_TIMEOUT).
fn is_peer_error(e: &UctError) -> bool {
    matches!(
        e,
        UctError::EndpointFailed(_)
            | UctError::Canceled(_)
            | UctError::Io { .. }
            | UctError::Timeout(_)
    )
}

/// Checks that `e` is a peer error, and that it is the transport's and not
/// the harness's own timeout.
fn peer_error(what: &str, e: &UctError) -> TestResult {
    ensure!(
        is_peer_error(e),
        "{what} failed with {e:?}, not a peer error"
    );
    Ok(())
}

/// Closing the target iface makes operations fail with a peer error (the
/// transport's, not the harness's timeout), without hangs.
fn peer_closed(pair: &mut Pair) -> TestResult {
    pair.target.close()?;
    let comp = Completion::new();
    let am = pair.post_outcome(&comp, |ep, _| ep.am_bcopy(1, &[0u8; 8]));
    let flush = pair.flush_outcome();
    match (am, flush) {
        (_, Outcome::Pending) => Err(format!(
            "a flush to a closed peer neither failed nor completed in {WAIT:?}"
        )),
        (Outcome::Pending, _) => Err(format!(
            "an AM to a closed peer neither failed nor completed in {WAIT:?}"
        )),
        (Outcome::Failed(e), _) => peer_error("an AM to a closed peer", &e),
        (Outcome::Done, Outcome::Failed(e)) => peer_error("a flush to a closed peer", &e),
        (Outcome::Done, Outcome::Done) => {
            Err("an AM and a flush to a closed peer both succeeded".into())
        }
    }
}

/// Puts peer_killed posts to the stopped target at most, waiting for a
/// NoResource: 64 MiB of 64 KiB puts, far beyond tcp's queue and socket
/// buffers. posix and cma copy at once and never refuse.
const STOPPED_PUTS: usize = 1024;

/// The target process dies with puts pending: after a healthy stream, the
/// target is stopped (`Target::hold`: the child stops driving its iface,
/// as a SIGSTOP would stop it; only the target's progress is taken away,
/// which is all a transport's data path can need of its CPU), puts with a
/// completion each are posted until the transport refuses one (a refused
/// put is not posted: its completion is never started), the puts still
/// pending are noted, and then the process is killed. Every completion
/// must then fire, with success or a peer error; where delivery needs the
/// target's progress (tcp, see [`delivery_needs_target`]) at least one put
/// must have been pending, and none of those may succeed: the peer never
/// executed them. Where the target's memory is written without its CPU
/// (posix and cma by the initiator, rc by the NIC) a pending put may
/// legitimately complete with success after the kill: it did land. Then a
/// put or the flush after it fails with a peer error within [`WAIT`], and
/// the peer stays dead for what is posted after that.
fn peer_killed(pair: &mut Pair) -> TestResult {
    let piece = 64 << 10;
    let local = pair.alloc(piece, Access::all_rights())?;
    let remote = pair.remote(16 * piece, Access::all_rights())?;
    let rkey = pair.rkey(&remote)?;
    let t0 = std::time::Instant::now();
    let addr = |i: usize| remote.addr + ((i % 16) * piece) as u64;
    // A healthy stream first: these puts were acknowledged by the flush.
    let healthy = Completion::new();
    for i in 0..16usize {
        let iov = [Iov::new(&local, 0, piece)];
        crate::cases::ordering::put_retrying(pair, &iov, addr(i), &rkey, &healthy)?;
    }
    pair.flush().ctx("flush to the live peer")?;
    let transport = pair.resource.tl.transport.clone();
    let strict = delivery_needs_target(&transport);
    // Stop the target, then fill the transport's queues.
    pair.target.hold(true)?;
    let mut posted: Vec<(usize, Completion)> = Vec::new();
    let mut refused = false;
    let mut done_at_once = 0usize;
    for i in 0..STOPPED_PUTS {
        let comp = Completion::new();
        let iov = [Iov::new(&local, 0, piece)];
        match pair
            .ep
            .put_zcopy(&iov, addr(i), &rkey, Some(&comp))
            .ctx(&format!("put {i} to the stopped, still living peer"))?
        {
            // Not posted: its untouched completion would read as a success.
            Status::NoResource => {
                refused = true;
                break;
            }
            // Complete at once, before the kill.
            Status::Done => done_at_once += 1,
            Status::InProgress => posted.push((i, comp)),
        }
        pair.progress();
    }
    let pending: Vec<usize> = posted
        .iter()
        .filter(|(_, comp)| !comp.is_complete())
        .map(|(i, _)| *i)
        .collect();
    log::info!(
        "{transport}: peer_killed: to the stopped target, {done_at_once} puts done at once, {} \
         in progress, {} of them pending at the kill; refused: {refused}",
        posted.len(),
        pending.len()
    );
    if strict {
        ensure!(
            refused,
            "{STOPPED_PUTS} puts of {piece} bytes posted to a stopped {transport} target, never a \
             NoResource"
        );
        ensure!(
            !pending.is_empty(),
            "no put was pending when the stopped {transport} target was killed: the check that \
             none of them succeeds would be empty"
        );
    }
    ensure!(pair.target.kill()?, "the target has no process to kill");
    let all: Vec<Completion> = posted.iter().map(|(_, comp)| comp.clone()).collect();
    pair.wait_for("the completions of the puts after the peer died", |_| {
        Ok(all.iter().all(Completion::is_complete))
    })?;
    for (i, comp) in &posted {
        match comp.result() {
            Ok(()) if strict && pending.contains(i) => {
                return Err(format!(
                    "put {i} was pending when the stopped {transport} target was killed, and then \
                     succeeded: the target never executed it"
                ))
            }
            Ok(()) => {}
            Err(e) => peer_error(&format!("put {i}"), &e)?,
        }
    }
    // The death is reported in bounded time: a put and a flush after the
    // kill, again until one fails with a peer error. Where every put to the
    // stopped target has completed (rc's NIC acknowledged them all), a
    // flush with nothing outstanding is Done without asking the peer, and
    // rc's NIC may still answer for the dead process's queue pair until
    // the kernel has destroyed it: the first rounds may succeed there.
    let killed = std::time::Instant::now();
    let mut round = 0usize;
    loop {
        let comp = Completion::new();
        let iov = [Iov::new(&local, 0, piece)];
        let put = pair.post_outcome(&comp, |ep, comp| {
            ep.put_zcopy(&iov, addr(round), &rkey, Some(comp))
        });
        let outcome = match put {
            Outcome::Done => pair.flush_outcome(),
            other => other,
        };
        match outcome {
            Outcome::Failed(e) => {
                peer_error("a put or flush after the kill", &e)?;
                break;
            }
            Outcome::Pending => {
                return Err(format!(
                    "a put or flush to a killed peer neither failed nor completed in {WAIT:?}"
                ))
            }
            Outcome::Done => round += 1,
        }
        ensure!(
            killed.elapsed() < WAIT,
            "{round} puts and flushes to a killed peer succeeded in {WAIT:?}"
        );
    }
    // Once dead, the peer stays dead: a put posted now fails or, where a
    // put is a local copy (posix writes into the still-mapped segment), the
    // flush after it fails.
    let comp = Completion::new();
    let iov = [Iov::new(&local, 0, piece)];
    match pair.post_outcome(&comp, |ep, comp| {
        ep.put_zcopy(&iov, addr(0), &rkey, Some(comp))
    }) {
        Outcome::Failed(e) => peer_error("a put after the failed flush", &e)?,
        Outcome::Done => match pair.flush_outcome() {
            Outcome::Failed(e) => peer_error("a second flush to the dead peer", &e)?,
            other => {
                return Err(format!(
                    "a put and a flush to a peer already reported dead ended {other:?}"
                ))
            }
        },
        Outcome::Pending => {
            return Err(format!(
                "a put to a dead peer neither failed nor completed in {WAIT:?}"
            ))
        }
    }
    ensure!(t0.elapsed() < 2 * WAIT, "failure took {:?}", t0.elapsed());
    Ok(())
}
