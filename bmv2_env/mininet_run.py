"""``make run``: a Mininet network of hosts and P4 switches running inagg, the p4lang/tutorials way.

Reads a topology file (hosts with ip/mac, switches, links with optional delay/bw/loss, the host
aggregator, jobs), builds it in Mininet with P4 switch nodes (``simple_switch_grpc`` when
installed, else the software data plane: same flags, same P4Runtime), starts the controller
in the root namespace (workers reach it over a Unix socket, which crosses namespaces), the host
aggregator and the training jobs on their hosts, and prints a per-job summary. Per-switch logs
and per-port pcaps go to ``logs/`` and ``pcaps/``.

    python -m bmv2_env.mininet_run --topo bmv2_env/topologies/single_switch.json
    python -m bmv2_env.mininet_run --stop      # clean up what a killed run left behind
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from controller.credentials import write_token
from hostlib import add_version_flag

from .testbed import stop_processes

ROOT = Path(__file__).resolve().parents[1]
STATE = Path("/tmp/inagg-mininet")
GRPC_BASE_PORT = 9559


def import_mininet():
    """Debian's Mininet lives in the system dist-packages; make it importable from a venv."""
    try:
        import mininet  # noqa: F401
    except ImportError:
        sys.path.append("/usr/lib/python3/dist-packages")
    from mininet.link import TCLink
    from mininet.net import Mininet
    from mininet.node import Switch
    return Mininet, Switch, TCLink


def choose_dataplane(wanted: str) -> str:
    have_bmv2 = shutil.which("simple_switch_grpc") is not None
    if wanted == "auto":
        return "bmv2" if have_bmv2 else "soft"
    if wanted == "bmv2" and not have_bmv2:
        raise SystemExit("--dataplane bmv2: simple_switch_grpc is not on PATH")
    return wanted


def make_switch_class(Switch):
    class P4Switch(Switch):
        """A Mininet switch node running a P4Runtime data plane process in the root namespace."""

        def __init__(self, name, dataplane="soft", grpc_port=GRPC_BASE_PORT, device_id=0, **kw):
            Switch.__init__(self, name, **kw)
            self.dataplane, self.grpc_port, self.device_id = dataplane, grpc_port, device_id
            self.proc = None

        def start(self, controllers):
            ports = [a for p, i in sorted(self.intfs.items()) if i.name != "lo"
                     for a in ("-i", f"{p}@{i.name}")]
            binary = (["simple_switch_grpc"] if self.dataplane == "bmv2"
                      else [sys.executable, "-m", "bmv2_env.soft_switch"])
            (ROOT / "pcaps").mkdir(exist_ok=True)
            (ROOT / "logs").mkdir(exist_ok=True)
            cmd = binary + ports + ["--device-id", str(self.device_id), "--pcap", str(ROOT / "pcaps"),
                                    "--no-p4", "--", "--grpc-server-addr", f"127.0.0.1:{self.grpc_port}"]
            log = open(ROOT / "logs" / f"{self.name}.log", "w")
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            (STATE / f"{self.name}.pid").write_text(str(self.proc.pid))
            deadline = time.time() + 30
            while not _listening(self.grpc_port):
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"{self.name}: data plane did not start, see logs/{self.name}.log")
                time.sleep(0.1)

        def stop(self, deleteIntfs=True):
            stop_processes([self.proc])
            Switch.stop(self, deleteIntfs)

    return P4Switch


def netem_available() -> bool:
    """Whether ``tc ... netem`` works here (some kernels are built without sch_netem)."""
    probe = subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "0ms"],
                           capture_output=True)
    if probe.returncode == 0:
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    return probe.returncode == 0


def _listening(port: int) -> bool:
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def load_topology(path: Path) -> dict:
    topo = json.loads(path.read_text())
    for key in ("hosts", "switches", "links", "aggregator", "jobs"):
        if key not in topo:
            raise SystemExit(f"{path}: missing key {key!r}")
    return topo


