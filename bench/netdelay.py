#!/usr/bin/env python3
"""A TCP relay that adds a one-way delay to every byte in each direction: the round-trip time of
a real network, for a kernel without `sch_netem` (this machine's: CONFIG_NET_SCH_NETEM is not
set, and no fq/ETF qdisc to hold packets until a departure time either).

Run inside the controller's network namespace (`nsenter --net=/run/netns/NS`), it listens on
127.0.0.1:PORT for each `--map PORT:ADDR:PORT2` and forwards to ADDR:PORT2 (the target
namespace's side of a veth pair). Each chunk read is written on `--delay` seconds after it
arrived, in order; a connection's onward connect waits 1.5 round trips, so that the first byte
the server sends reaches the client 2 round trips after connect(), as over TCP (SYN, SYN-ACK,
then the server's banner). Not modelled: bandwidth, loss and congestion windows (the payloads
here are a few KiB). Timers are `time.sleep` (clock_nanosleep) in a thread per direction, not
asyncio's (epoll's timeout is whole milliseconds): sub-millisecond delays keep their size. Run it
under SCHED_FIFO (`chrt -f 50`): on a loaded machine a normal thread's wake-up after a sleep
comes 3-7 ms late (measured here at load 13 on 2 CPUs), a real-time one's within 0.1 ms; the
network is not the controller's CPU, so its timing should not queue behind it.

`--echo PORT` instead runs an echo server on 0.0.0.0:PORT (in the target namespace): the
round trip that a probe through the relay measures is the effective RTT stated with results.

Bounded: `--lifetime` seconds at most (default 3600), then it exits by itself.
"""

from __future__ import annotations

import argparse
import queue
import socket
import sys
import threading
import time


def pump(src: socket.socket, dst: socket.socket, delay: float, done: threading.Event) -> None:
    q: queue.Queue = queue.Queue()

    def reader() -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            q.put((time.monotonic() + delay, data))
            if not data:
                return

    def writer() -> None:
        try:
            while True:
                at, data = q.get()
                wait = at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            done.set()

    threading.Thread(target=reader, daemon=True).start()
    threading.Thread(target=writer, daemon=True).start()


def serve(conn: socket.socket, to: tuple[str, int], delay: float) -> None:
    time.sleep(3 * delay)  # 1.5 round trips: the SYN, the SYN-ACK, the client's first bytes on their way
    try:
        up = socket.create_connection(to, timeout=30)
    except OSError:
        conn.close()
        return
    up.settimeout(None)
    for s in (conn, up):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    a, b = threading.Event(), threading.Event()
    pump(conn, up, delay, a)
    pump(up, conn, delay, b)
    a.wait()
    b.wait()
    conn.close()
    up.close()


def bound(addr: str, port: int) -> socket.socket:
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(512)
    return ls


def listen(ls: socket.socket, to: tuple[str, int], delay: float) -> None:
    while True:
        conn, _ = ls.accept()
        threading.Thread(target=serve, args=(conn, to, delay), daemon=True).start()


def echo(ls: socket.socket) -> None:
    def one(c: socket.socket) -> None:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := c.recv(4096):
            c.sendall(data)
        c.close()

    while True:
        c, _ = ls.accept()
        threading.Thread(target=one, args=(c,), daemon=True).start()


def probe(port: int, n: int = 30) -> float:
    """The median round trip of one byte through the relay on 127.0.0.1:port, in seconds."""
    import statistics

    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"x")
        s.recv(1)
        rtts = []
        for _ in range(n):
            t0 = time.perf_counter()
            s.sendall(b"x")
            if not s.recv(1):
                raise OSError("echo closed")
            rtts.append(time.perf_counter() - t0)
    return statistics.median(rtts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay", type=float, default=0.0, help="one-way delay, seconds")
    ap.add_argument("--map", action="append", default=[], help="PORT:ADDR:PORT2")
    ap.add_argument("--echo", type=int, help="run an echo server on this port instead")
    ap.add_argument("--probe", type=int, help="print the median RTT through 127.0.0.1:PORT and exit")
    ap.add_argument("--lifetime", type=float, default=3600.0)
    a = ap.parse_args()
    if a.probe:
        print(f"{probe(a.probe):.6f}")
        return 0
    if a.echo:
        threading.Thread(target=echo, args=(bound("0.0.0.0", a.echo),), daemon=True).start()
    for m in a.map:
        port, addr, port2 = m.rsplit(":", 2)
        threading.Thread(target=listen, args=(bound("127.0.0.1", int(port)), (addr, int(port2)), a.delay),
                         daemon=True).start()
    print("ready", flush=True)
    time.sleep(a.lifetime)
    return 0


if __name__ == "__main__":
    sys.exit(main())
