"""Frames through software switches wired as a controller config's links say (tests of
aggregation trees): a UDP frame as a host sends it, the frames carried over the links until
none is left, and what reaches the hosts."""

from __future__ import annotations

from typing import Callable

import numpy as np

from inagg.bmv2_env.softswitch.pipeline_reference import build_frame
from inagg.hostlib.wire.protocol import MSG_RESULT, ipv4, mac, unpack_header

HEADERS = 42           # Ethernet + IPv4 + UDP in front of the inagg header
VALUES_AT = HEADERS + 16

Responder = Callable[[bytes], list[bytes]]   # a host that answers a frame with frames


def udp_frame(src: tuple[str, str, int], dst: tuple[str, str, int], payload: bytes) -> bytes:
    """An Ethernet/IPv4/UDP frame from ``src`` to ``dst``, each (MAC, IPv4, UDP port)."""
    eth = mac(dst[0]).to_bytes(6, "big") + mac(src[0]).to_bytes(6, "big") + b"\x08\x00"
    ip = bytearray(b"\x45\x00\x00\x00\x00\x00\x40\x00\x40\x11\x00\x00" + ipv4(src[1]).to_bytes(4, "big")
                   + ipv4(dst[1]).to_bytes(4, "big"))
    return build_frame(eth, ip, src[2].to_bytes(2, "big") + dst[2].to_bytes(2, "big"), payload)


def frame_source(frame: bytes) -> tuple[str, str, int]:
    """(MAC, IPv4, UDP port) a frame comes from."""
    m = int.from_bytes(frame[6:12], "big")
    ip = ".".join(str(b) for b in frame[26:30])
    return ":".join(f"{m >> s & 0xFF:02x}" for s in range(40, -1, -8)), ip, int.from_bytes(frame[34:36], "big")


def run(cfg, pipelines: dict, frames: list[tuple[str, int, bytes]],
        lose: Callable[[str, int, bytes], bool] = lambda name, port, frame: False,
        responders: dict[tuple[str, int], Responder] | None = None) -> list[tuple[str, int, bytes]]:
    """Frames in (switch, port, frame), carried over the links of ``cfg`` until none is left;
    the frames that reach hosts, as (switch, port, frame). ``lose`` drops a frame on its way; a
    frame reaching a port of ``responders`` is answered there (a host aggregator)."""
    links = {s.name: {port: other for other, port in s.links.items()} for s in cfg.switches}
    ports = {s.name: s.links for s in cfg.switches}
    responders = responders or {}
    delivered, flight = [], list(frames)
    while flight:
        name, port, frame = flight.pop(0)
        for out_port, out in pipelines[name].process(port, frame):
            if lose(name, out_port, out):
                continue
            other = links[name].get(out_port)
            if other is not None:
                flight.append((other, ports[other][name], out))
            elif (name, out_port) in responders:
                flight += [(name, out_port, f) for f in responders[(name, out_port)](out)]
            else:
                delivered.append((name, out_port, out))
    return delivered


def results(delivered: list[tuple[str, int, bytes]], k: int) -> dict[tuple[str, int], dict[int, list[int]]]:
    """The RESULT values each host port got, by the round's offset."""
    out: dict[tuple[str, int], dict[int, list[int]]] = {}
    for name, port, frame in delivered:
        h = unpack_header(frame[HEADERS:])
        assert h.msg_type == MSG_RESULT
        out.setdefault((name, port), {})[h.offset] = np.frombuffer(frame, ">i4", k, VALUES_AT).tolist()
    return out
