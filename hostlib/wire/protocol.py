"""Python twin of the inagg wire protocol defined in ``p4/include/``.

The P4 include files are the one definition; this module mirrors them so hosts can build and
parse packets. ``tests/test_protocol_twin.py`` parses the P4 files and fails on any drift in
field names, widths, order, signedness or constants.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from typing import NamedTuple

import numpy as np

VERSION = 1
UDP_PORT = 0xA66A

# RoCEv2 encapsulation (inagg.hostlib.wire.roce frames it; p4/include/constants.p4 defines it).
ROCE_UDP_PORT = 4791
ROCE_OPCODE_UC_WRITE_ONLY_IMM = 0x2B
ROCE_INAGG_IMMEDIATE = 0x494E4147  # "INAG"
ROCE_HEADER_BYTES = 32  # BTH 12 + RETH 16 + ImmDt 4
ROCE_ICRC_BYTES = 4

# Encapsulations, by their P4 code (ENCAP_<NAME>, from 1): job_table's encap parameter.
ENCAPSULATIONS: tuple[str, ...] = ("udp", "roce")
ENCAP_CODE: dict[str, int] = {name: code for code, name in enumerate(ENCAPSULATIONS, 1)}

MSG_CONTRIBUTION = 1
MSG_RESULT = 2

FLAG_RETRANSMIT = 0x01
FLAG_FROM_HOST = 0x02
FLAG_CONGESTION = 0x04
FLAG_OVERFLOW = 0x08
FLAG_FROM_SWITCH = 0x80  # a switch's partial sum to its parent in an aggregation tree (docs/trees.md)
# On a contribution (FROM_HOST's bit, which only results carry): the block is wholly in the
# sender's shard of a reduce-scatter, so the aggregator records the sender as the round's owner
# and sends the values only to it; the other ranks get the result's header alone ("values
# elided": count kept, no payload), which frees their slot (docs/protocol.md, "Reduce-scatter").
# The soft switch, the host aggregator, the BMv2 program and the Tofino 2 program honour it (its
# P4 constants are in p4/include/round_owner.p4 and p4/tofino/types.p4); the Tofino 1 program
# ignores it (every rank gets the values).
FLAG_MINE = 0x02
# The round tag in the flags byte (bits 4..6, not flags): round k of a slot (counted from 0 at each
# grant) goes on set k % 2 with tag (k // 2) % ROUND_TAGS; a slot keeps each set's tag, so a copy
# of another round of the set is stale (p4/include/constants.p4, docs/protocol.md).
ROUND_TAG_MASK = 0x70
ROUND_TAG_SHIFT = 4
ROUND_TAGS = 8
# Rounds of a slot before its (set, tag) pair repeats: the worker's per-slot round counter wraps here.
ROUND_CYCLE = 2 * ROUND_TAGS
# The flags a result can carry (a switch's or the host aggregator's, with its round's tag); a
# worker drops any other.
RESULT_FLAGS = FLAG_RETRANSMIT | FLAG_FROM_HOST | FLAG_CONGESTION | FLAG_OVERFLOW | ROUND_TAG_MASK

EXP_NONE = -128
MAX_WORKERS = 32
HEADER_BYTES = 16
SWITCH_VALUES_PER_PACKET = 64

# Drop reasons, indexed by their P4 code (DROP_<NAME> in constants.p4): per-job counters...
DROP_REASONS: tuple[str, ...] = (
    "bad_type", "bad_worker", "stale_epoch", "bad_slot", "bad_length", "stale_round", "bad_encap",
    "bad_round",
)
# ...and the drops that belong to no job (GLOBAL_DROP_<NAME>).
GLOBAL_DROP_REASONS: tuple[str, ...] = ("truncated", "bad_version")
# ...and the frames a switch's SourceGuard drops on a host port (GUARD_DROP_<NAME>): one claiming
# an aggregator's address, one carrying a result or a switch's partial sum (docs/security.md).
GUARD_DROP_REASONS: tuple[str, ...] = ("aggregator_addr", "result")



class Outcome(enum.IntEnum):
    """What an aggregator did with one inagg packet: a row of SlotState's decision table
    (``SLOT_<NAME>`` in constants.p4, same value), a decision on a parent's result in an
    aggregation tree (docs/trees.md), or the reason it was dropped before the slot.
    The native engine's ``inagg::Outcome`` (native/engine.hpp) has the same values; counters name
    a drop by its ``label`` (``DROP_REASONS``/``GLOBAL_DROP_REASONS``, and ``unknown_job`` for an
    aggregator that has no job to forward to)."""

    FIRST = 1          # first contribution of a round: overwrite the set
    ADD = 2            # a further contribution: add
    STALE_ROUND = 3    # drop: reordered packet of a finished round
    DUP_PENDING = 4    # duplicate, round unfinished: drop
    DUP_DONE = 5       # duplicate, round finished: the stored result back to its sender
    BAD_ROUND = 6      # drop: offset or count differ from the round's
    DUP_UPSTREAM = 7   # duplicate, the round's partial sum is up at the parent: resend it up
    BAD_TYPE = 8
    BAD_WORKER = 9
    STALE_EPOCH = 10
    BAD_SLOT = 11
    BAD_LENGTH = 12
    BAD_ENCAP = 13
    TRUNCATED = 14
    BAD_VERSION = 15
    UNKNOWN_JOB = 16
    PARENT_RESULT = 17  # the parent's result for a round sent up: store it, send it down
    DUP_RESULT = 18     # the parent's result again, already stored: drop
    COLLISION = 19      # ATP, switch: the round's aggregator is another's: the packet goes on up
    ACK = 20            # ATP, switch: the host aggregator's result passes (frees its aggregator)
    SWITCH_SUM = 21     # ATP, host aggregator: a switch's complete sum, stored and multicast

    @property
    def label(self) -> str:
        """The name counters and logs use ("first", "bad_round", ...)."""
        return self.name.lower()

    @property
    def is_drop(self) -> bool:
        return self not in _NOT_DROPS


_NOT_DROPS = frozenset((Outcome.FIRST, Outcome.ADD, Outcome.DUP_PENDING, Outcome.DUP_DONE,
                        Outcome.DUP_UPSTREAM, Outcome.PARENT_RESULT, Outcome.DUP_RESULT,
                        Outcome.COLLISION, Outcome.ACK, Outcome.SWITCH_SUM))
# Outcomes counted as duplicates (job_duplicates).
DUPLICATE_OUTCOMES = frozenset((Outcome.DUP_PENDING, Outcome.DUP_DONE, Outcome.DUP_UPSTREAM,
                                Outcome.DUP_RESULT))

# The rows of SlotState's decision table (p4/include/slot_state.p4), in P4 code order.
SLOT_OUTCOMES: tuple[Outcome, ...] = tuple(o for o in Outcome if o <= Outcome.DUP_UPSTREAM)

# SlotState's decision: the const entries of table slot_decision (p4/include/slot_state.p4),
# entry for entry, as (key, outcome); a key is SLOT_DECISION_KEYS' bits, None for "any". The
# reference engine (hostlib/aggregator/engine_reference.py) decides each row the same: tests/test_slot_decision.py.
# sent_up: the switch has an uplink and all its children are in, without the parent's result.
# this_round: the packet's round tag is the one stored for the set's round; next_round: it is
# that tag + 1 (mod ROUND_TAGS), the set's next round. Neither: a copy of an older round, stale.
SLOT_DECISION_KEYS: tuple[str, ...] = ("mine", "empty", "complete", "same_round", "sent_up",
                                       "this_round", "next_round")
SLOT_DECISION: tuple[tuple[tuple[int | None, ...], Outcome], ...] = (
    ((None, None, None, None, None, 0, 0), Outcome.STALE_ROUND),
    ((0, 1, None, None, None, 0, 1), Outcome.FIRST),
    ((0, 0, None, None, None, 0, 1), Outcome.BAD_ROUND),
    ((1, None, None, None, None, 0, 1), Outcome.BAD_ROUND),
    ((0, 1, None, None, None, 1, None), Outcome.STALE_ROUND),
    ((0, 0, 0, 1, 0, 1, None), Outcome.ADD),
    ((0, 0, 0, 0, 0, 1, None), Outcome.BAD_ROUND),
    ((0, 0, 1, None, None, 1, None), Outcome.STALE_ROUND),
    ((0, 0, 0, None, 1, 1, None), Outcome.STALE_ROUND),
    ((1, None, 0, 1, 0, 1, None), Outcome.DUP_PENDING),
    ((1, None, 0, 1, 1, 1, None), Outcome.DUP_UPSTREAM),
    ((1, None, 1, 1, None, 1, None), Outcome.DUP_DONE),
    ((1, None, None, 0, None, 1, None), Outcome.BAD_ROUND),
)


class OwnerUpdate(enum.IntEnum):
    """What a contribution that joins a round (FIRST or ADD) does to the round's owner in a
    reduce-scatter (docs/protocol.md): ``OWNER_<verb>`` in p4/include/round_owner.p4, same value."""

    KEEP = 0        # the owner stays what it was
    SET_NONE = 1    # no owner: every member gets the values
    SET_SENDER = 2  # the sender owns the round: it alone gets the values
    SET_SHARED = 3  # shared: every member gets the values, whatever marks follow


# RoundOwner's decision: the const entries of table owner_decision (p4/include/round_owner.p4),
# entry for entry, as (key, update); a key is OWNER_DECISION_KEYS' bits, None for "any". The
# reference engine and its C++ twin decide each row the same: tests/test_owner_decision.py.
# first: the contribution opens the round (FIRST; else it is an ADD); from_switch: it carries
# FLAG_FROM_SWITCH (a child switch's sum); marked: it carries FLAG_MINE; owned: the round has an
# owner already, or is shared.
OWNER_DECISION_KEYS: tuple[str, ...] = ("first", "from_switch", "marked", "owned")
OWNER_DECISION: tuple[tuple[tuple[int | None, ...], OwnerUpdate], ...] = (
    ((None, 1, None, None), OwnerUpdate.SET_SHARED),
    ((1, 0, 1, None), OwnerUpdate.SET_SENDER),
    ((1, 0, 0, None), OwnerUpdate.SET_NONE),
    ((0, 0, 1, 0), OwnerUpdate.SET_SENDER),
    ((0, 0, 1, 1), OwnerUpdate.SET_SHARED),
    ((0, 0, 0, None), OwnerUpdate.KEEP),
)


# Bytes below the inagg header on an Ethernet/IPv4/UDP path: what each packet costs on the wire
# beyond its inagg header and payload (Ethernet 14 + IPv4 20 + UDP 8).
ENCAP_BYTES = 14 + 20 + 8

# (name, width in bits, signed) in wire order; mirrors ``header inagg_h`` in p4/include/headers.p4.
HEADER_FIELDS: tuple[tuple[str, int, bool], ...] = (
    ("version", 4, False),
    ("msg_type", 4, False),
    ("flags", 8, False),
    ("job_id", 16, False),
    ("worker_id", 8, False),
    ("exp", 8, True),
    ("epoch", 16, False),
    ("slot_set", 1, False),
    ("slot", 15, False),
    ("count", 16, False),
    ("offset", 32, False),
)

# Constants mirrored from p4/include/constants.p4 (P4 name -> value).
P4_CONSTANTS: dict[str, int] = {
    "INAGG_VERSION": VERSION,
    "INAGG_UDP_PORT": UDP_PORT,
    "ROCE_UDP_PORT": ROCE_UDP_PORT,
    "ROCE_OPCODE_UC_WRITE_ONLY_IMM": ROCE_OPCODE_UC_WRITE_ONLY_IMM,
    "ROCE_INAGG_IMMEDIATE": ROCE_INAGG_IMMEDIATE,
    "ROCE_HEADER_BYTES": ROCE_HEADER_BYTES,
    "ROCE_ICRC_BYTES": ROCE_ICRC_BYTES,
    **{f"ENCAP_{name.upper()}": code for name, code in ENCAP_CODE.items()},
    "MSG_CONTRIBUTION": MSG_CONTRIBUTION,
    "MSG_RESULT": MSG_RESULT,
    "FLAG_RETRANSMIT": FLAG_RETRANSMIT,
    "FLAG_FROM_HOST": FLAG_FROM_HOST,
    "FLAG_CONGESTION": FLAG_CONGESTION,
    "FLAG_OVERFLOW": FLAG_OVERFLOW,
    "FLAG_FROM_SWITCH": FLAG_FROM_SWITCH,
    "ROUND_TAG_MASK": ROUND_TAG_MASK,
    "ROUND_TAG_SHIFT": ROUND_TAG_SHIFT,
    "ROUND_TAGS": ROUND_TAGS,
    "EXP_NONE": EXP_NONE,
    "MAX_WORKERS": MAX_WORKERS,
    "INAGG_HEADER_BYTES": HEADER_BYTES,
    "SWITCH_VALUES_PER_PACKET": SWITCH_VALUES_PER_PACKET,
    **{f"SLOT_{o.name}": o.value for o in SLOT_OUTCOMES},
    **{f"DROP_{name.upper()}": code for code, name in enumerate(DROP_REASONS)},
    "DROP_REASONS": len(DROP_REASONS),
    **{f"GLOBAL_DROP_{name.upper()}": code for code, name in enumerate(GLOBAL_DROP_REASONS)},
    "GLOBAL_DROP_REASONS": len(GLOBAL_DROP_REASONS),
    **{f"GUARD_DROP_{name.upper()}": code for code, name in enumerate(GUARD_DROP_REASONS)},
    "GUARD_DROP_REASONS": len(GUARD_DROP_REASONS),
}

# version|msg_type, flags, job_id, worker_id, exp, epoch, slot_set|slot, count, offset
HEADER_STRUCT = struct.Struct("!BBHBbHHHI")
assert HEADER_STRUCT.size == HEADER_BYTES

MAX_SLOT = (1 << 15) - 1


def round_tag(flags: int) -> int:
    """The round tag a header's flags byte carries."""
    return (flags & ROUND_TAG_MASK) >> ROUND_TAG_SHIFT


