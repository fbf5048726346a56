"""The worker's stream: the native one (C++) against the Python one (its specification), the
control vector, and the exact result checks, over real sockets and the aggregator CLI."""

import contextlib
import itertools
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.hostlib.wire import codec
from inagg.hostlib.native_build import _native
from inagg.bmv2_env.demos.allreduce_demo import TensorSpec, run_local_job
from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.worker.stream import NativeSlotStream, native_block_exponents
from inagg.hostlib.wire.protocol import (
    FLAG_CONGESTION, FLAG_FROM_SWITCH, FLAG_RETRANSMIT, HEADER_BYTES, HEADER_STRUCT, ROUND_TAG_MASK,
    VERSION, unpack_header,
)
from inagg.hostlib.worker.call_protocol import (
    CallError, CallRefused, CallSpec, ControlVector, Refusal, ResultCheck,
)
from inagg.hostlib.worker.rounds import ALPHA_GAIN, INITIAL_WINDOW, CongestionWindow
from inagg.hostlib.worker.stream_base import SlotStalled
from inagg.hostlib.worker.stream_reference import SlotStream
from inagg.hostlib.wire.transport import UdpTransport
from scripted_udp import as_result, bound_socket, datagrams
from test_codec import exact_reference

STREAMS = {"python": SlotStream, "native": NativeSlotStream}
SPECS = [
    TensorSpec(100_003, dynamic_range=12.0, seed=11),   # not a multiple of K
    TensorSpec(5, seed=12),                             # a small call: rides in the control round
    TensorSpec(0, seed=14),                             # zero-length: a control round only
    TensorSpec(40_000, dtype="int32", seed=13),
    TensorSpec(25, seed=15),                            # K = 256, N = 3: the most that rides in the control round
    TensorSpec(26, seed=16),                            # one more: control round, then a block
    TensorSpec(250, dtype="int32", seed=17),            # int32: K - 2N values ride
]


def test_result_checks_have_one_definition():
    assert [c.name.lower() for c in ResultCheck] == list(_native.RESULT_CHECKS)


def awkward_floats(n: int, seed: int) -> np.ndarray:
    """Values across the whole float32 range: subnormals, zeros, huge, inf/NaN in some blocks."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-149, 127, n))).astype(np.float32)
    x[rng.integers(0, n, n // 50)] = 0.0
    x[:64] = 0.0                           # an all-zero block
    x[64:128] = np.float32(1e-44)          # a subnormal block
    x[200] = np.inf
    x[300] = np.nan
    x[400] = np.float32(2.0**127)          # too large for the codec
    return x


@pytest.mark.parametrize("k", [1, 7, 64, 4096])
def test_native_codec_is_bit_identical_to_numpy(k):
    x = awkward_floats(20_000, k)
    exps, bad = codec.block_exponents(x, k)
    n_exps, n_bad = native_block_exponents(x, k)
    assert np.array_equal(exps, n_exps) and np.array_equal(bad, n_bad)
    shift = codec.shift_for(4)
    for b in np.flatnonzero(~bad)[:200]:
        block = x[b * k: b * k + k]
        q = codec.quantize(block, int(exps[b]), shift)
        q_be = np.empty(block.size, np.uint32)
        _native.quantize_be(block, int(exps[b]), shift, q_be)
        assert np.array_equal(q, q_be.byteswap().view(np.int32))
        total = (q.astype(np.int64) * 3).astype(np.int32)       # a sum of 3 workers
        y = np.empty(block.size, np.float32)
        _native.dequantize_be(total.astype(">i4").view(np.uint32), int(exps[b]), shift, y)
        with np.errstate(over="ignore"):    # exponent 127 blocks overflow to inf alike
            assert np.array_equal(codec.dequantize(total, int(exps[b]), shift), y)



@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), exp=st.integers(-127, 127), workers=st.integers(1, 32))
def test_native_codec_rounds_and_scales_as_numpy_at_every_exponent(seed, exp, workers):
    """The vectorized C++ loops (no ldexp/rint per value) against numpy: agreed exponents above
    the block's own, exact half-quantum ties (round half to even, both signs), and int32 sums of
    any size back to float32 (subnormal results and overflow to inf included)."""
    rng = np.random.default_rng(seed)
    shift = codec.shift_for(workers)
    quantum = np.ldexp(1.0, exp - shift)
    ties = (rng.integers(-2**20, 2**20, 256) + 0.5) * quantum   # exact in float32
    x = np.concatenate([ties, rng.uniform(-1, 1, 256) * np.ldexp(1.0, exp)]).astype(np.float32)
    x = x[np.abs(x) < np.float32(np.ldexp(1.0, exp))]   # the exponent is an upper bound
    q_be = np.empty(x.size, np.uint32)
    _native.quantize_be(x, exp, shift, q_be)
    assert np.array_equal(codec.quantize(x, exp, shift), q_be.byteswap().view(np.int32))
    sums = rng.integers(-2**31, 2**31, 512, dtype=np.int64).astype(np.int32)
    y = np.empty(sums.size, np.float32)
    _native.dequantize_be(sums.astype(">i4").view(np.uint32), exp, shift, y)
    with np.errstate(over="ignore"):
        assert np.array_equal(codec.dequantize(sums, exp, shift), y)

# -- float16 and bfloat16: quantized from their own format, results rounded once ----------------

FORMATS = {"float16": np.dtype(np.float16), "bfloat16": codec.BFLOAT16}


def every_value(dtype: np.dtype) -> np.ndarray:
    """Every 16-bit pattern of ``dtype``: zeros, subnormals, normals, inf and NaN."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)


