"""native/net.hpp's error policy, on real sockets: a receive, send or wait (native/wait.hpp)
error other than EAGAIN/EINTR reaches Python at once as an OSError with its errno (the errno's
subclass), naming the failed call and the socket, from each of the three users of the network
layer: the worker's stream, the host aggregator's loop and the software switch's loop.

The errors are the kernel's own: a descriptor that no longer is a socket (ENOTSOCK, on the first
send), a connected UDP socket whose peer's port is closed (the ICMP port unreachable makes its
next receive fail with ECONNREFUSED), and a descriptor that is not open when a loop waits on it
(EBADF)."""

import errno
import os
import socket
import threading
import time

import numpy as np
import pytest

from inagg.hostlib.aggregator.server import HostAggregator
from inagg.hostlib.aggregator.engine_reference import AggregationEngine
from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.native_build import _native
from inagg.hostlib.worker.stream import NativeSlotStream
from inagg.hostlib.wire.transport import UdpTransport


def closed_port() -> tuple[str, int]:
    """A loopback UDP address nothing listens on (its datagrams are answered port unreachable)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()


def named(error: OSError, call: str, sock: socket.socket | tuple[str, int]) -> bool:
    address = sock if isinstance(sock, tuple) else sock.getsockname()
    return f"{call} on socket {address[0]}:{address[1]} (fd " in str(error)


def stream_to(aggregator: tuple[str, int], stall_timeout: float) -> tuple[NativeSlotStream, UdpTransport]:
    transport = UdpTransport(aggregator, bind=("127.0.0.1", 0))
    return NativeSlotStream(Grant(3, 1, 0, 4, 4, aggregator), 0, 1, transport,
                            stall_timeout=stall_timeout), transport


def test_a_stream_send_error_is_an_oserror_naming_the_socket():
    stream, transport = stream_to(closed_port(), stall_timeout=30.0)
    address = transport.address
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, transport.sock.fileno())   # the stream's descriptor is no socket any more
        with pytest.raises(OSError) as raised:
            stream.allreduce(np.arange(10, dtype=np.int32))
        assert raised.value.errno == errno.ENOTSOCK
        assert named(raised.value, "sendmmsg", address), str(raised.value)
    finally:
        os.close(null)
        transport.close()


def test_a_stream_receive_error_ends_the_call_at_once_not_at_the_stall_timeout():
    aggregator = closed_port()
    stream, transport = stream_to(aggregator, stall_timeout=30.0)
    try:
        transport.sock.connect(aggregator)   # connected: the port unreachable becomes its error
        started = time.monotonic()
        with pytest.raises(ConnectionRefusedError) as raised:
            stream.allreduce(np.arange(10, dtype=np.int32))
        assert time.monotonic() - started < 10      # not silence until the 30 s stall timeout
        assert raised.value.errno == errno.ECONNREFUSED
        assert named(raised.value, "recvmmsg", transport.sock), str(raised.value)
    finally:
        transport.close()


def test_a_host_loop_receive_error_is_raised_by_serve():
    agg = HostAggregator(("127.0.0.1", 0), AggregationEngine(4, 4))
    raised: list[BaseException] = []

    def serve() -> None:
        try:
            agg.serve()
        except BaseException as e:   # noqa: BLE001 - the test looks at it
            raised.append(e)

    thread = threading.Thread(target=serve, daemon=True)
    try:
        agg.sock.connect(closed_port())
        thread.start()
        agg.sock.send(b"x")          # answered port unreachable: the socket's error
        thread.join(10)
        assert not thread.is_alive(), "serve() went on past the socket's error"
        assert len(raised) == 1 and isinstance(raised[0], ConnectionRefusedError), raised
        assert raised[0].errno == errno.ECONNREFUSED and named(raised[0], "recvmmsg", agg.sock)
    finally:
        agg.stop()
        thread.join(5)
        agg.sock.close()


def test_a_switch_loop_receive_error_stops_the_loop_and_stop_raises_it():
    loop = _native.SwitchLoop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        sock.connect(closed_port())
        loop.add_udp_ports(sock.fileno(), 0x7F000001, [(0x7F000002, 1)])
        loop.start()
        sock.send(b"x")              # answered port unreachable: the socket's error
        deadline = time.monotonic() + 10
        while loop.running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not loop.running, "the loop went on past the socket's error"
        with pytest.raises(ConnectionRefusedError) as raised:
            loop.stop()
        assert named(raised.value, "recvmmsg", sock), str(raised.value)
        loop.stop()                  # the error is raised once; a stopped loop stops quietly
    finally:
        sock.close()


def test_a_switch_loop_port_descriptor_not_open_stops_the_loop_with_ebadf():
    """The loops' wait is under the same policy (native/wait.hpp): a port whose descriptor is not
    open when the loop waits (here a dup closed before start(); the socket itself stays open) is
    an error of its wait, with no datagram needed to find it."""
    loop = _native.SwitchLoop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        port_fd = os.dup(sock.fileno())
        loop.add_udp_ports(port_fd, 0x7F000001, [(0x7F000002, 1)])
        os.close(port_fd)
        loop.start()
        deadline = time.monotonic() + 10
        while loop.running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not loop.running, "the loop went on waiting on a closed descriptor"
        with pytest.raises(OSError) as raised:
            loop.stop()
        assert raised.value.errno == errno.EBADF
        assert named(raised.value, "ppoll", sock), str(raised.value)
    finally:
        sock.close()


def test_a_switch_loop_takes_ports_only_before_it_starts():
    loop = _native.SwitchLoop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("127.0.0.1", 0))
        loop.start()
        with pytest.raises(RuntimeError, match="while the switch loop runs"):
            loop.add_udp_ports(sock.fileno(), 0x7F000001, [(0x7F000002, 1)])
        loop.stop()
        loop.stop()                  # stopped twice: quietly
    finally:
        sock.close()
