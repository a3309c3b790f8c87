"""Two Python processes (this one and tests/peer.py) over posix, tcp and rc
(where there is an RDMA device): a ping-pong of NumPy arrays with every
byte checked on both sides, and a peer killed with SIGKILL."""

import os
import signal
import time

import numpy as np
import pytest
import uct_rs
from conftest import GRACE, LIMIT, PEER_TIMEOUT, TWO_PROCESS, connect, memory_for, pattern, require, transport

SIZES = [8 << 10, 1 << 20, 16 << 20]
ROUNDS = 3


@pytest.mark.parametrize("tl", TWO_PROCESS)
def test_ping_pong_of_numpy_arrays_every_byte_checked(tl, spawn):
    require(tl)
    t = transport(tl)
    mem, arr = memory_for(t, tl, max(SIZES))
    peer = spawn(tl, "pingpong", ",".join(map(str, SIZES)), ROUNDS)
    remote = connect(t, peer, mem)
    assert t.connected and t.transport_name == tl
    seq = 0
    for size in SIZES:
        for _ in range(ROUNDS):
            arr[:size] = pattern(2 * seq, size)
            t.write(mem.view(0, size), remote.slice(0, size), tag=seq).wait(LIMIT)
            # The pong lands in our memory, after the peer checked our ping.
            note = t.wait_for_write(timeout=LIMIT)
            assert (note.nbytes, note.tag) == (size, seq)
            want = pattern(2 * seq + 1, size)
            bad = np.flatnonzero(arr[:size] != want)
            assert bad.size == 0, f"pong {seq}: {bad.size} of {size} bytes differ, the first at {bad[0]}"
            assert peer.expect("ok ") == str(seq)
            seq += 1
    peer.expect("done")
    stats = t.stats()
    assert stats["writes"] == seq, stats
    if tl == "rc":
        # Each notification the immediate of one RDMA WRITE WITH IMMEDIATE.
        assert stats["notifications_received_by_immediate"] == seq, stats
    received = stats["notifications_received_by_message"] + stats["notifications_received_by_immediate"]
    assert received == seq, stats


@pytest.mark.parametrize("tl", TWO_PROCESS)
def test_ping_pong_from_a_float64_array_registered_in_place(tl, spawn):
    """Any writable buffer, of any dtype, is registered as its bytes (tcp:
    in place; posix refuses memory it did not allocate, so there the array
    is a float64 view of allocated memory)."""
    require(tl)
    t = transport(tl)
    size = 1 << 20
    if tl == "posix":
        mem = uct_rs.Memory.alloc(t, size)
        values = np.frombuffer(mem, dtype=np.float64)
    else:
        values = np.zeros(size // 8, dtype=np.float64)
        mem = uct_rs.Memory(t, values)
    assert mem.nbytes == size
    peer = spawn(tl, "pingpong", size, 1)
    remote = connect(t, peer, mem)
    values.view(np.uint8)[:] = pattern(0, size)
    t.write(mem, remote, tag=0).wait(LIMIT)
    note = t.wait_for_write(timeout=LIMIT)
    assert (note.nbytes, note.tag) == (size, 0)
    assert np.array_equal(values.view(np.uint8), pattern(1, size))
    assert peer.expect("ok ") == "0"


@pytest.mark.parametrize("tl", TWO_PROCESS)
def test_peer_killed_with_sigkill_raises_peer_error_within_the_peer_timeout(tl, spawn):
    """A wait, an awaited wait and writes pending when the peer is killed:
    each ends (a wait with uct_rs.PeerError) within the peer timeout and a
    grace for the machine's load, and later writes fail at once. rc finds
    a dead peer by the clock: the peer timeout, plus the time the bytes in
    flight take at 64 MiB/s (UCT_RC_PEER_TIMEOUT's documentation)."""
    require(tl)
    t = transport(tl)
    mem, arr = memory_for(t, tl, 1 << 20)
    peer = spawn(tl, "serve")
    remote = connect(t, peer, mem)
    waiting = t.wait_for_write_async()
    writes = [t.write(mem, remote, notify=True) for _ in range(8)]
    os.kill(peer.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    peer.proc.wait(timeout=LIMIT)
    limit = PEER_TIMEOUT + GRACE + (len(writes) * mem.nbytes / (64 << 20) if tl == "rc" else 0)
    with pytest.raises(uct_rs.PeerError) as blocking:
        t.wait_for_write(timeout=LIMIT)
    took = time.monotonic() - killed
    assert took < limit, f"{tl}: the wait ended {took:.2f} s after SIGKILL"
    assert "peer" in str(blocking.value)
    with pytest.raises(uct_rs.PeerError):
        waiting.wait(LIMIT)
    for w in writes:
        # Landed before the kill, or failed: never left hanging.
        try:
            w.wait(LIMIT)
        except uct_rs.Error:
            pass
    with pytest.raises(uct_rs.Error) as later:
        t.write(mem, remote, notify=True).wait(LIMIT)
    assert isinstance(later.value, uct_rs.PeerError), repr(later.value)
    assert time.monotonic() - killed < limit
    print(f"{tl}: the wait ended {took:.2f} s after SIGKILL: {blocking.value}")