def torch_rounded(y: np.ndarray, name: str) -> np.ndarray:
    """float32 ``y`` rounded to the format by torch's ``.to`` (the reference), as uint16 bits."""
    import torch

    return torch.from_numpy(y).to(getattr(torch, name)).view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("name", FORMATS)
def test_every_16_bit_value_widens_and_rounds_back_exactly_in_both_codecs(name):
    """Each value its own block: the C++ and numpy exponents and int32 are equal, and each
    value's int32 (exact: 11 or 8 significant bits) dequantizes to the same bits."""
    x = every_value(FORMATS[name])
    exps, bad = codec.block_exponents(x, 1)
    n_exps, n_bad = native_block_exponents(x, 1)
    assert np.array_equal(exps, n_exps) and np.array_equal(bad, n_bad)
    # inf and NaN; in bfloat16 also |x| >= 2**127
    assert np.flatnonzero(bad).size == (2048 if name == "float16" else 512)
    shift = codec.shift_for(1)
    q = codec.quantize_blocks(x, 1, exps, shift)
    q_native = np.empty(x.size, np.int32)
    _native.quantize_blocks(codec.native_values(x), 1, exps, shift, q_native)
    assert np.array_equal(q, q_native)
    back, back_native = np.empty_like(x), np.empty_like(x)
    codec.dequantize_blocks(q, 1, exps, shift, 1, back)
    _native.dequantize_blocks(q, 1, exps, shift, 1, codec.native_values(back_native))
    good = ~bad & (x.view(np.uint16) != 0x8000)          # -0 comes back as +0, as in float32
    assert np.array_equal(back.view(np.uint16)[good], x.view(np.uint16)[good])
    assert np.array_equal(back.view(np.uint16), back_native.view(np.uint16))


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), name=st.sampled_from(sorted(FORMATS)), divisor=st.integers(1, 32))
def test_float32_results_round_to_16_bits_as_torch_rounds_them(seed, name, divisor):
    """Arbitrary float32 results (every exponent the codec carries, ties, subnormal and float16
    overflowing ones), written as float16 or bfloat16 by the C++ and numpy codecs: torch's
    rounding of the float32 result (divided by ``divisor``, as an average), bit for bit."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 0x7F000000, 4096, dtype=np.uint32).view(np.float32)   # below 2**127
    y[:1024] = (y[:1024].view(np.uint32) & ~np.uint32(0xFFF)).view(np.float32)   # ties to 16 bits
    y *= np.where(rng.random(y.size) < 0.5, -1, 1).astype(np.float32)
    exps, _ = codec.block_exponents(y, 1)
    shift = codec.shift_for(1)
    q = codec.quantize_blocks(y, 1, exps, shift)     # 30 bits: y exactly
    out, out_native = np.empty(y.size, FORMATS[name]), np.empty(y.size, FORMATS[name])
    codec.dequantize_blocks(q, 1, exps, shift, divisor, out)
    _native.dequantize_blocks(q, 1, exps, shift, divisor, codec.native_values(out_native))
    y32 = codec.dequantize_blocks(q, 1, exps, shift, divisor, np.empty(y.size, np.float32))
    assert np.array_equal(y32, y / np.float32(divisor))   # (-0 gives +0, as every zero sum)
    expected = torch_rounded(y32, name)
    assert np.array_equal(out.view(np.uint16), expected)
    assert np.array_equal(out_native.view(np.uint16), expected)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 32), size=st.integers(1, 700), k=st.sampled_from([1, 7, 64, 256]),
       seed=st.integers(0, 2**32 - 1), name=st.sampled_from(sorted(FORMATS)), average=st.booleans())
def test_16_bit_aggregation_is_the_float32_one_rounded_once_in_both_codecs(n, size, k, seed, name, average):
    """What a job computes, block by block, for N ranks' float16 or bfloat16 tensors: the C++
    codec reads them in their own format and gives the numpy twin's bits, which are the bits of
    the same values aggregated as float32, rounded once to the format."""
    rng = np.random.default_rng(seed)
    scale = np.exp2(rng.integers(-30, 12, (n, size))).astype(np.float32)
    xs = [codec.narrow(row, np.empty(size, FORMATS[name])) for row in rng.standard_normal((n, size)).astype(np.float32) * scale]
    exps = np.max([codec.block_exponents(x, k)[0] for x in xs], axis=0)
    assert np.array_equal(exps, np.max([native_block_exponents(x, k)[0] for x in xs], axis=0))
    shift, divisor = codec.shift_for(n), n if average else 1
    total = np.zeros(size, np.int64)
    for x in xs:
        q = codec.quantize_blocks(x, k, exps, shift)
        assert np.array_equal(q, codec.quantize_blocks(codec.widen(x), k, exps, shift))
        for b, e in enumerate(exps.tolist()):   # the wire's big-endian blocks
            q_be = np.empty(min(k, size - b * k), np.uint32)
            _native.quantize_be(codec.native_values(x[b * k:b * k + k]), e, shift, q_be)
            assert np.array_equal(q_be.byteswap().view(np.int32), q[b * k:b * k + k])
        total += q
    sums = total.astype(np.int32)
    y32 = codec.dequantize_blocks(sums, k, exps, shift, divisor, np.empty(size, np.float32))
    y, y_native = np.empty(size, FORMATS[name]), np.empty(size, FORMATS[name])
    codec.dequantize_blocks(sums, k, exps, shift, divisor, y)
    for b, e in enumerate(exps.tolist()):
        chunk = sums[b * k:b * k + k].astype(">i4").view(np.uint32)
        _native.dequantize_be(chunk, e, shift, codec.native_values(y_native[b * k:b * k + k]), divisor)
    assert np.array_equal(y.view(np.uint16), torch_rounded(y32, name))
    assert np.array_equal(y.view(np.uint16), y_native.view(np.uint16))


def summed(vectors):
    return np.sum(np.stack(vectors).astype(np.int64), axis=0).astype(np.int32)


def test_control_vector_gives_every_rank_the_same_agreement():
    cv = ControlVector(3)
    specs = [CallSpec(7, 100, True, False, None, goal, delta) for goal, delta in ((9, 2), (5, 1), (30, 3))]
    agreement = cv.decode(summed([cv.encode(r, s) for r, s in enumerate(specs)]), 7)
    assert (agreement.window_goal, agreement.epoch_delta) == (5, 1)


@pytest.mark.parametrize("specs, message", [
    ([CallSpec(7, 100, True), CallSpec(6, 100, True)],
     r"call numbers differ across ranks \(rank 0: call 7, rank 1: call 6, modulo 256\)"),
    ([CallSpec(7, 100, True), CallSpec(7, refusal=Refusal(CallError.DTYPE, 1))],
     r"allreduce call 7 refused: rank 1 passed a float64 tensor"),
    ([CallSpec(7, refusal=Refusal(CallError.REDUCE_OP, 3)), CallSpec(7, 100, True)],
     r"rank 0 passed reduce op MAX \(inagg supports SUM and AVG\)"),
    ([CallSpec(7, 100, True), CallSpec(7, refusal=Refusal(9, 2))],   # a code another version sent
     r"rank 1 passed a refusal this inagg does not know \(code 9, detail 2\): run the same inagg version"),
    ([CallSpec(7, refusal=Refusal(CallError.BAD_PART, 9)), CallSpec(7, refusal=Refusal(CallError.DTYPE, 99))],
     r"rank 0 passed a refusal this inagg does not know \(code 7, detail 9\).*; rank 1 passed a refusal "
     r"this inagg does not know \(code 1, detail 99\)"),
    ([CallSpec(7, 100, True), CallSpec(7, 100, True, average=True)],
     r"differ across ranks \(rank 0: 100 x float, rank 1: 100 x float avg\)"),
    ([CallSpec(7, 0, True), CallSpec(7, 3, True)],
     r"differ across ranks \(rank 0: 0 x float, rank 1: 3 x float\)"),
])
def test_control_vector_mismatches_are_errors(specs, message):
    cv = ControlVector(2)
    with pytest.raises(CallRefused, match=message):
        cv.decode(summed([cv.encode(r, s) for r, s in enumerate(specs)]), 7)


@pytest.mark.parametrize("drop_rate", [0.0, 0.05])
def test_native_and_python_streams_are_bit_identical_through_the_aggregator(drop_rate):
    """The same job through the aggregator CLI, once with Python streams and once native,
    with and without injected loss in both directions: the same bits on every rank."""
    runs = [run_local_job(3, SPECS, window=16, values_per_packet=256, drop_rate=drop_rate, seed=3,
                          keep_results=True, native=native) for native in (False, True)]
    for run in runs:
        assert all(r.max_err_over_bound <= 1.0 for r in run.workers)
        assert all(r.stats["calls"] == len(SPECS) for r in run.workers)
        if drop_rate:
            assert run.aggregator["injected_drops"] > 0
            assert sum(r.stats["retransmissions"] for r in run.workers) > 0
    reference = runs[0].workers[0].results
    for run in runs:
        for worker in run.workers:
            assert all(np.array_equal(a, b) for a, b in zip(reference, worker.results))


class ScriptedAggregator:
    """Plays the aggregator of a one-rank job: answers each contribution first with every kind
    of wrong result (and one from a foreign socket), then with the right one."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.sock = bound_socket()
        self.foreign = bound_socket()
        self.rounds = 0

    def wrong_answers(self, result: bytes) -> list[bytes]:
        vt, flags, job, worker, exp, epoch, ss, count, offset = HEADER_STRUCT.unpack_from(result)
        payload = result[HEADER_BYTES:]

        def with_(**changes):
            fields = dict(vt=vt, flags=flags, job=job, worker=worker, exp=exp, epoch=epoch, ss=ss,
                          count=count, offset=offset)
            fields.update(changes)
            return HEADER_STRUCT.pack(*fields.values()) + payload

        return [result[:HEADER_BYTES - 1],                                  # truncated
                with_(vt=(VERSION << 4) | 1),                               # a contribution
                with_(flags=flags | FLAG_FROM_SWITCH),                      # a switch's partial sum
                with_(job=job + 1), with_(epoch=epoch + 1),
                with_(ss=(ss & 0x8000) | ((ss & 0x7FFF) + 5)),              # a slot with no round
                with_(ss=ss ^ 0x8000),
                with_(flags=flags ^ ROUND_TAG_MASK),                        # another round's tag
                with_(offset=offset + self.k),
                with_(count=count + 1 if count else 1),
                result + b"\0\0\0\0",                                       # wrong length
                result[:HEADER_BYTES]]                                      # values elided in an allreduce

    def serve(self) -> None:
        for data, sender in datagrams(self.sock):
            self.rounds += 1
            result = as_result(data)
            self.foreign.sendto(result, sender)
            for wrong in self.wrong_answers(result):
                self.sock.sendto(wrong, sender)
            self.sock.sendto(result, sender)

    def close(self) -> None:
        self.sock.close()
        self.foreign.close()


