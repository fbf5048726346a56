"""What the tests' hand-scripted aggregators share (tests/test_stream.py,
tests/test_loss_detection.py): a UDP socket on loopback, its datagrams until it falls silent, and
a contribution echoed as its result (a one-rank job's sum is the contribution itself)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

from inagg.hostlib.wire.protocol import MSG_RESULT, VERSION


def bound_socket(timeout: float = 5.0) -> socket.socket:
    """A UDP socket on 127.0.0.1 (a free port) whose receives give up after ``timeout``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(timeout)
    return sock


def datagrams(sock: socket.socket) -> Iterator[tuple[bytes, tuple[str, int]]]:
    """(datagram, sender) until the socket times out or is closed (the test is over)."""
    while True:
        try:
            yield sock.recvfrom(65536)
        except (TimeoutError, OSError):
            return


def as_result(contribution: bytes) -> bytes:
    """``contribution`` with its message type turned into a result."""
    return bytes([(VERSION << 4) | MSG_RESULT]) + contribution[1:]
