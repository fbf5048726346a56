"""``inagg-aggregator``: the host aggregator, a UDP server in front of the aggregation engine.

It serves the jobs the switch has no room for (and every job where there is no switch). Jobs
come from a JSON file, ``--job`` flags and/or the controller's feed. The packet loop is native
(native/host_loop.cpp: recvmmsg/sendmmsg batches, the C++ engine, no GIL) on the thread that
calls ``serve()``; Python only configures it and reads its counters. Datagrams are never
fragmented: K (values per packet) fits the MTU of the interface the aggregator is bound to.

Job JSON: ``{"job_id": 7, "epoch": 1, "slot_base": 0, "slot_count": 64,
"workers": ["127.0.0.1:47000", "127.0.0.1:47001"]}`` (a list of these, or ``{"jobs": [...]}``).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Iterable

from inagg.hostlib import add_version_flag
from inagg.hostlib.native_build import _native
from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig
from inagg.hostlib.wire.grant import (HOST_AGGREGATOR_PORT, HOST_VALUES_PER_PACKET, IPV4_UDP_BYTES, parse_address,
                    values_for_mtu)
from inagg.hostlib.wire.protocol import HEADER_BYTES
from inagg.hostlib.aggregator.engine import NativeEngine, udp_sender_id
from inagg.hostlib.wire.transport import enlarge_buffers, forbid_fragmentation, interface_mtu


def job_from_dict(d: dict) -> JobConfig:
    """Build a JobConfig from its JSON form, naming the missing or bad key."""
    try:
        members = tuple(parse_address(w) for w in d["workers"])
        return JobConfig(
            job_id=int(d["job_id"]), epoch=int(d.get("epoch", 1)),
            slot_base=int(d["slot_base"]), slot_count=int(d["slot_count"]), members=members,
        )
    except KeyError as e:
        raise ValueError(f"job {d.get('job_id', '?')}: missing key {e.args[0]!r}") from None
    except (TypeError, AttributeError):
        raise ValueError(f"job entry must be a JSON object with a list of workers: {d!r}") from None


def load_jobs(text: str) -> list[JobConfig]:
    data = json.loads(text)
    if isinstance(data, dict):
        data = data.get("jobs", [data])
    return [job_from_dict(d) for d in data]


def host_engine(n_slots: int, values_per_packet: int) -> NativeEngine:
    """The native engine in host mode, members identified by their UDP address (IPv4:port),
    as the native loop identifies senders."""
    return NativeEngine(n_slots, values_per_packet, host_mode=True, sender_id=udp_sender_id)


def default_values_per_packet(bind_host: str) -> int:
    """K for an aggregator bound to ``bind_host``: HOST_VALUES_PER_PACKET where its interface's
    MTU allows it, else the most that MTU allows (364 on a 1500-byte link)."""
    return min(HOST_VALUES_PER_PACKET, values_for_mtu(interface_mtu(bind_host)))


def check_values_per_packet(bind_host: str, k: int) -> None:
    """Refuse a K whose datagrams would need IP fragmentation on the bound interface."""
    mtu = interface_mtu(bind_host)
    if k > values_for_mtu(mtu):
        raise ValueError(f"{k} values per packet need {IPV4_UDP_BYTES + HEADER_BYTES + 4 * k}-byte "
                         f"datagrams; the "
                         f"interface of {bind_host} has MTU {mtu}: at most {values_for_mtu(mtu)}")


# Socket buffers of the aggregator: a clean path never drops (4 workers x 32 slots x 16 KiB in
# flight is 2 MiB; this leaves room for many jobs).
SOCKET_BUFFER_BYTES = 32 << 20


class HostAggregator:
    """A UDP socket served by the native loop: datagram -> engine -> datagrams to the job's
    members, with optional loss injection (tests)."""

    def __init__(
        self,
        bind: tuple[str, int],
        engine: AggregationEngine | NativeEngine,
        *,
        drop_rate: float = 0.0,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= drop_rate < 1.0:
            raise ValueError(f"drop rate must be in [0, 1), got {drop_rate}")
        self.engine = _as_host_engine(engine)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(bind)
        enlarge_buffers(self.sock, SOCKET_BUFFER_BYTES)
        forbid_fragmentation(self.sock)
        self._loop = _native.HostLoop(self.engine.native, self.sock.fileno(), drop_rate, seed)

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()

    @property
    def buffers_too_small(self) -> bool:
        """Whether the kernel capped the socket buffers (net.core.rmem_max/wmem_max without
        root) below what a window of contributions from every worker needs."""
        got = [self.sock.getsockopt(socket.SOL_SOCKET, o) for o in (socket.SO_RCVBUF, socket.SO_SNDBUF)]
        return min(got) < SOCKET_BUFFER_BYTES  # Linux reports twice what it grants

    @property
    def injected_drops(self) -> int:
        return self._loop.injected_drops

    def serve(self) -> None:
        """Run the packet loop on this thread (GIL released) until ``stop()``."""
        self._loop.run()

    def stop(self) -> None:
        self._loop.stop()

    def report(self) -> dict:
        r = self.engine.snapshot_counters()
        r["injected_drops"] = self._loop.injected_drops
        r["send_errors"] = self._loop.send_errors
        return r


def apply_snapshot(engine: AggregationEngine | NativeEngine, jobs) -> dict[int, str]:
    """Serve exactly the controller's host-mode ``jobs`` (HostJob messages); a job the engine
    cannot serve (two ranks at one address, slots outside the pool...) is left out and returned
    with the reason, so one bad job never keeps the others from being served. A job with an
    ``atp_peer`` shares that switch's ATP pool: its complete sums come from there (docs/atp.md)."""
    refused: dict[int, str] = {}
    configs: dict[int, JobConfig] = {}
    for j in jobs:
        try:
            configs[j.job_id] = JobConfig(j.job_id, j.epoch, j.slot_base, j.slot_count,
                                          tuple(parse_address(w) for w in j.workers),
                                          atp_peer=parse_address(j.atp_peer) if j.atp_peer else None)
        except ValueError as e:
            refused[j.job_id] = str(e)
    for job_id in [j for j, config in engine.jobs.items() if configs.get(j) != config]:
        engine.remove_job(job_id)      # gone or changed: first, so its slots are free
    for config in configs.values():
        if config.job_id not in engine.jobs:
            try:
                engine.set_job(config)
            except ValueError as e:
                refused[config.job_id] = str(e)
    return refused


