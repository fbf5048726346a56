"""``inagg-soft-switch``: the software data plane, a stand-in for BMv2's ``simple_switch_grpc``.

Same command-line shape::

    inagg-soft-switch -i 1@veth1 -i 2@veth2 --device-id 0 [--log-console] [--pcap DIR]
                      [--pcap-buffer KIB]
                      [--engine native|python|tofino-model] [--no-p4 | p4/out/bmv2/inagg.json]
                      -- --grpc-server-addr 0.0.0.0:9559 [--cpu-port 255]

It attaches to Linux interfaces with raw sockets and serves P4Runtime on the gRPC address. It
can run only the inagg program: the pipeline pushed (or the JSON given) must be the committed one,
at the K (values per packet) of the P4Info pushed: the software target's own
(p4/out/soft/inagg.p4info.txtpb, the default program) or BMv2's 64, any K its ports carry in one
packet (a P4Info of a larger K is refused).

``--engine native`` (the default) runs the program in C++ (``inagg.bmv2_env.softswitch.pipeline``, the
tables the P4Runtime server writes mirrored into the core) on a packet-loop thread of its own
that batches its system calls (recvmmsg/sendmmsg) and never takes the GIL; with
``--log-console`` (a log line per frame) frames take a per-frame Python loop instead.
``--engine python`` runs ``inagg.bmv2_env.softswitch.pipeline_reference.SoftPipeline``, the reference (the program in
Python, its slot logic being the shared aggregation engine), in that Python loop.
``--engine tofino-model`` runs ``inagg.bmv2_env.softswitch.tna_slot_model.TofinoModelPipeline`` (the reference
with the TNA program's slot logic, register by register) in that loop; start it with the Tofino
P4Info of either chip (``--p4info p4/out/tofino/inagg.p4info.txtpb`` or ``p4/out/tofino2/``).
Its recirculation ports lose second passes by kind with ``--recirc-loss PASS:PCT%`` (a seeded
share) or ``PASS:N[,N...]`` (exactly those passes of the kind), PASS one of result, answer,
answer-retire, undo (``recirc_loss.py``; refused on the other engines, which recirculate nothing).

``--pcap DIR`` writes <iface>_in.pcap / <iface>_out.pcap per port with scapy's writer
(``PortCaptures``), whichever loop runs: the Python loop writes each frame as it goes; the
native loop copies each captured frame (with its time) into a bounded queue that a Python thread
drains every 50 ms and once at stop. When the writer falls behind and the queue
(``--pcap-buffer``) is full, frames are left out of the capture, never held up: the count is in
the loop's stats (``capture_dropped``) and a warning at stop.

Congestion: the native loop marks a UDP result with FLAG_CONGESTION where the raw port it leaves
by has ``--congestion-kib`` or more queued in the kernel (SIOCOUTQ: the interface's queue, as
BMv2's egress marks on enq_qdepth); counted in its stats (``marked``). RoCE results are not
marked (their ICRC covers the flags), nor results on loopback (UDP) ports, nor the Python
engine's.

Loopback attachment (no root, no interfaces): ``--udp-bind 127.A.B.254`` listens on that address
at the inagg UDP port, and ``-i N@udp:127.A.B.N`` makes the host 127.A.B.N port N. Datagrams
from a host enter its port as Ethernet/IPv4/UDP frames; frames leaving a UDP-attached port are
sent as datagrams to their IPv4/UDP destination. This is how ``make demo`` runs the switch.

Impairments without netem (``impair.py``, netem's meanings), each ``PORT:in|out:AMOUNT`` and
repeatable: ``--loss PCT`` drops that share of the frames the port receives or sends,
``--delay MS`` holds the others that long back, ``--jitter MS`` draws each frame's delay in
delay +- that (so frames overtake each other), ``--duplicate PCT`` sends that share twice,
``--reorder PCT`` lets that share leave at once ahead of the held ones; every draw seeded by
``--loss-seed``, in either loop (the native loop's C++ and its Python twin decide alike).
``--impair-stats FILE`` keeps each impaired direction's frames seen, dropped, delayed,
duplicated and reordered (measured as they leave) there as JSON, rewritten every
IMPAIR_STATS_SECONDS and at stop, which ``make run``'s summary reports.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import re
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from scapy.data import DLT_EN10MB
from scapy.utils import RawPcapWriter

from inagg.controller.config import default_program
from inagg.controller.p4info import P4Info

from inagg.hostlib import add_version_flag
from inagg.hostlib.native_build import _native
from inagg.hostlib.wire.protocol import (
    UDP_PORT,
    ipv4,
)
from inagg.hostlib.wire.grant import MAX_IPV4_DATAGRAM, values_for_mtu
from inagg.hostlib.wire.transport import enlarge_buffers

from inagg.bmv2_env.softswitch.impair import (UNITS, DelayLine, PortImpairments, configure, parse_impairment,
                                              settings_by_direction, stats_json)
from inagg.bmv2_env.softswitch.pipeline import NativePipeline
from inagg.bmv2_env.softswitch.p4runtime_server import P4RuntimeService, SoftSwitchState, serve
from inagg.bmv2_env.softswitch.pipeline_reference import ETH, INAGG_AT, IP, SoftPipeline, build_frame
from inagg.bmv2_env.softswitch.recirc_loss import RecircLoss, parse_schedules
from inagg.bmv2_env.softswitch.tna_slot_model import TofinoModelPipeline

log = logging.getLogger("inagg.soft_switch")

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
SIOCGIFMTU = 0x8921
# Frames a port hands over per select() wakeup: fewer system calls under load, while one busy
# port still yields to the others every RECV_BATCH frames.
RECV_BATCH = 32
# Socket buffers of the switch's ports: a whole window of every worker (1024 slots x 32 workers
# of about 1 KiB of kernel memory each) can queue up without a drop.
PORT_BUFFER_BYTES = 32 << 20
# The native loop's congestion mark (--congestion-kib): a raw port whose socket holds this much
# unsent (its interface's queue: a shaped link's tbf, each frame at its ~2.3 KiB buffer) marks
# the results leaving by it, as BMv2 does at an egress queue of INAGG_CONGESTION_QDEPTH (16).
CONGESTION_KIB = 48


# How often the native loop's captured frames are written out (and flushed): a capture lags the
# wire by about this much.
CAPTURE_DRAIN_SECONDS = 0.05
# How often --impair-stats is rewritten: the summary, read once the jobs are done, waits this long.
IMPAIR_STATS_SECONDS = 0.2


class PortCaptures:
    """The --pcap files of both packet loops, by scapy's writer: one pcap (Ethernet) per port
    and direction, as BMv2 writes them, each valid from the start (a port that sees no traffic
    still gets one) and flushed per batch, so a capture is readable while the switch runs."""

    def __init__(self, paths: dict[int, dict[str, Path]]) -> None:
        self.writers = {(port, d): RawPcapWriter(str(path), linktype=DLT_EN10MB)
                        for port, by_direction in paths.items() for d, path in by_direction.items()}
        for w in self.writers.values():
            w.write_header(None)

    def write(self, port: int, direction: str, usec: int, frame: bytes) -> None:
        """One frame that entered (``"in"``) or left (``"out"``) ``port`` at ``usec``
        (microseconds since the epoch)."""
        self.writers[port, direction].write_packet(bytes(frame), sec=usec // 1_000_000,
                                                   usec=usec % 1_000_000)

    def flush(self) -> None:
        for w in self.writers.values():
            w.flush()

    def close(self) -> None:
        for w in self.writers.values():
            w.close()


def now_usec() -> int:
    """The pcap time of a frame the Python loop handles now: microseconds since the epoch."""
    return time.time_ns() // 1000


def recv_batch(sock: socket.socket):
    """Yield up to RECV_BATCH waiting (data, address) pairs of a non-blocking socket."""
    for _ in range(RECV_BATCH):
        try:
            yield sock.recvfrom(65535)
        except BlockingIOError:
            return


def open_port(iface: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((iface, 0))
    mreq = struct.pack("IHH8s", socket.if_nametoindex(iface), PACKET_MR_PROMISC, 0, b"")
    s.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
    enlarge_buffers(s, PORT_BUFFER_BYTES)
    s.setblocking(False)
    return s


class RawPort:
    """A Linux interface as a switch port (AF_PACKET, promiscuous)."""

    def __init__(self, port: int, iface: str) -> None:
        self.port, self.name = port, iface
        self.sock = open_port(iface)
        request = struct.pack("16si12x", iface.encode(), 0)
        self.mtu = struct.unpack_from("16si", fcntl.ioctl(self.sock, SIOCGIFMTU, request))[1]

    def recv(self) -> list[tuple[int, bytes]]:
        """Up to RECV_BATCH waiting frames (one select per batch, not per frame)."""
        return [(self.port, frame) for frame, addr in recv_batch(self.sock)
                if addr[2] != PACKET_OUTGOING]

    def send(self, port: int, frame: bytes) -> None:
        self.sock.send(frame)


# A UDP-attached host's frames carry this source MAC: 02:00 and its IPv4 address (the controller
# binds each rank to its MAC, so the loopback deployment's config names these).
UDP_HOST_MAC_PREFIX = b"\x02\x00"


def udp_host_mac(ip: str) -> str:
    """The source MAC of the frames a UDP-attached host at ``ip`` sends into the switch."""
    return ":".join(f"{b:02x}" for b in UDP_HOST_MAC_PREFIX + socket.inet_aton(ip))


class UdpPorts:
    """Hosts on loopback as switch ports: one UDP socket at the switch's inagg address and port
    (inagg's own by default; the frames the pipeline sees carry inagg's port whatever it is)."""

    def __init__(self, bind_ip: str, peers: dict[int, str], port: int = UDP_PORT) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind((bind_ip, port))
        except OSError as e:
            self.sock.close()
            raise OSError(e.errno, f"the switch cannot bind UDP {bind_ip}:{port} ({e.strerror}): another "
                                   f"program holds it; give --udp-bind {bind_ip}:PORT with a free port") from e
        enlarge_buffers(self.sock, PORT_BUFFER_BYTES)
        self.sock.setblocking(False)
        self.name = f"udp:{bind_ip}"
        self.bind_ip = socket.inet_aton(bind_ip)
        self.peers = peers
        self.port_of = {socket.inet_aton(ip): port for port, ip in peers.items()}
        self.dropped = 0

    def recv(self) -> list[tuple[int, bytes]]:
        """Up to RECV_BATCH waiting datagrams, each as the frame its host would have sent."""
        out = []
        for data, (ip, sport) in recv_batch(self.sock):
            src = socket.inet_aton(ip)
            port = self.port_of.get(src)
            if port is None:
                self.dropped += 1
                continue
            eth = b"\x00\x00\x00\x00\x00\xfe" + UDP_HOST_MAC_PREFIX + src + b"\x08\x00"
            ip_hdr = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 0, 0, 0, 64, 17, 0, src, self.bind_ip))
            out.append((port, build_frame(eth, ip_hdr, struct.pack("!HH", sport, UDP_PORT), data)))
        return out

    def send(self, port: int, frame: bytes) -> None:
        if len(frame) < INAGG_AT:
            return
        dst = socket.inet_ntoa(frame[ETH + 16: ETH + 20])
        dport, length = struct.unpack_from("!HH", frame, ETH + IP + 2)
        self.sock.sendto(frame[INAGG_AT: ETH + IP + length], (dst, dport))


def positive_int(text: str) -> int:
    """An argparse type: a size of which 0 would mean nothing at all (a capture queue of none)."""
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def check_ports(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``args.ports`` (port -> interface) and ``args.impairments`` ((port, egress) -> settings:
    impair.settings_by_direction) from the -i and impairment options; ``p.error`` on a
    malformed one or an impairment on no attached port."""
    ports = {}
    for spec in args.interface:
        num, sep, iface = spec.partition("@")
        if not sep or not num.isdigit() or not iface:
            p.error(f"bad interface {spec!r}: expected PORT@IFACE")
        if int(num) in ports:
            p.error(f"port {num} given twice")
        ports[int(num)] = iface
    if any(i.startswith("udp:") for i in ports.values()) and not args.udp_bind:
        p.error("udp: ports need --udp-bind")
    if args.udp_bind and not re.fullmatch(r"[\d.]+(:\d{1,5})?", args.udp_bind):
        p.error(f"bad --udp-bind {args.udp_bind!r}: expected IP or IP:PORT")
    args.ports = ports
    try:
        args.impairments = settings_by_direction({name: [parse_impairment(name, text) for text in getattr(args, name)]
                                                  for name in UNITS})
    except ValueError as e:
        p.error(str(e))
    unknown = sorted({port for port, _ in args.impairments} - set(ports))
    if unknown:
        p.error(f"--{'/--'.join(UNITS)} on port(s) {unknown}, which no -i attaches")
    if not 0 <= args.loss_seed < 2**64:
        p.error("--loss-seed must be in 0..2**64-1")