@pytest.mark.parametrize("kind", STREAMS)
def test_only_exact_results_from_the_granted_aggregator_are_accepted(kind):
    agg = ScriptedAggregator(k=4)
    thread = threading.Thread(target=agg.serve, daemon=True)
    thread.start()
    transport = UdpTransport(agg.sock.getsockname(), bind=("127.0.0.1", 0))
    try:
        stream = STREAMS[kind](Grant(3, 2, 0, 4, 4, agg.sock.getsockname()), 0, 1, transport,
                               rto_min=3.0, rto_max=3.0, stall_timeout=5.0)   # no resends on a loaded machine
        x = np.arange(10, dtype=np.int32)
        stream.allreduce(x)
        assert x.tolist() == list(range(10))
        rounds = agg.rounds      # the control round and 3 blocks
        assert rounds == 4
        expected = {c.name.lower(): rounds for c in ResultCheck if c is not ResultCheck.ACCEPTED}
        assert stream.stats.result_drops == expected
        assert stream.stats.ignored_results == rounds * (len(ResultCheck) - 1)
        assert stream.stats.retransmissions == 0
    finally:
        agg.close()
        transport.close()
        thread.join(5)


@pytest.mark.parametrize("kind", STREAMS)
def test_a_refused_call_fails_on_every_rank_and_the_next_is_exact(kind):
    from inagg.hostlib.aggregator.server import HostAggregator
    from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig

    transports = [UdpTransport(("127.0.0.1", 0), bind=("127.0.0.1", 0)) for _ in range(2)]
    engine = AggregationEngine(8, 64)
    engine.set_job(JobConfig(1, 1, 0, 8, tuple(t.address for t in transports)))
    agg = HostAggregator(("127.0.0.1", 0), engine)
    thread = threading.Thread(target=agg.serve, daemon=True)
    thread.start()
    for t in transports:
        t.retarget(agg.address)
    streams = [STREAMS[kind](Grant(1, 1, 0, 8, 64, agg.address), r, 2, t, stall_timeout=10.0)
               for r, t in enumerate(transports)]

    def call_all(arrays):
        errors = [None, None]

        def go(r):
            try:
                streams[r].allreduce(arrays[r])
            except Exception as e:  # noqa: BLE001 - compared below
                errors[r] = e

        threads = [threading.Thread(target=go, args=(r,)) for r in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        return errors

    try:
        for bad in (np.ones(300), np.ones(300, np.float32)[::2], np.ones(0, np.float32)):
            errors = call_all([np.ones(300, np.float32), bad])
            assert all(isinstance(e, CallRefused) for e in errors) and str(errors[0]) == str(errors[1])
            assert "rank 1" in str(errors[0])
            xs = [np.full(300, r + 1.0, np.float32) for r in range(2)]
            assert call_all(xs) == [None, None] and all(np.all(x == 3.0) for x in xs)
        assert [s.stats.calls for s in streams] == [6, 6]
        streams[1].stats.calls += 1   # as if rank 1 had made a call the others did not
        for _ in range(2):            # detected, and never absorbed
            errors = call_all([np.ones(10, np.float32), np.ones(10, np.float32)])
            assert all(isinstance(e, CallRefused) and "call numbers differ" in str(e) for e in errors)
    finally:
        agg.stop()
        thread.join(5)
        for t in transports:
            t.close()


class SlowFirstAnswer:
    """A one-rank job's aggregator that answers the control round late (past the RTO), then
    answers the retransmitted copies as a switch does for a finished round: the stored result
    again, flagged FLAG_RETRANSMIT."""

    def __init__(self) -> None:
        self.sock = bound_socket()

    def serve(self) -> None:
        answered: dict[bytes, bytes] = {}
        for data, sender in datagrams(self.sock):
            key = data[2:4] + data[8:16]          # job, slot, count, offset
            if key in answered:
                self.sock.sendto(answered[key][:1] + bytes([answered[key][1] | FLAG_RETRANSMIT])
                                 + answered[key][2:], sender)
                continue
            if not answered:
                time.sleep(0.3)                   # the control round's answer comes late
            answered[key] = as_result(data)
            self.sock.sendto(answered[key], sender)


@contextlib.contextmanager
def one_rank_stream(kind: str, agg, slots: int, **options):
    """A one-rank job's stream (``kind``) of ``slots`` slots, K = 4, against the scripted
    aggregator ``agg`` (its ``sock`` and ``serve``), which is served on a thread meanwhile."""
    thread = threading.Thread(target=agg.serve, daemon=True)
    thread.start()
    transport = UdpTransport(agg.sock.getsockname(), bind=("127.0.0.1", 0))
    try:
        yield STREAMS[kind](Grant(3, 2, 0, slots, 4, agg.sock.getsockname()), 0, 1, transport,
                            **{"stall_timeout": 5.0, **options})
    finally:
        agg.sock.close()
        transport.close()
        thread.join(5)


@pytest.mark.parametrize("kind", STREAMS)
def test_retransmissions_answered_twice_are_spurious_and_keep_the_window(kind):
    with one_rank_stream(kind, SlowFirstAnswer(), 16, rto_min=0.05) as stream:
        goal = stream.window_control.goal         # 16: a timeout would make it 4
        x = np.arange(10, dtype=np.int32)
        stream.allreduce(x)
        assert x.tolist() == list(range(10))
        s = stream.stats
        assert s.retransmissions >= 1
        assert s.spurious_retransmissions == s.retransmissions and s.timeouts() == 0
        assert stream.window_control.goal == goal   # a spurious timeout is no loss signal


class SilentOnOneOffset:
    """A one-rank job's aggregator that answers every round but those at ``offset`` (a slot
    that stalls mid-call), each by echoing it (a one-rank sum)."""

    def __init__(self, offset: int) -> None:
        self.sock = bound_socket()
        self.offset = offset

    def serve(self) -> None:
        for data, sender in datagrams(self.sock):
            if unpack_header(data).offset != self.offset:
                self.sock.sendto(as_result(data), sender)


@pytest.mark.parametrize("kind", STREAMS)
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float16])
def test_a_call_that_stalls_mid_blocks_raises_slot_stalled_with_its_tensor_as_it_was(kind, dtype):
    """Blocks answered before the stall were written in place; the call gives them back, so it
    can run again from scratch (the communicator does, on a fresh epoch)."""
    with one_rank_stream(kind, SilentOnOneOffset(4 * 5), 16, stuck_timeout=0.5) as stream:
        x = (np.arange(40) * 3 + 1).astype(dtype)
        before = x.copy()
        with pytest.raises(SlotStalled, match=r"no result for 0.5s .*\(epoch 2\); 1 of 10 blocks missing"):
            stream.allreduce(x)
        assert stream.stats.calls == 1 and np.array_equal(x, before)


