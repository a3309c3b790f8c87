//! What the posix integration tests share: a posix MD and iface through
//! the registry, the object behind a mapped address (as a hostile process
//! with access to our files would find it), and child processes for the
//! cases that may kill the process (SIGBUS) or hang, run with a deadline.

// Each test file that includes this module uses its own part of it.
#![allow(dead_code)]

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uct_core::{
    Access, Endpoint, EpParams, Iface, MemHandle, MemoryDomain, MemoryType, Registry, RkeyBundle,
};

/// The environment variable that tells a re-executed test binary which
/// child role to play.
pub const ROLE: &str = "TL_SM_POSIX_TEST_ROLE";

/// The posix MD and an iface on it.
pub fn open_posix() -> (Arc<dyn MemoryDomain>, Box<dyn Iface>) {
    // Link tl-sm, whose component registers itself.
    let _ = std::any::type_name::<tl_sm::SmComponent>();
    let registry = Registry::global();
    let resource = registry
        .find_resource("posix", None)
        .expect("the posix transport");
    let iface = resource
        .component
        .open_iface(&resource.md, &resource.tl, &Default::default())
        .expect("open a posix iface");
    (resource.md.clone(), iface)
}

/// An endpoint of `iface` to the iface at these addresses.
pub fn connect_to(
    iface: &mut dyn Iface,
    device_addr: &[u8],
    iface_addr: &[u8],
) -> uct_core::Result<Box<dyn Endpoint>> {
    iface.create_ep(EpParams::ToIface {
        device_addr: device_addr.to_vec(),
        iface_addr: iface_addr.to_vec(),
    })
}

/// An endpoint of `iface` to itself.
pub fn connect_to_self(iface: &mut dyn Iface) -> uct_core::Result<Box<dyn Endpoint>> {
    let (device, addr) = (iface.device_address(), iface.iface_address());
    connect_to(iface, &device, &addr)
}

/// A count of the active messages with `id` that `iface` receives.
pub fn counter(iface: &mut dyn Iface, id: u8) -> Arc<AtomicUsize> {
    let n = Arc::new(AtomicUsize::new(0));
    let c = n.clone();
    iface
        .set_am_handler(
            id,
            Box::new(move |_| {
                c.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
    n
}

/// `len` bytes of `md`'s memory open to peers, and their packed rkey.
pub fn exported(md: &dyn MemoryDomain, len: usize) -> (MemHandle, Vec<u8>) {
    let mem = md
        .alloc(len, MemoryType::Host, Access::all())
        .expect("alloc");
    let rkey = RkeyBundle::single(md.pack_rkey(&mem).unwrap())
        .pack()
        .unwrap();
    (mem, rkey)
}

/// The role this process plays, when a test re-executed it.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// What a child process left.
pub struct ChildRun {
    pub status: Option<ExitStatus>,
    pub output: String,
}

impl ChildRun {
    /// The exit status in words: the signal by name when it was killed.
    pub fn describe(&self) -> String {
        match self.status {
            None => "still running at its deadline (killed)".into(),
            Some(s) => match s.signal() {
                Some(libc::SIGBUS) => "killed by SIGBUS".into(),
                Some(libc::SIGSEGV) => "killed by SIGSEGV".into(),
                Some(sig) => format!("killed by signal {sig}"),
                None => format!("exit code {:?}", s.code()),
            },
        }
    }

    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Runs test `test` of this binary in a child process as `role`, with
/// `env`, and waits at most `deadline` for it.
pub fn run_child(test: &str, role: &str, env: &[(&str, String)], deadline: Duration) -> ChildRun {
    let mut cmd = child_command(test, role, env);
    cmd.stdin(Stdio::null());
    let out_path = std::env::temp_dir().join(format!(
        "tl-sm-posix-child-{}-{role}.out",
        std::process::id()
    ));
    let out = File::create(&out_path).expect("child output file");
    cmd.stdout(out.try_clone().expect("dup")).stderr(out);
    let mut child = cmd.spawn().expect("spawn the child");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    ChildRun { status, output }
}

/// The object mapped at `addr` in this process and the file offset of
/// `addr` in it, opened read-write as another process of the same user
/// could open it: by its /dev/shm name, or through the descriptor that
/// keeps it (`/proc/<pid>/fd/<n>`).
pub fn object_at(addr: u64) -> std::io::Result<(File, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(_perms), Some(offset), Some(_dev), Some(inode)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let path: Vec<&str> = fields.collect();
        let path = path.join(" ");
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let start = u64::from_str_radix(start, 16).unwrap_or(0);
        let end = u64::from_str_radix(end, 16).unwrap_or(0);
        if !(start..end).contains(&addr) {
            continue;
        }
        let at = u64::from_str_radix(offset, 16).unwrap_or(0) + (addr - start);
        let inode: u64 = inode.parse().unwrap_or(0);
        let rw = |p: &str| File::options().read(true).write(true).open(p);
        if path.starts_with("/dev/shm/") {
            return rw(&path).map(|f| (f, at));
        }
        for entry in std::fs::read_dir("/proc/self/fd")?.flatten() {
            let p = entry.path();
            if std::fs::metadata(&p).is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt;
                m.ino() == inode
            }) {
                return rw(&p.to_string_lossy()).map(|f| (f, at));
            }
        }
        return Err(std::io::Error::other(format!(
            "no descriptor of this process holds {path} (inode {inode})"
        )));
    }
    Err(std::io::Error::other(format!(
        "nothing is mapped at {addr:#x}"
    )))
}

/// A child process playing `role` in test `test` of this binary, its
/// stdout piped: it prints what the test needs and waits to be killed.
pub fn spawn_child(test: &str, role: &str, env: &[(&str, String)]) -> std::process::Child {
    child_command(test, role, env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child")
}

/// This test binary, to run test `test` alone as `role`, with `env`.
fn child_command(test: &str, role: &str, env: &[(&str, String)]) -> Command {
    let exe = std::env::current_exe().expect("this test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        test,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE, role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// What follows `prefix` on the first line of `child`'s stdout that has
/// it; waits at most `deadline`.
pub fn line_from(child: &mut std::process::Child, prefix: &str, deadline: Duration) -> String {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let wanted = prefix.to_string();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            // libtest prints "test NAME ... " before the test's own output.
            // Keep reading after it: a closed pipe would fail the child's
            // later output.
            if let Some(at) = line.find(&wanted) {
                let _ = tx.send(line[at + wanted.len()..].to_string());
            }
        }
    });
    match rx.recv_timeout(deadline) {
        Ok(line) => line,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child printed no {prefix:?} line within {deadline:?}");
        }
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}