def check_recirc_loss(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``args.recirc_loss`` as ``recirc_loss.parse_schedules``' schedules; ``p.error`` on a bad one,
    or on one given to an engine that recirculates nothing."""
    if args.recirc_loss and args.engine != "tofino-model":
        p.error(f"--recirc-loss needs --engine tofino-model (with a Tofino --p4info): only the model of "
                f"the Tofino program recirculates, not the {args.engine} engine")
    try:
        args.recirc_loss = parse_schedules(args.recirc_loss)
    except ValueError as e:
        p.error(str(e))


def parse_args(argv: list[str]) -> argparse.Namespace:
    if "--" in argv:
        split = argv.index("--")
        argv, target_argv = argv[:split], argv[split + 1:]
    else:
        target_argv = []
    p = argparse.ArgumentParser(prog="inagg-soft-switch", description=__doc__.split("\n\n")[0])
    add_version_flag(p)
    p.add_argument("-i", "--interface", action="append", default=[], metavar="PORT@IFACE",
                   help="attach a Linux interface as a switch port (repeatable)")
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument("--log-console", action="store_true", help="log every packet to stderr")
    p.add_argument("--pcap", nargs="?", const=".", metavar="DIR",
                   help="write <iface>_in.pcap / <iface>_out.pcap per port into DIR")
    p.add_argument("--pcap-buffer", type=positive_int, metavar="KIB",
                   default=_native.SWITCH_LOOP_CAPTURE_BYTES >> 10,
                   help="native engine: the captured frames waiting to be written, at most "
                        "(beyond, frames are left out of the pcaps and counted; default %(default)s)")
    p.add_argument("--congestion-kib", type=int, metavar="KIB", default=CONGESTION_KIB,
                   help="native engine: results leaving by a raw port whose queue holds this much (the "
                        "kernel's count of its unsent frames' buffers) carry FLAG_CONGESTION (0: never; "
                        "default %(default)s, about 20 full frames)")
    p.add_argument("--no-p4", action="store_true", help="start without a program; wait for P4Runtime")
    p.add_argument("--udp-bind", metavar="IP[:PORT]",
                   help=f"switch address for udp: ports (loopback mode); port {UDP_PORT} unless given")
    p.add_argument("--p4info", metavar="PATH",
                   help="the P4Info of the program this data plane runs (default: p4/out/soft/inagg's; "
                        "p4/out/tofino/inagg.p4info.txtpb makes a Tofino-shaped switch)")
    p.add_argument("--engine", choices=("native", "python", "tofino-model"), default="native",
                   help="the pipeline: C++ on its own packet-loop thread (default), the "
                        "Python reference, or the model of the Tofino program (with its --p4info)")
    for name, what in (("loss", "drop PCT %% of the frames PORT receives (in) or sends (out)"),
                       ("delay", "hold the frames PORT receives (in) or sends (out) MS milliseconds back"),
                       ("jitter", "draw each frame's delay in delay +- MS milliseconds (frames then overtake)"),
                       ("duplicate", "send PCT %% of the frames PORT receives (in) or sends (out) twice"),
                       ("reorder", "let PCT %% of the frames leave at once, ahead of those held back")):
        p.add_argument(f"--{name}", action="append", default=[], metavar=f"PORT:in|out:{'MS' if UNITS[name] == 'MS' else 'PCT'}",
                       help=f"{what}; seeded, repeatable")
    p.add_argument("--recirc-loss", action="append", default=[], metavar="PASS:PCT%|PASS:N[,N...]",
                   help="tofino-model engine: lose that share (or exactly the N-th) of the second passes "
                        "of kind PASS (result, answer, answer-retire, undo) at the recirculation ports; "
                        "seeded by --loss-seed, repeatable")
    p.add_argument("--loss-seed", type=int, default=0, help="the seed of every impairment's draws")
    p.add_argument("--impair-stats", metavar="FILE", help="keep the ports' impairment counts here (JSON)")
    p.add_argument("config", nargs="?", help="BMv2 JSON to start with (must be p4/out/bmv2/inagg.json)")
    t = argparse.ArgumentParser(prog="inagg-soft-switch ... --")
    t.add_argument("--grpc-server-addr", default="0.0.0.0:9559")
    t.add_argument("--cpu-port", type=int, default=None, help="accepted for compatibility; unused")
    args = p.parse_args(argv)
    args.target = t.parse_args(target_argv)
    if bool(args.config) == args.no_p4:
        p.error("give either a BMv2 JSON config or --no-p4")
    check_ports(p, args)
    check_recirc_loss(p, args)
    return args


def attach_ports(args: argparse.Namespace) -> dict[int, RawPort | UdpPorts]:
    """Each switch port's attachment: the shared UDP socket of the udp: ports, or its own raw
    socket."""
    attach: dict[int, RawPort | UdpPorts] = {}
    udp_peers = {p: i[4:] for p, i in args.ports.items() if i.startswith("udp:")}
    if udp_peers:
        ip, _, port = args.udp_bind.partition(":")
        udp = UdpPorts(ip, udp_peers, int(port) if port else UDP_PORT)
        attach.update({p: udp for p in udp_peers})
    for port, iface in args.ports.items():
        if port not in udp_peers:
            attach[port] = RawPort(port, iface)
    return attach


def distinct(attach: dict[int, RawPort | UdpPorts]) -> list[RawPort | UdpPorts]:
    return list({id(a): a for a in attach.values()}.values())


def max_values_per_packet(attach: dict[int, RawPort | UdpPorts]) -> int:
    """The largest K every port carries in one packet, in the leaner framing (UDP's): a UDP
    datagram's worth on loopback attachments, the interface MTU's on raw ones (364 on Mininet's
    1500-byte veth links). RoCE framing carries 9 values fewer (``switch_values_for_mtu``):
    whoever pushes the program picks its K for the transports its jobs use."""
    mtus = [a.mtu if isinstance(a, RawPort) else MAX_IPV4_DATAGRAM for a in distinct(attach)]
    return values_for_mtu(min(mtus, default=MAX_IPV4_DATAGRAM))


def pipeline_factory(engine: str, loop: _native.SwitchLoop | None, recirc_loss: RecircLoss | None = None):
    """What builds the pipeline for each committed config (at the K of its P4Info): the Python
    reference, the Tofino model (its recirculation ports losing the passes ``recirc_loss``
    schedules, one schedule whatever program is pushed), or a native core that the packet loop
    (when there is one) switches to."""
    if engine == "python":
        return SoftPipeline
    if engine == "tofino-model":
        def model(program: P4Info) -> TofinoModelPipeline:
            pipeline = TofinoModelPipeline(program)
            pipeline.recirc_loss = recirc_loss
            return pipeline
        return model

    def native(program: P4Info) -> NativePipeline:
        pipeline = NativePipeline(program)
        if loop is not None:
            loop.set_pipeline(pipeline.core)
        return pipeline
    return native


def start_with(state: SoftSwitchState, program: P4Info) -> None:
    """Run ``program`` from the start (a JSON given on the command line), if its ports carry
    its K."""
    if program.values_per_packet > state.max_values_per_packet:
        raise RuntimeError(f"the program's {program.values_per_packet} values per packet do not fit "
                           f"the ports ({state.max_values_per_packet} at most); push a P4Info of "
                           f"a smaller K over P4Runtime instead")
    state.pipeline = state.make_pipeline(program)


class ImpairStatsFile:
    """``--impair-stats``: the ports' impairment counts (``stats()``, as ``impairment_stats``) saved
    as JSON, replaced whole (a reader never sees half a file), at most every
    IMPAIR_STATS_SECONDS unless forced (at stop)."""

    def __init__(self, path: Path, stats: Callable[[], list]) -> None:
        self.path, self.stats, self.saved_at = Path(path), stats, 0.0

    def save(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.saved_at < IMPAIR_STATS_SECONDS:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(stats_json(self.stats())) + "\n")
        tmp.replace(self.path)
        self.saved_at = now


def port_impairments(args: argparse.Namespace, loop: _native.SwitchLoop | None
                     ) -> tuple[PortImpairments, ImpairStatsFile | None]:
    """The ports' impairments set on the native loop (when it runs) and on the Python loop's
    twin, and the --impair-stats file of whichever counts."""
    impair = PortImpairments(args.loss_seed)
    configure(impair, args.impairments)
    if loop is not None:
        loop.set_impairment_seed(args.loss_seed)
        for (port, egress), settings in args.impairments.items():
            loop.set_impairment(port, egress, **settings)
    if not args.impair_stats:
        return impair, None
    return impair, ImpairStatsFile(args.impair_stats, loop.impairment_stats if loop is not None else impair.stats)


def pcap_paths(args: argparse.Namespace) -> dict[int, dict[str, Path]]:
    """Per port, <iface>_in.pcap and <iface>_out.pcap in the --pcap directory."""
    return {port: {d: Path(args.pcap) / f"{iface.replace(':', '_')}_{d}.pcap" for d in ("in", "out")}
            for port, iface in args.ports.items()}


def write_captures(loop: _native.SwitchLoop, captures: PortCaptures) -> None:
    """Write out (and flush) what the packet loop captured since the last call."""
    for port, direction, usec, frame in loop.take_captures():
        captures.write(port, direction, usec, frame)
    captures.flush()


def drain_captures(loop: _native.SwitchLoop, captures: PortCaptures, done: threading.Event) -> None:
    """The capture writer of the native loop: every CAPTURE_DRAIN_SECONDS until ``done``."""
    while not done.wait(CAPTURE_DRAIN_SECONDS):
        write_captures(loop, captures)


def run_native_loop(loop: _native.SwitchLoop, attach: dict[int, RawPort | UdpPorts],
                    captures: PortCaptures | None, stop: threading.Event,
                    impaired: ImpairStatsFile | None = None) -> int:
    """Hand the ports to the C++ packet loop (and its captures to a writer thread) and wait for
    a signal (or the loop's failure)."""
    for a in distinct(attach):
        if isinstance(a, UdpPorts):
            loop.add_udp_ports(a.sock.fileno(), ipv4(socket.inet_ntoa(a.bind_ip)),
                               [(ipv4(ip), port) for port, ip in a.peers.items()])
        else:
            loop.add_raw_port(a.sock.fileno(), a.port)
    writer_done = threading.Event()
    writer = None
    if captures is not None:
        writer = threading.Thread(target=drain_captures, args=(loop, captures, writer_done),
                                  name="pcap-writer", daemon=True)
        writer.start()
    loop.start()
    # woken every 0.1 s: a SIGTERM the kernel gives another thread runs its handler (here, on
    # the main thread) only then
    while not stop.wait(0.1) and loop.running:
        if impaired is not None:
            impaired.save()
    failed = not loop.running and not stop.is_set()
    try:
        loop.stop()
    except Exception as e:  # what stopped the loop: a socket's OSError (errno, socket), ...
        print(f"inagg-soft-switch: packet loop stopped: {e}", file=sys.stderr)
        failed = True
    if writer is not None:
        writer_done.set()
        writer.join()
        write_captures(loop, captures)   # what the loop captured since the last drain
    if impaired is not None:
        impaired.save(force=True)
    stats = loop.stats()
    log.info("packet loop: %s", stats)
    if stats["capture_dropped"]:
        log.warning("pcap: %d captured frames left out of the pcaps (the writer fell behind; "
                    "a larger --pcap-buffer holds more)", stats["capture_dropped"])
    return 1 if failed else 0


class PythonPorts:
    """The Python loop's path of a frame through the ports and the pipeline, with the ports'
    impairments (``impair``, the twin of the native loop's; held frames in ``held``)."""

    def __init__(self, state: SoftSwitchState, attach: dict[int, RawPort | UdpPorts],
                 captures: PortCaptures | None, impair: PortImpairments) -> None:
        self.state, self.attach, self.captures, self.impair = state, attach, captures, impair
        self.held = DelayLine()

    def _leaving_now(self, port: int, egress: bool, frame: bytes) -> int:
        """How many copies of ``frame`` (its port direction's next) leave now: 0 when lost, the
        others held back for their delay (``held`` releases them later); as the native loop's."""
        dropped, delay, duplicated, copy_delay, n = self.impair.next(port, egress)
        if dropped:
            return 0
        now = 0
        for d in (delay, copy_delay)[:1 + duplicated]:
            if d:
                self.held.hold(time.monotonic() + d / 1e6, port, egress, n, frame)
            else:
                self.impair.left(port, egress, n)
                now += 1
        return now

    def ingress(self, port: int, frame: bytes, released: bool = False) -> None:
        """A frame in by ``port``: lost, held back for its delay, or captured and processed
        (twice when duplicated)."""
        for _ in range(1 if released else self._leaving_now(port, False, frame)):
            if self.captures is not None:
                self.captures.write(port, "in", now_usec(), frame)
            with self.state.lock:
                out = self.state.pipeline.process(port, frame) if self.state.pipeline else []
            for egress, data in out:
                self.egress(egress, data)

    def egress(self, port: int, frame: bytes, released: bool = False) -> None:
        """A frame out by ``port``: lost, held back for its delay, or sent and captured (twice
        when duplicated)."""
        a = self.attach.get(port)
        if a is None:
            return
        for _ in range(1 if released else self._leaving_now(port, True, frame)):
            log.debug("out by port %d: %d bytes", port, len(frame))
            a.send(port, frame)
            if self.captures is not None:
                self.captures.write(port, "out", now_usec(), frame)

    def release_due(self) -> None:
        for port, egress, n, frame in self.held.take_due(time.monotonic()):
            self.impair.left(port, egress, n)
            (self.egress if egress else self.ingress)(port, frame, released=True)

    def timeout(self) -> float:
        """How long the next wait may be: 0.2 s, or until the earliest held frame is due."""
        due = self.held.next_release()
        return 0.2 if due is None else min(0.2, max(0.0, due - time.monotonic()))


def run_python_loop(state: SoftSwitchState, attach: dict[int, RawPort | UdpPorts],
                    captures: PortCaptures | None, stop: threading.Event,
                    impair: PortImpairments | None = None, impaired: ImpairStatsFile | None = None) -> int:
    """The per-frame loop: every frame through Python (pcaps, packet logs, the reference);
    ``impair``: the ports' impairments (the twin of the native loop's), in and out."""
    ports = PythonPorts(state, attach, captures, impair or PortImpairments())
    sel = selectors.DefaultSelector()
    for a in distinct(attach):
        sel.register(a.sock, selectors.EVENT_READ, a)
    while not stop.is_set():
        if impaired is not None:
            impaired.save()
        for key, _ in sel.select(timeout=ports.timeout()):
            for port, frame in key.data.recv():
                ports.ingress(port, frame)
        ports.release_due()
        if captures is not None:
            captures.flush()
    if impaired is not None:
        impaired.save(force=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.DEBUG if args.log_console else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    per_frame = args.engine != "native" or args.log_console
    loop = None if per_frame else _native.SwitchLoop(args.pcap_buffer << 10)
    impair, impaired = port_impairments(args, loop)
    if loop is not None:
        loop.set_congestion_threshold(args.congestion_kib << 10)
    captures = None
    try:
        default = default_program("soft")   # a wheel's or a checkout's p4/, else an OSError naming both
        program = P4Info.load(args.p4info) if args.p4info else default.p4info
        if args.config and Path(args.config).read_bytes() != default.device_config():
            print(f"inagg-soft-switch: {args.config} is not the committed inagg program "
                  f"({default.files['bmv2_json']})", file=sys.stderr)
            return 2
        attach = attach_ports(args)
        recirc_loss = RecircLoss(args.recirc_loss, args.loss_seed) if args.recirc_loss else None
        state = SoftSwitchState(args.device_id, program, pipeline_factory(args.engine, loop, recirc_loss),
                                max_values_per_packet(attach))
        if args.config:
            start_with(state, program)
        if args.pcap:
            captures = PortCaptures(pcap_paths(args))
            if loop is not None:
                for port in args.ports:
                    loop.capture(port)
        service = P4RuntimeService(state)
        server = serve(state, args.target.grpc_server_addr, service)
    except (OSError, RuntimeError) as e:
        print(f"inagg-soft-switch: {e}", file=sys.stderr)
        return 2

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"inagg-soft-switch device {args.device_id}: ports "
          f"{', '.join(f'{p}@{i}' for p, i in sorted(args.ports.items()))}; "
          f"P4Runtime on {args.target.grpc_server_addr}; {args.engine} engine; "
          f"nice {os.getpriority(os.PRIO_PROCESS, 0)}", flush=True)
    if loop is not None:
        status = run_native_loop(loop, attach, captures, stop, impaired)
    else:
        status = run_python_loop(state, attach, captures, stop, impair, impaired)
    if recirc_loss is not None:
        log.warning("recirculation ports lost %s", recirc_loss.lost or "no pass")
    service.close()
    server.stop(grace=1)
    if captures is not None:
        captures.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
