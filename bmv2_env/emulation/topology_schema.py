"""What a topology file may say, checked entry by entry before any network is built.

The loader (topology.py) calls ``check_schema`` on the raw JSON before it builds its
``Topology``, then ``check_addresses`` and ``check_settings`` on the parsed entries. The design:

* **Closed schema.** Every object (the file, a host, a switch, a link's options, a job, the
  controller section) has a fixed set of keys (``SCHEMA``); an unknown key is an error naming the
  key, its entry and the closest known key (``worker`` -> ``workers``), never silently ignored: a
  typo in ``epochs`` used to train the default number of epochs without a word.
* **Syntax first, then meaning.** MACs and IPv4 addresses are parsed (``parse_mac``,
  ``parse_host_ip``, ``parse_switch_ip``); then what the emulation cannot build is refused: two
  entries with one MAC or one IP (the ranks then died of gloo connect errors long after the
  network was up), a switch's aggregator address equal to a host's, addresses off the hosts'
  subnet (the emulation has no router), interface names over Linux's 15 characters, and
  controller settings that cannot work (``min_window`` 0, a key the launcher itself sets).
* **Every message says where and what to write**: ``<file>: <entry>: <problem>; <fix>``.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from typing import Any, Iterable

from inagg.controller.allocator import DYNAMIC, SHARING
from inagg.hostlib.wire.protocol import ENCAPSULATIONS

# the keys each kind of object may have; those marked required must be there
SCHEMA: dict[str, dict[str, bool]] = {
    "the topology": {"description": False, "hosts": True, "switches": True, "links": True,
                     "aggregator": True, "jobs": True, "controller": False, "mtu": False},
    "host": {"ip": True, "mac": True},
    "switch": {"aggregator_ip": True, "aggregator_mac": True},
    # Mininet's TCLink options (what `tc` is asked for on both ends of the link), netem's duplicate
    # and reorder, and a bandwidth schedule (impairments.py, shaping.py)
    "link options": {"bw": False, "delay": False, "jitter": False, "loss": False, "max_queue_size": False,
                     "use_tbf": False, "use_hfsc": False, "latency_ms": False, "enable_ecn": False,
                     "enable_red": False, "duplicate": False, "reorder": False, "bw_schedule": False},
    "job": {"name": True, "workers": True, "epochs": False, "host_reduce": False, "hook": False,
            "transport": False, "start_delay": False, "description": False,
            "model": False, "profile": False, "iterations": False, "duration": False, "start": False},
    # a synthetic gradient profile: a job's traffic without its model (demos/workloads.py)
    "profile": {"bucket_bytes": True, "compute_ms": False, "collective": False},
    # the controller's settings a topology may change; the launcher sets the rest (LAUNCHER_SETS)
    "controller": {"min_window": False, "lease_seconds": False, "rank_lease_seconds": False,
                   "switch_check_seconds": False, "switch_audit_seconds": False, "max_jobs": False, "host_slots": False, "host_window": False,
                   "sharing": False, "atp_pool": False},
}
NETEM_OPTIONS = ("delay", "jitter", "loss", "max_queue_size")   # link options Mininet applies with netem
IMPAIRMENTS = ("delay", "jitter", "loss", "duplicate", "reorder", "max_queue_size")   # netem's, as links ask them
LAUNCHER_SETS = ("listen", "admin_token", "admin_token_file", "database", "host_aggregator", "switches",
                 "metrics_listen", "host_values_per_packet", "tls_cert", "tls_key", "insecure")
HOOKS = ("inagg", "artopk")          # the training demo's DDP hooks that report stats
MODELS = ("mlp", "cnn", "transformer")   # demos/workloads.py's zoo (tests/test_workloads.py)
COLLECTIVES = ("allreduce", "reduce_scatter")   # what a profile's steps run on each bucket (train_demo)
MAX_BUCKET_BYTES = 64 << 20          # one synthetic bucket at most: 64 MiB, DDP's bucket_cap_mb here
_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_TC_TIME = re.compile(r"^[0-9]+(\.[0-9]+)?(us|ms|s)$")          # tc's delay and jitter, e.g. "5ms"
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")   # it names log files and the controller's job


class TopologyError(ValueError):
    """The topology file is malformed or asks for something the emulation cannot build."""


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known word closest to ``word``, else ''."""
    close = difflib.get_close_matches(word.lower(), list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_keys(obj: Any, kind: str, where: str) -> None:
    """``obj`` is an object whose keys are all in ``SCHEMA[kind]`` and holds every required one."""
    keys = SCHEMA[kind]
    if not isinstance(obj, dict):
        raise TopologyError(f"{where}: {kind} must be a JSON object {{...}}, got {obj!r}")
    for key in obj:
        if key not in keys:
            hint = did_you_mean(key, keys)
            if kind == "controller" and key in LAUNCHER_SETS:
                raise TopologyError(f"{where}: {key!r} is set by the launcher for every run; remove it "
                                    f"(a topology's controller section may set: {', '.join(keys)})")
            raise TopologyError(f"{where}: unknown key {key!r}{hint}; {kind} keys are: {', '.join(keys)}")
    missing = [k for k, required in keys.items() if required and k not in obj]
    if missing:
        raise TopologyError(f"{where}: missing {', '.join(map(repr, missing))}; {kind} needs "
                            f"{', '.join(k for k, r in keys.items() if r)}")


def check_schema(data: Any, file: str) -> None:
    """The raw file's shape: known keys at every level, objects and lists where they belong."""
    check_keys(data, "the topology", file)
    for section, kind in (("hosts", "host"), ("switches", "switch")):
        if not isinstance(data[section], dict) or not data[section]:
            raise TopologyError(f"{file}: {section} must be a non-empty object of name -> {{...}}")
        for name, entry in data[section].items():
            check_keys(entry, kind, f"{file}: {kind} {name}")
    for key in ("links", "jobs"):
        if not isinstance(data[key], list) or not data[key]:
            raise TopologyError(f"{file}: {key} must be a non-empty list [...]")
    for i, link in enumerate(data["links"]):
        if isinstance(link, list) and len(link) == 3:
            check_keys(link[2], "link options", f"{file}: links[{i}]")
    for i, job in enumerate(data["jobs"]):
        label = f"jobs[{i}]" + (f" (job {job['name']})" if isinstance(job, dict) and "name" in job else "")
        check_keys(job, "job", f"{file}: {label}")
        if "profile" in job:
            check_keys(job["profile"], "profile", f"{file}: {label}: profile")
    check_keys(data.get("controller", {}), "controller", f"{file}: controller")


def parse_mac(text: Any, where: str) -> str:
    """A unicast Ethernet address written ``08:00:00:00:00:01``, lower-cased."""
    if not isinstance(text, str) or not _MAC.match(text):
        raise TopologyError(f"{where}: {text!r} is not a MAC address; write six hex pairs joined by ':', "
                            "e.g. '08:00:00:00:00:01'")
    if int(text[:2], 16) & 1 or text.replace(":", "").strip("0") == "":
        raise TopologyError(f"{where}: {text} is a multicast or zero address, which no port can own; use a "
                            "unicast one (first octet even, not all zeros), e.g. '08:00:00:00:00:01'")
    return text.lower()


def parse_host_ip(text: Any, where: str) -> ipaddress.IPv4Interface:
    """A host's IPv4 address with its prefix length, ``10.0.0.1/24``: neither the subnet's
    network nor its broadcast address."""
    try:
        iface = ipaddress.IPv4Interface(text) if isinstance(text, str) and "/" in text else None
    except ValueError:
        iface = None
    if iface is None:
        raise TopologyError(f"{where}: {text!r} is not an IPv4 address with its prefix length; write it "
                            "like '10.0.0.1/24'")
    net = iface.network
    if net.prefixlen < 31 and iface.ip in (net.network_address, net.broadcast_address):
        raise TopologyError(f"{where}: {text} is the {'network' if iface.ip == net.network_address else 'broadcast'} "
                            f"address of {net}; pick a host address inside it, "
                            f"e.g. '{next(net.hosts())}/{net.prefixlen}'")
    return iface


def parse_switch_ip(text: Any, where: str) -> ipaddress.IPv4Address:
    """A switch's aggregator address: a plain IPv4 address (the hosts' subnet is theirs)."""
    try:
        return ipaddress.IPv4Address(text) if isinstance(text, str) else ipaddress.IPv4Address("x")
    except ValueError:
        raise TopologyError(f"{where}: {text!r} is not an IPv4 address; write it without a prefix length, "
                            "like '10.0.0.254'") from None


def _claim(owners: dict, value: Any, who: str, kind: str, free: str, file: str) -> None:
    """Record that ``who`` owns ``value``; a TopologyError when another entry already does."""
    if value in owners:
        raise TopologyError(f"{file}: {who}: {kind} {value} is already {owners[value]}'s; every host and every "
                            f"switch's aggregator needs {'an' if kind == 'IP' else 'a'} {kind} of its own "
                            f"(a free one: {free})")
    owners[value] = who


def _free_mac(taken: set[str]) -> str:
    """A MAC no entry of the file has, in the style of the shipped topologies."""
    return next((m for i in range(1, 255) if (m := f"08:00:00:00:00:{i:02x}") not in taken), "08:00:00:00:01:01")


def _free_ip(net: ipaddress.IPv4Network, taken: set[str]) -> str:
    """A host address of ``net`` no entry of the file has."""
    return str(next((ip for ip in net.hosts() if str(ip) not in taken), "none left in the subnet"))


def check_addresses(hosts: dict, switches: dict, file: str) -> None:
    """Every MAC and IPv4 address well formed and owned by one entry (hosts' ``mac``/``ip``,
    switches' ``aggregator_mac``/``aggregator_ip``), and all of them on the hosts' one subnet:
    the emulation has no router, hosts reach each other and the aggregators on-link. A clash
    names both owners and a free value (one no entry of the file has)."""
    entries = [*hosts.values(), *switches.values()]
    all_macs = {str(e.get(k, "")).lower() for e in entries for k in ("mac", "aggregator_mac")}
    all_ips = {str(e.get(k, "")).split("/")[0] for e in entries for k in ("ip", "aggregator_ip")}
    macs: dict[str, str] = {}
    ips: dict[ipaddress.IPv4Address, str] = {}
    nets = {name: parse_host_ip(h["ip"], f"{file}: host {name}: ip") for name, h in hosts.items()}
    first, subnet = next(iter(nets)), next(iter(nets.values())).network
    for name, h in hosts.items():
        _claim(macs, parse_mac(h["mac"], f"{file}: host {name}: mac"), f"host {name}", "MAC", _free_mac(all_macs), file)
        _claim(ips, nets[name].ip, f"host {name}", "IP", _free_ip(subnet, all_ips), file)
    for name, iface in nets.items():
        if iface.network != subnet:
            raise TopologyError(
                f"{file}: host {name}: {iface} is not on {subnet}, the subnet of host {first}: the emulation has "
                f"no router, so every host is on one subnet; "
                f"write e.g. '{_free_ip(subnet, all_ips)}/{subnet.prefixlen}'")
    for name, s in switches.items():
        where = f"switch {name}"
        mac = parse_mac(s["aggregator_mac"], f"{file}: {where}: aggregator_mac")
        _claim(macs, mac, f"{where} (aggregator_mac)", "MAC", _free_mac(all_macs), file)
        ip = parse_switch_ip(s["aggregator_ip"], f"{file}: {where}: aggregator_ip")
        _claim(ips, ip, f"{where} (aggregator_ip)", "IP", _free_ip(subnet, all_ips), file)
        if ip not in subnet or ip in (subnet.network_address, subnet.broadcast_address):
            raise TopologyError(f"{file}: {where}: aggregator_ip {ip} is not a host address of the hosts' subnet "
                                f"{subnet}, so no host reaches it (no router); "
                                f"write e.g. '{_free_ip(subnet, all_ips)}'")


def _number(value: Any, integer: bool, low: float) -> bool:
    """Whether ``value`` is a JSON number (an integer when asked), not a boolean, >= ``low``."""
    kinds = (int,) if integer else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool) and value >= low


