"""``make run``: a Mininet network of hosts and P4 switches running inagg, the p4lang/tutorials way.

Reads a topology file (bmv2_env/emulation/topology.py), builds it in Mininet with P4 switch nodes
(``simple_switch_grpc`` when installed, else the software data plane: same flags, same
P4Runtime), starts the controller in the root namespace (workers reach it over a Unix socket,
which crosses namespaces), the host aggregator and the training jobs on their hosts, and prints a
per-job summary, saved in the run directory (summary.py). With ``--cli`` the network stays up at a
``mininet>`` prompt afterwards.

Every run has a directory of its own, ``build/emulation/<run id>/`` (``latest`` points to the
newest): logs, per-port pcaps, the controller's socket and the admin token; interface names carry
the run id and P4Runtime listens on Unix sockets there, so runs of several checkouts share a
machine. ``--stop`` stops what this user's runs of this checkout started (``--all``: every
user's), as recorded in their directories.

The data planes and the controller run in sessions of their own (the hosts' processes too:
Mininet starts them with ``mnexec -d``), so Ctrl-C at the ``mininet>`` prompt reaches only the
command in the foreground, never the network's services; the teardown, or ``--stop``, stops them
by the PIDs the run recorded.

    python -m inagg.bmv2_env.emulation.mininet_run --topo bmv2_env/emulation/topologies/single_switch.json [--cli]
    python -m inagg.bmv2_env.emulation.mininet_run --stop      # clean up what a killed run left behind
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import inagg.controller as controller_package
from inagg.controller.config import default_program
from inagg.hostlib.jobservice.credentials import ADMIN_TOKEN_FILE_ENV, write_token
from inagg.hostlib import add_version_flag
from inagg.hostlib.aggregator import server as aggregator_server
from inagg.hostlib.launch import python_m
from inagg.hostlib.wire.grant import (HOST_AGGREGATOR_PORT, HOST_VALUES_PER_PACKET, switch_values_for_mtu,
                              values_for_mtu)
from inagg.hostlib.wire.protocol import UDP_PORT
from inagg.hostlib.worker.host_communicator import HOST_REDUCE_ENV

from inagg.bmv2_env.softswitch import switch as soft_switch
from inagg.bmv2_env.emulation.forked import ForkedCommand, PopenSurface, start_fork_server
from inagg.bmv2_env.emulation.run_dir import (KEEP_ENV, RUNS_DIR, RunDir, all_runs, current_user, delete_runs,
                                              keep_runs, runs_of, stop_run, unfinished_runs)
from inagg.bmv2_env.emulation.summary import job_record, summary, write_summary
from inagg.bmv2_env.emulation.testbed import stop_processes
from inagg.bmv2_env.emulation.topology import Topology, TopologyError, host_ip, load_topology
from inagg.bmv2_env.emulation import impairments
from inagg.bmv2_env.emulation.shaping import BandwidthSchedule
from inagg.bmv2_env.emulation.watch import RunFailed, Watched, check_processes

ROOT = Path(__file__).resolve().parents[2]
# the training demo's ranks: a launch up the layers (emulation < demos), so by name (declared in
# tests/test_layers.py's LAUNCHES_UP, which checks that it names a real module)
TRAIN_DEMO_MODULE = "inagg.bmv2_env.demos.train_demo"
# What a training rank imports before its first step, imported once by the fork server every
# rank is forked from (forked.rank_context): torch's import, torch._dynamo's at the first DDP
# construction and scikit-learn's for the digits were most of a spawned rank's start.
RANK_IMPORTS = (TRAIN_DEMO_MODULE, "torch.distributed", "torch.nn.parallel", "torch._dynamo",
                "sklearn.datasets", "inagg.hostlib.pytorch.hooks", "inagg.hostlib.worker.host_communicator",
                "inagg.hostlib.jobservice.client")


class Terminated(Exception):
    """SIGTERM (``make stop``): not a KeyboardInterrupt, which the mininet> prompt swallows."""


SYSTEM_PACKAGES = "/usr/lib/python3/dist-packages"


def import_mininet():
    """Debian's Mininet lives in the system dist-packages: from a venv, it is imported from
    there with that folder on sys.path only meanwhile. The ranks forked from this process's fork
    server get its sys.path; with the system's packages on it they would import what the venv's
    interpreter finds nowhere (scapy loads the system's cryptography)."""
    try:
        import mininet  # noqa: F401
    except ImportError:
        sys.path.append(SYSTEM_PACKAGES)
    try:
        from mininet.link import TCLink
        from mininet.log import lg
        from mininet.net import Mininet
        from mininet.node import Switch
    finally:
        if SYSTEM_PACKAGES in sys.path:
            sys.path.remove(SYSTEM_PACKAGES)
    lg.propagate = False     # Mininet prints its own lines; the root logger would repeat them
    return Mininet, Switch, TCLink


def choose_dataplane(wanted: str) -> str:
    have_bmv2 = shutil.which("simple_switch_grpc") is not None
    if wanted == "auto":
        return "bmv2" if have_bmv2 else "soft"
    if wanted == "bmv2" and not have_bmv2:
        raise SystemExit("--dataplane bmv2: simple_switch_grpc is not on PATH")
    return wanted


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The data plane models a switch's own silicon, which shares no CPU with the hosts: in the
# emulation it runs ahead of the ranks and of anything else on the machine (root may go below 0).
DATA_PLANE_NICE = -10
BMV2_LOG_LEVELS = ("trace", "debug", "info", "warn", "error", "off")
BMV2_LOG_LEVEL = "info"   # no line per packet: trace and debug slow BMv2 down (--bmv2-log, make run BMV2_LOG=)


def log_text(path: Path) -> str:
    """A log's text, '' when it is not there (yet)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def describe_switch(sw) -> str:
    """A P4Switch's line at start: its data plane, where to reach it, its log. A BMv2 built
    without Thrift says so in its log's first lines (when its level shows warnings): then it
    has no port (``thrift_port`` becomes None), and the line says so."""
    log = sw.run.path / "logs" / f"{sw.name}.log"
    if sw.dataplane != "bmv2":
        return f"switch {sw.name}: software data plane, P4Runtime {sw.grpc}, log {log}"
    if "compiled without Thrift support" in log_text(sw.bmv2_log_path):
        sw.thrift_port = None
        thrift = "no Thrift server (this simple_switch_grpc is built without it: no simple_switch_CLI)"
    else:
        thrift = f"Thrift port {sw.thrift_port} (mininet> sh simple_switch_CLI --thrift-port {sw.thrift_port})"
    return (f"switch {sw.name}: BMv2, {thrift}, P4Runtime {sw.grpc}, log {sw.bmv2_log_path} "
            f"({sw.bmv2_log} level; its stdout: {log})")


def soft_switch_binary(run: RunDir, name: str, impair: list, device_id: int) -> list[str]:
    """The software data plane's command (before its ports): with its ports' impairments
    (``impair``: impairments.switch_impairments), seeded by its device id, counted into the
    run's logs."""
    if not impair:
        return python_m(soft_switch)
    stats = impairments.stats_path(run.path / "logs", name)
    return [*python_m(soft_switch), *impairments.impairment_flags(impair, 1 + device_id), "--impair-stats", str(stats)]


def make_switch_class(Switch):
    class P4Switch(Switch):
        """A Mininet switch node running a P4Runtime data plane process in the root namespace;
        its P4Runtime server listens on a Unix socket in the run directory. BMv2 logs at
        ``bmv2_log`` level to ``logs/<name>-bmv2.txt`` (rotated at 5 MB) and, when built with
        Thrift, serves simple_switch_CLI on a free TCP port of the root namespace,
        ``thrift_port`` (None when the binary says it has no Thrift server)."""

        def __init__(self, name, dataplane="soft", run: RunDir | None = None, device_id=0, pcaps=True,
                     nice=DATA_PLANE_NICE, bmv2_log: str = BMV2_LOG_LEVEL, impair=(), **kw):
            Switch.__init__(self, name, **kw)
            self.impair = list(impair)   # the soft switch's port settings: impairments.switch_impairments
            self.dataplane, self.run, self.device_id, self.pcaps = dataplane, run, device_id, pcaps
            self.nice, self.bmv2_log = nice, bmv2_log
            self.grpc = f"unix:{run.path / (name + '-p4rt.sock')}"
            self.proc = None
            self.thrift_port: int | None = None   # BMv2's, once started
            self.bmv2_log_path = run.path / "logs" / f"{name}-bmv2.txt"   # BMv2 adds the .txt

        def data_plane_command(self) -> list[str]:
            ports = [a for p, i in sorted(self.intfs.items()) if i.name != "lo"
                     for a in ("-i", f"{p}@{i.name}")]
            if self.dataplane == "bmv2":
                # BMv2's Thrift port and notification socket are machine-wide by default
                self.thrift_port = free_tcp_port()
                # per packet BMv2 logs at debug and trace: flushing each line there would slow it down
                flush = ["--log-flush"] if self.bmv2_log not in ("trace", "debug") else []
                binary = ["simple_switch_grpc", "--thrift-port", str(self.thrift_port),
                          "--notifications-addr", f"ipc://{self.run.path / (self.name + '-notify.ipc')}",
                          "--log-file", str(self.bmv2_log_path.with_suffix("")), "--log-level", self.bmv2_log,
                          *flush]
            else:
                binary = soft_switch_binary(self.run, self.name, self.impair, self.device_id)
            capture = ["--pcap", str(self.run.path / "pcaps")] if self.pcaps else []
            # every thread of the data plane at this priority: nice(1) before exec, threads inherit it
            return ["nice", "-n", str(self.nice), *binary, *ports, "--device-id", str(self.device_id), *capture,
                    "--no-p4", "--", "--grpc-server-addr", self.grpc]

        def start(self, controllers):
            log_path = self.run.path / "logs" / f"{self.name}.log"
            with open(log_path, "w") as log:
                self.proc = subprocess.Popen(self.data_plane_command(), cwd=ROOT, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            self.run.add_process(self.proc.pid, f"{self.name} data plane")
            deadline = time.time() + 30
            while not Path(self.grpc[len("unix:"):]).exists():
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"{self.name}: data plane did not start, see {log_path}")
                time.sleep(0.1)

        def stop_data_plane(self) -> None:
            """Stop the process before Mininet deletes the interfaces it reads from."""
            stop_processes([self.proc])

        def stop(self, deleteIntfs=True):
            self.stop_data_plane()
            Switch.stop(self, deleteIntfs)

    return P4Switch


def netem_available(run: RunDir) -> bool:
    """Whether ``tc ... netem`` works here (some kernels are built without sch_netem), tried on a
    veth pair of this run's own (the machine's ``lo`` may carry another run's qdisc)."""
    probe = f"{run.run_id}netem"
    run.add_interfaces([probe, probe + "2"])
    subprocess.run(["ip", "link", "add", probe, "type", "veth", "peer", "name", probe + "2"],
                   capture_output=True, check=True)
    try:
        return subprocess.run(["tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "0ms"],
                              capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "link", "del", probe], capture_output=True)


def program_files_for(dataplane: str, p4info: Path | None = None, bmv2_json: Path | None = None) -> dict[str, str]:
    """The P4Info/BMv2 JSON the controller pushes to every switch ({}: p4/'s committed ones, or
    on the software data plane the P4Info the run writes at the K of its links' MTU:
    ``Run.soft_program``). The software data plane runs the committed program only: files given
    for it are a ValueError, not silently left unused."""
    given = {key: str(path.resolve()) for key, path in (("p4info", p4info), ("bmv2_json", bmv2_json)) if path}
    if dataplane == "soft" and given:
        raise ValueError("--p4info/--bmv2-json are pushed to BMv2 switches; this run's data plane is the "
                         "software one (--dataplane soft, or auto without simple_switch_grpc on PATH), "
                         "which runs only the committed inagg program: leave them out, or use --dataplane bmv2")
    return given


def soft_values_per_packet(mtu: int, transports: set[str]) -> int:
    """The software target's K on links of ``mtu`` bytes: as many values as a frame carries in
    the framing of every transport its jobs use (364 at 1500 over UDP, 355 once a job runs RoCE,
    2239 at 9000 over UDP)."""
    return switch_values_for_mtu(mtu) if "roce" in transports else values_for_mtu(mtu)


def write_soft_p4info(path: Path, values_per_packet: int) -> Path:
    """The committed program's P4Info with job_table's K annotation set to ``values_per_packet``
    (what tools/soft_p4info.py writes for p4/out/soft/, here for one run's links)."""
    from google.protobuf import text_format
    from inagg.controller.p4info import without_values_per_packet

    message = without_values_per_packet(default_program("soft").p4info.message)
    table = next(t for t in message.tables if t.preamble.name.rsplit(".", 1)[-1] == "job_table")
    table.preamble.annotations.append(f"@inagg_values_per_packet({values_per_packet})")
    path.write_text(text_format.MessageToString(message))
    return path


def controller_switches(topo: Topology, grpcs: list[str], target: str,
                        program_files: dict[str, str]) -> list[dict]:
    """The controller's ``switches``: each topology switch (device id its index, P4Runtime at
    ``grpcs[i]``) with its hosts and its links to the other switches (aggregation trees)."""
    return [{"name": name, "grpc": grpc, "device_id": i, "target": target, **program_files,
             "aggregator": f"{s['aggregator_ip']}:{UDP_PORT}",
             "aggregator_mac": s["aggregator_mac"],   # what every host's ARP table has (Run.build)
             "hosts": topo.host_ports(name), "links": topo.switch_links(name)}
            for i, ((name, s), grpc) in enumerate(zip(topo.switches.items(), grpcs))]


def job_epochs(topo: Topology, epochs: int | None) -> dict[str, int]:
    """Each job's epochs (of those that run for epochs: not a profile, no iterations or
    duration). ``epochs`` sets the first such job's and scales the others by the same factor,
    so the jobs keep their relative lengths (the two-job demo's second job still outlives the
    first and is upgraded to the switch)."""
    own = {j["name"]: int(j.get("epochs", 4)) for j in topo.jobs
           if not any(k in j for k in ("profile", "iterations", "duration"))}
    if not epochs or not own:
        return own
    factor = epochs / next(iter(own.values()))
    return {name: max(1, round(e * factor)) for name, e in own.items()}


def workload_text(spec: dict, cfg: dict) -> str:
    """What a job trains, for how long and when it arrives, in words."""
    what = (f"profile {len(spec['profile']['bucket_bytes'])} bucket(s)" if "profile" in spec
            else spec.get("model", "mlp"))
    length = (f"{cfg['iterations']} iterations" if "iterations" in cfg else
              f"{cfg['duration']} s" if "duration" in cfg else f"{cfg['epochs']} epochs")
    return f"{what}, {length}" + (f", arrives at +{spec['start']} s" if "start" in spec else "")


class Run:
    """One bring-up of a topology: network, controller, aggregator, jobs, summary, teardown."""

    def __init__(self, topo: Topology, dataplane: str, run: RunDir, epochs: int | None = None,
                 transport: str | None = None, program_files: dict[str, str] | None = None,
                 pcaps: bool = True, switch_nice: int = DATA_PLANE_NICE, bmv2_log: str = BMV2_LOG_LEVEL) -> None:
        self.topo, self.dataplane, self.run, self.transport = topo, dataplane, run, transport
        self.pcaps = pcaps   # every switch port's pcaps in the run directory (2-7 GB for a bandwidth flip)
        self.switch_nice = switch_nice   # the data planes' nice(1) value
        self.bmv2_log = bmv2_log         # BMv2's log level (BMV2_LOG_LEVELS)
        self.epochs = job_epochs(topo, epochs)
        self.program_files = program_files or {}   # p4info/bmv2_json for every switch; {}: p4/
        self.net = None
        self.procs: list[subprocess.Popen | PopenSurface] = []
        self.watched: list[Watched] = []   # what must stay up (services) or not fail (ranks): watch.py
        self.admin_file = run.path / "admin-token"
        self.controller_addr = f"unix:{run.path / 'controller.sock'}"
        self.metrics_addr = f"127.0.0.1:{free_tcp_port()}"
        self.train_gate = run.path / "jobs" / "train"   # all jobs train once all hold grants
        self.placements: dict[str, str] = {}   # job name -> where the controller listed it at placement
        self.time_zero: float | None = None    # when the jobs without a start time began training
        self.impairments = impairments.Impairments()   # how the links' options are applied (build)
        self.bw_schedule = BandwidthSchedule([])       # the links' bw_schedule (build), re-rated from time zero

    def log(self, name: str):
        return open(self.run.path / "logs" / name, "w")

    def write_env(self) -> None:
        """The admin token (a file only its owner reads: tokens never go on argv), and what
        inaggctl needs to find the run: set for this process's children (the mininet> prompt's
        host shells included) and, in ``env``, for a shell elsewhere (``make ctl``)."""
        self.admin = secrets.token_hex(16)
        write_token(self.admin_file, self.admin)
        env = {"INAGG_CONTROLLER": self.controller_addr, ADMIN_TOKEN_FILE_ENV: str(self.admin_file),
               "INAGG_METRICS": f"http://{self.metrics_addr}/metrics"}
        (self.run.path / "env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        os.environ.update(env)
        os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"

    def build(self) -> None:
        Mininet, Switch, TCLink = import_mininet()
        self.plan_impairments()
        P4Switch = make_switch_class(Switch)
        self.write_env()
        self.net = Mininet(topo=None, controller=None, link=TCLink, build=False, autoSetMacs=False)
        ports = impairments.switch_impairments(self.topo) if self.impairments.by == "soft switch ports" else {}
        for i, name in enumerate(self.topo.switches):
            # a datapath id of its own: Mininet derives one only from names like "s1", not "tor1"
            self.net.addSwitch(name, cls=P4Switch, dataplane=self.dataplane, run=self.run, device_id=i,
                               pcaps=self.pcaps, nice=self.switch_nice, bmv2_log=self.bmv2_log,
                               dpid=f"{i + 1:016x}", impair=ports.get(name, ()))
        for name, h in self.topo.hosts.items():
            self.net.addHost(name, ip=h["ip"], mac=h["mac"])
        self.add_links()
        self.net.build()
        self.bw_schedule.bring_up()
        self.apply_mtu()
        self.disable_offloads()
        for host in self.net.hosts:
            self.run.add_process(host.pid, f"host {host.name} shell")
        for sw in self.net.switches:
            self.run.add_process(sw.pid, f"switch {sw.name} shell")
        self.net.start()
        self.watched += [Watched(f"switch {sw.name}'s data plane", sw.proc, self.run.path / "logs" / f"{sw.name}.log",
                                 service=True) for sw in self.net.switches]
        self.announce_switches()
        for host in self.net.hosts:
            host.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1")
            for other, h in self.topo.hosts.items():
                if other != host.name:
                    host.setARP(host_ip(h), h["mac"])
            for s in self.topo.switches.values():
                host.setARP(s["aggregator_ip"], s["aggregator_mac"])

    def add_links(self) -> None:
        """The topology's links, with the options Mininet's TCLink applies
        (``impairments.tclink_options``); those with a ``bw_schedule`` go to ``bw_schedule``."""
        names, scheduled = [], []
        for link in self.topo.links:
            # a switch end lives in the root namespace: its name carries the run id
            opts = impairments.tclink_options(link.params, self.impairments.by)
            for n, end in ((1, link.a), (2, link.b)):
                if end.port is not None:
                    opts[f"port{n}"] = end.port
                    opts[f"intfName{n}"] = self.run.interface_name(end.node, end.port)
                    names.append(opts[f"intfName{n}"])
            made = self.net.addLink(link.a.node, link.b.node, **opts)
            if "bw_schedule" in link.params:
                scheduled.append((f"{link.a}-{link.b}", [made.intf1, made.intf2], link.params["bw_schedule"]))
        self.run.add_interfaces(names)
        self.bw_schedule = BandwidthSchedule(scheduled)

    def plan_impairments(self) -> None:
        """Decide how the links' delay/loss/... are applied (impairments.plan: netem where the
        kernel has it, else at the soft switch's ports; TopologyError for them on BMv2) and
        say it."""
        netem = not impairments.asked_options(self.topo) or netem_available(self.run)
        self.impairments = impairments.plan(self.topo, self.dataplane, netem)
        if self.impairments.by == "soft switch ports":
            print(f"link {' and '.join(self.impairments.applied)}: the software data plane's ports apply them "
                  f"({'no netem qdisc here' if not netem else 'netem gets no duplicate/reorder from Mininet'}; "
                  "seeded, counted in the summary)", flush=True)
        if self.impairments.not_applied:
            print(f"warning: this kernel has no netem qdisc: the links' {', '.join(self.impairments.not_applied)} "
                  "asked in the topology file NOT applied (the summary says so)", flush=True)

    def announce_switches(self) -> None:
        """Print each switch's line (BMv2's Thrift port for simple_switch_CLI, its log) and save
        the same in ``switches.json`` of the run directory, for scripts."""
        saved = {}
        for sw in self.net.switches:
            print(describe_switch(sw), flush=True)
            saved[sw.name] = {"dataplane": sw.dataplane, "p4runtime": sw.grpc, "thrift_port": sw.thrift_port,
                              "log": str(sw.bmv2_log_path if sw.dataplane == "bmv2" else
                                         self.run.path / "logs" / f"{sw.name}.log")}
        (self.run.path / "switches.json").write_text(json.dumps(saved, indent=2) + "\n")

    def disable_offloads(self) -> None:
        """Checksum offloads off on every interface: a software data plane forwards frames as
        captured, so their checksums must be complete. On the switches' ports segmentation and
        receive offloads go too, before the switches start: BMv2 reads its ports through libpcap,
        which sizes each slot of its capture ring for the largest frame a port can deliver, 64
        KiB where these offloads are on, and its 4 MiB ring then holds about 32 frames, less
        than one worker's window (BMv2 then drops what arrives while it is busy)."""
        for node in self.net.hosts + self.net.switches:
            port_offloads = " gso off gro off tso off" if node in self.net.switches else ""
            for intf in node.intfList():
                if intf.name != "lo":
                    node.cmd(f"ethtool -K {intf.name} tx off rx off{port_offloads} >/dev/null 2>&1")

    def apply_mtu(self) -> None:
        """Every interface at the topology's MTU, before the switches start (the software data
        plane reads its ports' MTU once), and the software target's program at its K."""
        for node in self.net.hosts + self.net.switches:
            for intf in node.intfList():
                if intf.name != "lo":
                    node.cmd(f"ip link set dev {intf.name} mtu {self.topo.mtu}")
        if self.dataplane == "soft" and not self.program_files:
            self.program_files = {"p4info": str(self.soft_program())}

    def soft_program(self) -> Path:
        """The software target's P4Info at the K of the links' MTU, in the run directory."""
        transports = {self.transport or job.get("transport", "udp") for job in self.topo.jobs}
        k = soft_values_per_packet(self.topo.mtu, transports)
        return write_soft_p4info(self.run.path / "soft.p4info.txtpb", k)

    def controller_config(self) -> dict:
        agg_ip = host_ip(self.topo.hosts[self.topo.aggregator])
        return {
            "listen": self.controller_addr, "admin_token_file": str(self.admin_file),
            "database": str(self.run.path / "controller.sqlite"),
            "host_aggregator": f"{agg_ip}:{HOST_AGGREGATOR_PORT}",
            # host-path datagrams fit the links' MTU unfragmented (the aggregator derives the
            # same K from its interface)
            "host_values_per_packet": min(HOST_VALUES_PER_PACKET, values_for_mtu(self.topo.mtu)),
            "metrics_listen": self.metrics_addr,
            "switches": controller_switches(self.topo, [sw.grpc for sw in self.net.switches],
                                            self.dataplane, self.program_files),
            **self.topo.controller,
        }

    def start_services(self) -> None:
        config_path = self.run.path / "controller.json"
        config_path.write_text(json.dumps(self.controller_config(), indent=2))
        ctl = subprocess.Popen(python_m(controller_package, "--config", str(config_path)),
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log("controller.log"), text=True,
                               start_new_session=True)
        self.procs.append(ctl)
        self.run.add_process(ctl.pid, "controller")
        self.watched.append(Watched("the controller", ctl, self.run.path / "logs" / "controller.log", service=True))
        if "serving" not in ctl.stdout.readline():
            raise RuntimeError(f"controller did not start, see {self.run.path}/logs/controller.log")
        agg_ip = host_ip(self.topo.hosts[self.topo.aggregator])
        agg = self.net.get(self.topo.aggregator)
        proc = agg.popen(python_m(aggregator_server, "--bind", f"{agg_ip}:{HOST_AGGREGATOR_PORT}",
                                   "--controller", self.controller_addr, "--admin-token-file", str(self.admin_file),
                                   "--stats-file", str(self.run.path / "logs" / "aggregator.json")),
                         cwd=ROOT, stdout=self.log("aggregator.log"), stderr=subprocess.STDOUT)
        self.procs.append(proc)
        self.run.add_process(proc.pid, "host aggregator")
        self.watched.append(Watched("the host aggregator", proc, self.run.path / "logs" / "aggregator.log",
                                    service=True))
        print(f"controller {self.controller_addr}, metrics http://{self.metrics_addr}/metrics; "
              f"inaggctl finds both at the mininet> prompt, elsewhere: set -a; . {self.run.path}/env",
              flush=True)

    def run_jobs(self) -> list[dict]:
        """Start every job's workers at once (their start-up overlaps). A job with a
        ``start_delay`` joins the controller that many seconds after every job before it holds
        a grant; once every job holds one, all start training together (time zero). A job with
        a ``start`` joins that many seconds after time zero and trains once placed. So placement order and
        overlap never depend on the machine's speed. Poll reports until every worker exits;
        RunFailed as soon as a rank fails or a service exits (``check_processes``), so a dead
        rank ends the run instead of leaving the others and the launcher waiting."""
        from inagg.hostlib.jobservice.client import ControllerClient

        # the jobs that arrive at a time (``start``) last, each released at its time after time zero
        order = sorted(self.topo.jobs, key=lambda j: ("start" in j, j.get("start", 0), j.get("start_delay", 0)))
        start_fork_server(*RANK_IMPORTS)   # a no-op where launch started it
        jobs = [self._start_job(spec) for spec in order]
        fixed = [j for j in jobs if "start" not in j["spec"]]
        arriving = [j for j in jobs if "start" in j["spec"]]
        gated = [i for i, j in enumerate(fixed) if j["gate"] is not None]
        client = ControllerClient(self.controller_addr)
        settled_at = None
        try:
            while any(w.poll() is None for j in jobs for w in j["procs"]):
                check_processes(self.watched)
                if not self.train_gate.exists() and settled_at is None and \
                        self._all_placed(client, fixed[:gated[0]] if gated else fixed):
                    settled_at = time.time()
                if gated and settled_at is not None and \
                        time.time() - settled_at >= fixed[gated[0]]["spec"]["start_delay"]:
                    fixed[gated.pop(0)]["gate"].touch()
                    settled_at = None
                elif not gated and settled_at is not None:
                    self.start_training(fixed)
                    settled_at = None
                self.release_arrivals(arriving)
                for job in jobs:
                    self._poll(job)
                time.sleep(0.2)
        finally:
            client.close()
        for job in jobs:
            self._poll(job)
        check_processes([w for w in self.watched if not w.service])   # a rank that failed last
        return jobs

    def start_training(self, fixed: list[dict]) -> None:
        """Time zero: every job without an arrival time holds a grant, all of them train now
        (their arrival), and the arrivals' clock starts."""
        self.train_gate.touch()
        self.time_zero = time.time()
        self.bw_schedule.start(self.time_zero)
        for job in fixed:
            job["arrival"] = self.time_zero
        print(f"time zero: {len(fixed)} job(s) train", flush=True)

    def release_arrivals(self, arriving: list[dict]) -> None:
        """Let each job with a ``start`` join (and then train) once that many seconds have
        passed since time zero; its arrival is then."""
        if self.time_zero is None:
            return
        for job in arriving:
            if "arrival" not in job and time.time() - self.time_zero >= job["spec"]["start"]:
                job["gate"].touch()
                job["arrival"] = time.time()
                print(f"job {job['spec']['name']} arrives at +{job['arrival'] - self.time_zero:.1f} s", flush=True)

    def _all_placed(self, client, jobs: list[dict]) -> bool:
        running = [j["spec"]["name"] for j in jobs if any(w.poll() is None for w in j["procs"])]
        if not running:
            return True
        listing = [j for j in client.list_jobs(self.admin).jobs if j.HasField("active")]
        for j in listing:
            self.placements.setdefault(j.name, j.active.reason or f"{j.active.mode} {j.active.aggregator}")
        return set(running) <= {j.name for j in listing}

    def _start_job(self, spec: dict) -> dict:
        """Start one job's ranks as training-demo processes (``inagg.bmv2_env.demos.train_demo --worker``: a
        process boundary, so the emulation imports nothing of the demos above it), each forked
        from the fork server (``RANK_IMPORTS``) into its host's namespaces, in a session of its
        own, as ``host.popen`` (``mnexec -da``) would start it; ``cfg`` holds the demo's options
        this job sets, the rest keep the demo's defaults."""
        name = spec["name"]
        workdir = self.run.path / "jobs" / name
        workdir.mkdir(parents=True)
        gate = workdir / "join" if "start_delay" in spec or "start" in spec else None
        cfg = {"workers": len(spec["workers"]), "hook": spec.get("hook", "inagg"), "job_name": name,
               "transport": self.transport or spec.get("transport", "udp"),
               **{k: spec[k] for k in ("model", "profile", "iterations", "duration") if k in spec},
               **({"epochs": self.epochs[name]} if name in self.epochs else {})}
        procs = []
        for rank, host_name in enumerate(spec["workers"]):
            host = self.net.get(host_name)
            cmd = python_m(TRAIN_DEMO_MODULE, "--worker", "--rank", str(rank),
                           "--dist-file", str(workdir / "dist"), "--rdv-file", str(workdir / "rdv"),
                           "--controller", self.controller_addr, "--bind-ip", host.IP(),
                           "--config", json.dumps(cfg), "--train-after", str(self.train_gate),
                           *(["--join-after", str(gate)] if gate else []))
            env = {"GLOO_SOCKET_IFNAME": host.defaultIntf().name,
                   HOST_REDUCE_ENV: "auto" if spec.get("host_reduce") else "off"}
            log = f"{name}-{host_name}-r{rank}.log"
            with self.log(log) as stderr:
                proc = ForkedCommand(cmd, stderr.fileno(), ROOT, env, namespaces_of=host.pid)
            self.run.add_process(proc.pid, f"job {name} rank {rank}")
            self.watched.append(Watched(f"job {name} rank {rank} on {host_name}", proc, self.run.path / "logs" / log))
            procs.append(proc)
        self.procs.extend(procs)
        print(f"job {name}: {len(procs)} workers on {', '.join(spec['workers'])}, {workload_text(spec, cfg)}",
              flush=True)
        return {"spec": spec, "cfg": cfg, "procs": procs, "epochs": [], "done": {}, "gate": gate}

    def _poll(self, job: dict) -> None:
        for rank, p in enumerate(job["procs"]):
            while p.stdout and select.select([p.stdout], [], [], 0)[0]:
                line = p.stdout.readline()
                if not line:
                    break
                msg = json.loads(line)
                if msg[0] == "epoch":
                    job["epochs"].append(msg[2:])
                    if "profile" in job["spec"]:   # no loss, no accuracy to tell
                        continue
                    total = f"/{job['cfg']['epochs']}" if "epochs" in job["cfg"] else ""
                    print(f"  {job['spec']['name']}: epoch {msg[1] + 1}{total} "
                          f"loss {msg[2]:.4f} test acc {100 * msg[3]:.1f}%", flush=True)
                else:
                    job["done"][rank] = {"stats": msg[3], "seconds": msg[4], "steps": msg[5],
                                         "params_sha256": msg[2], "workload": msg[6]}

    def switch_counters(self) -> dict:
        from inagg.controller.p4info import P4Type
        from inagg.controller.switch import SwitchConnection
        totals = {}
        for sw in self.net.switches:
            conn = SwitchConnection(sw.grpc, sw.device_id, election_id=(0, 0))
            try:
                names = ("job_aggregated", "job_results") + \
                    (("job_collisions",) if conn.p4info.has(P4Type.counter, "job_collisions") else ())
                totals[sw.name] = {c: sum(conn.counter(c).values()) for c in names}
            finally:
                conn.close()
        return totals

    def summarize(self, jobs: list[dict]) -> list[dict]:
        """Save the jobs' records (``records.json``), print the summary and save it
        (``summary.txt``, ``summary.json``) in the run directory; returns the jobs' rows."""
        records = [job_record(job, self.time_zero) for job in jobs]
        (self.run.path / "records.json").write_text(json.dumps(records, indent=1) + "\n")
        counters = self.switch_counters()
        if self.impairments.by == "soft switch ports":   # the switches' counts, rewritten while they run
            time.sleep(2 * soft_switch.IMPAIR_STATS_SECONDS)
            self.impairments.port_stats = impairments.read_port_stats(self.run.path / "logs",
                                                                      list(self.topo.switches))
        self.impairments.bw_changes = self.bw_schedule.applied(self.time_zero)
        lines, rows = summary(self.topo, records, counters, self.run.path / "logs", self.placements,
                              self.impairments)
        print("\n".join(lines), flush=True)
        write_summary(self.run.path, lines, rows, counters, applied=self.impairments)
        print(f"summary saved: {self.run.path / 'summary.txt'}, summary.json; records: records.json", flush=True)
        return rows

    def cli(self, during: bool = False) -> None:
        """The mininet> prompt (after the jobs, or ``during`` them)."""
        from mininet.cli import CLI
        ends = "waits for the jobs, then tears the network down" if during else "tears it down"
        print(f"network up{', the jobs running' if during else ''}; try: sh inaggctl jobs, sh inaggctl top, "
              f"h1 ip addr, dump; exit (or Ctrl-D) {ends}", flush=True)
        CLI(self.net)

    def jobs_with_prompt(self) -> list[dict]:
        """``--cli during``: the jobs run (``run_jobs``, then ``summarize``) in a thread of
        their own while the mininet> prompt is up in this one, so inaggctl and the hosts'
        shells see them as they train. Leaving the prompt waits for the jobs (``make stop
        RUN=<id>`` ends them sooner); what the thread raised (RunFailed: printed at once, for
        the prompt's user) is raised here, after the prompt."""
        outcome: dict = {}

        def jobs() -> None:
            try:
                outcome["rows"] = self.summarize(self.run_jobs())
            except BaseException as e:      # handed to the main thread
                outcome["error"] = e
                if isinstance(e, RunFailed):
                    print(f"run {self.run.run_id} failed: {e}\n(leave the prompt to end the run)",
                          file=sys.stderr, flush=True)
                    e.announced = True

        thread = threading.Thread(target=jobs, name="jobs", daemon=True)
        thread.start()
        self.cli(during=True)
        if thread.is_alive():
            print(f"the jobs are still running: waiting for them (make stop RUN={self.run.run_id} ends them)",
                  flush=True)
        while thread.is_alive():
            thread.join(0.5)        # with a timeout: SIGTERM (make stop) is handled meanwhile
        if "error" in outcome:
            raise outcome["error"]
        return outcome["rows"]

    def teardown(self) -> None:
        self.bw_schedule.stop()
        stop_processes(self.procs)
        if self.net is not None:
            for sw in self.net.switches:
                sw.stop_data_plane()
            self.net.stop()
        for name in ("controller.sock", "admin-token", "controller.json", "env"):
            (self.run.path / name).unlink(missing_ok=True)
        self.run.finish()


def chosen_runs(all_users: bool, clean: bool, base: Path) -> tuple[list[RunDir], list[RunDir]]:
    """The runs ``make stop`` (unfinished ones) or ``make clean`` (every one) acts on: the
    caller's, or every user's with ``all_users``; and the others', which it leaves alone."""
    runs = all_runs(base) if clean else unfinished_runs(base)
    return runs_of(runs, None if all_users else current_user())


def stop_leftovers(run_id: str | None, all_users: bool = False, clean: bool = False,
                   base: Path = RUNS_DIR) -> int:
    """``make stop``: stop what the caller's unfinished runs of this checkout started (every
    user's with ``all_users``; only run ``run_id`` when named), naming the other users' runs it
    leaves running. ``clean`` (``make clean``): then delete those runs' directories too."""
    if run_id:
        runs, others = [RunDir(run_id, base)], []
        if not runs[0].record_path.exists():
            print(f"inagg-mininet: no run {run_id} in {base}", file=sys.stderr)
            return 2
    else:
        runs, others = chosen_runs(all_users, clean, base)
    for run in runs:
        if run_id or not run.record.get("finished"):
            done = stop_run(run)
            print(f"run {run.run_id}: {'; '.join(done) if done else 'nothing left running'}")
    for run in others:
        if not run.record.get("finished"):
            print(f"run {run.run_id}: started by {run.record.get('user', 'an unknown user')}, left alone "
                  f"(ALL=1, --all: every user's runs)")
    if not runs:
        print(f"no {'' if clean else 'unfinished '}run of {current_user()} in {base}")
    if clean:
        delete_runs(runs, base)
    return 0


def pruned_line(pruned: list[str], kept: int) -> str:
    """The line a new run prints when it deleted finished runs to make room (RunDir.create)."""
    return (f"pruned {len(pruned)} finished run(s) of {current_user()} beyond the newest {kept}: "
            f"{', '.join(pruned)} (keep more: make run KEEP_RUNS=n, --keep-runs n or {KEEP_ENV}=n)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The launcher's options, combinations that make no sense refused (exit 2)."""
    p = argparse.ArgumentParser(prog="inagg-mininet", description=__doc__.split("\n\n")[0])
    add_version_flag(p)
    p.add_argument("--topo", type=Path, default=Path(__file__).parent / "topologies/single_switch.json")
    p.add_argument("--dataplane", choices=["auto", "bmv2", "soft"], default="auto")
    p.add_argument("--epochs", type=int, help="the first job's epochs; the others scale alike (jobs that run "
                                              "for iterations or a duration keep them)")
    p.add_argument("--transport", choices=["udp", "roce"],
                   help="override every job's transport to the switch (topology: \"transport\")")
    p.add_argument("--p4info", type=Path, help="P4Info pushed to BMv2 switches (default: p4/'s)")
    p.add_argument("--bmv2-json", type=Path, help="BMv2 JSON pushed to BMv2 switches (default: p4/'s)")
    p.add_argument("--switch-nice", type=int, default=DATA_PLANE_NICE,
                   help="the data planes' nice(1) value (default %(default)s: ahead of the hosts; 0: as they are)")
    p.add_argument("--bmv2-log", choices=BMV2_LOG_LEVELS, default=BMV2_LOG_LEVEL,
                   help="BMv2's log level, to logs/<switch>-bmv2.log (default %(default)s; trace: every table "
                        "and action per packet, as in p4lang/tutorials, slower)")
    p.add_argument("--cli", nargs="?", const="after", choices=["after", "during"],
                   help="a mininet> prompt after the jobs (--cli) or during them (--cli during)")
    p.add_argument("--json", type=Path, help="write the summary rows here")
    p.add_argument("--keep-runs", type=int, metavar="N",
                   help="finished runs of yours kept beside the new one (default: $INAGG_KEEP_RUNS or 3)")
    p.add_argument("--stop", action="store_true", help="stop this user's unfinished runs of this checkout and exit")
    p.add_argument("--clean", action="store_true", help="as --stop, then delete those runs' directories")
    p.add_argument("--all", action="store_true", help="with --stop/--clean: every user's runs")
    p.add_argument("--run", metavar="ID", help="with --stop: only this run (whoever started it)")
    args = p.parse_args(argv)
    if args.epochs is not None and args.epochs < 1:
        p.error(f"--epochs must be >= 1, got {args.epochs}")   # 0 used to mean "the topology's"
    if args.clean and args.run:
        p.error("--clean acts on every run of a user; --run goes with --stop")
    if (args.all or args.run) and not (args.stop or args.clean):
        p.error("--all and --run go with --stop (or --all with --clean)")
    if args.keep_runs is not None and args.keep_runs < 0:
        p.error(f"--keep-runs must be >= 0 (finished runs kept), got {args.keep_runs}")
    try:
        keep_runs()
    except ValueError as e:
        p.error(str(e))
    if not (args.stop or args.clean):
        args.dataplane = choose_dataplane(args.dataplane)
        try:
            args.program_files = program_files_for(args.dataplane, args.p4info, args.bmv2_json)
        except ValueError as e:
            p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    """``make run`` (``make stop``/``make clean`` with --stop/--clean): check the options and
    the topology before anything is made, then ``launch``."""
    args = parse_args(argv)
    if args.stop or args.clean:
        return stop_leftovers(args.run, args.all, args.clean)
    try:
        topo = load_topology(args.topo)   # first: a bad file is named with or without root
    except TopologyError as e:
        print(f"inagg-mininet: {e}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("inagg-mininet: Mininet needs root", file=sys.stderr)
        return 2
    return launch(args, topo)


def launch(args: argparse.Namespace, topo: Topology) -> int:
    """Bring the run up in a run directory of its own, run its jobs, summarize, tear down.
    Exit status 0 when every job finished; 1 when one failed, a process it depends on died
    (named with its log's last lines: ``RunFailed``) or the run was stopped."""
    run_dir = RunDir.create(keep=args.keep_runs)
    print(f"inagg emulation: {args.topo.name}, data plane {args.dataplane}, run {run_dir.run_id} in {run_dir.path}",
          flush=True)
    if run_dir.pruned:
        print(pruned_line(run_dir.pruned, keep_runs() if args.keep_runs is None else args.keep_runs), flush=True)
    run = Run(topo, args.dataplane, run_dir, args.epochs, args.transport, args.program_files,
              switch_nice=args.switch_nice, bmv2_log=args.bmv2_log)

    def terminated(*_):
        raise Terminated

    signal.signal(signal.SIGTERM, terminated)
    rows = []
    try:
        start_fork_server(*RANK_IMPORTS)   # the ranks' imports, while the network comes up
        run.build()
        run.start_services()
        if args.cli == "during":
            rows = run.jobs_with_prompt()
        else:
            rows = run.summarize(run.run_jobs())
            if args.cli:
                run.cli()
    except Terminated:
        print(f"run {run_dir.run_id}: stopped (SIGTERM)", flush=True)
    except TopologyError as e:   # what the links ask that this machine's data plane cannot apply
        print(f"inagg-mininet: {e}", file=sys.stderr, flush=True)
        write_summary(run_dir.path, [f"run {run_dir.run_id} refused: {e}"], [], {}, failed=str(e))
    except RunFailed as e:
        if not getattr(e, "announced", False):
            print(f"run {run_dir.run_id} failed, ending it: {e}", file=sys.stderr, flush=True)
        write_summary(run_dir.path, [f"run {run_dir.run_id} failed: {e}"], [], {}, failed=str(e))
    finally:
        run.teardown()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
