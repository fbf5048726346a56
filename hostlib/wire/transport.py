"""Datagram transports under the slot stream: plain UDP now; RoCEv2 framing plugs in here."""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import socket
import struct

from inagg.hostlib.wire.protocol import ENCAP_BYTES

SOCKET_BUFFER_BYTES = 8 << 20
_SIOCGIFFLAGS, _SIOCGIFADDR, _SIOCGIFNETMASK, _SIOCGIFMTU = 0x8913, 0x8915, 0x891B, 0x8921
_IFF_UP = 0x1
_IP_MTU_DISCOVER, _IP_PMTUDISC_DO = 10, 2  # linux/in.h


def forbid_fragmentation(sock: socket.socket) -> None:
    """Set DF on every datagram: one larger than the path MTU fails to send (EMSGSIZE) instead
    of travelling as IP fragments (which a switch cannot aggregate and any loss multiplies)."""
    sock.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_DO)


def _ifreq(sock: socket.socket, request: int, name: str) -> bytes:
    return fcntl.ioctl(sock.fileno(), request, struct.pack("16s16s", name.encode()[:15], b""))


def up_interfaces() -> list[tuple[str, int, ipaddress.IPv4Network | None]]:
    """(name, MTU, IPv4 subnet or None) of every interface that is up."""
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            if not struct.unpack_from("H", _ifreq(s, _SIOCGIFFLAGS, name), 16)[0] & _IFF_UP:
                continue
            mtu = struct.unpack_from("i", _ifreq(s, _SIOCGIFMTU, name), 16)[0]
            try:
                own = _ifreq(s, _SIOCGIFADDR, name)[20:24]
                mask = _ifreq(s, _SIOCGIFNETMASK, name)[20:24]
            except OSError:  # no IPv4 address
                out.append((name, mtu, None))
                continue
            out.append((name, mtu, ipaddress.IPv4Network((socket.inet_ntoa(own), socket.inet_ntoa(mask)),
                                                         strict=False)))
    return out


def interface_of(ip: str) -> str | None:
    """The name of the interface that is up and whose IPv4 subnet holds ``ip``; None if none."""
    addr = ipaddress.IPv4Address(ip)
    return next((name for name, _, net in up_interfaces() if net is not None and addr in net), None)


def interface_mtu(local_ip: str) -> int:
    """The MTU of the interface whose IPv4 subnet holds ``local_ip`` (127.x.y.z: loopback);
    for a wildcard or an address on no interface, the smallest MTU of the interfaces that are
    up and have an IPv4 address (any of them may carry the datagram)."""
    addr = ipaddress.IPv4Address(socket.gethostbyname(local_ip or "0.0.0.0"))
    addressed = [(mtu, net) for _, mtu, net in up_interfaces() if net is not None]
    if not addressed:
        raise OSError(f"no interface that is up has an IPv4 address (looking for {local_ip})")
    if not addr.is_unspecified:
        for mtu, net in addressed:
            if addr in net:
                return mtu
    return min(mtu for mtu, _ in addressed)


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
        forbid_fragmentation(self.sock)
        self.peer = peer
        self._timeout: float | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()

    def retarget(self, peer: tuple[str, int]) -> None:
        """Send to another aggregator from now on (a new grant)."""
        self.peer = peer

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendto(data, self.peer)
        except OSError as e:
            if e.errno == errno.EMSGSIZE:
                raise ValueError(
                    f"a {len(data)}-byte datagram to {self.peer[0]}:{self.peer[1]} does not fit "
                    f"the path MTU and is never fragmented: the grant's values per packet is too "
                    f"large for this network (inagg.hostlib.wire.grant.values_for_mtu)") from None
            raise

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