@pytest.mark.parametrize("kind", STREAMS)
def test_a_control_round_waits_the_stall_timeout_not_the_stuck_one(kind):
    """A rank late to the call looks like a stalled slot 0: the control round waits longer."""
    with one_rank_stream(kind, SilentOnOneOffset(0), 16, stall_timeout=1.5, stuck_timeout=0.2) as stream:
        with pytest.raises(SlotStalled, match=r"no result for 1.5s .*call 0's control round missing"):
            stream.allreduce(np.arange(40, dtype=np.int32))


@pytest.mark.parametrize("stuck", [0, -1.0, float("nan")])
def test_a_stuck_timeout_that_is_no_positive_time_is_refused(stuck):
    with pytest.raises(ValueError, match="must be positive seconds"):
        SlotStream(Grant(3, 2, 0, 4, 4, ("127.0.0.1", 9)), 0, 1, None, stuck_timeout=stuck)


# -- small calls: one round trip, values in the control packet's spare lanes --------------------

@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 256), seed=st.integers(0, 2**32 - 1), size=st.integers(0, 30))
def test_native_fixed_point_codec_is_bit_identical_to_numpy(n, seed, size):
    """Encode: floats across the whole range, specials included. Decode: any int32 lane sums,
    not only those of valid encodings (every carry path)."""
    x = awkward_floats(max(size, 401), seed)[np.random.default_rng(seed).permutation(max(size, 401))[:size]]
    n_limbs = codec.fixed_limbs(n)
    assert _native.fixed_limbs(n) == n_limbs and _native.limb_bits(n) == codec.limb_bits(n)
    ours, theirs = np.zeros(size * n_limbs, np.int32), np.zeros(size * n_limbs, np.int32)
    assert codec.fixed_encode(x, n, ours) == _native.fixed_encode(x, n, theirs)
    assert np.array_equal(ours, theirs)
    sums = np.random.default_rng(seed).integers(-2**31, 2**31, size * n_limbs, dtype=np.int64).astype(np.int32)
    y, y_native = np.empty(size, np.float32), np.empty(size, np.float32)
    codec.fixed_decode(sums, n, y)
    _native.fixed_decode(sums, n, y_native)
    assert np.array_equal(y.view(np.uint32), y_native.view(np.uint32))