def round_fields(round_no: int) -> tuple[int, int]:
    """(slot_set, flag bits) of a slot's round ``round_no`` (any count; only its residue modulo
    ``ROUND_CYCLE`` reaches the wire)."""
    return round_no & 1, ((round_no >> 1) % ROUND_TAGS) << ROUND_TAG_SHIFT


class ProtocolError(ValueError):
    """A packet that is not a well-formed inagg packet."""


class Header(NamedTuple):
    """One inagg header, field for field as on the wire."""

    version: int
    msg_type: int
    flags: int
    job_id: int
    worker_id: int
    exp: int
    epoch: int
    slot_set: int
    slot: int
    count: int
    offset: int

    def pack(self) -> bytes:
        return pack_header(*self)


def pack_header(
    version: int,
    msg_type: int,
    flags: int,
    job_id: int,
    worker_id: int,
    exp: int,
    epoch: int,
    slot_set: int,
    slot: int,
    count: int,
    offset: int,
) -> bytes:
    """Serialize a header; raises ``struct.error``/``ProtocolError`` on out-of-range fields."""
    if not (0 <= version < 16 and 0 <= msg_type < 16):
        raise ProtocolError(f"version {version} / msg_type {msg_type} do not fit in 4 bits")
    if slot_set not in (0, 1) or not 0 <= slot <= MAX_SLOT:
        raise ProtocolError(f"slot {slot} set {slot_set} out of range (slot < 2**15, set 0/1)")
    return HEADER_STRUCT.pack(
        (version << 4) | msg_type, flags, job_id, worker_id, exp, epoch,
        (slot_set << 15) | slot, count, offset,
    )


