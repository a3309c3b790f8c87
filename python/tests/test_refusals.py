"""Bad input raises ValueError (uct_rs.InputError) carrying the transfer
API's message: URLs, keys, ranges, buffers that are not writable."""

import array

import numpy as np
import pytest
import uct_rs
from conftest import transport


def test_a_bad_url_raises_value_error_with_the_message():
    t = transport("tcp")
    t.bind()
    with pytest.raises(ValueError, match="not a uct-rs transfer URL") as e:
        t.connect("http://example.invalid/")
    assert isinstance(e.value, uct_rs.InputError) and isinstance(e.value, uct_rs.Error)
    assert "pass the exact string the peer's bind() returned" in str(e.value)
    assert not t.connected


def test_a_truncated_url_raises_value_error():
    a, b = transport("tcp"), transport("tcp")
    a.bind()
    url = b.bind()
    with pytest.raises(ValueError, match="truncated or altered"):
        a.connect(url[: len(url) // 2])


def test_connect_before_bind_is_an_error_not_bad_input():
    a, b = transport("tcp"), transport("tcp")
    with pytest.raises(uct_rs.Error, match="not bound; call bind") as e:
        a.connect(b.bind())
    assert not isinstance(e.value, ValueError)


def test_a_bad_remote_key_raises_value_error():
    with pytest.raises(ValueError, match="bad remote key"):
        uct_rs.RemoteBuffer("uct-key:garbage")


def test_out_of_range_views_and_slices_raise_value_error():
    t = transport("tcp")
    mem = uct_rs.Memory(t, bytearray(4096))
    with pytest.raises(ValueError, match=r"view \[4000, \+200\) is out of range: the memory has 4096 bytes"):
        mem.view(4000, 200)
    with pytest.raises(ValueError, match="out of range"):
        mem.view(5000)
    remote = uct_rs.RemoteBuffer(mem.remote_key())
    with pytest.raises(ValueError, match=r"remote slice \[0, \+5000\) is out of range"):
        remote.slice(0, 5000)


def read_only_array():
    arr = np.zeros(4096, dtype=np.uint8)
    arr.setflags(write=False)
    return arr


@pytest.mark.parametrize(
    "make",
    [lambda: b"\0" * 4096, lambda: memoryview(bytearray(4096)).toreadonly(), read_only_array],
    ids=["bytes", "read-only memoryview", "read-only numpy array"],
)
def test_a_buffer_that_is_not_writable_is_refused(make):
    t = transport("tcp")
    buf = make()
    with pytest.raises(ValueError, match="not writable") as e:
        uct_rs.Memory(t, buf)
    assert isinstance(e.value, uct_rs.InputError)


def test_buffers_that_cannot_be_registered_are_refused_by_name():
    t = transport("tcp")
    with pytest.raises(ValueError, match="not contiguous"):
        uct_rs.Memory(t, np.zeros((64, 64), dtype=np.uint8)[:, ::2])
    with pytest.raises(ValueError, match="empty"):
        uct_rs.Memory(t, bytearray())
    with pytest.raises(ValueError, match="has no buffer"):
        uct_rs.Memory(t, 12345)


def test_posix_refuses_memory_it_did_not_allocate_and_names_the_way():
    t = transport("posix")
    with pytest.raises(ValueError, match="posix cannot register memory the application allocated") as e:
        uct_rs.Memory(t, bytearray(4096))
    assert "use uct_rs.Memory.alloc" in str(e.value) and 'transport="cma"' in str(e.value)


def test_registered_in_place_without_a_copy():
    """The registration is the buffer itself: bytes written through the
    Memory's own buffer are the array's, and the address is the array's."""
    t = transport("tcp")
    arr = array.array("B", bytes(4096))
    mem = uct_rs.Memory(t, arr)
    assert mem.address == arr.buffer_info()[0]
    memoryview(mem)[10] = 77
    assert arr[10] == 77


def test_bad_settings_raise_value_error():
    with pytest.raises(ValueError, match="max_in_flight of 0"):
        uct_rs.Transport("tcp", max_in_flight=0)
    with pytest.raises(ValueError, match="progress"):
        uct_rs.Transport("tcp", progress="sometimes")
    with pytest.raises(ValueError):
        uct_rs.Transport("tcp", memory_types=["plasma"])
    with pytest.raises(uct_rs.Error):
        uct_rs.Transport("no-such-transport")
