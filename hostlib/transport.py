"""Datagram transports under the slot stream: plain UDP now; RoCEv2 framing plugs in here."""

from __future__ import annotations

import socket

from .protocol import ENCAP_BYTES

SOCKET_BUFFER_BYTES = 8 << 20


def enlarge_buffers(sock: socket.socket, nbytes: int = SOCKET_BUFFER_BYTES) -> None:
    """Ask for large socket buffers (forcing past rmem_max when we are root): a window of
    results arriving at once must not overflow the receive queue."""
    for force, plain in ((33, socket.SO_RCVBUF), (32, socket.SO_SNDBUF)):  # SO_*BUFFORCE
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, nbytes)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, plain, nbytes)


class UdpTransport:
    """One UDP socket talking to one aggregator address (a host aggregator or a switch)."""

    # Bytes each datagram costs below its UDP payload (Ethernet + IPv4 + UDP headers).
    overhead = ENCAP_BYTES

    def __init__(self, peer: tuple[str, int], bind: tuple[str, int] = ("0.0.0.0", 0)) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(bind)
        enlarge_buffers(self.sock)
        self.peer = peer
        self._timeout: float | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()

    def retarget(self, peer: tuple[str, int]) -> None:
        """Send to another aggregator from now on (a new grant)."""
        self.peer = peer

    def send(self, data: bytes) -> None:
        self.sock.sendto(data, self.peer)

    def recv_from(self, buf: bytearray, timeout: float) -> tuple[int, tuple[str, int] | None]:
        """Receive one datagram into ``buf``: (length, sender), or (0, None) when nothing came
        within ``timeout`` seconds."""
        if timeout != self._timeout:
            self.sock.settimeout(timeout)
            self._timeout = timeout
        try:
            return self.sock.recvfrom_into(buf)
        except TimeoutError:
            return 0, None

    def recv_into(self, buf: bytearray, timeout: float) -> int:
        """Receive one datagram into ``buf``; 0 when nothing came within ``timeout`` seconds."""
        return self.recv_from(buf, timeout)[0]

    @staticmethod
    def source_of(aggregator: tuple[str, int]) -> tuple[str, int]:
        """The sender address results from ``aggregator`` arrive with (its name resolved)."""
        return socket.gethostbyname(aggregator[0]), aggregator[1]

    def close(self) -> None:
        self.sock.close()
