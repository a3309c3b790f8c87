"""Type stubs of uct_rs._native, the Rust half of uct_rs (PyO3)."""

from collections.abc import Generator, Sequence
from typing import Any, Literal, final

URL_VERSION: int
KEY_VERSION: int
DEFAULT_MAX_IN_FLIGHT: int

@final
class Probe:
    """What probe() finds for one transport."""

    @property
    def transport(self) -> str: ...
    @property
    def device(self) -> str | None: ...
    @property
    def usable(self) -> bool: ...
    @property
    def reason(self) -> str | None: ...

@final
class Notification:
    """A notified write that arrived."""

    @property
    def nbytes(self) -> int:
        """Bytes the write carried, as the writer says."""
    @property
    def tag(self) -> int:
        """The writer's tag (0 without one)."""

@final
class Pending:
    """An operation or a wait in flight: wait() on it, or await it."""

    def wait(self, timeout: float | None = None) -> Any:
        """Blocks (GIL released) until it completes, at most `timeout`
        seconds; None for a write, read or flush, a Notification for a
        wait. Raises its error, or Timeout (the operation goes on)."""
    def done(self) -> bool: ...
    def result(self) -> Any:
        """The result once completed; raises its error, or Error before."""
    def _on_wake(self, callback: Any) -> None: ...
    def _cancel(self) -> None: ...
    def __await__(self) -> Generator[Any, None, Any]: ...

@final
class View:
    """A range of a Memory."""

    @property
    def offset(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...

@final
class RemoteBuffer:
    """A peer's memory, from the key its Memory.remote_key() returned."""

    def __init__(self, key: str) -> None: ...
    def slice(self, offset: int = 0, length: int | None = None) -> RemoteBuffer: ...
    @property
    def key(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def writable(self) -> bool: ...
    @property
    def mem_type(self) -> str: ...
    def __len__(self) -> int: ...

@final
class Memory:
    """Registered memory: a writable buffer in place (no copy), or
    allocated. Host memory is itself a writable buffer."""

    def __init__(self, transport: Transport, buffer: Any, *, read_only: bool = False) -> None:
        """Registers a bytearray, writable memoryview, NumPy array or CPU
        torch tensor in place, and holds it while in use."""
    @staticmethod
    def alloc(
        transport: Transport,
        size: int,
        *,
        mem_type: str = "host",
        read_only: bool = False,
    ) -> Memory: ...
    def view(self, offset: int = 0, length: int | None = None) -> View: ...
    def remote_key(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def address(self) -> int: ...
    @property
    def mem_type(self) -> str: ...
    @property
    def read_only(self) -> bool: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

Local = View | Memory
Remote = RemoteBuffer | str

@final
class Transport:
    """One side of a connection: bind() gives the peer a URL, connect()
    takes the peer's."""

    def __init__(
        self,
        transport: str = "auto",
        *,
        device: str | None = None,
        memory_types: Sequence[str] | None = None,
        max_in_flight: int | None = None,
        progress: Literal["thread", "manual"] = "thread",
        max_notification_backlog: int | None = None,
    ) -> None: ...
    @staticmethod
    def supported() -> bool: ...
    @staticmethod
    def probe() -> list[Probe]: ...
    def bind(self) -> str: ...
    def connect(self, url: str) -> None: ...
    @property
    def connected(self) -> bool: ...
    @property
    def transport_name(self) -> str | None: ...
    def stats(self) -> dict[str, int]: ...
    def write(
        self,
        local: Local,
        remote: Remote,
        *,
        notify: bool = False,
        tag: int | None = None,
    ) -> Pending: ...
    def read(self, local: Local, remote: Remote) -> Pending: ...
    def flush(self) -> Pending: ...
    def wait_for_write(self, timeout: float | None = None) -> Notification: ...
    def wait_for_write_async(self) -> Pending: ...
    def progress(self) -> int: ...
    def close(self) -> None: ...
    def __enter__(self) -> Transport: ...
    def __exit__(self, *exc: object) -> bool: ...