def _as_host_engine(engine: AggregationEngine | NativeEngine) -> NativeEngine:
    """The engine the native loop runs: a host-mode NativeEngine keyed by UDP address, or, for
    a Python engine (the specification), a native one with its pool and jobs."""
    if isinstance(engine, NativeEngine):
        return engine
    native = host_engine(engine.n_slots, engine.k)
    native.replace_jobs(engine.jobs)
    return native


def follow_controller(engine: NativeEngine, address: str, admin_token: str,
                      stop: threading.Event, ca: str | None = None) -> None:
    """Apply the controller's host-mode job snapshots to ``engine`` until ``stop`` (reconnecting
    when the controller restarts); jobs it cannot serve are reported once each on stderr."""
    from inagg.hostlib.jobservice.client import ControllerClient  # the controller's gRPC stubs, only when used

    reported: dict[int, str] = {}
    while not stop.is_set():
        try:
            client = ControllerClient(address, ca=ca)
        except Exception as e:  # noqa: BLE001 - a setup error (no TLS on TCP): say it and stop
            print(f"inagg-aggregator: controller feed from {address}: {e}", file=sys.stderr, flush=True)
            return
        try:
            for snapshot in client.watch_host_jobs(admin_token):
                refused = apply_snapshot(engine, snapshot.jobs)
                for job_id, why in refused.items():
                    if reported.get(job_id) != why:
                        print(f"inagg-aggregator: not serving job {job_id}: {why}", file=sys.stderr, flush=True)
                reported = refused
                if stop.is_set():
                    break
        except Exception as e:  # noqa: BLE001 - keep serving; say why the feed broke
            print(f"inagg-aggregator: controller feed from {address}: {e}", file=sys.stderr, flush=True)
        finally:
            client.close()
        stop.wait(1.0)