def test_native_fixed_point_codec_rejects_bad_arguments():
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="n_workers must be >= 1"):
        _native.fixed_encode(x, 0, np.zeros(64, np.int32))
    with pytest.raises(ValueError, match="limbs shorter"):
        _native.fixed_encode(x, 4, np.zeros(3 * codec.fixed_limbs(4) - 1, np.int32))
    with pytest.raises(ValueError, match="sums shorter"):
        _native.fixed_decode(np.zeros(codec.fixed_limbs(4), np.int32), 4, x)


class MixedJob:
    """A 3-rank job through the host aggregator (K = 64): ranks 0 and 1 run the native stream,
    rank 2 the Python one, so every call compares the twins on the same wire."""

    N, K = 3, 64

    def __init__(self) -> None:
        from inagg.hostlib.aggregator.server import HostAggregator
        from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig

        self.transports = [UdpTransport(("127.0.0.1", 0), bind=("127.0.0.1", 0)) for _ in range(self.N)]
        engine = AggregationEngine(8, self.K)
        engine.set_job(JobConfig(1, 1, 0, 8, tuple(t.address for t in self.transports)))
        self.agg = HostAggregator(("127.0.0.1", 0), engine)
        self.thread = threading.Thread(target=self.agg.serve, daemon=True)
        self.thread.start()
        for t in self.transports:
            t.retarget(self.agg.address)
        kinds = (NativeSlotStream, NativeSlotStream, SlotStream)
        self.streams = [kind(Grant(1, 1, 0, 8, self.K, self.agg.address), r, self.N, t, stall_timeout=20.0)
                        for r, (kind, t) in enumerate(zip(kinds, self.transports))]

    def rounds(self) -> int:
        return self.agg.report()["jobs"][1]["results"]

    def call(self, arrays: list[np.ndarray], average: bool = False) -> list[Exception | None]:
        errors: list[Exception | None] = [None] * self.N

        def go(r: int) -> None:
            try:
                self.streams[r].allreduce(arrays[r], average=average)
            except Exception as e:  # noqa: BLE001 - compared by the caller
                errors[r] = e

        threads = [threading.Thread(target=go, args=(r,)) for r in range(self.N)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        return errors

    def close(self) -> None:
        self.agg.stop()
        self.thread.join(5)
        for t in self.transports:
            t.close()


@pytest.fixture
def mixed_job():
    job = MixedJob()
    yield job
    job.close()


def test_a_small_call_takes_one_round_and_the_capacity_follows_k(mixed_job):
    streams = mixed_job.streams
    # K - 2N = 58 spare lanes: 58 int32 values, or 5 float32 values of 10 limbs (29-bit limbs)
    assert [s.one_round_capacity(False) for s in streams] == [58] * 3
    assert [s.one_round_capacity(True) for s in streams] == [5] * 3
    for size, dtype, rounds in ((5, np.float32, 1), (58, np.int32, 1), (6, np.float32, 2), (59, np.int32, 2)):
        xs = [np.arange(size, dtype=dtype) * (r + 1) for r in range(3)]
        before = mixed_job.rounds()
        assert mixed_job.call(xs) == [None] * 3
        assert mixed_job.rounds() - before == rounds    # control (+ block 0)
        assert all(np.array_equal(x, np.arange(size, dtype=dtype) * 6) for x in xs)


def test_a_bad_value_in_a_small_call_fails_it_on_every_rank_as_a_bad_block(mixed_job):
    xs = [np.array([1.0, 2.0, -3.0], np.float32) for _ in range(3)]
    xs[1][2] = np.nan
    kept = [x.copy() for x in xs]
    errors = mixed_job.call(xs)
    assert all(isinstance(e, FloatingPointError) for e in errors)
    assert len({str(e) for e in errors}) == 1 and "first at element 0" in str(errors[0])
    assert all(np.array_equal(x, k, equal_nan=True) for x, k in zip(xs, kept))   # left unchanged
    ys = [np.array([1.0, 2.0, -3.0], np.float32) for _ in range(3)]
    assert mixed_job.call(ys, average=True) == [None] * 3                       # the next is exact
    assert all(np.array_equal(y, [1.0, 2.0, -3.0]) for y in ys)


def test_a_small_call_mismatch_is_refused_not_summed(mixed_job):
    xs = [np.ones(3, np.float32), np.ones(3, np.float32), np.ones(4, np.float32)]
    errors = mixed_job.call(xs)
    assert all(isinstance(e, CallRefused) and "differ across ranks" in str(e) for e in errors)
    assert all(np.all(x == 1.0) for x in xs)


SMALL_FLOATS = st.one_of(
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1.4e-45, -1.4e-45, 2.0**-126, 1e30, -1e30, 1.0, 3.4e38, -3.4e38]))


@st.composite
def small_calls(draw):
    """One call of the mixed job: dtype, op and every rank's values, around the capacity."""
    is_float = draw(st.booleans())
    size = draw(st.integers(1, 7 if is_float else 60))
    if not is_float:
        return [np.array(draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=size, max_size=size)), np.int32)
                for _ in range(MixedJob.N)], False
    arrays = [np.array(draw(st.lists(SMALL_FLOATS, min_size=size, max_size=size)), np.float32)
              for _ in range(MixedJob.N)]
    return arrays, draw(st.booleans())


def test_small_calls_are_exact_and_bit_identical_on_native_and_python_ranks(mixed_job):
    float_capacity = mixed_job.streams[0].one_round_capacity(True)

    @settings(max_examples=40, deadline=None)
    @given(small_calls())
    def check(call):
        arrays, average = call
        xs = [a.copy() for a in arrays]
        is_float = xs[0].dtype == np.float32
        errors = mixed_job.call(xs, average)
        bad = is_float and not all(np.all(np.abs(a) < 2.0**127) for a in arrays)
        if bad:   # |3.4e38| >= 2**127: refused as a bad block, on every rank, in both paths
            assert all(isinstance(e, FloatingPointError) for e in errors)
            assert all(np.array_equal(x, a) for x, a in zip(xs, arrays))   # left unchanged
            return
        assert errors == [None] * 3
        assert all(np.array_equal(x.view(np.uint32), xs[0].view(np.uint32)) for x in xs)
        if not is_float:
            assert np.array_equal(xs[0], np.sum(np.stack(arrays).astype(np.int64), axis=0).astype(np.int32))
        elif arrays[0].size <= float_capacity:     # one round: the exact sum, rounded once
            expected = exact_reference(arrays)
            if average:
                expected = expected / np.float32(MixedJob.N)
            assert np.array_equal(xs[0].view(np.uint32), expected.view(np.uint32))

    check()


@pytest.mark.parametrize("name", FORMATS)
def test_16_bit_calls_are_their_float32_calls_rounded_once_on_native_and_python_ranks(mixed_job, name):
    """float16 and bfloat16 tensors through the aggregator, in a call that rides in the control
    round and in one of many blocks, SUM and AVG: every rank (two native, one Python) gets the
    bits of the same values allreduced as float32, rounded once to the format."""
    rng = np.random.default_rng(7)
    for size in (3, 500):
        for average in (False, True):
            rows = rng.standard_normal((MixedJob.N, size)).astype(np.float32) * np.float32(1000.0)
            xs = [codec.narrow(row, np.empty(size, FORMATS[name])) for row in rows]
            references = [codec.widen(x).copy() for x in xs]
            assert mixed_job.call(xs, average) == [None] * MixedJob.N
            assert mixed_job.call(references, average) == [None] * MixedJob.N
            for x, reference in zip(xs, references):
                assert np.array_equal(x.view(np.uint16), torch_rounded(reference, name))


def test_slow_start_doubles_the_congestion_window_per_round_trip_until_a_mark():
    c = CongestionWindow(maximum=512)
    for _ in range(16):                              # one round trip of clean results
        c.on_result(False)
    assert (c.size, c.slow_start) == (32, True)
    for i in range(32):                              # one marked result in the next: cut at its end
        c.on_result(i == 0)
    assert not c.slow_start and c.alpha == pytest.approx((1 - ALPHA_GAIN) ** 2 + ALPHA_GAIN / 32)
    assert c.size == pytest.approx(63 * (1 - c.alpha / 2))


def test_a_round_trip_cuts_the_window_by_half_its_marked_estimate_and_a_clean_one_adds_one():
    c = CongestionWindow(size=40, alpha=0.0, slow_start=False, maximum=512)
    for i in range(40):                              # half of a round trip's results marked
        c.on_result(i < 20)
    assert c.alpha == pytest.approx(ALPHA_GAIN / 2) and c.size == pytest.approx(40 * (1 - ALPHA_GAIN / 4))
    size = c.size
    for _ in range(40):                              # a clean round trip (its length: the size it began at)
        c.on_result(False)
    assert c.size == pytest.approx(size + 1)


def test_two_windows_that_see_the_same_marks_converge_to_equal_shares():
    """Two ranks of two jobs behind one queue that marks while more than 40 rounds are in flight:
    each window gets its own size of results per round trip, all marked or none. From 6x
    apart, their windows end within 20 % of each other and the queue's share with them."""
    a, b = (CongestionWindow(size=size, slow_start=False, maximum=512) for size in (10, 60))
    for _ in range(400):
        marked = a.size + b.size > 40
        for window, results in ((a, int(a.size)), (b, int(b.size))):
            for _ in range(max(1, results)):
                window.on_result(marked)
    assert max(a.size, b.size) / min(a.size, b.size) < 1.2


class MarkingAggregator:
    """A one-rank job's aggregator behind a deep queue: every result it answers with carries
    FLAG_CONGESTION, as a switch's egress marks it."""

    def __init__(self) -> None:
        self.sock = bound_socket()

    def serve(self) -> None:
        for data, sender in datagrams(self.sock):
            result = as_result(data)
            self.sock.sendto(result[:1] + bytes([result[1] | FLAG_CONGESTION]) + result[2:], sender)


@pytest.mark.parametrize("kind", STREAMS)
def test_marked_results_shrink_the_window_within_the_call_without_a_loss(kind):
    with one_rank_stream(kind, MarkingAggregator(), 64) as stream:
        x = np.arange(400, dtype=np.int32)              # 100 blocks, more than any window
        stream.allreduce(x)
        assert x.tolist() == list(range(400))
        assert stream.stats.congestion_marks == 101     # every block's result and the control round's
        assert stream.stats.timeouts() == 0 and stream.stats.retransmissions == 0
        c = stream.window_control.congestion            # halved every round trip: at its least
        assert (c.size, c.slow_start) == (1, False)
        assert stream.window_control.goal == 2 * INITIAL_WINDOW   # twice its largest in the call: its first


class HoldingAggregator:
    """A one-rank job's aggregator that answers the control round at once, then holds what
    arrives for ``hold`` seconds (``held``) before it answers, and answers at once from then on."""

    def __init__(self, hold: float = 0.3) -> None:
        self.sock = bound_socket()
        self.hold = hold
        self.held: list[bytes] = []

    def serve(self) -> None:
        stream = datagrams(self.sock)
        data, sender = next(stream)
        self.sock.sendto(as_result(data), sender)
        deadline = time.monotonic() + self.hold
        while time.monotonic() < deadline:
            self.sock.settimeout(max(1e-3, deadline - time.monotonic()))
            self.held += [data for data, _ in itertools.islice(datagrams(self.sock), 1)]
        self.sock.settimeout(5.0)
        for data in self.held:
            self.sock.sendto(as_result(data), sender)
        for data, sender in stream:
            self.sock.sendto(as_result(data), sender)


@pytest.mark.parametrize("kind", STREAMS)
def test_a_rank_sends_no_more_blocks_than_its_congestion_window_allows(kind):
    agg = HoldingAggregator()
    with one_rank_stream(kind, agg, 64, rto_min=2.0) as stream:   # no resend while it holds
        x = np.arange(400, dtype=np.int32)              # 100 blocks
        stream.allreduce(x)
        assert x.tolist() == list(range(400))
        # the call used twice the first window's slots, but sent what the window allowed: 16,
        # and one more for the control round's clean result (slow start)
        assert stream.window == 2 * INITIAL_WINDOW
        assert len(agg.held) == INITIAL_WINDOW + 1
