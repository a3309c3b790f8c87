//! This process's record table, opened through its `/proc/self/fd` path as
//! a peer opens it, and small tables made by hand. The table is one per
//! process: the tests that publish take a lock, so that each sees only its
//! own registrations (and the one that fills the table fills it alone).

use std::sync::{Mutex, MutexGuard};

use uct_core::{Access, UctError};

use super::*;

const REGION: u64 = 31;
const BASE: u64 = 0x7000_0000_0000;
const LEN: u64 = 0x1000;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `check` of `[addr, +len)` needing `needed`, with the right secret.
fn access(
    map: &Mapping,
    slot: &Slot,
    secret: u64,
    addr: u64,
    len: u64,
    needed: Access,
) -> Result<(), UctError> {
    check(map, slot.index, REGION, secret, addr, len, needed)
}

#[test]
fn a_published_region_is_checked_by_peers() {
    let _serial = serial();
    let slot = publish(11, BASE, LEN, Access::remote_read_only()).unwrap();
    let table = open_table(&slot.table, REGION).unwrap();
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
}

#[test]
fn registrations_share_one_table_and_get_their_own_records() {
    let _serial = serial();
    let a = publish(1, BASE, LEN, Access::all()).unwrap();
    let b = publish(2, BASE + LEN, LEN, Access::all()).unwrap();
    assert_eq!(a.table, b.table);
    assert_ne!(a.index, b.index);
    let table = open_table(&a.table, REGION).unwrap();
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
    let table = open_table(&slot.table, REGION).unwrap();
    let index = slot.index;
    drop(slot);
    assert_eq!(
        check(&table, index, REGION, 21, BASE, 8, Access::REMOTE_READ),
        Err(UctError::NoSuchRegion { region_id: REGION })
    );
    // The record is used again; the old secret does not open the new region.
    let again = publish(22, BASE, LEN, Access::all()).unwrap();
    assert_eq!(again.index, index);
    assert_eq!(
        check(&table, index, REGION, 21, BASE, 8, Access::REMOTE_READ),
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
    let slots: Vec<Slot> = (0..CAPACITY)
        .map(|i| publish(i as u64, BASE, LEN, Access::all()).unwrap())
        .collect();
    let table = open_table(&slots[0].table, REGION).unwrap();
    for slot in [&slots[0], &slots[CAPACITY as usize - 1]] {
        assert_eq!(
            access(
                &table,
                slot,
                slot_secret(&slots, slot),
                BASE,
                LEN,
                Access::REMOTE_READ
            ),
            Ok(())
        );
    }
    let indices: std::collections::BTreeSet<u32> = slots.iter().map(|s| s.index).collect();
    assert_eq!(indices.len(), CAPACITY as usize);
    assert!(indices.iter().all(|&i| i < CAPACITY));
    match publish(0, BASE, LEN, Access::all()) {
        Err(UctError::NoMemory(text)) => assert!(text.contains("deregister"), "{text}"),
        other => panic!("a registration past the capacity: {other:?}"),
    }
    drop(slots);
    assert!(publish(0, BASE, LEN, Access::all()).is_ok());
}

/// The secret the capacity test gave `slot`: its position in `slots`.
fn slot_secret(slots: &[Slot], slot: &Slot) -> u64 {
    slots.iter().position(|s| std::ptr::eq(s, slot)).unwrap() as u64
}

#[test]
fn open_table_refuses_what_is_not_a_table() {
    let (_small, _fd, path) = Mapping::create_anonymous("uct-test-small", 100).unwrap();
    assert!(matches!(
        open_table(&path, REGION),
        Err(UctError::BadRkey(_))
    ));
    let (_short, _fd, path) =
        Mapping::create_anonymous("uct-test-short", table_bytes() - 1).unwrap();
    assert!(matches!(
        open_table(&path, REGION),
        Err(UctError::BadRkey(_))
    ));
    assert!(matches!(
        open_table("/dev/shm/x", REGION),
        Err(UctError::BadRkey(_))
    ));
    let (_exact, _fd, path) = Mapping::create_anonymous("uct-test-exact", table_bytes()).unwrap();
    assert!(open_table(&path, REGION).is_ok());
}

/// Writes a live record at `index` of `map`, as an owner (or a hostile
/// peer writing the table's bytes) would, without asking `record_at`.
fn write_record(map: &Mapping, index: usize, secret: u64) {
    // SAFETY: the tests only write records that lie in the mapped pages of
    // `map` (past its data length at most to the end of its last page);
    // Record is all atomics.
    let record = unsafe { &*(map.data_ptr() as *const Record).add(index) };
    record.secret.store(secret, Ordering::Relaxed);
    record.base.store(BASE, Ordering::Relaxed);
    record.len.store(LEN, Ordering::Relaxed);
    record
        .access
        .store(Access::all().bits() as u64, Ordering::Relaxed);
    record.state.store(LIVE, Ordering::Release);
}

fn check_at(map: &Mapping, index: u32, secret: u64) -> Result<(), UctError> {
    check(map, index, REGION, secret, BASE, 8, Access::REMOTE_READ)
}

#[test]
fn a_record_past_the_table_is_no_such_region() {
    let size = std::mem::size_of::<Record>();
    // Three whole records.
    let (whole, _fd, _path) = Mapping::create_anonymous("uct-test-whole", 3 * size).unwrap();
    for index in 0..3 {
        write_record(&whole, index, 40 + index as u64);
    }
    for index in 0..3u32 {
        assert_eq!(
            check_at(&whole, index, 40 + index as u64),
            Ok(()),
            "{index}"
        );
    }
    let none = Err(UctError::NoSuchRegion { region_id: REGION });
    assert_eq!(check_at(&whole, 3, 0), none);
    assert_eq!(check_at(&whole, CAPACITY, 0), none);
    assert_eq!(check_at(&whole, u32::MAX, 0), none);
    // Two and a half: the third record is cut off by the end of the table,
    // however live its bytes say it is.
    let (cut, _fd, _path) = Mapping::create_anonymous("uct-test-cut", 2 * size + size / 2).unwrap();
    for index in 0..3 {
        write_record(&cut, index, 50 + index as u64);
    }
    assert_eq!(check_at(&cut, 0, 50), Ok(()));
    assert_eq!(check_at(&cut, 1, 51), Ok(()));
    assert_eq!(check_at(&cut, 2, 52), none);
}

#[test]
fn a_record_that_is_not_live_is_no_such_region() {
    let (map, _fd, _path) = Mapping::create_anonymous("uct-test-states", 4096).unwrap();
    write_record(&map, 0, 7);
    assert_eq!(check_at(&map, 0, 7), Ok(()));
    for state in [0, DEAD, 3, u64::MAX] {
        // SAFETY: record 0 lies inside the 4096-byte table.
        unsafe { &*(map.data_ptr() as *const Record) }
            .state
            .store(state, Ordering::Release);
        assert_eq!(
            check_at(&map, 0, 7),
            Err(UctError::NoSuchRegion { region_id: REGION }),
            "state {state}"
        );
    }
}