def check_controller(section: dict, file: str) -> None:
    """The controller settings a topology may change: whole numbers >= 1 for sizes (a
    ``min_window`` of 0 divided by zero in the allocator), positive seconds for leases."""
    for key in ("min_window", "max_jobs", "host_slots", "host_window", "atp_pool"):
        if key in section and not _number(section[key], True, 1):
            raise TopologyError(f"{file}: controller: {key} {section[key]!r} must be a whole number >= 1 "
                                f"(slots or jobs); remove it for the default or write e.g. 8")
    for key in ("lease_seconds", "rank_lease_seconds", "switch_check_seconds", "switch_audit_seconds"):
        if key in section and not (_number(section[key], False, 0) and section[key] > 0):
            raise TopologyError(f"{file}: controller: {key} {section[key]!r} must be a number of seconds > 0")
    if section.get("sharing", DYNAMIC) not in SHARING:
        raise TopologyError(f"{file}: controller: sharing {section['sharing']!r}: write one of {', '.join(SHARING)} "
                            f"(how the switch's slots are shared among its jobs; default {DYNAMIC})")
    if section.get("host_window", 0) > section.get("host_slots", 4096):
        raise TopologyError(f"{file}: controller: host_window {section['host_window']} is larger than host_slots "
                            f"{section.get('host_slots', 4096)}: no job would fit on the host aggregator; lower it")
    if section.get("min_window", 1) > 32768:
        raise TopologyError(f"{file}: controller: min_window {section['min_window']} exceeds the largest pool a "
                            "switch can have (32768 slots, the header's 15-bit slot field); write e.g. 8")


def check_job(job: dict, hosts: dict, where: str) -> None:
    """One job's settings: a plain name (it names log files), workers that are hosts, and
    values the training demo can run (``transport`` one the switch speaks, ``hook`` one that
    reports, no host reduction under AR-Topk, which needs every rank a worker)."""
    name = job["name"]
    if not isinstance(name, str) or not _JOB_NAME.match(name):
        raise TopologyError(f"{where}: name {name!r}: use letters, digits, '_', '.', '-' (up to 32), e.g. 'job1'")
    workers = job["workers"]
    if not isinstance(workers, list) or not workers or not all(isinstance(w, str) for w in workers):
        raise TopologyError(f"{where}: workers must be a non-empty list of host names, e.g. [\"h1\", \"h2\"]")
    unknown = [w for w in workers if w not in hosts]
    if unknown:
        hint = did_you_mean(unknown[0], hosts)
        raise TopologyError(f"{where}: workers must be hosts, unknown {unknown}{hint}; hosts: {', '.join(hosts)}")
    if "epochs" in job and not _number(job["epochs"], True, 1):
        raise TopologyError(f"{where}: epochs {job['epochs']!r} must be a whole number >= 1")
    if "start_delay" in job and not _number(job["start_delay"], False, 0):
        raise TopologyError(f"{where}: start_delay {job['start_delay']!r} must be a number of seconds >= 0")
    if not isinstance(job.get("host_reduce", False), bool):
        raise TopologyError(f"{where}: host_reduce must be true or false, got {job['host_reduce']!r}")
    for key, allowed, default in (("transport", ENCAPSULATIONS, "udp"), ("hook", HOOKS, "inagg")):
        if job.get(key, default) not in allowed:
            raise TopologyError(f"{where}: {key} {job[key]!r}: the emulation's jobs take "
                                f"{' or '.join(map(repr, allowed))}; write one of them (default {default!r})")
    if job.get("host_reduce") and job.get("hook") == "artopk":
        raise TopologyError(f"{where}: host_reduce true with hook 'artopk': AR-Topk needs every rank a worker "
                            "of the job; drop host_reduce or use hook 'inagg'")
    check_workload(job, where)


