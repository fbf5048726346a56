"""The Tofino device config: what SetForwardingPipelineConfig carries as ``p4_device_config``
for a Tofino, in the layout of each P4Runtime server that loads Tofino programs.

``bf_switchd`` (``--p4rt-server``, an SDE built with P4Runtime and PI): PI's DeviceMgr hands the
raw bytes to the Tofino PI backend, ``_pi_update_device_start`` in open-p4studio's
``pkgsrc/bf-drivers/src/pi/pi_imp.c``, which reads, each part preceded by its length as a
host-order (little-endian) uint32 and with no bounds check:

    program name (at most 100 bytes) | tofino.bin | context.json | pipeline name (at most 100
    bytes) | bfrt.json (present only when the pipeline name is not empty)

The fourth length is always read, so a three-part config is read past its end. Before that,
PI's DeviceMgr (p4lang/PI ``proto/frontend/src/device_mgr.cpp``) tries to parse the bytes as
the deprecated ``p4.tmp.P4DeviceConfig`` protobuf and, when that succeeds, hands the reader
that message's ``device_data`` instead. The first byte of the packing is the name's length n
(< 128: one protobuf tag byte), followed by three zero bytes: field number 0 (n < 8) or a
zero-length/zero-valued field followed by tag 0 makes every such parse fail, except where n's
wire type (n % 8) is 1 or 5, which skips the zeros into the name; such names are refused.

``stratum`` (stratum_bfrt / Stratum TDI): a serialized ``BfPipelineConfig``
(stratum ``stratum/hal/lib/tdi/tdi.proto``: ``p4_name`` = 1, ``bfruntime_info`` = 2,
``profiles`` = 3, each ``Profile`` with ``profile_name`` = 1, ``context`` = 2, ``binary`` = 3,
``pipe_scope`` = 4). One profile, named after the pipeline, no pipe scope (all pipes).

Both are written and read here with the protobuf wire format done by hand (four length-
delimited fields), so the control layer needs no Stratum protos.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

SERVERS: tuple[str, ...] = ("bf_switchd", "stratum")
PI_NAME_MAX = 100   # _PI_UPDATE_MAX_NAME_SIZE: longer program or pipeline names are refused
_LENGTH = struct.Struct("<I")
_LEN = 2            # protobuf wire type of bytes, strings and sub-messages


def _check_name(what: str, name: str) -> bytes:
    raw = name.encode()
    if not 1 <= len(raw) <= PI_NAME_MAX or b"\0" in raw or b"/" in raw:
        raise ValueError(f"tofino device config: {what} {name!r} must be 1..{PI_NAME_MAX} bytes "
                         f"without NUL or '/' (PI names its temporary files after it)")
    return raw


def _check_json(what: str, data: bytes) -> None:
    try:
        json.loads(data)
    except ValueError as e:
        raise ValueError(f"tofino device config: {what} is not JSON ({e})") from None


@dataclass(frozen=True)
class TofinoDeviceConfig:
    """One compiled Tofino program: its name (the P4Info's), tofino.bin, context.json, the
    pipeline name bf-p4c gave it (``Switch(pipe)``) and bfrt.json. All checked on creation."""

    program: str
    binary: bytes
    context: bytes
    pipeline: str
    bfrt: bytes

    def __post_init__(self) -> None:
        _check_name("program name", self.program)
        _check_name("pipeline name", self.pipeline)
        if not self.binary:
            raise ValueError("tofino device config: empty tofino.bin")
        _check_json("context.json", self.context)
        _check_json("bfrt.json", self.bfrt)

    def pack(self, server: str) -> bytes:
        """The bytes ``server`` (one of SERVERS) reads as p4_device_config."""
        if server == "bf_switchd":
            return self._pack_pi()
        if server == "stratum":
            return self._pack_stratum()
        raise ValueError(f"unknown P4Runtime server {server!r}: one of {', '.join(SERVERS)}")

    def _pack_pi(self) -> bytes:
        n = len(self.program.encode())
        if n >= 8 and n % 8 in (1, 5):
            raise ValueError(
                f"tofino device config: a {n}-byte program name makes PI's packing parse as a "
                f"legacy P4DeviceConfig (module docstring); rename the program")
        parts = (self.program.encode(), self.binary, self.context, self.pipeline.encode(), self.bfrt)
        return b"".join(_LENGTH.pack(len(part)) + part for part in parts)

    def _pack_stratum(self) -> bytes:
        profile = (_field(1, self.pipeline.encode()) + _field(2, self.context)
                   + _field(3, self.binary))
        return _field(1, self.program.encode()) + _field(2, self.bfrt) + _field(3, profile)

    @classmethod
    def unpack(cls, data: bytes) -> tuple[str, TofinoDeviceConfig]:
        """(server, config) of packed bytes in either layout; ValueError saying why neither fits.
        The layouts exclude each other: PI's starts with a length <= 100 and three zero bytes,
        a BfPipelineConfig with a tag (0x0a, 0x12 or 0x1a) and a non-zero length."""
        try:
            return "bf_switchd", cls._unpack_pi(data)
        except ValueError as pi_error:
            try:
                return "stratum", cls._unpack_stratum(data)
            except ValueError as stratum_error:
                raise ValueError(f"{pi_error}; as a Stratum BfPipelineConfig: {stratum_error}") from None

    @classmethod
    def _unpack_pi(cls, data: bytes) -> TofinoDeviceConfig:
        parts, at = [], 0
        for what in ("program name", "binary", "context", "pipeline name", "bfrt.json"):
            if at + _LENGTH.size > len(data):
                raise ValueError(f"tofino device config (PI packing): truncated before the {what} length")
            (n,) = _LENGTH.unpack_from(data, at)
            at += _LENGTH.size
            if at + n > len(data):
                raise ValueError(f"tofino device config (PI packing): {what} length {n} runs past "
                                 f"the end ({len(data) - at} bytes left)")
            parts.append(data[at:at + n])
            at += n
        if at != len(data):
            raise ValueError(f"tofino device config (PI packing): {len(data) - at} trailing bytes")
        name, binary, context, pipeline, bfrt = parts
        return cls(name.decode(), binary, context, pipeline.decode(), bfrt)

    @classmethod
    def _unpack_stratum(cls, data: bytes) -> TofinoDeviceConfig:
        top = _fields(data, {1, 2, 3})
        profiles = top.get(3, [])
        if len(profiles) != 1:
            raise ValueError(f"{len(profiles)} profiles, inagg's program has one pipeline")
        profile = _fields(profiles[0], {1, 2, 3})
        return cls(_last(top, 1).decode(), _last(profile, 3), _last(profile, 2),
                   _last(profile, 1).decode(), _last(top, 2))


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, value: bytes) -> bytes:
    """A length-delimited protobuf field (proto3 leaves empty ones out)."""
    return _varint(number << 3 | _LEN) + _varint(len(value)) + value if value else b""


def _last(fields: dict[int, list[bytes]], number: int) -> bytes:
    """A singular field's value: proto3 takes the last occurrence; absent is empty."""
    return fields.get(number, [b""])[-1]


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(data) and shift < 64:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at
    raise ValueError(f"malformed varint at byte {at}")


def _fields(data: bytes, numbers: set[int]) -> dict[int, list[bytes]]:
    """The length-delimited fields of a protobuf message, by number; ValueError on any other
    field or wire type (a BfPipelineConfig has only these) or a length past the end."""
    fields: dict[int, list[bytes]] = {}
    at = 0
    while at < len(data):
        tag, at = _read_varint(data, at)
        number, wire = tag >> 3, tag & 7
        if number not in numbers or wire != _LEN:
            raise ValueError(f"unexpected field {number} (wire type {wire})")
        n, at = _read_varint(data, at)
        if at + n > len(data):
            raise ValueError(f"field {number} length {n} runs past the end")
        fields.setdefault(number, []).append(data[at:at + n])
        at += n
    return fields
