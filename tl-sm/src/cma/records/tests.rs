//! This process's record table, opened through its `/proc/self/fd` path as
//! a peer opens it. The table is one per process: the tests that publish
//! take a lock, so that each sees only its own registrations (and the one
//! that fills the table fills it alone).

use std::sync::{mpsc, Arc};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use uct_core::{Access, UctError};

use super::*;

const REGION: u64 = 31;
const BASE: u64 = 0x7000_0000_0000;
const LEN: u64 = 0x1000;

/// Held by every test of this crate that publishes records.
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Our own table, as a peer maps it.
fn peer_view(slot: &Slot) -> Arc<PeerTable> {
    PeerTable::open(&slot.table, std::process::id(), REGION).unwrap()
}

/// Forgets the peers found stuck (this process's own area, in these
/// tests), so that the next test waits for its accesses again.
fn unstick() {
    let mut guard = super::table().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(own) = guard.as_mut() {
        own.stuck.clear();
    }
}

/// Our count of accesses to record `index` in `table`.
fn count(table: &PeerTable, index: u32) -> u32 {
    counter_at(&table.mem, table.area, index)
        .unwrap()
        .load(Ordering::SeqCst)
}

/// `check` of `[addr, +len)` needing `needed`.
fn access(
    table: &PeerTable,
    slot: &Slot,
    secret: u64,
    addr: u64,
    len: u64,
    needed: Access,
) -> Result<(), UctError> {
    table.check(slot.index, REGION, secret, addr, len, needed)
}

#[test]
fn a_published_region_is_checked_by_peers() {
    let _serial = serial();
    let slot = publish(11, BASE, LEN, Access::remote_read_only()).unwrap();
    let table = peer_view(&slot);
    let read = Access::REMOTE_READ;
    assert_eq!(access(&table, &slot, 11, BASE, LEN, read), Ok(()));
    assert_eq!(access(&table, &slot, 11, BASE + 100, 8, read), Ok(()));
    assert_eq!(access(&table, &slot, 11, BASE + LEN - 1, 1, read), Ok(()));
    assert_eq!(access(&table, &slot, 11, BASE + LEN, 0, read), Ok(()));
    assert_eq!(
        access(&table, &slot, 11, BASE, 8, read | Access::LOCAL_READ),
        Ok(())
    );
    assert_eq!(
        access(&table, &slot, 12, BASE, 8, read),
        Err(UctError::BadSecret)
    );
    for (addr, len) in [
        (BASE - 1, 1),
        (BASE - 1, 2),
        (BASE + LEN - 1, 2),
        (BASE + LEN, 1),
        (BASE, LEN + 1),
        (u64::MAX - 1, 10),
    ] {
        assert_eq!(
            access(&table, &slot, 11, addr, len, read),
            Err(UctError::OutOfRange {
                addr,
                len,
                base: BASE,
                region_len: LEN
            }),
            "[{addr:#x}, +{len})"
        );
    }
    for needed in [Access::REMOTE_WRITE, read | Access::REMOTE_ATOMIC] {
        assert_eq!(
            access(&table, &slot, 11, BASE, 8, needed),
            Err(UctError::AccessDenied {
                needed,
                granted: Access::remote_read_only()
            })
        );
    }
    // Every refusal left the busy counter as it found it.
    assert_eq!(count(&table, slot.index), 0);
}

#[test]
fn registrations_share_one_table_and_get_their_own_records() {
    let _serial = serial();
    let a = publish(1, BASE, LEN, Access::all()).unwrap();
    let b = publish(2, BASE + LEN, LEN, Access::all()).unwrap();
    assert_eq!(a.table, b.table);
    assert_ne!(a.index, b.index);
    let table = peer_view(&a);
    assert_eq!(
        access(&table, &a, 1, BASE, LEN, Access::REMOTE_WRITE),
        Ok(())
    );
    assert_eq!(
        access(&table, &b, 2, BASE + LEN, LEN, Access::REMOTE_WRITE),
        Ok(())
    );
    assert_eq!(
        access(&table, &b, 1, BASE + LEN, 1, Access::REMOTE_WRITE),
        Err(UctError::BadSecret)
    );
}

#[test]
fn a_dropped_registration_is_no_such_region_and_its_rkey_stays_stale() {
    let _serial = serial();
    let slot = publish(21, BASE, LEN, Access::all()).unwrap();
    let table = peer_view(&slot);
    let index = slot.index;
    drop(slot);
    assert_eq!(
        table.check(index, REGION, 21, BASE, 8, Access::REMOTE_READ),
        Err(UctError::NoSuchRegion { region_id: REGION })
    );
    // The record is used again; the old secret does not open the new region.
    let again = publish(22, BASE, LEN, Access::all()).unwrap();
    assert_eq!(again.index, index);
    assert_eq!(
        table.check(index, REGION, 21, BASE, 8, Access::REMOTE_READ),
        Err(UctError::BadSecret)
    );
    assert_eq!(
        access(&table, &again, 22, BASE, 8, Access::REMOTE_READ),
        Ok(())
    );
}

