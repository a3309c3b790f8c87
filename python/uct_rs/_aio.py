"""asyncio glue: ``await pending``.

The task polls its Pending itself (``done()``); when there may be news,
the native side calls back from its dispatcher thread, and the callback
wakes the task through its event loop with ``call_soon_threadsafe``.
Nothing blocks the loop, and the transport's progress thread never waits
for the GIL. A wait whose task is cancelled gives its place up to the next
wait, having taken no notification.
"""

import asyncio


def await_pending(pending):
    """The iterator behind ``Pending.__await__``."""
    if pending.done():
        return pending.result()
    loop = asyncio.get_running_loop()
    try:
        while not pending.done():
            woken = loop.create_future()
            pending._on_wake(_waker(loop, woken))
            yield from woken
    except BaseException:
        # Cancelled (or the coroutine closed): a wait gives its place up.
        pending._cancel()
        raise
    return pending.result()


def _waker(loop, woken):
    def settle():
        if not woken.done():
            woken.set_result(None)

    def wake():
        # Any thread. A loop closed meanwhile has nobody left to wake.
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:
            pass

    return wake
