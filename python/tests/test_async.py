"""The Pending objects under asyncio: 64 writes gathered, waits awaited, and
the same Pending both awaited and waited on."""

import asyncio

import numpy as np
import pytest
import uct_rs
from conftest import LIMIT, memory_for, pattern, transport

WRITES = 64
SLOT = 16 << 10


def pair(tl):
    a, b = transport(tl), transport(tl)
    ua, ub = a.bind(), b.bind()
    a.connect(ub)
    b.connect(ua)
    return a, b


@pytest.mark.parametrize("tl", ["posix", "tcp"])
def test_gather_of_64_writes(tl):
    a, b = pair(tl)
    src, src_arr = memory_for(a, tl, WRITES * SLOT)
    dst, dst_arr = memory_for(b, tl, WRITES * SLOT)
    src_arr[:] = pattern(64, WRITES * SLOT)
    remote = uct_rs.RemoteBuffer(dst.remote_key())

    async def main():
        writes = [
            a.write(src.view(i * SLOT, SLOT), remote.slice(i * SLOT, SLOT), tag=i)
            for i in range(WRITES)
        ]
        waits = [b.wait_for_write_async() for _ in range(WRITES)]
        done = await asyncio.wait_for(asyncio.gather(*writes), LIMIT)
        notes = await asyncio.wait_for(asyncio.gather(*waits), LIMIT)
        return done, notes

    done, notes = asyncio.run(main())
    assert done == [None] * WRITES
    assert sorted(n.tag for n in notes) == list(range(WRITES))
    assert all(n.nbytes == SLOT for n in notes)
    assert np.array_equal(dst_arr, src_arr)
    assert a.stats()["writes"] == WRITES


def test_an_await_is_woken_by_a_write_made_later():
    """The wait is awaited before the write exists: the dispatcher thread
    wakes the event loop when the notification lands."""
    a, b = pair("tcp")
    src, _ = memory_for(a, "tcp", 4096)
    dst, _ = memory_for(b, "tcp", 4096)

    async def main():
        waiting = asyncio.ensure_future(b.wait_for_write_async())
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await a.write(src, dst.remote_key(), tag=9)
        return await asyncio.wait_for(waiting, LIMIT)

    note = asyncio.run(main())
    assert (note.nbytes, note.tag) == (4096, 9)


def test_a_pending_awaited_and_waited_on_resolves_both():
    a, b = pair("tcp")
    src, _ = memory_for(a, "tcp", 4096)
    dst, _ = memory_for(b, "tcp", 4096)

    async def main():
        pending = b.wait_for_write_async()
        awaited = asyncio.ensure_future(pending)
        await asyncio.sleep(0.05)
        with pytest.raises(uct_rs.Timeout):
            pending.wait(0.05)
        a.write(src, dst.remote_key(), tag=3).wait(LIMIT)
        # Blocking here takes the notification; the await sees it too.
        assert pending.wait(LIMIT).tag == 3
        return await asyncio.wait_for(awaited, LIMIT)

    assert asyncio.run(main()).tag == 3


def test_await_raises_the_operations_error():
    a, b = pair("tcp")
    src, _ = memory_for(a, "tcp", 4096)
    dst, _ = memory_for(b, "tcp", 1024)

    async def main():
        await a.write(src, dst.remote_key())

    with pytest.raises(ValueError, match="local view has 4096 bytes and the remote slice 1024"):
        asyncio.run(main())


def test_a_cancelled_await_of_a_wait_gives_its_place_to_the_next():
    """A wait whose await is cancelled (asyncio.wait_for's timeout) takes
    no notification, even while its Pending is still referenced: the next
    wait, pending before the write, gets it."""
    a, b = pair("tcp")
    src, _ = memory_for(a, "tcp", 4096)
    dst, _ = memory_for(b, "tcp", 4096)

    async def main():
        stale = b.wait_for_write_async()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(stale, 0.1)
        fresh = asyncio.ensure_future(b.wait_for_write_async())
        await asyncio.sleep(0.05)
        a.write(src, dst.remote_key(), tag=5).wait(LIMIT)
        note = await asyncio.wait_for(fresh, LIMIT)
        with pytest.raises(uct_rs.Error, match="cancelled"):
            stale.result()
        return note

    assert asyncio.run(main()).tag == 5


def test_a_cancelled_await_of_a_write_lets_it_complete():
    a, b = pair("tcp")
    src, src_arr = memory_for(a, "tcp", 1 << 20)
    dst, dst_arr = memory_for(b, "tcp", 1 << 20)
    src_arr[:] = pattern(3, 1 << 20)

    async def main():
        w = a.write(src, dst.remote_key(), tag=8)
        task = asyncio.ensure_future(w)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return w.wait(LIMIT), b.wait_for_write(timeout=LIMIT)

    done, note = asyncio.run(main())
    assert done is None and note.tag == 8
    assert np.array_equal(dst_arr, src_arr)


def test_a_wait_that_timed_out_blocking_holds_up_no_await():
    """A Pending wait, waited on with a timeout that ran out and kept:
    an await made after it still gets the next notification."""
    a, b = pair("tcp")
    src, _ = memory_for(a, "tcp", 4096)
    dst, _ = memory_for(b, "tcp", 4096)
    kept = b.wait_for_write_async()
    with pytest.raises(uct_rs.Timeout):
        kept.wait(0.05)
    assert not kept.done()

    async def main():
        fresh = asyncio.ensure_future(b.wait_for_write_async())
        await asyncio.sleep(0.05)
        a.write(src, dst.remote_key(), tag=6).wait(LIMIT)
        return await asyncio.wait_for(fresh, LIMIT)

    assert asyncio.run(main()).tag == 6
    # The kept wait gets the one after.
    a.write(src, dst.remote_key(), tag=7).wait(LIMIT)
    assert kept.wait(LIMIT).tag == 7


FORK_SCRIPT = r"""
import asyncio, os, sys, uct_rs

def pair():
    a, b = uct_rs.Transport("tcp", device="lo"), uct_rs.Transport("tcp", device="lo")
    ua, ub = a.bind(), b.bind()
    a.connect(ub)
    b.connect(ua)
    return a, b

async def roundtrip(a, b):
    sm, dm = uct_rs.Memory(a, bytearray(4096)), uct_rs.Memory(b, bytearray(4096))
    w = asyncio.ensure_future(b.wait_for_write_async())
    await asyncio.sleep(0.05)
    await a.write(sm, dm.remote_key(), tag=1)
    return (await asyncio.wait_for(w, 10)).tag

a, b = pair()
assert asyncio.run(roundtrip(a, b)) == 1
a.close()
b.close()
pid = os.fork()
if pid == 0:
    a, b = pair()
    try:
        code = 0 if asyncio.run(roundtrip(a, b)) == 1 else 3
    except BaseException as e:
        print("child failed:", type(e).__name__, e, flush=True)
        code = 4
    os._exit(code)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_awaits_work_in_a_child_forked_after_the_parent_awaited():
    # The dispatcher thread does not survive a fork: the child starts its
    # own (in a subprocess, so that pytest itself never forks).
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stdout}{r.stderr}"
