"""Loopback ports for servers that a test names in a configuration before they start.

``bind(0)``, close, and hand the number to a server later is a race: between the close and
the server's bind, the kernel may give that ephemeral port to another process's outgoing
connection or ``bind(0)``, or to a client of this test retrying a connection to it (a TCP
self-connect). So ports come from *below* the kernel's ephemeral range, which the kernel
never hands out by itself, and each one is claimed with an ``flock`` on a file named after
it: concurrent test sessions on one machine never claim the same port, and the lock dies
with the process that held it (even on ``kill -9``). A port is also never handed out twice
in one session. Servers that can bind port 0 and report it should do that instead.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

__all__ = ["free_port"]

_LOCK_DIR = Path(tempfile.gettempdir()) / "roomstream-test-ports"
_claimed: dict[int, int] = {}  # port -> fd of its lock file, held for the session
_FIRST = 20000  # above the well-known ports the machine's services use


def _port_range() -> range:
    try:
        low, _high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        ephemeral_low = int(low)
    except (OSError, ValueError):
        ephemeral_low = 32768  # Linux's default
    if ephemeral_low - _FIRST < 2000:
        raise RuntimeError(
            f"the ephemeral port range starts at {ephemeral_low}: too few ports below it"
        )
    return range(_FIRST, ephemeral_low)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        # As the servers do (asyncio's default), so TIME_WAIT leftovers do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _claim(port: int) -> bool:
    fd = os.open(_LOCK_DIR / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    if not _bindable(port):
        os.close(fd)  # releases the lock
        return False
    _claimed[port] = fd
    return True


def free_port() -> int:
    """A loopback port no other test (in this session or a concurrent one) will use, and
    that is free now; outside the ephemeral range, so nothing else takes it meanwhile."""
    _LOCK_DIR.mkdir(parents=True, exist_ok=True)
    ports = _port_range()
    start = random.randrange(len(ports))  # spread concurrent sessions; any port will do
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        if port not in _claimed and _claim(port):
            return port
    raise RuntimeError(f"no free loopback port in {ports.start}..{ports.stop - 1}")