class Run:
    """One bring-up of a topology: network, controller, aggregator, jobs, summary, teardown."""

    def __init__(self, topo: dict, dataplane: str, epochs: int | None = None,
                 transport: str | None = None) -> None:
        self.topo, self.dataplane, self.epochs, self.transport = topo, dataplane, epochs, transport
        self.net = None
        self.procs: list[subprocess.Popen] = []
        self.admin = secrets.token_hex(8)

    def build(self) -> None:
        Mininet, Switch, TCLink = import_mininet()
        shaped = [l for l in self.topo["links"] if len(l) > 2 and l[2]]
        if shaped and not netem_available():
            print("warning: this kernel has no netem qdisc: link delay/loss in the topology file "
                  "are not applied", flush=True)
        P4Switch = make_switch_class(Switch)
        STATE.mkdir(parents=True, exist_ok=True)
        self.net = Mininet(topo=None, controller=None, link=TCLink, build=False, autoSetMacs=False)
        for i, name in enumerate(self.topo["switches"]):
            self.net.addSwitch(name, cls=P4Switch, dataplane=self.dataplane,
                               grpc_port=GRPC_BASE_PORT + i, device_id=i)
        for name, h in self.topo["hosts"].items():
            self.net.addHost(name, ip=h["ip"], mac=h["mac"])
        for link in self.topo["links"]:
            a, b, params = link[0], link[1], (link[2] if len(link) > 2 else {})
            sw, port = b.split("-p")
            self.net.addLink(a, sw, port2=int(port), **params)
        self.net.build()
        self.net.start()
        (STATE / "hosts").write_text(" ".join(self.topo["hosts"]))
        for node in self.net.hosts + self.net.switches:
            # a software data plane forwards frames as captured: checksums must be complete
            for intf in node.intfList():
                if intf.name != "lo":
                    node.cmd(f"ethtool -K {intf.name} tx off rx off >/dev/null 2>&1")
        for host in self.net.hosts:
            host.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1")
            for other, h in self.topo["hosts"].items():
                if other != host.name:
                    host.setARP(h["ip"].split("/")[0], h["mac"])
            for s in self.topo["switches"].values():
                host.setARP(s["aggregator_ip"], s["aggregator_mac"])

    def host_config(self, switch: str) -> dict:
        hosts = {}
        for a, b, *_ in self.topo["links"]:
            sw, port = b.split("-p")
            if sw == switch:
                h = self.topo["hosts"][a]
                hosts[h["ip"].split("/")[0]] = {"port": int(port), "mac": h["mac"]}
        return hosts

    def start_services(self) -> None:
        from hostlib.grant import ETHERNET_MTU, values_for_mtu

        agg_ip = self.topo["hosts"][self.topo["aggregator"]]["ip"].split("/")[0]
        self.controller_addr = f"unix:{STATE}/controller.sock"
        config = {
            "listen": self.controller_addr, "admin_token": self.admin,
            "database": str(STATE / "controller.sqlite"), "host_aggregator": f"{agg_ip}:42666",
            # Mininet links have Ethernet's MTU: host-path datagrams must fit it unfragmented
            # (the aggregator derives the same K from its interface)
            "host_values_per_packet": values_for_mtu(ETHERNET_MTU),
            "switches": [{"name": name, "grpc": f"127.0.0.1:{GRPC_BASE_PORT + i}", "device_id": i,
                          "aggregator": f"{s['aggregator_ip']}:42602", "hosts": self.host_config(name)}
                         for i, (name, s) in enumerate(self.topo["switches"].items())],
            **self.topo.get("controller", {}),
        }
        (STATE / "controller.sqlite").unlink(missing_ok=True)
        token_file = STATE / "admin.token"   # the aggregator reads it: tokens never go on argv
        write_token(token_file, self.admin)
        (STATE / "controller.json").write_text(json.dumps(config, indent=2))
        ctl = subprocess.Popen([sys.executable, "-m", "controller", "--config", str(STATE / "controller.json")],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=open(ROOT / "logs" / "controller.log", "w"),
                               text=True)
        self.procs.append(ctl)
        if "serving" not in ctl.stdout.readline():
            raise RuntimeError("controller did not start, see logs/controller.log")
        agg = self.net.get(self.topo["aggregator"])
        self.procs.append(agg.popen([sys.executable, "-m", "hostlib.aggregator", "--bind", f"{agg_ip}:42666",
                                     "--controller", self.controller_addr, "--admin-token-file", str(token_file),
                                     "--stats-file", str(ROOT / "logs" / "aggregator.json")],
                                    cwd=ROOT, stdout=open(ROOT / "logs" / "aggregator.log", "w"),
                                    stderr=subprocess.STDOUT))

    def run_jobs(self) -> list[dict]:
        from hostlib.train_demo import TrainConfig

        jobs = []
        t0 = time.time()
        pending = sorted(self.topo["jobs"], key=lambda j: j.get("start_delay", 0))
        while pending or any(w.poll() is None for j in jobs for w in j["procs"]):
            while pending and time.time() - t0 >= pending[0].get("start_delay", 0):
                jobs.append(self._start_job(pending.pop(0), TrainConfig))
            for job in jobs:
                self._poll(job)
            time.sleep(0.2)
        for job in jobs:
            self._poll(job)
        return jobs

    def _start_job(self, spec: dict, TrainConfig) -> dict:
        name = spec["name"]
        workdir = STATE / name
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        cfg = TrainConfig(workers=len(spec["workers"]), epochs=self.epochs or spec.get("epochs", 4),
                          hook=spec.get("hook", "inagg"),
                          transport=self.transport or spec.get("transport", "udp"))
        procs = []
        for rank, host_name in enumerate(spec["workers"]):
            host = self.net.get(host_name)
            cmd = [sys.executable, "-m", "hostlib.train_demo", "--worker", "--rank", str(rank),
                   "--dist-file", str(workdir / "dist"), "--rdv-file", str(workdir / "rdv"),
                   "--controller", self.controller_addr, "--bind-ip", host.IP(),
                   "--config", json.dumps(cfg.__dict__)]
            env = {**os.environ, "GLOO_SOCKET_IFNAME": host.defaultIntf().name}
            procs.append(host.popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=open(ROOT / "logs" / f"{name}-{host_name}.log", "w"), text=True))
        self.procs.extend(procs)
        print(f"job {name}: {len(procs)} workers on {', '.join(spec['workers'])}", flush=True)
        return {"spec": spec, "cfg": cfg, "procs": procs, "epochs": [], "done": {}}

    def _poll(self, job: dict) -> None:
        import select
        for rank, p in enumerate(job["procs"]):
            while p.stdout and select.select([p.stdout], [], [], 0)[0]:
                line = p.stdout.readline()
                if not line:
                    break
                msg = json.loads(line)
                if msg[0] == "epoch":
                    job["epochs"].append(msg[2:])
                    print(f"  {job['spec']['name']}: epoch {msg[1] + 1}/{job['cfg'].epochs} "
                          f"loss {msg[2]:.4f} test acc {100 * msg[3]:.1f}%", flush=True)
                else:
                    job["done"][rank] = {"stats": msg[3], "seconds": msg[4], "steps": msg[5]}

    def switch_counters(self) -> dict:
        from controller.switch import SwitchConnection
        totals = {}
        for i, name in enumerate(self.topo["switches"]):
            sw = SwitchConnection(f"127.0.0.1:{GRPC_BASE_PORT + i}", election_id=(0, 0))
            try:
                totals[name] = {c: sum(sw.counter(c).values()) for c in ("job_aggregated", "job_results")}
            finally:
                sw.close()
        return totals

    def teardown(self) -> None:
        stop_processes(self.procs)
        if self.net is not None:
            self.net.stop()
        shutil.rmtree(STATE, ignore_errors=True)