def _parse_args(argv: Iterable[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="inagg-aggregator", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)  # no --admin-token prefix of --admin-token-file
    add_version_flag(p)
    p.add_argument("--bind", default=f"127.0.0.1:{HOST_AGGREGATOR_PORT}", help="HOST:PORT to listen on (port 0: any)")
    p.add_argument("--slots", type=int, default=4096, help="slots in the aggregator's pool")
    p.add_argument("--values-per-packet", type=int,
                   help="int32 values per packet (K); default: %d, or what the bound "
                        "interface's MTU allows without fragmentation" % HOST_VALUES_PER_PACKET)
    p.add_argument("--jobs", type=Path, help="JSON file with the jobs to serve")
    p.add_argument("--job", action="append", default=[], help="one job as inline JSON (repeatable)")
    p.add_argument("--drop-rate", type=float, default=0.0,
                   help="drop this fraction of packets in each direction (loss injection for tests)")
    p.add_argument("--seed", type=int, default=0, help="seed of the loss injection")
    p.add_argument("--stats-file", type=Path, help="write counters here as JSON on exit")
    p.add_argument("--controller", help="HOST:PORT of an inagg controller to take host-mode jobs from")
    p.add_argument("--admin-token-file", help="file holding the controller's admin token "
                                              "(default: $INAGG_ADMIN_TOKEN)")
    p.add_argument("--controller-ca", help="CA certificate (PEM) of the controller's TLS certificate "
                                           "(default: $INAGG_CONTROLLER_CA)")
    return p.parse_args(argv)


def main(argv: Iterable[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        bind = parse_address(args.bind)
        k = args.values_per_packet or default_values_per_packet(bind[0])
        check_values_per_packet(bind[0], k)
        engine = host_engine(args.slots, k)
        jobs = load_jobs(args.jobs.read_text()) if args.jobs else []
        jobs += [j for text in args.job for j in load_jobs(text)]
        for job in jobs:
            engine.set_job(job)
        server = HostAggregator(bind, engine, drop_rate=args.drop_rate, seed=args.seed)
    except (ValueError, OSError) as e:
        print(f"inagg-aggregator: {e}", file=sys.stderr)
        return 2
    if server.buffers_too_small:
        print(f"inagg-aggregator: the kernel capped the socket buffers below "
              f"{SOCKET_BUFFER_BYTES} bytes (raise net.core.rmem_max and wmem_max, or run as "
              f"root): bursts may be dropped and retransmitted", file=sys.stderr, flush=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    feed_stop = threading.Event()
    if args.controller:
        from inagg.hostlib.jobservice.credentials import load_token

        try:
            admin_token = load_token(args.admin_token_file)
        except ValueError as e:
            print(f"inagg-aggregator: {e}", file=sys.stderr)
            return 2
        threading.Thread(target=follow_controller, daemon=True,
                         args=(engine, args.controller, admin_token, feed_stop, args.controller_ca)).start()
    host, port = server.address
    print(f"inagg-aggregator listening on {host}:{port} with {len(jobs)} job(s), K = {k}",
          flush=True)
    serving = threading.Thread(target=server.serve, name="inagg-host-loop")
    serving.start()
    # the main thread wakes every 0.1 s so signal handlers run (a signal the kernel gives another
    # thread wakes no one): a SIGTERM stops it within that
    while serving.is_alive():
        serving.join(0.1)
    feed_stop.set()
    report = json.dumps(server.report(), indent=2, sort_keys=True)
    if args.stats_file:
        args.stats_file.write_text(report)
    print(report, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
