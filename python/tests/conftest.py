"""Helpers of the uct_rs tests: the peer process (tests/peer.py) driven over
its stdin and stdout, and the settings both processes run with.

The peer timeout of posix and tcp is 2 s here, in this process and its
peers (as in the transfer crate's two-process tests): a dead peer must be
found within it and GRACE.
"""

import os
import queue
import subprocess
import sys
import threading

import pytest

PEER_TIMEOUT = 2.0
GRACE = 3.0
# Before uct_rs reads its configuration (on the first Transport).
for _tl in ("POSIX", "TCP", "RC"):
    os.environ[f"UCT_{_tl}_PEER_TIMEOUT"] = f"{int(PEER_TIMEOUT * 1000)}ms"

# The bound on every wait of a test: a hang is a failure, not a stuck run.
LIMIT = 60.0
HERE = os.path.dirname(os.path.abspath(__file__))

# The two-process tests run over these. rc needs an RDMA device and the
# ib module (libuct_ib.so, a release build of the root workspace's tl-rc,
# found through UCT_MODULE_DIR): where it is absent its tests are skipped
# with the reason, except where the run expects it (inside scripts/rxe-vm,
# which sets RXE_VM_DEVICE, or UCT_TEST_EXPECT naming rc): there they fail.
TWO_PROCESS = ["posix", "tcp", "rc"]


def rc_expected():
    names = os.environ.get("UCT_TEST_EXPECT")
    if names is not None:
        return "rc" in [n.strip() for n in names.split(",")]
    return "RXE_VM_DEVICE" in os.environ


def absent(tl):
    """Why `tl` cannot run here, or None."""
    import uct_rs

    probes = [p for p in uct_rs.probe() if p.transport == tl]
    if any(p.usable for p in probes):
        return None
    if probes:
        return probes[0].reason or "not usable"
    return (
        f"no component provides {tl} (for rc: build libuct_ib.so with "
        "`cargo build --release -p tl-rc` and set UCT_MODULE_DIR to its folder)"
    )


def require(tl):
    """Skips the test, with the reason, where `tl` is absent and not
    expected; fails it where it is expected."""
    why = absent(tl)
    if why is None:
        return
    if tl == "rc" and rc_expected():
        pytest.fail(f"this run expects rc, and it is absent: {why}")
    pytest.skip(f"{tl} is not available here: {why}")


def transport(tl, **kw):
    """A Transport over `tl` (tcp on loopback)."""
    import uct_rs

    if tl == "tcp":
        kw.setdefault("device", "lo")
    return uct_rs.Transport(tl, **kw)


def memory_for(t, tl, nbytes):
    """Memory of `nbytes` for `tl`, and a uint8 NumPy array over its bytes:
    over tcp and rc an array of the application registered in place; over
    posix, which maps only memory it allocated, Memory.alloc seen through
    NumPy."""
    import numpy as np
    import uct_rs

    if tl == "posix":
        mem = uct_rs.Memory.alloc(t, nbytes)
        return mem, np.frombuffer(mem, dtype=np.uint8)
    arr = np.zeros(nbytes, dtype=np.uint8)
    return uct_rs.Memory(t, arr), arr


def pattern(seed, nbytes):
    """The bytes write `seed` carries: random, so that a shifted or stale
    byte shows."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


class Peer:
    """The peer process (tests/peer.py), line by line."""

    def __init__(self, tl, scenario, *args):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "peer.py"), tl, scenario, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines = queue.Queue()
        self.stderr = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _read_err(self):
        for line in self.proc.stderr:
            self.stderr.append(line)

    def expect(self, prefix, limit=LIMIT):
        """The peer's next line, which must start with `prefix`; what
        follows it."""
        try:
            line = self.lines.get(timeout=limit)
        except queue.Empty:
            raise AssertionError(f"the peer said nothing within {limit} s (wanted {prefix!r})")
        if line is None:
            self.proc.wait(timeout=LIMIT)
            raise AssertionError(
                f"the peer exited ({self.proc.returncode}) before {prefix!r}: {''.join(self.stderr)[-2000:]}"
            )
        if line.startswith("bad: "):
            raise AssertionError(f"the peer failed: {line[5:]}")
        assert line.startswith(prefix), f"expected {prefix!r} from the peer, got {line!r}"
        return line[len(prefix):]

    def say(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=LIMIT)


@pytest.fixture
def spawn():
    """Starts peers; kills whichever are left at the end of the test."""
    peers = []

    def start(tl, scenario, *args):
        p = Peer(tl, scenario, *args)
        peers.append(p)
        return p

    yield start
    for p in peers:
        p.close()


def connect(t, peer, mem):
    """Both sides bound and connected; the peer's memory as a
    RemoteBuffer. The peer prints its URL and key, then reads ours (`mem`'s
    key)."""
    import uct_rs

    url = peer.expect("url ")
    key = peer.expect("key ")
    peer.say("url " + t.bind())
    peer.say("key " + mem.remote_key())
    t.connect(url)
    peer.expect("connected")
    return uct_rs.RemoteBuffer(key)
