"""Memory held while in use, allocated memory as a buffer, reads, waits that
time out, the GIL released while waiting, probe()."""

import gc
import threading
import time

import numpy as np
import pytest
import uct_rs
from conftest import LIMIT, pattern, transport


def pair(tl):
    a, b = transport(tl), transport(tl)
    ua, ub = a.bind(), b.bind()
    a.connect(ub)
    b.connect(ua)
    return a, b


def test_probe_lists_the_transports_with_reasons():
    found = {p.transport: p for p in uct_rs.probe() if p.usable}
    assert {"posix", "tcp", "self"} <= set(found), uct_rs.probe()
    assert uct_rs.supported()
    for p in uct_rs.probe():
        assert p.usable or p.reason, p


def test_a_registered_buffer_is_held_until_the_memory_and_its_views_are_gone():
    t = transport("tcp")
    buf = bytearray(4096)
    mem = uct_rs.Memory(t, buf)
    view = mem.view(0, 16)
    with pytest.raises(BufferError):
        buf.extend(b"x")  # the export stops a resize under the registration
    del mem
    gc.collect()
    with pytest.raises(BufferError):
        buf.extend(b"x")  # the view still holds it
    del view
    gc.collect()
    buf.extend(b"x")
    assert len(buf) == 4097


def test_a_buffer_stays_held_until_a_dropped_write_completes():
    """A write's Pending dropped at once, and its Memory: the buffer is
    held until the transport is done with it, then released."""
    a, b = pair("tcp")
    src = bytearray(pattern(5, 1 << 20).tobytes())
    dst = bytearray(1 << 20)
    dmem = uct_rs.Memory(b, dst)
    smem = uct_rs.Memory(a, src)
    a.write(smem, dmem.remote_key(), tag=1)  # the Pending is dropped here
    del smem
    assert b.wait_for_write(timeout=LIMIT).tag == 1
    assert dst == src
    deadline = time.monotonic() + LIMIT
    while True:
        try:
            src.extend(b"x")
            break
        except BufferError:
            assert time.monotonic() < deadline, "the buffer was never released"
            time.sleep(0.01)


def test_allocated_memory_is_a_writable_buffer():
    t = transport("posix")
    mem = uct_rs.Memory.alloc(t, 1 << 16)
    arr = np.frombuffer(mem, dtype=np.uint32)
    assert arr.flags.writeable and arr.size == (1 << 16) // 4
    arr[:] = 7
    assert bytes(memoryview(mem)[:4]) == b"\x07\0\0\0"
    assert mem.mem_type == "host" and not mem.read_only
    assert uct_rs.RemoteBuffer(mem.remote_key()).writable


@pytest.mark.parametrize("tl", ["posix", "tcp"])
def test_read_fetches_the_peers_bytes(tl):
    a, b = pair(tl)
    src = uct_rs.Memory.alloc(b, 1 << 20, read_only=True)
    np.frombuffer(src, dtype=np.uint8)[:] = pattern(11, 1 << 20)
    dst = uct_rs.Memory.alloc(a, 1 << 20)
    remote = uct_rs.RemoteBuffer(src.remote_key())
    assert not remote.writable
    a.read(dst, remote).wait(LIMIT)
    assert np.array_equal(np.frombuffer(dst, dtype=np.uint8), pattern(11, 1 << 20))
    with pytest.raises(ValueError, match="grants"):
        a.write(dst, remote).wait(LIMIT)


def test_a_wait_for_write_times_out_and_the_next_one_gets_the_write():
    a, b = pair("tcp")
    src = uct_rs.Memory(a, bytearray(64))
    dst = uct_rs.Memory(b, bytearray(64))
    start = time.monotonic()
    with pytest.raises(uct_rs.Timeout, match="did not complete within") as e:
        b.wait_for_write(timeout=0.2)
    assert isinstance(e.value, TimeoutError)
    assert 0.2 <= time.monotonic() - start < 5
    a.write(src, dst.remote_key(), tag=4).wait(LIMIT)
    assert b.wait_for_write(timeout=LIMIT).tag == 4


def test_the_gil_is_released_while_waiting():
    a, b = pair("tcp")
    src = uct_rs.Memory(a, bytearray(64))
    dst = uct_rs.Memory(b, bytearray(64))
    got = []
    waiter = threading.Thread(target=lambda: got.append(b.wait_for_write(timeout=LIMIT)))
    waiter.start()
    # This thread runs Python while the other one waits.
    spins, end = 0, time.monotonic() + 0.3
    while time.monotonic() < end:
        spins += 1
    assert spins > 1000 and waiter.is_alive()
    a.write(src, dst.remote_key(), tag=2).wait(LIMIT)
    waiter.join(LIMIT)
    assert got and got[0].tag == 2


def test_a_closed_transport_fails_its_waits_and_refuses_calls():
    a, b = pair("tcp")
    waiting = b.wait_for_write_async()
    b.close()
    with pytest.raises(uct_rs.Error, match="dropped with this operation pending"):
        waiting.wait(LIMIT)
    with pytest.raises(uct_rs.Error, match="closed"):
        b.bind()
    with transport("tcp") as t:
        assert "not connected" in repr(t)
    assert "closed" in repr(t)


def test_manual_progress_is_driven_by_wait():
    a = transport("tcp", progress="manual")
    b = transport("tcp", progress="manual")
    ua, ub = a.bind(), b.bind()
    a.connect(ub)
    b.connect(ua)
    src = uct_rs.Memory(a, bytearray(b"m" * 128))
    dst = uct_rs.Memory(b, bytearray(128))
    w = a.write(src, dst.remote_key(), tag=6)
    deadline = time.monotonic() + LIMIT
    # b's wait drives b; a's write needs a driven too.
    while not w.done():
        a.progress()
        b.progress()
        assert time.monotonic() < deadline
    assert b.wait_for_write(timeout=LIMIT).tag == 6


class FakeTensor:
    """An object that looks like a torch tensor (data_ptr(), nbytes, device,
    is_contiguous(), untyped_storage) but is none: its pointer has no buffer
    behind it, so uct_rs must not take it."""

    class Device:
        type = "cpu"

    device = Device()

    def __init__(self, ptr, nbytes):
        self.ptr, self.nbytes = ptr, nbytes

    def data_ptr(self):
        return self.ptr

    def is_contiguous(self):
        return True

    def untyped_storage(self):
        return self


def test_an_object_that_only_looks_like_a_tensor_is_refused():
    t = transport("tcp")
    with pytest.raises(ValueError, match="has no buffer"):
        uct_rs.Memory(t, FakeTensor(0x10, 4096))
    immutable = b"x" * 4096
    with pytest.raises(ValueError, match="has no buffer"):
        uct_rs.Memory(t, FakeTensor(id(immutable), len(immutable)))


# Real torch tensors: tests/test_torch.py (skipped where torch is absent).
