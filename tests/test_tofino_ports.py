"""Tofino port bring-up (``inagg-tofino-ports``): the config's ``ports`` section, the bfrt_python
script written from it, run against a stand-in of bfrt_python's port tables built from the SDE's
own field names (tests/bfrt_standin.py, tests/fixtures/bfrt_port_tables.json), and the map its
output (or pm show's text) makes into the config's ``device_ports``."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re

import pytest

from bfrt_standin import FIXTURE, TableError, bfrt_with_board
from inagg.controller.tofino.bfrt_port_script import LOOPBACK_MODES, port_script
from inagg.controller.config import load_config, parse_config
from inagg.controller.tofino.ports import AUTONEG, FECS, SPEEDS
from inagg.controller.tofino_ports_cli import main

# A board: connector c, channel n -> pipe (c - 1) // 4, 4 connectors of 4 channels a pipe.
BOARD = {(c, n): ((c - 1) // 4) << 7 | ((c - 1) % 4) * 8 + n for c in range(1, 9) for n in range(4)}
HOSTS = {"10.0.0.1": {"port": 1, "mac": "00:00:00:00:00:01"},
         "10.0.0.2": {"port": 2, "mac": "00:00:00:00:00:02"},
         "10.0.0.3": {"port": 5, "mac": "00:00:00:00:00:03"}}
TABLE_METHODS = {"get", "add", "mod", "delete"}   # what bfrt_python makes of a port table
PORTS = {"1": {"connector": "1/0", "speed": "100G", "fec": "rs"},
         "2": {"connector": "2/0", "speed": "100g", "autoneg": "off"},
         "5": {"speed": "25G", "fec": "fc", "autoneg": "on"}}


def config(**switch) -> dict:
    sw = {"name": "tofino1", "grpc": "127.0.0.1:9559", "aggregator": "10.0.0.254:42602",
          "target": "tofino", "hosts": HOSTS, "ports": PORTS, **switch}
    return {"host_aggregator": "10.0.0.100:42666", "switches": [sw]}


def run_script(script: str, bfrt) -> str:
    """What ``bfshell -b`` prints running ``script`` with ``bfrt`` as its global."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(script, "ports.py", "exec"), {"bfrt": bfrt})
    return out.getvalue()


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def test_the_script_uses_the_sde_port_tables_names():
    """Every ``bfrt.port.<table>`` the script reaches and every keyword it passes is a table and
    field of open-p4studio's port json; the values it sets are among the field's choices."""
    tables = json.loads(FIXTURE.read_text())["tables"]
    nodes = {name.lstrip("$").lower(): spec for name, spec in tables.items()}
    tree = ast.parse(port_script(parse_config(config()).switches[0], "c.json"))
    used = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "bfrt.port":
            used[node.attr] = nodes[node.attr]
    assert set(used) == {"port", "port_hdl_info"}
    fields = {f.lstrip("$") for spec in used.values() for f in (*spec["key"], *spec["data"])}
    table_calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                   and isinstance(n.func, ast.Attribute) and n.func.attr in TABLE_METHODS]
    keywords = {k.arg for call in table_calls for k in call.keywords}
    assert keywords - {"print_ents"} <= fields
    assert {"DEV_PORT", "CONN_ID", "CHNL_ID", "SPEED", "FEC", "AUTO_NEGOTIATION",
            "LOOPBACK_MODE", "PORT_ENABLE"} <= keywords
    data = tables["$PORT"]["data"]
    for words, field in ((SPEEDS, "$SPEED"), (FECS, "$FEC"), (AUTONEG, "$AUTO_NEGOTIATION"),
                         (LOOPBACK_MODES, "$LOOPBACK_MODE")):
        assert set(words.values()) <= set(data[field]["choices"])
    assert "$DEV_PORT" in tables["$PORT_HDL_INFO"]["data"]


def test_the_script_adds_and_enables_each_port_and_prints_the_map():
    bfrt = bfrt_with_board(BOARD)
    output = run_script(port_script(parse_config(config()).switches[0], "c.json"), bfrt)
    rows = bfrt.port.port.rows
    no = {b"$LOOPBACK_MODE": "BF_LPBK_NONE", b"$PORT_ENABLE": True}
    assert rows == {
        ((b"$DEV_PORT", 0),): {b"$SPEED": "BF_SPEED_100G", b"$FEC": "BF_FEC_TYP_REED_SOLOMON",
                               b"$AUTO_NEGOTIATION": "PM_AN_DEFAULT", **no},
        ((b"$DEV_PORT", 8),): {b"$SPEED": "BF_SPEED_100G", b"$FEC": "BF_FEC_TYP_NONE",
                               b"$AUTO_NEGOTIATION": "PM_AN_FORCE_DISABLE", **no},
        ((b"$DEV_PORT", 128),): {b"$SPEED": "BF_SPEED_25G", b"$FEC": "BF_FEC_TYP_FIRECODE",
                                 b"$AUTO_NEGOTIATION": "PM_AN_FORCE_ENABLE", **no}}
    assert [m for m, _ in bfrt.port.port.calls] == ["get", "add", "mod"] * 3
    (line,) = output.splitlines()
    assert line.startswith("inagg-port-map ")
    assert json.loads(line.split(" ", 1)[1]) == {"switch": "tofino1", "ports": {
        "1": {"connector": "1/0", "dev_port": 0}, "2": {"connector": "2/0", "dev_port": 8},
        "5": {"connector": "5/0", "dev_port": 128}}}
    run_script(port_script(parse_config(config()).switches[0], "c.json"), bfrt)   # again
    assert [m for m, _ in bfrt.port.port.calls[9:12]] == ["get", "delete", "add"]
    assert all(row[b"$PORT_ENABLE"] for row in rows.values()) and len(rows) == 3


