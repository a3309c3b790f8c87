"""Ping-pong of notified writes between two Python processes with uct_rs:
the Python side of scripts/compare-python.

    python python/bench/pingpong.py [-t posix] [-s 64M] [-n 25] [-w 3]
                                    [--answer full|zero] [--validate]
                                    [--cpus MEASURER,PEER]

This process measures; it starts its peer (this same script, --peer) and
trades URLs and keys with it over the peer's stdin and stdout. Both
buffers are Memory.alloc'd (posix maps only memory it allocated; over tcp
the same), seen through NumPy.

--answer full (the default): a ping-pong. Each round trip is a notified
  write of SIZE bytes to the peer, which waits for it and writes SIZE
  bytes back, notified; this side waits for that. Time per write = the
  elapsed time of the measured round trips / (2 x round trips): one
  notified write and its receiver's wake-up.
--answer zero: transfer-bench's method in two processes, in Python. The
  peer answers each notified write with a zero-length notified write;
  time per write = the round trip less half the median round trip of a
  zero-length write and its answer (made right after each write, not
  timed with it).

Prints one JSON line: size, writes, seconds, bytes_per_second,
real_time_us. --validate fills every SIZE write with its own bytes and
checks every byte on arrival (in the time: only for checking the loop).
--cpus 1,0 pins this process to CPU 1 and its peer to CPU 0 (as
scripts/compare-python pins transfer-bench's two processes).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import uct_rs

LIMIT = 60.0


def parse_size(text):
    units = {"k": 1 << 10, "K": 1 << 10, "m": 1 << 20, "M": 1 << 20, "g": 1 << 30, "G": 1 << 30}
    if text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def pin(args, which):
    if args.cpus:
        os.sched_setaffinity(0, {int(args.cpus.split(",")[which])})


def build(args):
    kw = {"device": "lo"} if args.transport == "tcp" else {}
    t = uct_rs.Transport(args.transport, **kw)
    mem = uct_rs.Memory.alloc(t, args.size)
    return t, mem, np.frombuffer(mem, dtype=np.uint8)


def fill(arr, seq):
    """The bytes of write `seq`: cheap to make and to check, never all
    alike from one write to the next."""
    arr[:] = (seq * 7 + 1) & 0xFF
    arr[::4096] = np.uint8(seq & 0xFF)


def check(arr, seq, who):
    want = np.empty_like(arr)
    fill(want, seq)
    if not np.array_equal(arr, want):
        bad = np.flatnonzero(arr != want)
        raise RuntimeError(f"{who}: write {seq}: {bad.size} bytes differ, the first at {bad[0]}")


def expect(t, tag, nbytes, who):
    note = t.wait_for_write(timeout=LIMIT)
    if note.tag != tag or note.nbytes != nbytes:
        raise RuntimeError(f"{who}: got {note}, expected tag {tag} of {nbytes} bytes")


def peer(args):
    pin(args, 1)
    t, mem, arr = build(args)
    print("url", t.bind(), flush=True)
    print("key", mem.remote_key(), flush=True)
    url = sys.stdin.readline().split(" ", 1)[1].strip()
    remote = uct_rs.RemoteBuffer(sys.stdin.readline().split(" ", 1)[1].strip())
    t.connect(url)
    zero, zero_remote = mem.view(0, 0), remote.slice(0, 0)
    for seq in range(args.warmup + args.iters):
        expect(t, seq, args.size, "peer")
        if args.validate:
            check(arr, 2 * seq, "peer")
        if args.answer == "full":
            if args.validate:
                fill(arr, 2 * seq + 1)
            t.write(mem, remote, tag=seq).wait(LIMIT)
        else:
            t.write(zero, zero_remote, tag=seq).wait(LIMIT)
            # The zero-length round trip that follows.
            expect(t, seq, 0, "peer")
            t.write(zero, zero_remote, tag=seq).wait(LIMIT)


def measure(args):
    pin(args, 0)
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--peer"] + sys.argv[1:],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        t, mem, arr = build(args)
        url = child.stdout.readline().split(" ", 1)[1].strip()
        remote = uct_rs.RemoteBuffer(child.stdout.readline().split(" ", 1)[1].strip())
        child.stdin.write(f"url {t.bind()}\nkey {mem.remote_key()}\n")
        child.stdin.flush()
        t.connect(url)
        zero, zero_remote = mem.view(0, 0), remote.slice(0, 0)
        timed, zero_rtts = 0.0, []
        for seq in range(args.warmup + args.iters):
            if args.validate:
                fill(arr, 2 * seq)
            start = time.perf_counter()
            t.write(mem, remote, tag=seq).wait(LIMIT)
            expect(t, seq, args.size if args.answer == "full" else 0, "measurer")
            took = time.perf_counter() - start
            if args.validate and args.answer == "full":
                check(arr, 2 * seq + 1, "measurer")
            if args.answer == "zero":
                z = time.perf_counter()
                t.write(zero, zero_remote, tag=seq).wait(LIMIT)
                expect(t, seq, 0, "measurer")
                zero_rtts.append(time.perf_counter() - z)
            if seq >= args.warmup:
                timed += took
        if child.wait(timeout=LIMIT) != 0:
            raise RuntimeError(f"the peer exited with {child.returncode}")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if args.answer == "full":
        writes = 2 * args.iters
        per_write = timed / writes
    else:
        writes = args.iters
        per_write = (timed - args.iters * statistics.median(zero_rtts) / 2) / writes
    print(
        json.dumps(
            {
                "transport": t.transport_name,
                "answer": args.answer,
                "size": args.size,
                "writes": writes,
                "seconds": timed,
                "bytes_per_second": args.size / per_write,
                "real_time_us": per_write * 1e6,
                "validated": args.validate,
            }
        )
    )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-t", "--transport", default="posix")
    p.add_argument("-s", "--size", type=parse_size, default=64 << 20)
    p.add_argument("-n", "--iters", type=int, default=25, help="measured round trips")
    p.add_argument("-w", "--warmup", type=int, default=3, help="round trips before measuring")
    p.add_argument("--answer", choices=["full", "zero"], default="full")
    p.add_argument("--validate", action="store_true")
    p.add_argument("--cpus", help="MEASURER,PEER: the CPUs to pin the two processes to")
    p.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.iters < 1 or args.warmup < 0 or args.size < 1:
        p.error("-n must be at least 1, -w at least 0, -s at least 1 byte")
    if args.cpus and len(args.cpus.split(",")) != 2:
        p.error("--cpus takes two CPUs: MEASURER,PEER")
    (peer if args.peer else measure)(args)


if __name__ == "__main__":
    main()
