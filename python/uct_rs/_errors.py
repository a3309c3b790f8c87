"""The exceptions of uct_rs. Every one carries the transfer API's message,
which says what failed and what to do.

- ``Error``: the base of them all.
- ``InputError``: bad input (a URL, a remote key, a range, a buffer that is
  not writable, a setting); also a ``ValueError``.
- ``PeerError``: the peer died or cannot be reached.
- ``Timeout``: a wait ran out of time; also a ``TimeoutError``.
"""


class Error(Exception):
    """An error of uct-rs; the message says what failed and what to do."""


class InputError(Error, ValueError):
    """Bad input: a URL, a remote key, a range, a buffer, a setting."""


class PeerError(Error):
    """The peer died, or cannot be reached: create a new Transport."""


class Timeout(Error, TimeoutError):
    """A wait ran out of time; the operation goes on."""


# Shown as uct_rs.Error, uct_rs.PeerError, ... in tracebacks.
for _cls in (Error, InputError, PeerError, Timeout):
    _cls.__module__ = "uct_rs"
del _cls
