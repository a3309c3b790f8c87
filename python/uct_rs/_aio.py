"""asyncio glue: ``await pending``.

The native side calls back from its dispatcher thread once the operation
resolved; the callback hands over to the event loop with
``call_soon_threadsafe``. Nothing blocks the loop, and the transport's
progress thread never waits for the GIL.
"""

import asyncio


def await_pending(pending):
    """The iterator behind ``Pending.__await__``."""
    if pending.done():
        return pending.result()
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle():
        if not fut.done():
            fut.set_result(None)

    def resolved():
        # Any thread. A loop closed meanwhile has nobody left to tell.
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:
            pass

    pending._on_done(resolved)
    yield from fut
    return pending.result()