def check_workload(job: dict, where: str) -> None:
    """What a job trains and for how long: a ``model`` of the zoo or a synthetic ``profile``
    (not both); ``epochs``, ``iterations`` or ``duration`` (one at most; a profile has no data
    set, so not epochs); an arrival ``start`` (seconds after the run's first step) or a
    ``start_delay``, not both."""
    if "model" in job and job["model"] not in MODELS:
        raise TopologyError(f"{where}: unknown model {job['model']!r}{did_you_mean(str(job['model']), MODELS)}; "
                            f"the zoo has {', '.join(MODELS)} (or give a synthetic \"profile\")")
    if "model" in job and "profile" in job:
        raise TopologyError(f"{where}: both a model and a profile: a job trains a model or replays a synthetic "
                            "gradient profile; remove one")
    lengths = [k for k in ("epochs", "iterations", "duration") if k in job]
    if len(lengths) > 1:
        raise TopologyError(f"{where}: {' and '.join(lengths)} both given: a job runs for epochs, iterations or a "
                            "duration; keep one")
    if "iterations" in job and not _number(job["iterations"], True, 1):
        raise TopologyError(f"{where}: iterations {job['iterations']!r} must be a whole number of steps >= 1")
    if "duration" in job and not (_number(job["duration"], False, 0) and job["duration"] > 0):
        raise TopologyError(f"{where}: duration {job['duration']!r} must be a number of seconds > 0")
    if "start" in job and not _number(job["start"], False, 0):
        raise TopologyError(f"{where}: start {job['start']!r} must be a number of seconds >= 0 (the job's arrival "
                            "after the run's first step)")
    if "start" in job and "start_delay" in job:
        raise TopologyError(f"{where}: start and start_delay both given: start is an arrival time, start_delay "
                            "waits for the jobs before it to hold grants; keep one")
    if "profile" in job:
        check_profile(job, where)


