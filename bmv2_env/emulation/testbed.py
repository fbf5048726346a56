"""A switch (software data plane or BMv2) in a network namespace of its own, its ports wired by
veth pairs to raw sockets the caller sends and receives frames on: the conformance suite's and
the data-plane benchmark's test bed.

Everything lives in a namespace this module creates and deletes; no traffic leaves it."""

from __future__ import annotations

import ctypes
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from inagg.controller.config import default_program
from inagg.controller.program import Program
from inagg.hostlib.launch import python_m

ROOT = Path(__file__).resolve().parents[2]
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


# Software data plane targets: the engine each runs (inagg-soft-switch --engine); the model of
# the Tofino program runs that program as built for a chip (TOFINO_TARGETS: target -> the chip
# whose default_program is pushed; the model follows the P4Info's architecture).
SOFT_ENGINES = {"soft": "native", "soft-python": "python", "tofino-model": "tofino-model",
                "tofino2-model": "tofino-model"}
TOFINO_TARGETS = {"tofino-model": "tofino", "tofino2-model": "tofino2"}
BMV2_THRIFT_PORT = 9090   # simple_switch_grpc's default, in the testbed's own namespace


def have_netns() -> str | None:
    """None when namespaces can be used here, else why not."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 ('ip')"
    return None


def bmv2_missing() -> str | None:
    missing = [b for b in ("simple_switch_grpc", "p4c-bm2-ss") if shutil.which(b) is None]
    return f"BMv2 not installed ({', '.join(missing)} not on PATH)" if missing else None


@contextmanager
def in_netns(name: str):
    """Run the body with this thread in namespace ``name`` (sockets made there stay there)."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns failed")
        yield
    finally:
        _libc.setns(own, CLONE_NEWNET)
        os.close(own)
        os.close(target)


def program_testbed(sw, jobs, n_ports: int, guard: tuple[str, str] | None = None) -> None:
    """Forwarding for hosts 00:00:00:00:00:0<p> on port p, flooding, and the given jobs; with
    ``guard`` = (switch's aggregator IP, host aggregator's IP), SourceGuard on ports 1 to
    n_ports - 1 (the workers' hosts; port n_ports, the host aggregator's and a tree's parent's,
    stays open as a link would)."""
    from inagg.controller.switch import (INSERT, Forwarding, JobAdmission, ReplicaRewrite,
                                   ResultReplication, SourceGuard, TreeUplink)

    fwd = Forwarding(sw)
    ups = [fwd.host_update(INSERT, f"00:00:00:00:00:{p:02x}", p) for p in range(1, n_ports + 1)]
    ups += fwd.flood_updates(INSERT, range(1, n_ports + 1))
    if guard is not None:
        ups += [u for p in range(1, n_ports) for u in SourceGuard(sw).port_updates(INSERT, p, *guard, False)]
    for job in jobs:
        ups += TreeUplink(sw).updates(INSERT, job)
        ups += JobAdmission(sw).updates(INSERT, job)
        ups += ReplicaRewrite(sw).updates(INSERT, job)
        ups.append(ResultReplication(sw).job_update(INSERT, job))
    sw.write(ups)


def stop_processes(procs, timeout: float = 10.0) -> None:
    """SIGTERM every still-running process, then SIGKILL what has not exited after ``timeout``."""
    procs = [p for p in procs if p is not None]
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


SUN_PATH_MAX = 107   # bytes of a unix socket's path (sockaddr_un.sun_path less its NUL)


def socket_dir(prefix: str, longest: str) -> Path:
    """A fresh directory for a deployment's unix sockets (the longest named ``longest``): under
    $TMPDIR where the socket's path fits ``sun_path``, else under /tmp. A long $TMPDIR (a CI's
    or pytest-xdist's nested temporary directories) would otherwise fail gRPC's bind with no word
    about the length."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if len(str(path / longest).encode()) <= SUN_PATH_MAX:
        return path
    path.rmdir()
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


class Dataplane:
    """A switch under test with ``n_ports`` ports (1..n): ``target`` is "bmv2" or one of
    SOFT_ENGINES."""

    def __init__(self, target: str, n_ports: int = 4) -> None:
        self.target = target
        self.n_ports = n_ports
        self.ns = f"inaggt{os.getpid()}"
        self.tmp = socket_dir("inagg-dp-", "p4rt.sock")
        self.grpc_addr = f"unix:{self.tmp}/p4rt.sock"
        self.proc: subprocess.Popen | None = None
        self.socks: dict[int, socket.socket] = {}

    def start(self) -> "Dataplane":
        sh("ip", "netns", "add", self.ns)
        try:
            for i in range(1, self.n_ports + 1):
                sh("ip", "-n", self.ns, "link", "add", f"h{i}", "type", "veth", "peer", "name", f"s{i}")
                for dev in (f"h{i}", f"s{i}"):
                    sh("ip", "netns", "exec", self.ns, "sysctl", "-qw",
                       f"net.ipv6.conf.{dev}.disable_ipv6=1")
                    sh("ip", "-n", self.ns, "link", "set", dev, "up")
            ports = [a for i in range(1, self.n_ports + 1) for a in ("-i", f"{i}@s{i}")]
            if self.target in SOFT_ENGINES:
                from inagg.bmv2_env.softswitch import switch as soft_switch   # the data plane's own, when tested
                cmd = python_m(soft_switch, "--engine", SOFT_ENGINES[self.target])
                if self.target in TOFINO_TARGETS:
                    cmd += ["--p4info", str(self.program.p4info_path)]
            else:
                cmd = ["simple_switch_grpc", "--log-console"] if os.environ.get("INAGG_SWITCH_LOG") else ["simple_switch_grpc"]
                cmd += ["--thrift-port", str(BMV2_THRIFT_PORT)]   # slow_port's queue rates
            cmd += ports + ["--device-id", "0", "--no-p4", "--", "--grpc-server-addr", self.grpc_addr]
            self.log = open(self.tmp / "switch.log", "w")
            self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, *cmd], cwd=ROOT,
                                         stdout=self.log, stderr=subprocess.STDOUT)
            with in_netns(self.ns):
                for i in range(1, self.n_ports + 1):
                    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
                    s.bind((f"h{i}", 0))
                    self.socks[i] = s
            deadline = time.time() + 30
            while not (self.tmp / "p4rt.sock").exists():
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"switch did not start: {(self.tmp / 'switch.log').read_text()}")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def program(self) -> Program:
        """The program to push to this switch: the chip's Tofino one for TOFINO_TARGETS, else
        BMv2's."""
        return default_program(TOFINO_TARGETS.get(self.target, "bmv2"))

    def send(self, port: int, frame: bytes) -> None:
        self.socks[port].send(frame)

    def recv_all(self, timeout: float = 0.5) -> dict[int, list[bytes]]:
        """Every frame the switch sent out of each port within ``timeout`` (after the last)."""
        got: dict[int, list[bytes]] = {p: [] for p in self.socks}
        by_fd = {s.fileno(): p for p, s in self.socks.items()}
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                return got
            ready, _, _ = select.select(list(self.socks.values()), [], [], left)
            for s in ready:
                data, addr = s.recvfrom(65535)
                if addr[2] != 4:  # PACKET_OUTGOING: our own sends
                    got[by_fd[s.fileno()]].append(data)

    def drain(self) -> None:
        self.recv_all(0.05)

    def slow_port(self, port: int, frames_per_second: int | None) -> None:
        """Let the switch's egress toward ``port`` send only ``frames_per_second`` frames of up
        to 128 bytes a second (None: full speed again), so its queue fills: BMv2's own egress
        queue (simple_switch_CLI set_queue_rate), or for the software switch its interface's
        (tc tbf, whose queue its socket counts)."""
        ns = ["ip", "netns", "exec", self.ns]
        if self.target not in SOFT_ENGINES:
            rate = str(frames_per_second or 10 ** 7)
            path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"   # its python3: ours
            cli = subprocess.run([*ns, "simple_switch_CLI", "--thrift-port", str(BMV2_THRIFT_PORT)],
                                 input=f"set_queue_rate {rate} {port}\n", capture_output=True, text=True,
                                 env={**os.environ, "PATH": path})
            if cli.returncode:
                raise RuntimeError(f"simple_switch_CLI set_queue_rate: {cli.stderr.strip()[-300:]} (it needs "
                                   f"BMv2's Thrift server and the thrift package)")
        elif frames_per_second:
            sh(*ns, "tc", "qdisc", "replace", "dev", f"s{port}", "root", "tbf", "rate",
               f"{frames_per_second * 128 * 8}bit", "burst", "2kb", "limit", "4mb")
        else:
            sh(*ns, "tc", "qdisc", "del", "dev", f"s{port}", "root")

    def stop(self) -> None:
        for s in self.socks.values():
            s.close()
        self.socks.clear()
        stop_processes([self.proc])
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        if not os.environ.get("INAGG_KEEP_TESTBED"):
            shutil.rmtree(self.tmp, ignore_errors=True)
