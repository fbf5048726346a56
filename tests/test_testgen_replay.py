"""P4Testgen is the oracle for every target (issue 38): its tests of each program (symbolic
execution of the P4 source: p4/testgen/<target>/, tools/testgen.py) are replayed on every engine
that runs that program, and the tests that fail there are exactly the documented limits of
docs/testing.md ("P4Testgen replay"), so a new failure and a fixed limit both fail this test.

Engines per generated target: BMv2's tests on simple_switch_grpc (the conformance suite's test
bed: network namespace, veth ports 1-8, P4Runtime), on the soft switch's C++ engine
(NativePipeline) and on its Python reference (SoftPipeline), both in process with BMv2's P4Info;
the Tofino 1 and Tofino 2 tests on the Tofino model as built for that chip
(TofinoModelPipeline, with the chip's committed P4Info, compiled actions and parsers). Each test
starts from a fresh pipeline (a generated test assumes no state but what it installs): installs its
entries as the P4Runtime service would write them, sends its frames and compares what leaves
with its expected frames (masks applied; no expect line: nothing may leave).

The currency check mirrors the committed compiler outputs' (test_p4_program.py), with hashes
instead of a regeneration: with p4testgen installed, the manifest's commands, tool hash and
sources hash must be those of today's tools/testgen.py, p4testgen and P4 sources. Regenerating
would take minutes (BMv2's "out" run, the Tofino runs) and is not byte-stable: two runs of the
same command on a loaded machine gave different tests from BMv2's 30th path on (p4testgen's
solver time limits, presumably), so a byte comparison would fail at random."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Callable

import pytest

import stf
from inagg.bmv2_env.emulation.testbed import Dataplane, bmv2_missing, have_netns
from inagg.bmv2_env.softswitch.pipeline import NativePipeline
from inagg.bmv2_env.softswitch.pipeline_reference import JOB_TABLE, UPLINK_TABLE, WORKER_TABLE, SoftPipeline
from inagg.bmv2_env.softswitch.state import StatusError
from inagg.bmv2_env.softswitch.tna_slot_model import TofinoModelPipeline
from inagg.controller.config import default_program
from inagg.controller.p4info import P4Info
from inagg.controller.switch import SwitchConnection, SwitchError

from tools import testgen

ROOT = Path(__file__).resolve().parents[1]
TESTGEN = ROOT / "p4" / "testgen"

# generated target -> the engines that run its program
ENGINES = {"bmv2": ("bmv2", "soft", "soft-python"), "tofino": ("tofino-model",),
           "tofino2": ("tofino2-model",)}
Outcome = list[tuple[int, bytes]]


class Refused(Exception):
    """The engine refused a test's table entries (the write a P4Runtime client would see fail)."""


class Unsendable(Exception):
    """A test's frame cannot be put on the engine's port (a raw socket refuses a frame shorter
    than its Ethernet header)."""


class InProcess:
    """A software engine in this process: a fresh pipeline per test, written to as the soft
    switch's P4Runtime service writes (p4runtime_server._write_one: the job tables resync the
    slot engine, which may refuse them)."""

    def __init__(self, make: Callable[[P4Info], object], p4info: P4Info) -> None:
        self.make, self.p4info = make, p4info

    def run(self, test: stf.StfTest) -> Outcome:
        pipeline = self.make(self.p4info)
        with pipeline.writing():
            for entry in test.entries:
                update = stf.table_update(self.p4info, entry)
                pipeline.tables.write(update.type, update.entity.table_entry)
                if entry.table in (JOB_TABLE, WORKER_TABLE, UPLINK_TABLE):
                    try:
                        pipeline.sync_jobs()
                    except StatusError as e:
                        raise Refused(str(e)) from None
        return [out for port, data in test.packets for out in pipeline.process(port, data)]


class Bmv2:
    """simple_switch_grpc in the conformance suite's test bed; each test pushes the pipeline
    again (BMv2 then starts from empty tables and zeroed registers)."""

    def __init__(self) -> None:
        self.plane = Dataplane("bmv2", n_ports=8).start()
        try:
            self.sw = SwitchConnection(self.plane.grpc_addr, program=self.plane.program)
        except BaseException:
            self.plane.stop()
            raise

    def run(self, test: stf.StfTest) -> Outcome:
        self.sw.push_pipeline()
        try:
            self.sw.write([stf.table_update(self.sw.p4info, e) for e in test.entries])
        except SwitchError as e:
            raise Refused(str(e)) from None
        self.plane.drain()
        for port, data in test.packets:
            try:
                self.plane.send(port, data)
            except OSError as e:
                raise Unsendable(f"a frame of {len(data)} bytes on port {port}: {e}") from None
        out: Outcome = []
        deadline = time.monotonic() + 3.0   # on a loaded machine, wait for the frames expected
        while True:
            out += [(port, f) for port, frames in self.plane.recv_all(0.3).items() for f in frames]
            if len(out) >= len(test.expects) or time.monotonic() > deadline:
                return out

    def close(self) -> None:
        self.sw.close()
        self.plane.stop()


