"""Helpers shared by the chart checks (test_render.py, seccomp_check.py): standard library only,
so either Python (pyenv's or the system's, which has python3-seccomp) can import it."""

import socket


def free_ports(n):
    """n distinct free loopback TCP ports (bound together, then released)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports
