"""The call protocol of the worker's stream: what every rank says about a call before any data
moves, and the checks its results must pass. Shared by both streams (``inagg.hostlib.worker.stream``,
C++, and ``inagg.hostlib.worker.stream_reference``, its Python specification) and by the host-local
reduce; twin of native/stream.hpp's ``ResultCheck`` and of the C++ stream's control words.

Every call, whatever its size, and even one that this rank cannot run, opens with the *control
round*: slot 0's round carries the :class:`ControlVector` of 2N int32 values (rank r writes
positions r and N + r only, so the aggregator's exact integer sum hands every rank every rank's
words): the call number, the tensor's size, dtype and reduce op or the rank's refusal
(:class:`CallError`), its window goal and the newest pending grant it has seen. Every rank
decodes the same sum the same way, so a refusal on one rank, a size or op mismatch or a call
number mismatch fails that call on every rank with the same error before any data moves, and
the next call starts aligned (or, for call numbers, fails again: never absorbed).
``agreed_epoch`` = the smallest pending epoch all ranks have seen is the grant every rank may
switch to after this call, at the same boundary; the call's window W (slots in use, the most
rounds in flight) is the smallest goal, so every rank maps blocks to the same slots.

The control packet has K lanes (count = K); the K - 2N after the control vector are spare. A
call small enough (``one_round_capacity``, derived from K and N) rides in them
and is done in that one round trip: int32 values as they are, float32 values as exact
fixed-point limbs (``codec.fixed_encode``: the switch's lane-wise int32 sum is the exact sum of
the ranks' floats, rounded once to float32 on every rank alike, so no exponent agreement is
needed). Whether a call rides is decided by each rank from its own size, so the ranks agree
whenever the control vector does (else the call is refused before its lanes are read). A value
the codecs cannot carry (inf, NaN, |x| >= 2**127) sends zeros and FLAG_OVERFLOW, as a bad
block does: the call fails on every rank with the same error and leaves the tensor unchanged.
"""

from __future__ import annotations

import enum
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from inagg.hostlib.wire import codec


class CallRefused(ValueError):
    """Some rank refused this call (bad input or op), or the ranks' calls do not match; raised
    with the same message on every rank."""


class CallError(enum.IntEnum):
    """Why a rank refuses its part of a call; travels in the control vector (with a detail)."""

    NONE = 0
    DTYPE = 1         # detail: index in DTYPE_NAMES
    LAYOUT = 2        # not flat / not contiguous
    TOO_LARGE = 3
    REDUCE_OP = 4     # detail: index in OP_NAMES
    AVG_OF_INT = 5
    NOT_A_TENSOR = 6
    BAD_PART = 7      # detail: a PartProblem


DTYPE_NAMES = ("other", "float64", "float16", "bfloat16", "int64", "int16", "int8", "uint8", "bool",
               "complex64", "complex128", "uint16", "uint32", "uint64")


OP_NAMES = ("other", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")


MAX_ELEMENTS = 1 << 29  # the control vector carries 4 * numel + op + dtype in an int32


CALL_BITS = 8           # call numbers are compared modulo 2**8


GOAL_BITS = 15


EPOCH_DELTA_BITS = 8


@dataclass(frozen=True)
class Refusal:
    """This rank's reason to refuse a call, as the control vector carries it."""

    code: CallError
    detail: int = 0

    @staticmethod
    def describe_word(word: int) -> str:
        """A refusal's control-vector word (negative) in words. Another rank wrote it, so a code or
        detail this inagg does not know (another version, a corrupted rank) is named as such,
        never an exception of its own."""
        code, detail = -word & 0xF, -word >> 4
        try:
            return Refusal(CallError(code), detail).describe()
        except (ValueError, IndexError, KeyError):
            return (f"a refusal this inagg does not know (code {code}, detail {detail}): run the same "
                    f"inagg version on every rank")

    def describe(self) -> str:
        """The refusal in words, as every rank's ``CallRefused`` says it."""
        if self.code is CallError.DTYPE:
            return (f"a {DTYPE_NAMES[self.detail]} tensor (inagg allreduces float32, float16, bfloat16 "
                    f"and int32)")
        if self.code is CallError.REDUCE_OP:
            return f"reduce op {OP_NAMES[self.detail]} (inagg supports SUM and AVG)"
        if self.code is CallError.BAD_PART:
            return f"values to keep with {PART_PROBLEMS[PartProblem(self.detail)]} ({PART_RULE})"
        return {CallError.LAYOUT: "a tensor that is not contiguous",
                CallError.TOO_LARGE: f"a tensor of {MAX_ELEMENTS} or more elements",
                CallError.AVG_OF_INT: "AVG of an int32 tensor (AVG needs float32)",
                CallError.NOT_A_TENSOR: "an object that is neither a tensor nor an array"}[self.code]


def dtype_refusal(name: str) -> Refusal:
    """The refusal for a tensor of dtype ``name`` (numpy's or torch's name without 'torch.')."""
    return Refusal(CallError.DTYPE, DTYPE_NAMES.index(name) if name in DTYPE_NAMES else 0)


def check_array(x: np.ndarray, average: bool) -> Refusal | None:
    """The refusal for a numpy array this stream cannot allreduce, else None."""
    if not isinstance(x, np.ndarray):
        return Refusal(CallError.NOT_A_TENSOR)
    if not codec.is_float(x.dtype) and x.dtype != np.int32:
        return dtype_refusal(str(x.dtype))
    if x.ndim != 1 or not x.flags.c_contiguous:
        return Refusal(CallError.LAYOUT)
    if x.size >= MAX_ELEMENTS:
        return Refusal(CallError.TOO_LARGE)
    if average and not codec.is_float(x.dtype):
        return Refusal(CallError.AVG_OF_INT)
    return None


@dataclass(frozen=True)
class Shard:
    """Where a reduce-scatter's result goes: the sum's values ``[first, first + out.size)`` (the
    rank's own shard) into ``out``, which may be another array than the input; the input is then
    only read. Values outside the shard are never delivered to the rank."""

    first: int
    out: np.ndarray


def rank_shard(x: np.ndarray, out: np.ndarray, rank: int, world_size: int) -> Shard:
    """Rank ``rank``'s shard of ``x`` (the ranks' outputs end to end) into ``out``; a ValueError
    naming the problem when ``out`` is not one rank's share of ``x``, in ``x``'s dtype."""
    if out.dtype != x.dtype or out.ndim != 1 or not out.flags.c_contiguous:
        raise ValueError(f"a reduce-scatter's output must be a contiguous tensor of the input's dtype "
                         f"({x.dtype}); got {out.dtype}{'' if out.flags.c_contiguous else ', not contiguous'}")
    if out.size * world_size != x.size:
        raise ValueError(f"a reduce-scatter's input of {x.size} values is not {world_size} outputs of "
                         f"{out.size} end to end: pass an input of world_size x the output's values")
    return Shard(rank * out.size, out)


Part = tuple[tuple[int, int], ...]
"""The values of a call a rank needs (a reduce-scatter's shard, a host's leader's ranks' shards):
sorted, disjoint ``[first, end)`` ranges, none empty, none touching the next (``check_part``)."""


class PartProblem(enum.IntEnum):
    """What is wrong with the ranges passed as a part; a refusal's detail (``CallError.BAD_PART``)."""

    REVERSED = 1      # a range whose end lies before its first value
    OUTSIDE = 2       # a range beyond the tensor's values (or below 0)
    UNSORTED = 3      # a range that starts before the one passed before it
    OVERLAPPING = 4   # a range that starts inside the one before it


PART_PROBLEMS = {PartProblem.REVERSED: "a range whose end lies before its first value",
                 PartProblem.OUTSIDE: "a range outside the tensor",
                 PartProblem.UNSORTED: "ranges not sorted by their first value",
                 PartProblem.OVERLAPPING: "ranges that overlap"}
PART_RULE = "pass sorted, disjoint [first, end) ranges within the tensor's values"


class BadPart(ValueError):
    """Ranges that are no part of the tensor; ``refusal`` is how the call refuses them."""

    def __init__(self, problem: PartProblem, ranges: Iterable[tuple[int, int]], size: int) -> None:
        super().__init__(f"values to keep {list(ranges)} of a tensor of {size} values: "
                         f"{PART_PROBLEMS[problem]}; {PART_RULE}")
        self.refusal = Refusal(CallError.BAD_PART, problem)


def check_part(ranges: Iterable[tuple[int, int]], size: int) -> Part:
    """``ranges`` of a tensor of ``size`` values as a ``Part``, or :class:`BadPart` naming the
    first problem. Ranges are checked in order: an empty one holds nothing and is left out (after
    the check that it lies in the tensor), one that starts where the one before ends is joined to
    it (a block across their edge is wholly in the part). The C++ twin is ``check_part`` in
    native/stream.cpp (tests/test_reduce_scatter.py holds them to the same verdicts)."""
    ranges = [(int(first), int(end)) for first, end in ranges]
    part: list[tuple[int, int]] = []
    for first, end in ranges:
        problem = (PartProblem.REVERSED if end < first else
                   PartProblem.OUTSIDE if first < 0 or end > size else
                   None if first == end or not part or first >= part[-1][1] else
                   PartProblem.UNSORTED if first < part[-1][0] else PartProblem.OVERLAPPING)
        if problem is not None:
            raise BadPart(problem, ranges, size)
        if first == end:
            continue
        if part and first == part[-1][1]:
            part[-1] = (part[-1][0], end)
        else:
            part.append((first, end))
    return tuple(part)


def holds(part: Part, first: int, end: int) -> bool:
    """Values ``[first, end)`` (not empty) lie wholly in one range of ``part``: a block this rank
    marks FLAG_MINE (the C++ twin is ``Stream::owns``)."""
    i = bisect_right(part, first, key=_first) - 1   # the last range starting at or before first
    return i >= 0 and end <= part[i][1]


def misses(part: Part, first: int, end: int) -> bool:
    """Values ``[first, end)`` (not empty) meet no range of ``part``: a block whose result this
    rank may take without its values (the C++ twin is ``Stream::may_elide``)."""
    i = bisect_left(part, end, key=_first) - 1      # the last range starting before end
    return i < 0 or part[i][1] <= first


def _first(r: tuple[int, int]) -> int:
    return r[0]


@dataclass(frozen=True)
class CallSpec:
    """What one rank brings to a call: its call number, tensor (size, dtype, op) or refusal,
    window goal and the newest pending grant epoch it has seen (as a delta over the grant's)."""

    call: int
    size: int = 0
    is_float: bool = False
    average: bool = False
    refusal: Refusal | None = None
    goal: int = 1
    epoch_delta: int = 0

    def describe(self) -> str:
        """The call in words (``1000 x float avg``), for mismatch errors."""
        kind = "float" if self.is_float else "int32"
        return f"{self.size} x {kind}{' avg' if self.average else ''}"


@dataclass(frozen=True)
class Agreement:
    """The decoded sum of a call's control vector: what every rank does next."""

    window_goal: int
    epoch_delta: int  # 0: no pending grant seen by every rank


class ControlVector:
    """Encode one rank's :class:`CallSpec` into its two int32 words; decode the summed vector.

    Word r: ``-(code | detail << 4)`` for a refusal, else ``size << 2 | average << 1 | is_float``.
    Word N + r: ``(call mod 2**8) << 23 | goal << 8 | pending epoch delta`` (delta over the grant's
    epoch, capped at 255; 0 = none). The words are the first 2N lanes of the control packet;
    a small call's values follow (``one_round_capacity``)."""

    def __init__(self, n_workers: int) -> None:
        self.n = n_workers

    def encode(self, rank: int, spec: CallSpec) -> np.ndarray:
        """The 2N-word vector with this rank's words (r and N + r) set, the rest zero."""
        v = np.zeros(2 * self.n, np.int32)
        if spec.refusal is not None:
            v[rank] = -(int(spec.refusal.code) | spec.refusal.detail << 4)
        else:
            v[rank] = spec.size << 2 | int(spec.average) << 1 | int(spec.is_float)
        v[self.n + rank] = ((spec.call % (1 << CALL_BITS)) << (GOAL_BITS + EPOCH_DELTA_BITS)
                            | min(spec.goal, (1 << GOAL_BITS) - 1) << EPOCH_DELTA_BITS
                            | min(spec.epoch_delta, (1 << EPOCH_DELTA_BITS) - 1))
        return v

    def decode(self, summed: np.ndarray, call: int) -> Agreement:
        """Every rank's view of the call; raises :class:`CallRefused` (the same on every rank)
        when the call numbers differ, a rank refused, or the tensors differ."""
        n = self.n
        words = summed[:2 * n].tolist()    # plain ints: this runs once per call, small ones too
        first, second = words[:n], words[n:]
        calls = [w >> (GOAL_BITS + EPOCH_DELTA_BITS) for w in second]
        if calls.count(calls[0]) != n:
            desc = ", ".join(f"rank {r}: call {c}" for r, c in enumerate(calls))
            raise CallRefused(f"allreduce call numbers differ across ranks ({desc}, modulo "
                              f"{1 << CALL_BITS}): a rank skipped or repeated a call")
        if min(first) < 0:
            desc = "; ".join(f"rank {r} passed {Refusal.describe_word(w)}" for r, w in enumerate(first) if w < 0)
            raise CallRefused(f"allreduce call {call} refused: {desc}")
        if first.count(first[0]) != n:   # the words of equal tensors are equal
            specs = [CallSpec(call, w >> 2, bool(w & 1), bool(w & 2)) for w in first]
            desc = ", ".join(f"rank {r}: {s.describe()}" for r, s in enumerate(specs))
            raise CallRefused(f"allreduce tensors differ across ranks ({desc})")
        goal_mask, delta_mask = (1 << GOAL_BITS) - 1, (1 << EPOCH_DELTA_BITS) - 1
        return Agreement(window_goal=min([(w >> EPOCH_DELTA_BITS) & goal_mask for w in second]),
                         epoch_delta=min([w & delta_mask for w in second]))


class ResultCheck(enum.IntEnum):
    """Verdict on a received datagram; everything but ACCEPTED is dropped and counted. The C++
    twin is ``inagg::ResultCheck`` in native/stream.hpp (tests/test_stream.py ties them)."""

    ACCEPTED = 0
    FOREIGN_SOURCE = 1   # not from the grant's aggregator
    TRUNCATED = 2
    NOT_A_RESULT = 3     # version / message type
    WRONG_JOB = 4
    WRONG_EPOCH = 5
    NO_ROUND = 6         # no outstanding round on that slot (a late duplicate, a forgery)
    WRONG_SET = 7
    WRONG_OFFSET = 8
    WRONG_COUNT = 9
    WRONG_LENGTH = 10
    WRONG_FLAGS = 11     # a flag no aggregator sets on a result (FROM_SWITCH, an unknown bit)
    WRONG_ROUND = 12     # the round tag is not the outstanding round's (a result of an older round)
    MISSING_VALUES = 13  # values elided for a block this rank must get (its shard's, an allreduce's)


def one_round_capacity(values_per_packet: int, n_workers: int, is_float: bool) -> int:
    """The most values of a call of ``n_workers`` that ride in the control packet's spare lanes
    (K - 2N of them, after the control vector): one lane per int32 value, ``codec.fixed_limbs``
    per float32 value (an exact fixed-point encoding, so no exponent needs agreeing first)."""
    spare = max(0, values_per_packet - 2 * n_workers)
    return spare // codec.fixed_limbs(n_workers) if is_float else spare


def overflow_error(chunks: list[int], k: int) -> FloatingPointError:
    """The error every rank raises for the blocks ``chunks`` (of ``k`` values) that carried
    FLAG_OVERFLOW: some rank's input holds values no codec carries."""
    return FloatingPointError(
        f"allreduce input holds inf/NaN or |x| >= 2**127 on some rank: {len(chunks)} block(s) "
        f"of {k} values, first at element {min(chunks) * k}; those elements are left unchanged")