def check_profile(job: dict, where: str) -> None:
    """A synthetic profile: ``bucket_bytes`` a non-empty list of float32 tensor sizes (positive
    multiples of 4, MAX_BUCKET_BYTES at most), ``compute_ms`` >= 0, and a length in
    iterations or seconds; no DDP hook (a profile has no DDP)."""
    profile = job["profile"]
    buckets = profile["bucket_bytes"]
    if not isinstance(buckets, list) or not buckets or not all(
            _number(b, True, 4) and b % 4 == 0 and b <= MAX_BUCKET_BYTES for b in buckets):
        raise TopologyError(f"{where}: profile: bucket_bytes {buckets!r} must be a non-empty list of byte counts, "
                            f"each a multiple of 4 (float32) in 4..{MAX_BUCKET_BYTES}, e.g. [262144, 65536]")
    if "compute_ms" in profile and not _number(profile["compute_ms"], False, 0):
        raise TopologyError(f"{where}: profile: compute_ms {profile['compute_ms']!r} must be milliseconds >= 0")
    check_collective(job, where)
    if "iterations" not in job and "duration" not in job:
        raise TopologyError(f"{where}: a profile needs \"iterations\" or \"duration\" (it has no data set to "
                            "count epochs over)")
    if "hook" in job:
        raise TopologyError(f"{where}: hook with a profile: a profile allreduces its buckets directly, without DDP "
                            "or a hook; remove \"hook\"")


def check_collective(job: dict, where: str) -> None:
    """A profile's ``collective``: one of COLLECTIVES (default allreduce); a reduce-scatter
    splits each bucket into one equal shard per worker (rank), so its floats must divide."""
    collective = job["profile"].get("collective", "allreduce")
    if collective not in COLLECTIVES:
        raise TopologyError(f"{where}: profile: collective {collective!r} must be one of {', '.join(COLLECTIVES)}")
    n = len(job["workers"])
    if collective == "reduce_scatter" and any(b // 4 % n for b in job["profile"]["bucket_bytes"]):
        raise TopologyError(f"{where}: profile: a reduce_scatter gives each of its {n} workers an equal shard: "
                            f"every bucket_bytes must be a multiple of {4 * n} (4 bytes x {n} workers)")


def check_jobs(jobs: list, hosts: dict, file: str) -> None:
    """Every job valid (``check_job``) and named differently from the others."""
    seen: set[str] = set()
    for i, job in enumerate(jobs):
        where = f"{file}: jobs[{i}] (job {job['name']})"
        check_job(job, hosts, where)
        if job["name"] in seen:
            raise TopologyError(f"{where}: another job is named {job['name']!r}: give each job a name of its own")
        seen.add(job["name"])


def check_link_options(params: dict, where: str) -> None:
    """A link's options: ``bw`` Mbit/s in (0, 1000] (Mininet ignores larger ones with a
    warning), ``loss``/``duplicate``/``reorder`` percentages, ``delay``/``jitter`` tc times
    ("5ms"), ``max_queue_size`` packets, and netem's rules: jitter and reorder need a delay
    (they vary or skip it); ``bw_schedule`` (``check_bw_schedule``) instead of ``bw``."""
    if "bw" in params and not (_number(params["bw"], False, 0) and 0 < params["bw"] <= 1000):
        raise TopologyError(f"{where}: bw {params['bw']!r} must be Mbit/s in (0, 1000], e.g. 100")
    for key in ("loss", "duplicate", "reorder"):
        if key in params and not (_number(params[key], False, 0) and params[key] <= 100):
            raise TopologyError(f"{where}: {key} {params[key]!r} must be a percentage in 0..100, e.g. 1")
    for key in ("delay", "jitter"):
        if key in params and not (isinstance(params[key], str) and _TC_TIME.match(params[key])):
            raise TopologyError(f"{where}: {key} {params[key]!r} must be a time as tc writes it, e.g. \"5ms\"")
    for key, what in (("jitter", "varies the delay"), ("reorder", "sends that share at once, ahead of the frames "
                                                                  "held back for the delay")):
        if key in params and "delay" not in params:
            raise TopologyError(f"{where}: {key} without a delay: netem's {key} {what}; add a \"delay\", e.g. "
                                f"\"5ms\"")
    if "max_queue_size" in params and not _number(params["max_queue_size"], True, 1):
        raise TopologyError(f"{where}: max_queue_size {params['max_queue_size']!r} must be a whole number of "
                            "packets >= 1")
    if "bw_schedule" in params:
        check_bw_schedule(params, where)


def check_bw_schedule(params: dict, where: str) -> None:
    """``bw_schedule``: a list of [seconds after time zero, Mbit/s] pairs, the first at 0 (the
    rate from bring-up), the times increasing, each rate as ``bw``'s; not with ``bw``."""
    schedule = params["bw_schedule"]
    example = "e.g. [[0, 100], [5, 20], [10, 100]]"
    if "bw" in params:
        raise TopologyError(f"{where}: bw and bw_schedule both given: the schedule's first entry is the rate from "
                            f"bring-up; remove bw")
    if not isinstance(schedule, list) or not schedule or not all(
            isinstance(e, list) and len(e) == 2 and _number(e[0], False, 0) and _number(e[1], False, 0)
            and 0 < e[1] <= 1000 for e in schedule):
        raise TopologyError(f"{where}: bw_schedule {schedule!r} must be a list of [seconds, Mbit/s] pairs, rates in "
                            f"(0, 1000], {example}")
    times = [e[0] for e in schedule]
    if times[0] != 0 or any(b <= a for a, b in zip(times, times[1:])):
        raise TopologyError(f"{where}: bw_schedule times {times} must start at 0 and increase (seconds after time "
                            f"zero), {example}")
