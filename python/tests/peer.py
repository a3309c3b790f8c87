"""The peer process of the two-process tests, driven over stdin and stdout
by conftest.Peer: ``python peer.py TRANSPORT SCENARIO [ARGS...]``.

It binds, prints ``url URL`` and ``key KEY`` (its memory's remote key),
reads the parent's ``url`` and ``key`` lines, connects, prints
``connected``, then plays its scenario:

- ``pingpong SIZES ROUNDS``: for each size (comma list) and round, waits for
  the parent's notified write, checks its tag, length and every byte, then
  writes its answer (other bytes) back with the same tag; ``ok N`` after
  each, ``done`` at the end.
- ``serve``: stays connected until told ``quit`` (or killed).

A failure prints ``bad: WHY`` and exits 1.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import conftest  # noqa: E402  (sets the peer timeout before uct_rs loads)
import numpy as np  # noqa: E402
import uct_rs  # noqa: E402

LIMIT = conftest.LIMIT


def line(prefix):
    got = sys.stdin.readline().rstrip("\n")
    if not got.startswith(prefix):
        raise RuntimeError(f"expected {prefix!r} from the parent, got {got!r}")
    return got[len(prefix):]


def say(text):
    print(text, flush=True)


def pingpong(t, mem, arr, remote, sizes, rounds):
    seq = 0
    for size in sizes:
        for _ in range(rounds):
            note = t.wait_for_write(timeout=LIMIT)
            if (note.nbytes, note.tag) != (size, seq):
                raise RuntimeError(f"notification {note}, expected nbytes={size} tag={seq}")
            want = conftest.pattern(2 * seq, size)
            bad = np.flatnonzero(arr[:size] != want)
            if bad.size:
                raise RuntimeError(
                    f"ping {seq} ({size} bytes): {bad.size} bytes differ, the first at {bad[0]}"
                )
            arr[:size] = conftest.pattern(2 * seq + 1, size)
            t.write(mem.view(0, size), remote.slice(0, size), tag=seq).wait(LIMIT)
            say(f"ok {seq}")
            seq += 1
    say("done")


def main():
    tl, scenario, *args = sys.argv[1:]
    t = conftest.transport(tl)
    size = max(int(s) for s in args[0].split(",")) if scenario == "pingpong" else 1 << 20
    mem, arr = conftest.memory_for(t, tl, size)
    say("url " + t.bind())
    say("key " + mem.remote_key())
    url = line("url ")
    remote = uct_rs.RemoteBuffer(line("key "))
    t.connect(url)
    say("connected")
    if scenario == "pingpong":
        pingpong(t, mem, arr, remote, [int(s) for s in args[0].split(",")], int(args[1]))
    elif scenario == "serve":
        line("quit")
    else:
        raise RuntimeError(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 (every failure goes to the parent)
        say(f"bad: {type(e).__name__}: {e}")
        sys.exit(1)
