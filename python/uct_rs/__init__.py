"""uct_rs: zero-copy transfers between processes and hosts, over shared
memory (posix, cma), TCP and RDMA (rc), from Python.

The Python face of uct-rs's transfer API::

    import numpy as np
    import uct_rs

    t = uct_rs.Transport()                 # auto: the best transport here
    url = t.bind()                         # give it to the peer ...
    t.connect(peer_url)                    # ... and take the peer's

    mem = uct_rs.Memory.alloc(t, 1 << 20)  # or uct_rs.Memory(t, array): in place
    arr = np.frombuffer(mem, dtype=np.uint8)
    key = mem.remote_key()                 # give it to the peer

    t.write(mem, peer_key, tag=7).wait(10)  # zero-copy, notifies the peer
    note = t.wait_for_write(timeout=10)     # the peer's notified write landed
    await t.write(mem.view(0, 4096), uct_rs.RemoteBuffer(peer_key).slice(0, 4096))

Every call that may wait releases the GIL. Errors: ``InputError`` (a
``ValueError``) for bad input, ``PeerError`` for a dead peer, ``Timeout``
(a ``TimeoutError``), all ``uct_rs.Error``.
"""

from ._errors import Error, InputError, PeerError, Timeout
from ._native import (
    DEFAULT_MAX_IN_FLIGHT,
    KEY_VERSION,
    URL_VERSION,
    Memory,
    Notification,
    Pending,
    Probe,
    RemoteBuffer,
    Transport,
    View,
)

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "KEY_VERSION",
    "URL_VERSION",
    "Error",
    "InputError",
    "Memory",
    "Notification",
    "PeerError",
    "Pending",
    "Probe",
    "RemoteBuffer",
    "Timeout",
    "Transport",
    "View",
    "probe",
    "supported",
]


def probe() -> "list[Probe]":
    """Every transport this process knows, usable or not, with the reason
    for those that are not (as ``transport-info`` says)."""
    return Transport.probe()


def supported() -> bool:
    """Whether this machine can connect two processes at all."""
    return Transport.supported()