def summarize(topo: dict, jobs: list[dict], counters: dict) -> list[dict]:
    rows = []
    loss = {link[0]: (link[2] if len(link) > 2 else {}).get("loss", 0) for link in topo["links"]}
    print("\nper-job summary")
    print(f"{'job':<8} {'mode':<12} {'grants':>6} {'slots, epoch':<12} {'MB sent/worker':>14} {'retx':>6} "
          f"{'link loss %':>11} {'accuracy':>8} {'ms/step':>8}")
    for job in jobs:
        stats = [job["done"][r]["stats"] for r in sorted(job["done"])]
        if len(stats) != len(job["procs"]) or not job["epochs"]:
            rows.append({"name": job["spec"]["name"], "ok": False})
            print(f"{job['spec']['name']:<8} FAILED: see logs/{job['spec']['name']}-*.log")
            continue
        s0 = stats[0]
        acc = job["epochs"][-1][1]
        seconds, steps = job["done"][0]["seconds"], job["done"][0]["steps"]
        row = {"name": job["spec"]["name"], "ok": True, "mode": s0["mode"], "transport": s0["transport"],
               "grant_changes": s0["grant_changes"],
               "epoch": s0["epoch"], "accuracy": acc, "host_results": s0["host_results"],
               "switch_results": s0["packets_received"] - s0["host_results"],
               "mb_sent": sum(s["wire_bytes_sent"] for s in stats) / len(stats) / 1e6,
               "retransmissions": sum(s["retransmissions"] for s in stats)}
        rows.append(row)
        worst_loss = max(loss.get(h, 0) for h in job["spec"]["workers"])
        via = row['mode'] + ("/RoCE" if row["transport"] == "roce" else "")
        print(f"{row['name']:<8} {via:<12} {row['grant_changes']:>6} {s0['slots'] + ' e' + str(row['epoch']):<12} "
              f"{row['mb_sent']:>14.2f} {row['retransmissions']:>6} {worst_loss:>11} {100 * acc:>7.1f}% "
              f"{seconds / steps * 1e3:>8.1f}")
        print(f"{'':<8} results: {row['switch_results']} from the switch, {row['host_results']} from the host aggregator")
    for name, c in counters.items():
        print(f"switch {name}: {c['job_aggregated']} contributions aggregated, {c['job_results']} results multicast")
    return rows


