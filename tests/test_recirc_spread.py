"""Several recirculation ports per pipe (issue 38, "Recirculation capacity";
p4/tofino/recirc_spread.p4): the controller's rows of recirc_spread for the loopback ports the
operator names (one test per row of a pipe with SwitchML's seven), the config that names them,
and the Tofino model running them for each chip: every pass of a slot through its row's port
(so in that port's FIFO order), the per-pipe counters true, and a port the compiled parser does
not take second passes on losing them, as the chip would."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.bmv2_env.softswitch import tna_compiled, tna_slot_model
from inagg.bmv2_env.softswitch.pipeline_reference import RECIRC_SPREAD
from inagg.bmv2_env.softswitch.state import Action
from inagg.bmv2_env.softswitch.tna_slot_model import TofinoModelPipeline
from inagg.controller.config import default_program, parse_config
from inagg.controller.switch import (
    SwitchConnection, check_no_traffic_on_reserved_ports, recirculation_rows,
)
from test_tofino_program import make_comms
from test_tna_slot_model import CHIPS, K, _sums, frame, make

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = {chip: default_program(chip) for chip in CHIPS}
# the program's recirculation port and loopback range, per chip (p4/tofino/types.p4)
LOCAL = {"tofino": 68, "tofino2": 6}
LOOPBACK = {"tofino": range(56, 64), "tofino2": range(64, 72)}
SEVEN = {chip: [1 << 7 | p for p in LOOPBACK[chip][:7]] for chip in CHIPS}   # pipe 1's, as SwitchML


@pytest.fixture(params=CHIPS)
def chip(request) -> str:
    return request.param


def test_the_p4info_names_the_programs_recirculation_ports(chip):
    local, base, mask = PROGRAMS[chip].p4info.recirculation_ports
    assert local == LOCAL[chip] and [p for p in range(128) if p & mask == base] == list(LOOPBACK[chip])
    assert default_program("bmv2").p4info.recirculation_ports is None


@pytest.mark.parametrize("low", range(8))
def test_each_row_of_a_pipe_with_seven_loopback_ports_takes_its_own_port(chip, low):
    """Eight rows per pipe (the slot's low 3 bits): the recirculation port and the seven
    loopback ports, one each."""
    rows = recirculation_rows(PROGRAMS[chip].p4info, SEVEN[chip])
    assert set(rows) == {(1, i) for i in range(8)}
    assert rows[(1, low)] == ([1 << 7 | LOCAL[chip]] + SEVEN[chip])[low]


def test_fewer_ports_share_the_rows_round_robin_and_pipes_apart(chip):
    """Two loopback ports in pipe 1 and one in pipe 2: each pipe spreads over its own ports
    only (a pass recirculates in its pipe, where its registers are); a pipe with none has no
    row (the default: its recirculation port)."""
    a, b, c = 1 << 7 | LOOPBACK[chip][0], 1 << 7 | LOOPBACK[chip][3], 2 << 7 | LOOPBACK[chip][1]
    rows = recirculation_rows(PROGRAMS[chip].p4info, [b, c, a])
    local1, local2 = 1 << 7 | LOCAL[chip], 2 << 7 | LOCAL[chip]
    assert [rows[(1, i)] for i in range(8)] == [local1, a, b] * 2 + [local1, a]
    assert [rows[(2, i)] for i in range(8)] == [local2, c] * 4
    assert recirculation_rows(PROGRAMS[chip].p4info, []) == {}


def test_a_port_the_parser_does_not_take_second_passes_on_is_refused(chip):
    front = 1 << 7 | (LOOPBACK[chip][0] - 1)
    with pytest.raises(ValueError, match=rf"\[{front}\].*pipe-local ports {LOOPBACK[chip][0]}-{LOOPBACK[chip][-1]}"):
        recirculation_rows(PROGRAMS[chip].p4info, [front])
    with pytest.raises(ValueError, match="no recirc_spread table"):
        recirculation_rows(default_program("bmv2").p4info, [front])


def test_a_host_or_link_on_a_reserved_loopback_port_is_refused_naming_it(chip):
    """The parser takes any frame on a reserved port for a second pass, so no host or link may
    be there; the recirculation port and the ports beside the range are fine."""
    first = 1 << 7 | LOOPBACK[chip][0]
    with pytest.raises(ValueError, match=rf"host 10.0.0.9 \(device port {first}\): on a port the Tofino "
                                         rf"program reserves for loopback \(pipe-local {LOOPBACK[chip][0]}-"):
        check_no_traffic_on_reserved_ports(PROGRAMS[chip].p4info, {first - 1: "host 10.0.0.1",
                                                                    first: "host 10.0.0.9"})
    check_no_traffic_on_reserved_ports(PROGRAMS[chip].p4info, {first - 1: "h", first + 8: "l"})
    check_no_traffic_on_reserved_ports(default_program("bmv2").p4info, {first: "host 10.0.0.9"})


def _config(**extra) -> dict:
    return {"host_aggregator": "10.0.0.100:42666", "switches": [_switch(**extra)]}


def _switch(target: str = "tofino", **extra) -> dict:
    return {"name": "t1", "grpc": "127.0.0.1:1", "target": target, "aggregator": "10.0.0.254:42602",
            "hosts": {"10.0.0.1": {"port": 1, "mac": "02:00:00:00:00:01"}}, **extra}


def test_the_config_names_loopback_ports_mapped_like_the_hosts_ports():
    sw, = parse_config(_config(loopback_ports=[57, 58], device_ports={"1": 128, "57": 184, "58": 185})).switches
    assert sw.loopback_ports == (57, 58) and sw.loopback_device_ports == [184, 185]
    with pytest.raises(ValueError, match=r"device_ports: no device port for front-panel port\(s\) \[58\] \(loopback\)"):
        parse_config(_config(loopback_ports=[57, 58], device_ports={"1": 128, "57": 184}))


@pytest.mark.parametrize("bad, why", [
    ({"loopback_ports": [1]}, r"none a host or link is on: 1 \(host 10.0.0.1\)"),
    ({"loopback_ports": [57, 57]}, r"each port once"),
    ({"loopback_ports": "57"}, r"a list of front-panel port numbers"),
    ({"loopback_ports": [57], "target": "bmv2"}, r"belongs to a Tofino switch, not a bmv2 one"),
])
def test_a_bad_loopback_ports_entry_is_refused_naming_it(bad, why):
    with pytest.raises(ValueError, match=rf"switches\[0\]\.loopback_ports: .*{why}"):
        parse_config(_config(**bad))


# -- the model: the ports each slot's passes take ------------------------------------------------

def spread(model, chip: str, loopback: list[int]) -> None:
    """recirc_spread's rows as the controller writes them (pipe 0: the test bed's ports 1-3)."""
    for (pipe, low), port in recirculation_rows(PROGRAMS[chip].p4info, loopback).items():
        model.tables[RECIRC_SPREAD].put((pipe, low), Action("InaggIngress.recirc_spread.via", (("port", port),)))


def watch(model) -> list[tuple[int, int]]:
    """The recirculation ports' hook as a recorder: (port, harvest code) of every pass."""
    seen = []

    def record(port: int, wire: bytes) -> bool:
        seen.append((port, wire[3] >> 1 & 7))
        return False
    model.recirc_loss = record
    return seen


@pytest.mark.parametrize("slot", range(4))
def test_every_pass_of_a_slot_takes_its_rows_port_and_arrives(chip, slot):
    """Job 1's slots 0-3 with two loopback ports in pipe 0: slot s's result, its DUP_DONE
    answer (Tofino 1) and a BAD_ROUND undo all take row s's port (the pipe's recirculation port
    or a loopback one), come back through the compiled parser as second passes (counted by
    pipe) and the result is exact."""
    model = make(TofinoModelPipeline, chip)
    ports = [LOOPBACK[chip][2], LOOPBACK[chip][5]]
    spread(model, chip, ports)
    seen = watch(model)
    for r in range(2):
        assert model.process(*frame(1, r, [r + 1] * K, slot=slot)) == []
    assert _sums(model.process(*frame(1, 2, [3] * K, slot=slot))) == [[6] * K] * 3
    assert _sums(model.process(*frame(1, 0, [1] * K, slot=slot, flags=1))) == [[6] * K]   # answered
    model.process(*frame(1, 0, [1] * K, slot=slot, slot_set=1, offset=K))     # round 1 opens set 1
    assert model.process(*frame(1, 1, [1] * K, slot=slot, slot_set=1, offset=2 * K)) == []   # BAD_ROUND
    want = ([LOCAL[chip]] + ports)[slot % 3]
    codes = [tna_slot_model.HARVEST_RESULT] + ([tna_slot_model.HARVEST_ANSWER] if chip == "tofino" else []) \
        + [tna_slot_model.HARVEST_UNDO]
    assert seen == [(want, code) for code in codes]
    sent, arrived = (model.counters.arrays[n].tolist() for n in (tna_slot_model.RECIRC_SENT, tna_slot_model.RECIRC_ARRIVED))
    assert sent == arrived == [len(codes), 0, 0, 0]
    assert model.engine.maps[1][slot][1] == 0b001     # the undo came back: rank 1's bit is out


def test_a_row_naming_a_port_the_parser_does_not_take_loses_the_pass(chip):
    """A row the controller would refuse (a front-panel port outside the reserved range): the
    compiled parser takes the pass for an Ethernet frame (its bridged header read as addresses),
    so no second pass runs: sent, never arrived, no result. The reservation is the compiled
    parser's, not the model's."""
    model = make(TofinoModelPipeline, chip)
    model.tables[RECIRC_SPREAD].put((0, 1), Action("InaggIngress.recirc_spread.via", (("port", LOOPBACK[chip][0] - 1),)))
    for r in range(2):
        model.process(*frame(1, r, [r + 1] * K, slot=1))
    assert model.process(*frame(1, 2, [3] * K, slot=1)) == []
    sent, arrived = (model.counters.arrays[n].tolist() for n in (tna_slot_model.RECIRC_SENT, tna_slot_model.RECIRC_ARRIVED))
    assert (sent, arrived) == ([1, 0, 0, 0], [0, 0, 0, 0])


def test_the_controller_writes_the_rows_for_the_configs_loopback_ports(chip):
    """Three front-panel ports in loopback in a Tofino-shaped deployment's config: the
    controller writes recirc_spread's rows for them through P4Runtime, and a job still runs
    exact on the switch."""
    with LoopbackDeployment(2, target=chip, loopback=3) as dep:
        comms = make_comms(dep, 2)
        try:
            futures = [c.allreduce_async(torch.full((3 * K,), float(r + 1))) for r, c in enumerate(comms)]
            assert all(f.wait().tolist() == [3.0] * 3 * K for f in futures)
            cfg = parse_config(json.loads((dep.dir / "controller.json").read_text()), dep.dir).switches[0]
            sw = SwitchConnection(cfg.grpc, election_id=(0, 0), program=PROGRAMS[chip])
            try:
                have = {(k["pipe"], k["slot_low"]): p["port"] for k, a, p in sw.table_entries("recirc_spread")}
            finally:
                sw.close()
        finally:
            for c in comms:
                c.close()
    assert cfg.loopback_device_ports == [1 << 7 | p for p in LOOPBACK[chip][:3]]
    assert have == recirculation_rows(PROGRAMS[chip].p4info, cfg.loopback_device_ports)


# -- Tofino 1's answer check: worker_mask's rows for a second pass (p4/tofino/slot_inputs.p4) --

def worker_mask_zero_rows(chip: str) -> list[str]:
    """The const rows of worker_mask that give me = 0, as the chip's P4 has them."""
    text = tna_compiled.p4_source(chip, (ROOT / "p4" / "tofino" / "slot_inputs.p4").read_text())
    return re.findall(r"^\s*\((.*?)\): set_me\(0\);", text, re.M)


def test_worker_mask_gives_me_0_only_to_an_answers_pass_on_a_recirculation_port(chip):
    """Tofino 1's rows (the model's twin: a HARVEST_ANSWER pass undoes with me = 0): a pass on
    the recirculation port or a reserved loopback port carrying FLAG_RETRANSMIT, which of the
    second passes only a DUP_DONE answer does. Tofino 2 answers from the first pass: none."""
    want = {"tofino": ["_, RECIRC_PORT_LOCAL, FLAG_RETRANSMIT &&& FLAG_RETRANSMIT",
                       "_, LOOPBACK_BASE &&& LOOPBACK_MASK, FLAG_RETRANSMIT &&& FLAG_RETRANSMIT"],
            "tofino2": []}
    assert worker_mask_zero_rows(chip) == want[chip]


@pytest.mark.parametrize("row", ["recirculation port", "loopback port"])
def test_an_answers_pass_by_either_rows_port_takes_no_bit_and_answers_exact(row):
    """Tofino 1, one test per row of worker_mask's me = 0: a DUP_DONE answer of slot 1 whose
    pass comes back on the pipe's recirculation port (no recirc_spread row) or on a loopback
    port (a row): its owner check takes no bit out of the set's map, and the answer is exact."""
    model = make(TofinoModelPipeline, "tofino")
    if row == "loopback port":
        spread(model, "tofino", [LOOPBACK["tofino"][4]])
    seen = watch(model)
    for r in range(3):
        model.process(*frame(1, r, [r + 1] * K, slot=1))
    maps = [list(m) for m in model.engine.maps]
    assert _sums(model.process(*frame(1, 2, [3] * K, slot=1, flags=1))) == [[6] * K]
    assert [list(m) for m in model.engine.maps] == maps
    port = LOOPBACK["tofino"][4] if row == "loopback port" else LOCAL["tofino"]
    assert seen == [(port, tna_slot_model.HARVEST_RESULT), (port, tna_slot_model.HARVEST_ANSWER)]