def unpack_header(buf: bytes | bytearray | memoryview) -> Header:
    """Parse the first ``HEADER_BYTES`` of ``buf``; raises ``ProtocolError`` when too short."""
    if len(buf) < HEADER_BYTES:
        raise ProtocolError(f"truncated inagg header: {len(buf)} < {HEADER_BYTES} bytes")
    vt, flags, job, worker, exp, epoch, ss, count, offset = HEADER_STRUCT.unpack_from(buf)
    return Header(vt >> 4, vt & 0xF, flags, job, worker, exp, epoch, ss >> 15, ss & MAX_SLOT,
                  count, offset)


def unpack_raw(buf: bytes | bytearray | memoryview) -> tuple[int, ...]:
    """Hot-path parse without building a ``Header``: the 9 struct fields as packed on the wire
    (version|msg_type and slot_set|slot still combined). Caller checks the length first."""
    return HEADER_STRUCT.unpack_from(buf)


def build_contribution(
    job: int, worker: int, epoch: int, slot: int, slot_set: int, offset: int,
    values: np.ndarray | None, k: int, *, exp: int = EXP_NONE, flags: int = 0,
) -> bytes:
    """A contribution packet: header + ``values`` as big-endian int32 zero-padded to ``k``.

    ``values`` None or empty gives a header-only packet (count 0: an exponent-priming round)."""
    count = 0 if values is None else len(values)
    if count > k:
        raise ProtocolError(f"{count} values do not fit in a packet of {k}")
    header = pack_header(VERSION, MSG_CONTRIBUTION, flags, job, worker, exp, epoch, slot_set,
                         slot, count, offset)
    if not count:
        return header
    payload = np.asarray(values).astype(">i4", copy=False).tobytes()
    return header + payload + bytes(4 * (k - count))


# -- the framing below the inagg header (IPv4/Ethernet), shared by hosts and data planes --------

def ipv4(addr: str | int) -> int:
    return int(ipaddress.IPv4Address(addr))


def mac(addr: str | int) -> int:
    return addr if isinstance(addr, int) else int(addr.replace(":", ""), 16)


def ipv4_checksum(header: bytes | bytearray) -> int:
    """The header checksum of a 20-byte IPv4 header (its checksum field counted as is)."""
    total = sum(struct.unpack("!10H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF
