"""The embedded default deployment on loopback, no root needed: the software data plane
(attached over UDP), the controller and a host aggregator, each a real process.

Each deployment takes a loopback /24 of its own, 127.A.B.0/24, chosen at random, so runs of
other checkouts on the same machine never meet it: worker r uses 127.A.B.(r+1), attached to
switch port r+1; the switch's inagg address is 127.A.B.254, the host aggregator's 127.A.B.100,
each on a UDP port the kernel finds free there (never a fixed one: another program bound to
0.0.0.0 on inagg's well-known ports holds them on every address). ``make demo``, the training tests and the benchmarks run on it.

``target="tofino"`` (or ``"tofino2"``) makes it Tofino-shaped: the software data plane runs the
chip's Tofino program's P4Info (its K, names and counters), the controller deploys to it as to
a Tofino (the packed device config in bf_switchd's packing, front-panel ports mapped to
device ports 128 + 4 r), so the controller's Tofino path and grants carrying the Tofino K are
tested without the chip; ``loopback=n`` names n front-panel ports in loopback (101, 102, ...:
device ports in pipe 1's reserved loopback range), whose recirc_spread rows the controller
writes (the software switch keeps them; only the Tofino model recirculates). ``engine="tofino-model"``
runs that switch on the model of the chip's program (``inagg-soft-switch --engine tofino-model``:
the Python loop, every pass register by register, each recirculation through the compiled
program's ports); ``switch_args`` are more of the switch's options (its ports' impairments,
``--recirc-loss`` on the model), which the switch checks as from a command line.

``p4info`` names the P4Info the controller pushes to the software switch instead of the target's
own (the software target's large K): BMv2's P4Info (``default_program("bmv2")``) runs it at K = 64,
as a hardware switch would aggregate."""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import socket
import shutil
import subprocess
from pathlib import Path

import inagg.controller as controller_package
from inagg.controller.config import default_program
from inagg.controller.program import TOFINO_CHIPS
from inagg.hostlib.aggregator import server as aggregator_server
from inagg.hostlib.jobservice.credentials import ADMIN_TOKEN_ENV
from inagg.hostlib.launch import python_m

from inagg.bmv2_env.softswitch import switch as soft_switch
from inagg.bmv2_env.softswitch.switch import udp_host_mac
from inagg.bmv2_env.emulation.forked import ForkedService, die_with_parent
from inagg.bmv2_env.emulation.testbed import socket_dir, stop_processes

# The folder holding the packages (a checkout, or site-packages): the services' working
# directory, so that their `python -m` imports the same inagg as this process.
ROOT = Path(__file__).resolve().parents[2]
Service = subprocess.Popen | ForkedService   # a running service: exec'd anew, or forked


def free_udp_port(ip: str) -> int:
    """A UDP port nothing on this machine holds at ``ip`` (the kernel's pick), for a service
    started next to bind."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
            return s.getsockname()[1]
    except OSError as e:
        raise RuntimeError(f"cannot bind a UDP socket on {ip} ({e}): the local deployment needs the "
                           f"loopback network 127.0.0.0/8 (lo up, with its /8 route)") from e


def random_loopback_net() -> str:
    """A random ``127.A.B`` prefix: another deployment on this machine takes the same one only
    by a 1 in 65,000 chance, and then still runs (its services are on ports of their own)."""
    return f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"


class LoopbackDeployment:
    """Context manager: start everything, yield, stop everything (and remove its files).

    ``die_with_parent``: the services also stop when the process that started them dies
    (``inagg.bmv2_env.emulation.services`` sets it: nothing outlives a killed training job).
    ``fork_services``: start them as forks of this process (``inagg.bmv2_env.emulation.forked``: no
    interpreter start or imports of their own), only from a process that runs no other thread
    and has made no gRPC object (``inagg.bmv2_env.emulation.services``). ``pcap``: a folder where
    the soft switch writes each port's frames in and out (``port_pcap``: the wire as counted)."""

    def __init__(self, n_hosts: int = 4, *, with_switch: bool = True, min_window: int = 8,
                 lease_seconds: float = 30.0, rank_lease_seconds: float = 8.0,
                 aggregator_drop_rate: float = 0.0, target: str = "soft",
                 metrics: bool = False, die_with_parent: bool = False, fork_services: bool = False,
                 p4info: Path | str | None = None, database: Path | str | None = None,
                 pcap: Path | str | None = None, loopback: int = 0, engine: str = "native",
                 switch_args: tuple[str, ...] = ()) -> None:
        if target not in ("soft", *TOFINO_CHIPS):
            raise ValueError(f"a loopback switch is 'soft' or Tofino-shaped "
                             f"({', '.join(map(repr, TOFINO_CHIPS))}), not {target!r}")
        if p4info is not None and target != "soft":
            raise ValueError("only a 'soft' loopback switch runs another P4Info than its target's")
        if loopback and target not in TOFINO_CHIPS:
            raise ValueError(f"loopback ports belong to a Tofino-shaped switch, not a {target!r} one")
        if engine not in ("native", "tofino-model"):
            raise ValueError(f"a loopback switch runs the 'native' or the 'tofino-model' engine, not {engine!r}")
        if engine == "tofino-model" and target not in TOFINO_CHIPS:
            raise ValueError(f"the Tofino model runs a Tofino-shaped switch (target "
                             f"{' or '.join(map(repr, TOFINO_CHIPS))}), not a {target!r} one")
        self.target = target
        self.engine = engine
        self.switch_args = tuple(switch_args)
        self.p4info = p4info
        self.loopback = loopback
        self.database = database   # the controller's SQLite file; default: in the run's folder
        self.pcap = pcap
        self.n_hosts = n_hosts
        self.with_switch = with_switch
        self.min_window = min_window
        self.lease_seconds = lease_seconds
        self.rank_lease_seconds = rank_lease_seconds
        self.drop_rate = aggregator_drop_rate
        self.metrics = metrics
        self.metrics_url: str | None = None   # the controller's Prometheus endpoint (metrics=True)
        self.die_with_parent = die_with_parent
        self.fork_services = fork_services
        self.admin_token = secrets.token_hex(8)
        self.procs: list[Service] = []
        self.net = random_loopback_net()
        self.switch_ip = f"{self.net}.254"
        self.switch_port = free_udp_port(self.switch_ip)
        self.host_aggregator = f"{self.net}.100:{free_udp_port(f'{self.net}.100')}"

    @property
    def switch_address(self) -> str:
        """Where workers send to the switch: its inagg address and UDP port."""
        return f"{self.switch_ip}:{self.switch_port}"

    def worker_ip(self, rank: int) -> str:
        return f"{self.net}.{rank + 1}"

    def device_port(self, rank: int) -> int:
        """The switch port worker ``rank`` is attached to: front-panel port rank + 1, which a
        Tofino-shaped switch maps to device port 128 + 4 rank (pipe 1, as on a Tofino)."""
        return 128 + 4 * rank if self.target in TOFINO_CHIPS else rank + 1

    def port_pcap(self, rank: int, direction: str) -> Path:
        """The pcap of the frames worker ``rank``'s switch port receives (``in``) or sends
        (``out``: the results it gets), with ``pcap`` given."""
        if self.pcap is None:
            raise ValueError("this deployment captures nothing: pass pcap=<folder> to capture its ports")
        return Path(self.pcap) / f"udp_{self.worker_ip(rank)}_{direction}.pcap"

    @property
    def loopback_ports(self) -> dict[str, int]:
        """Front-panel port (101, 102, ...) -> device port of each port in loopback: pipe 1's
        reserved loopback ports (the P4Info's @inagg_recirculation_ports), in order."""
        if not self.loopback:
            return {}
        _, base, _ = default_program(self.target).p4info.recirculation_ports
        return {str(101 + i): 1 << 7 | base + i for i in range(self.loopback)}

    def worker_mac(self, rank: int) -> str:
        """The source MAC the soft switch gives host ``rank``'s datagrams."""
        return udp_host_mac(self.worker_ip(rank))

    @property
    def worker_ips(self) -> list[str]:
        return [self.worker_ip(r) for r in range(self.n_hosts)]

    def _spawn(self, name: str, cmd: list[str], env: dict | None = None) -> Service:
        """Start service ``name`` (its stderr to ``name.log``) without waiting for it."""
        with open(self.dir / f"{name}.log", "a") as log:
            if self.fork_services:
                proc = ForkedService(cmd, log.fileno(), ROOT, env, self.die_with_parent)
            else:
                proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
                                        env={**os.environ, **env} if env else None,
                                        preexec_fn=die_with_parent if self.die_with_parent else None)
        self.procs.append(proc)
        return proc

    def _await(self, name: str, proc: Service, ready: str) -> Service:
        """Wait for service ``name`` to print its ``ready`` line."""
        line = proc.stdout.readline()
        if ready not in line:
            raise RuntimeError(f"{name} did not start: {line!r}\n{(self.dir / f'{name}.log').read_text()}")
        return proc

    def __enter__(self) -> "LoopbackDeployment":
        """Start the services side by side (each spends most of its start importing): the
        controller reaches the switch once it is up (its channel retries within
        ``CHANNEL_OPTIONS``' backoff), the host aggregator the controller's feed likewise."""
        self.dir = socket_dir("inagg-lo-", "controller.sock")
        self.controller = f"unix:{self.dir}/controller.sock"
        try:
            switch = self._spawn_switch() if self.with_switch else None
            self._write_controller_config()
            controller = self._spawn_controller()
            aggregator = self._spawn(
                "aggregator", python_m(aggregator_server, "--bind", self.host_aggregator,
                                        "--controller", self.controller, "--drop-rate", str(self.drop_rate)),
                env={ADMIN_TOKEN_ENV: self.admin_token})   # never on argv
            if switch is not None:
                self.switch_proc = self._await("switch", switch, "inagg-soft-switch")
            self.controller_proc = self._await_controller(controller)
            self.aggregator = self._await("aggregator", aggregator, "inagg-aggregator listening")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _write_controller_config(self) -> None:
        """The controller's config (``controller.json``): this deployment's switch and host aggregator."""
        switches = []
        if self.with_switch:
            switch = {
                "name": "s1", "grpc": f"unix:{self.dir}/switch.sock", "target": self.target,
                "aggregator": self.switch_address,
                "hosts": {self.worker_ip(r): {"port": r + 1, "mac": self.worker_mac(r)}
                          for r in range(self.n_hosts)}}
            if self.p4info is not None:
                switch["p4info"] = str(Path(self.p4info).resolve())
            if self.target in TOFINO_CHIPS:
                switch["device_ports"] = {str(r + 1): self.device_port(r) for r in range(self.n_hosts)}
                switch["device_ports"].update(self.loopback_ports)
                switch["loopback_ports"] = [int(p) for p in self.loopback_ports]
            switches.append(switch)
        config = {"listen": self.controller, "admin_token": self.admin_token,
                  "database": str(self.database or self.dir / "controller.sqlite"), "lease_seconds": self.lease_seconds,
                  "rank_lease_seconds": self.rank_lease_seconds, "switch_check_seconds": 0.5,
                  "min_window": self.min_window, "host_aggregator": self.host_aggregator,
                  "switches": switches, **({"metrics_listen": "127.0.0.1:0"} if self.metrics else {})}
        (self.dir / "controller.json").write_text(json.dumps(config, indent=2))

    def _spawn_switch(self) -> Service:
        ports = [a for r in range(self.n_hosts)
                 for a in ("-i", f"{self.device_port(r)}@udp:{self.worker_ip(r)}")]
        p4info = default_program(self.target).p4info_path
        return self._spawn(
            "switch", python_m(soft_switch, *ports, "--udp-bind", self.switch_address,
                                "--p4info", str(p4info), "--device-id", "0", "--no-p4",
                                "--engine", self.engine, *self.switch_args,
                                *(("--pcap", str(self.pcap)) if self.pcap is not None else ()), "--",
                                "--grpc-server-addr", f"unix:{self.dir}/switch.sock"))

    def start_switch(self) -> None:
        self.switch_proc = self._await("switch", self._spawn_switch(), "inagg-soft-switch")

    def restart_switch(self) -> None:
        """Stop the soft switch process and start a fresh one (no pipeline, no entries, no slot
        state): the controller must notice and program it again."""
        stop_processes([self.switch_proc])
        self.procs.remove(self.switch_proc)
        self.start_switch()

    def _spawn_controller(self) -> Service:
        return self._spawn("controller", python_m(controller_package, "--config", str(self.dir / "controller.json")))

    def _await_controller(self, proc: Service) -> Service:
        """The controller once it serves; with ``metrics``, its Prometheus endpoint noted."""
        self._await("controller", proc, "inagg-controller serving")
        if self.metrics:
            found = re.search(r"metrics on (http://\S+)", self.log("controller"))
            if found is None:
                raise RuntimeError(f"controller announced no metrics endpoint: {self.log('controller')}")
            self.metrics_url = found.group(1)
        return proc

    def start_controller(self) -> None:
        self.controller_proc = self._await_controller(self._spawn_controller())

    def stop_controller(self) -> None:
        """Stop the controller process; its state stays in its SQLite store."""
        stop_processes([self.controller_proc])
        self.procs.remove(self.controller_proc)

    def restart_controller(self) -> None:
        """Stop the controller process and start it again on the same state (SQLite)."""
        self.stop_controller()
        self.start_controller()

    def __exit__(self, *exc) -> None:
        """Stop the services, the switch last: a controller that lost its switch first would
        spend its stop trying to reach it again."""
        switch = getattr(self, "switch_proc", None)
        stop_processes([p for p in reversed(self.procs) if p is not switch])
        stop_processes([switch])
        if not os.environ.get("INAGG_KEEP_TESTBED"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text()