def test_the_script_puts_the_configs_loopback_ports_in_mac_loopback():
    """A port the switch recirculates through (``loopback_ports``, docs/tofino.md
    "Recirculation capacity per pipe") comes up in MAC loopback; the hosts' ports do not."""
    bfrt = bfrt_with_board(BOARD)
    ports = {**PORTS, "8": {"connector": "8/0", "speed": "100G", "fec": "rs"}}
    run_script(port_script(parse_config(config(ports=ports, loopback_ports=[8])).switches[0], "c.json"), bfrt)
    modes = {key[0][1]: row[b"$LOOPBACK_MODE"] for key, row in bfrt.port.port.rows.items()}
    assert modes == {0: "BF_LPBK_NONE", 8: "BF_LPBK_NONE", 128: "BF_LPBK_NONE", 152: "BF_LPBK_MAC_NEAR"}


def test_the_script_names_a_connector_the_board_lacks():
    sw = parse_config(config(ports={**PORTS, "9": {"connector": "9/0", "speed": "10G"}})).switches[0]
    with pytest.raises(RuntimeError, match=r"no port 9/0 \(\$PORT_HDL_INFO has no entry\): fix "
                                           r"its connector"):
        run_script(port_script(sw, "c.json"), bfrt_with_board(BOARD))
    with pytest.raises(TableError, match="not one of"):   # the stand-in checks choices
        bfrt_with_board(BOARD).port.port.add(DEV_PORT=0, SPEED="100G")


def test_map_fills_a_json_config_and_then_checks_it(tmp_path):
    path, log = tmp_path / "controller.json", tmp_path / "bfshell.log"
    path.write_text(json.dumps(config()))
    rc, script, _ = cli("script", "--config", str(path))
    assert rc == 0
    log.write_text("bfrt_python banner\n" + run_script(script, bfrt_with_board(BOARD)) + "bye\n")
    rc, out, err = cli("map", "--config", str(path), str(log))
    assert rc == 1 and "front-panel port 1: config (none), switch 0" in err
    assert 'switch tofino1: "device_ports": {"1": 0, "2": 8, "5": 128}' in out
    assert "pipe 0: host 10.0.0.1 (port 1, device port 0), host 10.0.0.2 (port 2, device port 8)" in out
    assert "pipe 1: host 10.0.0.3 (port 5, device port 128)" in out
    assert "warning: switch tofino1's hosts are in pipes 0, 1: a Tofino's registers are per pipe" in err
    rc, out, err = cli("map", "--config", str(path), "--write", str(log))
    assert rc == 0 and load_config(path).switches[0].device_ports == {1: 0, 2: 8, 5: 128}
    rc, out, err = cli("map", "--config", str(path), "--job", "10.0.0.1,10.0.0.2", str(log))
    assert rc == 0 and "matches the switch" in out and "job 10.0.0.1" not in err
    rc, out, err = cli("map", "--config", str(path), "--job", "10.0.0.1,10.0.0.3", str(log))
    assert "warning: job 10.0.0.1,10.0.0.3 spans pipes 0, 1" in err and "host aggregator" in err
    data = json.loads(path.read_text())
    data["switches"][0]["device_ports"]["2"] = 4
    path.write_text(json.dumps(data))
    rc, _, err = cli("map", "--config", str(path), str(log))
    assert rc == 1 and "front-panel port 2: config 4, switch 8" in err


PM_SHOW = """\
-----+----+---+----+-------+----+--+--+---+---+---+--------+----------------+----------------+-
PORT |MAC |D_P|P/PT|SPEED  |FEC |AN|KR|RDY|ADM|OPR|LPBK    |FRAMES RX       |FRAMES TX       |E
-----+----+---+----+-------+----+--+--+---+---+---+--------+----------------+----------------+-
1/0  | 0/0|  0|0/ 0|100G   | RS |Au|Au|YES|ENB|UP |  NONE  |               0|               0|
2/0  | 1/0|  8|0/ 8|100G   |NONE|Ds|Au|YES|ENB|DWN|  NONE  |               0|               0|
5/0  | 4/0|128|1/ 0|25G    | FC |En|Au|YES|ENB|DWN|  NONE  |               0|               0|
"""


