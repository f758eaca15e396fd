#!/usr/bin/env python3
"""Connections that hold a server's sockets, for scripts/loadtest.sh.

  hold_connections.py idle N HOST PORT SECONDS
      N connections that connect and say nothing; after SECONDS, how many
      the server still holds open.
  hold_connections.py slowloris N HOST PORT SECONDS
      N connections that send a request head one header line a second and
      never finish it; when the server cut each off (it should, after its
      header-read timeout), and how many were still open after SECONDS.
"""
import selectors
import socket
import sys
import time


def connect(n, host, port):
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port))
        s.setblocking(False)
        socks.append(s)
    return socks


def closed(s):
    """True once the server closed (or answered and closed) the socket."""
    try:
        data = s.recv(4096)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return data == b"" or data.startswith(b"HTTP/1.1 408")


def idle(n, host, port, seconds):
    socks = connect(n, host, port)
    time.sleep(seconds)
    still = sum(not closed(s) for s in socks)
    print(f"idle: {n} opened, {still} still open after {seconds:g} s", flush=True)


def slowloris(n, host, port, seconds):
    start = time.monotonic()
    socks = connect(n, host, port)
    for s in socks:
        s.send(b"POST /embed HTTP/1.1\r\nHost: x\r\n")
    cut = {}
    while time.monotonic() - start < seconds and len(cut) < n:
        time.sleep(1.0)
        for i, s in enumerate(socks):
            if i in cut:
                continue
            if closed(s):
                cut[i] = time.monotonic() - start
                continue
            try:
                s.send(b"X-Slow: 1\r\n")
            except OSError:
                cut[i] = time.monotonic() - start
    times = sorted(cut.values())
    if times:
        mid = times[len(times) // 2]
        print(
            f"slowloris: {n} opened, {len(times)} cut off by the server after "
            f"{times[0]:.1f} / {mid:.1f} / {times[-1]:.1f} s (min / median / max), "
            f"{n - len(times)} still open after {seconds:g} s",
            flush=True,
        )
    else:
        print(f"slowloris: {n} opened, none cut off within {seconds:g} s", flush=True)


if __name__ == "__main__":
    mode, n, host, port, seconds = sys.argv[1:6]
    {"idle": idle, "slowloris": slowloris}[mode](int(n), host, int(port), float(seconds))
