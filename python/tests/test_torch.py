"""torch tensors registered in place (CPU): skipped, with the reason, where
torch is not installed."""

import pytest
import uct_rs
from conftest import LIMIT, transport

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch to run this test)")


def test_a_cpu_tensor_is_registered_in_place_and_written():
    a, b = transport("tcp"), transport("tcp")
    ua, ub = a.bind(), b.bind()
    a.connect(ub)
    b.connect(ua)
    src = torch.arange(1 << 18, dtype=torch.float32)
    dst = torch.zeros(1 << 18, dtype=torch.float32)
    smem, dmem = uct_rs.Memory(a, src), uct_rs.Memory(b, dst)
    assert smem.address == src.data_ptr() and smem.nbytes == src.nbytes
    a.write(smem, dmem.remote_key(), tag=1).wait(LIMIT)
    assert b.wait_for_write(timeout=LIMIT).tag == 1
    assert torch.equal(src, dst)


def test_a_non_contiguous_tensor_is_refused():
    t = transport("tcp")
    with pytest.raises(ValueError, match="not contiguous"):
        uct_rs.Memory(t, torch.zeros(64, 64)[:, ::2])