def make_engine(name: str):
    """The engine ``name`` runs, with the P4Info of its program; pytest.skip where absent."""
    if name == "bmv2":
        reason = have_netns() or bmv2_missing()
        if reason:
            pytest.skip(reason)
        return Bmv2()
    if name in ("soft", "soft-python"):
        return InProcess(NativePipeline if name == "soft" else SoftPipeline, default_program("bmv2").p4info)
    chip = name.removesuffix("-model")
    return InProcess(TofinoModelPipeline, default_program(chip).p4info)


def replay(engine, tests: list[stf.StfTest]) -> dict[str, str]:
    """test name -> why it failed, for every test that did not pass on ``engine``."""
    failed = {}
    for test in tests:
        try:
            why = stf.verdict(test, engine.run(test))
        except Refused as e:
            why = f"entries refused: {e}"
        except Unsendable as e:
            why = f"cannot send {e}"
        if why is not None:
            failed[test.name] = why
    return failed


def documented_limits() -> dict[tuple[str, str], set[str]]:
    """(target, engine) -> the tests docs/testing.md lists as failing there, from its table
    ``| target | engines | tests | reason |`` (tests as <run>_NNN, comma-separated)."""
    text = (ROOT / "docs" / "testing.md").read_text()
    section = text.split("## P4Testgen replay", 1)[1].split("\n## ", 1)[0]
    limits: dict[tuple[str, str], set[str]] = {}
    for row in re.findall(r"^\| *(bmv2|tofino2?) *\|([^|]+)\|([^|]+)\|", section, re.M):
        target, engines, tests = row
        for engine in (e.strip(" `") for e in engines.split(",")):
            limits.setdefault((target, engine), set()).update(
                f"{target}/{t.strip(' `')}" for t in tests.split(","))
    return limits


CASES = [(t, e) for t, engines in ENGINES.items() for e in engines]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("target,engine", CASES, ids=[f"{t}-{e}" for t, e in CASES])
def test_generated_tests_pass_or_are_documented_limits(target, engine):
    tests = stf.load(TESTGEN / target)
    assert tests, f"no generated tests in p4/testgen/{target}/: run `make testgen`"
    runner = make_engine(engine)
    try:
        failed = replay(runner, tests)
    finally:
        if isinstance(runner, Bmv2):
            runner.close()
    known = documented_limits().get((target, engine), set())
    new = {name: why for name, why in failed.items() if name not in known}
    fixed = sorted(known - set(failed))
    assert not new and not fixed, (
        f"{engine}: {len(tests) - len(failed)} of {len(tests)} pass"
        + ("; new failures (fix the engine and its twin, or document the limit in docs/testing.md):"
           if new else "") + "".join(f"\n  {n}: {w}" for n, w in sorted(new.items()))
        + (f"\npassing now, remove from docs/testing.md: {fixed}" if fixed else ""))


def test_every_documented_limit_names_a_replayed_case():
    """No row of the limits table names a target/engine pair or a test that does not exist."""
    for (target, engine), names in documented_limits().items():
        assert engine in ENGINES.get(target, ()), f"docs/testing.md: {engine} does not run {target}'s tests"
        for name in names:
            assert (TESTGEN / f"{name}.stf").exists(), f"docs/testing.md names {name}, which is not generated"


@pytest.mark.skipif(shutil.which("p4testgen") is None,
                    reason="p4testgen not on PATH (../shared/toolchains/install p4testgen)")
def test_committed_tests_are_current():
    """The manifests name today's commands, p4testgen and P4 sources (not a regeneration: see
    the module's docstring)."""
    tool = testgen.tool_identity()
    for name, target in testgen.TARGETS.items():
        committed = json.loads((TESTGEN / name / "manifest.json").read_text())
        today = testgen.manifest(target, tool)
        differ = sorted(k for k in today if committed.get(k) != today[k])
        assert not differ, f"run `make testgen` and commit ({name}: {differ} changed)"