def test_map_reads_pm_show_and_a_toml_config(tmp_path):
    path, show = tmp_path / "controller.toml", tmp_path / "pm_show.txt"
    path.write_text('host_aggregator = "10.0.0.100:42666"\n[[switches]]\nname = "tofino1"\n'
                    'grpc = "127.0.0.1:9559"\naggregator = "10.0.0.254:42602"\ntarget = "tofino"\n'
                    'device_ports = { "1" = 0, "2" = 8, "5" = 128 }\n'
                    '[switches.hosts]\n' + "".join(
                        f'"{ip}" = {{ port = {h["port"]}, mac = "{h["mac"]}" }}\n' for ip, h in HOSTS.items()))
    show.write_text(PM_SHOW)
    rc, out, err = cli("map", "--config", str(path), str(show))
    assert rc == 0 and 'device_ports = { "1" = 0, "2" = 8, "5" = 128 }' in out
    rc, _, err = cli("map", "--config", str(path), "--write", str(show))
    assert rc == 2 and "--write rewrites JSON configs only" in err
    rc, _, err = cli("script", "--config", str(path))
    assert rc == 2 and "switch tofino1 has no ports section: add one" in err


@pytest.mark.parametrize("ports, message", [
    ({"1": {"speed": "100GB"}}, r"unknown speed '100GB': use one of 1G, 10G, 25G"),
    ({"1": {"speed": "100G", "fec": "kr"}}, r"unknown fec 'kr': use one of none, fc, rs"),
    ({"1": {"speed": "100G", "fec": "fc"}}, r"fec 'fc' is not available at 100G .*takes none, rs"),
    ({"1": {"speed": "100G", "autoneg": "yes"}}, r"unknown autoneg 'yes': use one of default, on, off"),
    ({"1": {"fec": "rs"}}, r"missing 'speed': one of 1G"),
    ({"1": {"speed": "100G", "lanes": 4}}, r"unknown key\(s\) \['lanes'\]"),
    ({"1": {"connector": "1-0", "speed": "100G"}}, r"connector '1-0' is not conn/chnl"),
    ({"1": {"speed": "100G"}, "01": {"speed": "100G"}}, r"front-panel port 1 is listed twice"),
    ({"1": {"speed": "100G"}, "7": {"connector": "1/0", "speed": "100G"}},
     r"front-panel ports 1 and 7 both name connector 1/0"),
    ({"1": {"speed": "100G"}, "5": {"speed": "100G"}},
     r"no entry for front-panel port\(s\) 2 \(host 10.0.0.2\): add one"),
    ({"one": {"speed": "100G"}}, r"key 'one' is not a front-panel port number"),
])
def test_bad_ports_sections_are_refused_naming_the_problem(ports, message):
    with pytest.raises(ValueError, match=message):
        parse_config(config(ports=ports))


def test_the_config_refuses_repeated_keys_and_shared_device_ports(tmp_path):
    path = tmp_path / "c.json"
    text = json.dumps(config())
    path.write_text(text.replace('"ports": {', '"ports": {"1": {"speed": "10G"}, ', 1))
    with pytest.raises(ValueError, match=r"key '1' appears twice in one object: keep one"):
        load_config(path)
    with pytest.raises(ValueError, match=r"front-panel ports 1 and 2 both map to device port 8"):
        parse_config(config(device_ports={"1": 8, "2": 8, "5": 128}))
    with pytest.raises(ValueError, match=r"no device port for front-panel port\(s\) \[5\] "
                                         r"\(host 10.0.0.3\)"):
        parse_config(config(device_ports={"1": 0, "2": 8}))
    with pytest.raises(ValueError, match=r"ports: port bring-up settings belong to a Tofino switch"):
        parse_config(config(target="bmv2"))
    assert parse_config(config(target="tofino2", device_ports={"1": 0, "2": 8, "5": 128}))   # the same $PORT tables


@pytest.mark.parametrize("log, message", [
    ('inagg-port-map {"switch": "tofino1", "ports": {"1": {"connector": "1/0", "dev_port": 0}, '
     '"2": {"connector": "2/0", "dev_port": 0}}}', r"device port 0 is both 1/0 and 2/0"),
    ('inagg-port-map {"switch": "tofino1", "ports": {"1": {"connector": "1/0", "dev_port": 0}}}',
     r"no device port in the map for front-panel port 2 \(host 10.0.0.2, connector 2/0\), "
     r"front-panel port 5 \(host 10.0.0.3, connector 5/0\): bring it up"),
    ('inagg-port-map {"switch": "tofino2", "ports": {}}', r"switch tofino2's map, not tofino1's"),
    ("inagg-port-map {not json", r"the inagg-port-map line is not JSON"),
    ("Welcome to bfshell", r"neither the bring-up script's output .* nor pm show's table"),
    (PM_SHOW.replace("5/0  | 4/0|128", "5/0  | 4/0|  8"), r"device port 8 is both 2/0 and 5/0"),
])
def test_bad_maps_are_refused_naming_the_problem(tmp_path, log, message):
    path, log_path = tmp_path / "c.json", tmp_path / "log"
    path.write_text(json.dumps(config()))
    log_path.write_text(log + "\n")
    rc, _, err = cli("map", "--config", str(path), str(log_path))
    assert rc == 2
    assert re.search(message, err), err