#[test]
fn the_table_holds_capacity_registrations() {
    let _serial = serial();
    let (a, b) = (
        publish(0, BASE, LEN, Access::all()).unwrap(),
        publish(0, BASE, LEN, Access::all()).unwrap(),
    );
    assert_eq!(a.table, b.table);
    drop((a, b));
    // Every record but those other tests retired for good.
    let mut slots = Vec::new();
    let refused = loop {
        match publish(slots.len() as u64, BASE, LEN, Access::all()) {
            Ok(slot) => slots.push(slot),
            Err(e) => break e,
        }
    };
    match refused {
        UctError::NoMemory(text) => assert!(text.contains("deregister"), "{text}"),
        other => panic!("a registration past the capacity: {other:?}"),
    }
    assert!(slots.len() > CAPACITY as usize - 16, "{}", slots.len());
    let table = peer_view(&slots[0]);
    for (secret, slot) in slots.iter().enumerate().step_by(4096) {
        assert_eq!(
            access(&table, slot, secret as u64, BASE, LEN, Access::REMOTE_READ),
            Ok(())
        );
    }
    let indices: std::collections::BTreeSet<u32> = slots.iter().map(|s| s.index).collect();
    assert_eq!(indices.len(), slots.len());
    assert!(indices.iter().all(|&i| i < CAPACITY));
    drop(slots);
    assert!(publish(0, BASE, LEN, Access::all()).is_ok());
}

#[test]
fn an_index_past_the_table_is_no_such_region() {
    let _serial = serial();
    let slot = publish(5, BASE, LEN, Access::all()).unwrap();
    let table = peer_view(&slot);
    for index in [CAPACITY, CAPACITY + 1, u32::MAX] {
        assert_eq!(
            table.check(index, REGION, 5, BASE, 8, Access::REMOTE_READ),
            Err(UctError::NoSuchRegion { region_id: REGION }),
            "{index}"
        );
    }
}

#[test]
fn a_record_that_is_not_live_is_no_such_region() {
    let _serial = serial();
    let slot = publish(7, BASE, LEN, Access::all()).unwrap();
    let table = peer_view(&slot);
    assert_eq!(
        access(&table, &slot, 7, BASE, 8, Access::REMOTE_READ),
        Ok(())
    );
    for state in [0, DEAD, 3, u64::MAX, LIVE] {
        slot.record.state.store(state, Ordering::Release);
        let expected = if state == LIVE {
            Ok(())
        } else {
            Err(UctError::NoSuchRegion { region_id: REGION })
        };
        assert_eq!(
            access(&table, &slot, 7, BASE, 8, Access::REMOTE_READ),
            expected,
            "state {state}"
        );
    }
}

#[test]
fn deregistration_waits_for_an_access_in_flight() {
    let _serial = serial();
    let slot = publish(8, BASE, LEN, Access::all()).unwrap();
    let table = peer_view(&slot);
    let in_flight = table
        .access(slot.index, REGION, 8, BASE, 8, Access::REMOTE_WRITE)
        .unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let owner = std::thread::spawn(move || {
        let mut slot = slot;
        let drained = slot.retire(Duration::from_secs(20));
        let _ = done_tx.send(drained);
        slot
    });
    // The owner marked the record dead: a new access is refused (and not
    // counted), but the one in flight still holds the memory.
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        done_rx.try_recv().is_err(),
        "deregistration returned with an access in flight"
    );
    let index = table_index_of(&owner, &table);
    assert_eq!(
        table.check(index, REGION, 8, BASE, 8, Access::REMOTE_WRITE),
        Err(UctError::NoSuchRegion { region_id: REGION })
    );
    drop(in_flight);
    assert_eq!(
        done_rx.recv_timeout(Duration::from_secs(10)),
        Ok(true),
        "deregistration did not return once the access ended"
    );
    owner.join().unwrap();
}

/// The index of the slot the owner thread holds (published first by the
/// serial tests, so found by the state of the records).
fn table_index_of(_owner: &std::thread::JoinHandle<Slot>, table: &PeerTable) -> u32 {
    let guard = super::table().lock().unwrap_or_else(|e| e.into_inner());
    let own = guard.as_ref().unwrap();
    (0..own.next)
        .find(|&i| {
            let record = record_at(own.mem, i).unwrap();
            record.state.load(Ordering::SeqCst) == DEAD && count(table, i) == 1
        })
        .expect("the dead record with one access in flight")
}

#[test]
fn a_record_held_past_the_timeout_is_retired_until_let_go() {
    let _serial = serial();
    let mut slot = publish(9, BASE, LEN, Access::all()).unwrap();
    let index = slot.index;
    let table = peer_view(&slot);
    let stuck = table
        .access(index, REGION, 9, BASE, 8, Access::REMOTE_READ)
        .unwrap();
    let (freed_tx, freed_rx) = mpsc::channel::<()>();
    /// Says when it is dropped: the parked memory, freed.
    struct Memory(mpsc::Sender<()>);
    impl Drop for Memory {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    let parked: Box<dyn Send> = Box::new(Memory(freed_tx));
    assert!(!slot.retire_with(Duration::from_millis(50), Some(parked)));
    unstick();
    drop(slot);
    // Not handed out while our access holds it, the memory kept.
    let later: Vec<Slot> = (0..4)
        .map(|_| publish(10, BASE, LEN, Access::all()).unwrap())
        .collect();
    assert!(later.iter().all(|s| s.index != index));
    assert!(freed_rx.try_recv().is_err(), "the parked memory was freed");
    drop(stuck);
    // Let go: a later registration finds it free again, and frees the
    // memory.
    let again: Vec<Slot> = (0..REVISIT + 4)
        .map(|_| publish(10, BASE, LEN, Access::all()).unwrap())
        .collect();
    assert!(again.iter().any(|s| s.index == index));
    assert!(
        freed_rx.try_recv().is_ok(),
        "the parked memory was not freed"
    );
}

/// Issue 12 review, finding 2: a count held in the area of a process that
/// is gone is discarded at once (its transfers are over), and the area
/// cleared and free again.
#[test]
fn a_count_of_a_gone_process_is_not_waited_for() {
    let _serial = serial();
    let mut slot = publish(13, BASE, LEN, Access::all()).unwrap();
    let _ours = peer_view(&slot);
    // A pid no process has (above the kernel's pid_max).
    let gone = 1 << 30;
    let claims = slot.mem.claims();
    let area = (0..PEERS)
        .find(|&a| {
            claims[a]
                .compare_exchange(0, gone, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        })
        .expect("a free area");
    counter_at(slot.mem, area, slot.index)
        .unwrap()
        .store(7, Ordering::SeqCst);
    let start = std::time::Instant::now();
    assert!(slot.retire(Duration::from_secs(10)));
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(claims[area].load(Ordering::SeqCst), 0);
    assert_eq!(
        counter_at(slot.mem, area, slot.index)
            .unwrap()
            .load(Ordering::SeqCst),
        0
    );
}

/// A live peer that holds counts past the timeout is waited for once: a
/// later deregistration that only it holds retires its record at once.
#[test]
fn a_stuck_peer_is_waited_for_once() {
    let _serial = serial();
    let mut first = publish(14, BASE, LEN, Access::all()).unwrap();
    let mut second = publish(15, BASE, LEN, Access::all()).unwrap();
    let table = peer_view(&first);
    let held = [
        table
            .access(first.index, REGION, 14, BASE, 8, Access::REMOTE_READ)
            .unwrap(),
        table
            .access(second.index, REGION, 15, BASE, 8, Access::REMOTE_READ)
            .unwrap(),
    ];
    let start = std::time::Instant::now();
    assert!(!first.retire(Duration::from_millis(200)));
    assert!(start.elapsed() >= Duration::from_millis(200));
    let start = std::time::Instant::now();
    assert!(!second.retire(Duration::from_secs(10)));
    let took = start.elapsed();
    unstick();
    drop(held);
    assert!(took < Duration::from_secs(1), "{took:?}");
}

/// The permissions of the mapping that holds `addr`, from /proc/self/maps.
fn perms_at(addr: *const u8) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let addr = addr as u64;
    maps.lines()
        .find_map(|line| {
            let (range, rest) = line.split_once(' ')?;
            let (lo, hi) = range.split_once('-')?;
            let (lo, hi) = (
                u64::from_str_radix(lo, 16).ok()?,
                u64::from_str_radix(hi, 16).ok()?,
            );
            (lo <= addr && addr < hi).then(|| rest[..4].to_string())
        })
        .expect("the mapping is listed")
}

#[test]
fn a_peer_maps_the_records_read_only_and_the_counters_writable() {
    let _serial = serial();
    let slot = publish(12, BASE, LEN, Access::all()).unwrap();
    let table = peer_view(&slot);
    assert_eq!(perms_at(table.mem.records_ptr()), "r--s");
    assert_eq!(perms_at(table.mem.area_ptr(table.area)), "rw-s");
    assert_eq!(perms_at(table.mem.claims().as_ptr().cast()), "rw-s");
    // Another peer's area is read-only to us.
    let other = (table.area + 1) % PEERS;
    assert_eq!(perms_at(table.mem.area_ptr(other)), "r--s");
}