def stop_leftovers() -> None:
    """``make stop``: kill our data plane processes and delete our hosts' interfaces; touches
    nothing Mininet did not create for us."""
    for pid_file in STATE.glob("*.pid") if STATE.exists() else []:
        try:
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass
    hosts = (STATE / "hosts").read_text().split() if (STATE / "hosts").exists() else []
    for h in hosts:
        subprocess.run(["ip", "link", "del", f"{h}-eth0"], capture_output=True)
        subprocess.run(["pkill", "-f", f"mininet:{h}$"], capture_output=True)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if any(name.startswith(f"{s}-eth") for s in ("s1", "s2", "s3")):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
    shutil.rmtree(STATE, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inagg-mininet", description=__doc__.split("\n\n")[0])
    add_version_flag(p)
    p.add_argument("--topo", type=Path, default=ROOT / "bmv2_env/topologies/single_switch.json")
    p.add_argument("--dataplane", choices=["auto", "bmv2", "soft"], default="auto")
    p.add_argument("--epochs", type=int, help="override every job's epochs")
    p.add_argument("--transport", choices=["udp", "roce"],
                   help="override every job's transport to the switch (topology: \"transport\")")
    p.add_argument("--json", type=Path, help="write the summary rows here")
    p.add_argument("--stop", action="store_true", help="clean up a previous run and exit")
    args = p.parse_args(argv)
    if args.stop:
        stop_leftovers()
        return 0
    if os.geteuid() != 0:
        print("inagg-mininet: Mininet needs root", file=sys.stderr)
        return 2
    topo = load_topology(args.topo)
    dataplane = choose_dataplane(args.dataplane)
    print(f"inagg emulation: {args.topo.name}, data plane {dataplane}", flush=True)
    run = Run(topo, dataplane, args.epochs, args.transport)

    def interrupted(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        run.build()
        run.start_services()
        jobs = run.run_jobs()
        rows = summarize(topo, jobs, run.switch_counters())
    finally:
        run.teardown()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
