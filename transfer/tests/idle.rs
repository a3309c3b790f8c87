//! A wait that nothing answers does not burn a core: the progress thread
//! spins a little, then polls at intervals. One test in this binary, as it
//! measures the process's CPU time.

mod common;

use std::future::Future;
use std::time::Duration;

use uct_transfer::Progress;

fn cpu_time() -> Duration {
    // SAFETY: getrusage writes the struct it is given; zeroes are a valid
    // rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a live, writable rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[test]
fn a_pending_wait_costs_little_cpu_once_quiet() {
    let (a, _b) = common::pair("posix", Progress::Thread);
    let wait = a.wait_for_write();
    // Start waiting: the first poll nudges the progress thread.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut wait = std::pin::pin!(wait);
    assert!(wait.as_mut().poll(&mut cx).is_pending());
    std::thread::sleep(Duration::from_millis(200));
    let before = cpu_time();
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_time() - before;
    assert!(
        used < Duration::from_millis(500),
        "a pending wait used {used:?} of CPU in 1 s"
    );
    eprintln!("a pending wait used {used:?} of CPU in 1 s");
}
