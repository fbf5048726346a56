"""The links' part of the path choice's cost model (``inagg.hostlib.pytorch.path.choice``): what each path
puts on a host link per payload byte, and so the least time a call can take where the links'
rate is known.

Per payload byte, a host link carries (``LinkShape.of_job``):

* **inagg** (the switch, or the host aggregator its grant names): each worker sends its tensor
  once and receives the sum once, in frames of K values: frame bytes / value bytes each way,
  *whatever the number of workers N*;
* **host** (the host lane): the same frames, but the host aggregator's own link carries every
  worker's: N times that;
* **gloo** (its ring): 2(N-1)/N of the tensor each way, in TCP segments of the link's MTU,
  *growing with N*.

At a link rate R, a call of B bytes takes at least ``B x bytes_per_byte / R`` (``floor``). A
path's figure within ``link_bound`` times its floor is *link-bound*: most of its time is the
link's. Where two paths' figures at a size class are both link-bound, their difference is the
bytes each puts on the links, not the machine's noise, and the chooser takes the faster by
``link_margin`` instead of ``margin`` (``PathChoiceOptions``). Where the rate is unknown (no
``INAGG_LINK_RATE``, an interface that reports no speed: loopback) there are no floors and
the choice is the measurements' alone.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from inagg.hostlib.wire.grant import Grant, IPV4_UDP_BYTES
from inagg.hostlib.wire.protocol import HEADER_BYTES, ROCE_HEADER_BYTES, ROCE_ICRC_BYTES
from inagg.hostlib.wire.transport import interface_mtu, interface_of

LINK_RATE_ENV = "INAGG_LINK_RATE"   # every host link's rate: 100mbit, 25gbit, or bits per second
ETHERNET_BYTES = 14
TCP_IP_BYTES = 20 + 32              # a TCP segment's IPv4 and TCP headers (timestamps on)
VALUE_BYTES = 4                     # an int32 value on the wire
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)?$")
_UNIT = {None: 1.0, "bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def parse_rate(text: str) -> float:
    """A link rate as tc writes it (``100mbit``, ``1gbit``) or plain bits per second, in bits
    per second."""
    m = _RATE.match(text.strip().lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"link rate {text!r}: write it as tc does (100mbit, 25gbit) or in bits per second")
    return float(m.group(1)) * _UNIT[m.group(2)]


def job_links(local_ip: str, world: int, grant: Grant, lane: Grant | None) -> LinkShape | None:
    """The links of a job of ``world`` ranks whose rank is at ``local_ip`` (its first grants:
    ``grant``, its host lane's ``lane``), where their rate is known (``link_rate``; else None)."""
    rate = link_rate(local_ip)
    return None if rate is None else LinkShape.of_job(rate, world, grant, lane, interface_mtu(local_ip))


def link_rate(local_ip: str) -> float | None:
    """Bits per second of this host's links: ``INAGG_LINK_RATE`` where set, else the speed the
    interface holding ``local_ip`` reports (a NIC's; loopback and many virtual links report
    none: None)."""
    setting = os.environ.get(LINK_RATE_ENV, "").strip()
    if setting:
        return parse_rate(setting)
    try:
        name = interface_of(local_ip)
    except ValueError:   # a wildcard or a name, not an address: no one interface
        name = None
    try:
        mbits = int(Path(f"/sys/class/net/{name}/speed").read_text()) if name else -1
    except (OSError, ValueError):   # no such file, or EINVAL: no speed to report
        return None
    return mbits * 1e6 if mbits > 0 else None


def frame_bytes_per_byte(grant: Grant) -> float:
    """Link bytes per payload byte in a grant's frames of K values (Ethernet, IPv4, UDP, the
    RoCE headers where it is carried so, the inagg header)."""
    roce = ROCE_HEADER_BYTES + ROCE_ICRC_BYTES if grant.transport == "roce" else 0
    values = VALUE_BYTES * grant.values_per_packet
    return (ETHERNET_BYTES + IPV4_UDP_BYTES + roce + HEADER_BYTES + values) / values


@dataclass(frozen=True)
class LinkShape:
    """Every host link's rate (bits per second) and, per path, the bytes the busiest link
    carries each way per payload byte of a call (module docstring)."""

    rate_bits: float
    bytes_per_byte: Mapping[str, float]

    def __post_init__(self) -> None:
        if not self.rate_bits > 0:
            raise ValueError(f"a link rate must be positive, got {self.rate_bits}")

    @classmethod
    def of_job(cls, rate_bits: float, world: int, grant: Grant, lane: Grant | None, mtu: int) -> LinkShape:
        """The shape of a job of ``world`` ranks on links of ``rate_bits`` and ``mtu``: its
        ``grant``, its host lane's (None: no lane) and gloo's ring."""
        # a grant on the host aggregator puts every worker's frames on the aggregator's link
        shape = {"inagg": frame_bytes_per_byte(grant) * (world if grant.mode == "host" else 1),
                 "gloo": 2 * (world - 1) / world * (mtu + ETHERNET_BYTES) / (mtu - TCP_IP_BYTES)}
        if lane is not None:
            shape["host"] = world * frame_bytes_per_byte(lane)
        return cls(rate_bits, shape)

    def floor(self, path: str, nbytes: float) -> float:
        """The least seconds a call of ``nbytes`` takes on ``path`` (0 for a path not shaped)."""
        return nbytes * self.bytes_per_byte.get(path, 0.0) * 8 / self.rate_bits


def link_vector(links: LinkShape | None, paths: Sequence[str]) -> list[float]:
    """A rank's ``links`` as the ranks agree on them by elementwise minimum (``agreed_links``):
    the rate, then each path's bytes per byte negated; where the rate is unknown, an infinite
    rate and no bytes, which any rank that knows its rate outweighs."""
    if links is None:
        return [math.inf] + [0.0] * len(paths)
    return [links.rate_bits] + [-links.bytes_per_byte.get(p, 0.0) for p in paths]


def agreed_links(agreed: Sequence[float], paths: Sequence[str]) -> LinkShape | None:
    """The job's links from the ranks' ``link_vector``s' elementwise minimum: the slowest rate any
    rank reports and, per path, the most bytes any rank's links carry, so every rank has the
    same floors, none under any rank's own (None: no rank knows its rate). Each rank reads its
    own links (its interface's speed and MTU), so floors of its own could make the ranks'
    choices, and their calibration's calls, differ."""
    rate = float(agreed[0])
    if not math.isfinite(rate):
        return None
    return LinkShape(rate, {p: -float(b) for p, b in zip(paths, agreed[1:])})


@dataclass(frozen=True)
class GrantMove:
    """How the path choice follows the ``inagg`` path's grant as it moves (from the host
    aggregator to a switch, back, or to other slots): ``epoch`` is the grant in use, the same
    on every rank where nothing is in flight; ``next_epoch`` the grant the controller offers
    next where this rank has seen one, else ``epoch``; ``links`` the job's links under that
    grant. A move changes what an inagg call costs, so the path's figures must go; and a job
    whose calls are all on gloo makes no inagg call, the only place where its ranks take the
    grant offered, so without a probe it would never take it."""

    epoch: Callable[[], int]
    next_epoch: Callable[[], int]
    links: Callable[[], LinkShape | None]
