"""``inagg-tofino-ports``: a Tofino switch's port bring-up and its front-panel -> device port map,
from the controller's own config file (read and checked by controller/config.py, as
``inagg-controller`` reads it).

    inagg-tofino-ports script --config controller.toml [--switch NAME] [-o ports.py]
        the bfrt_python bring-up script of the switch's ``ports`` section
        (controller/tofino/bfrt_port_script.py); run it with ``bfshell -b ports.py``
    inagg-tofino-ports map --config controller.toml [--switch NAME] [--job IP,IP] [--write] LOG
        reads the script's output (or pm show's text) and prints the switch's ``device_ports``,
        its hosts by pipe and a warning for hosts (or a planned ``--job``) across pipes
        (controller/tofino/port_map.py); checks the config's ``device_ports`` against it
        (exit 1 on a difference) or, with ``--write``, writes it into a JSON config

A separate command, not an ``inaggctl`` one: it needs the config file and no controller, and runs
where the switch's shell is. Exit status 2 on a bad config or map, with the reason. Like
``inagg-controller``, it imports the control plane (``inagg[control]``) only once it runs, so
``--version`` and ``--help`` work on any install.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inagg.hostlib import add_version_flag


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inagg-tofino-ports", description="Bring up a Tofino "
                                "switch's ports (bfrt_python script) and map front-panel ports "
                                "to device ports in the controller config.")
    add_version_flag(p)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, text in (("script", "write the bfshell -b bring-up script"),
                       ("map", "fill or check device_ports from the script's output or pm show")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("--config", required=True, help="the controller config (TOML or JSON)")
        sp.add_argument("--switch", help="the switch's name (default: the config's one tofino switch)")
    sub.choices["script"].add_argument("-o", "--output", help="write the script here (default stdout)")
    mp = sub.choices["map"]
    mp.add_argument("log", help="the script's output (bfshell's log) or pm show's text; - for stdin")
    mp.add_argument("--job", action="append", default=[], metavar="IP,IP",
                    help="a planned job's hosts: warn when they span pipes (repeatable)")
    mp.add_argument("--write", action="store_true",
                    help="write device_ports into the (JSON) config instead of checking it")
    return p


def _switch_index(data: dict, name: str | None) -> int:
    """Index of the chosen switch in the raw config: by name, else the only tofino one."""
    switches = data.get("switches", [])
    names = [str(s.get("name", f"s{i + 1}")) for i, s in enumerate(switches)]
    if name is not None:
        if name not in names:
            raise ValueError(f"no switch {name!r} in the config: its switches are {', '.join(names)}")
        return names.index(name)
    tofinos = [i for i, s in enumerate(switches) if s.get("target") == "tofino"]
    if len(tofinos) != 1:
        raise ValueError(f"the config has {len(tofinos)} tofino switches: name one with --switch")
    return tofinos[0]


def _load_switch(path: str, name: str | None, drop_map: bool):
    """(raw config, switch index, its checked SwitchConfig). ``drop_map``: check it without
    its ``device_ports`` (the map being filled in, maybe stale)."""
    from inagg.controller.config import parse_config, read_config_data   # inagg[control]
    data = read_config_data(path)
    i = _switch_index(data, name)
    checked = json.loads(json.dumps(data))
    if drop_map:
        checked["switches"][i].pop("device_ports", None)
    sw = parse_config(checked, Path(path).parent).switches[i]
    if sw.program is None or sw.program.target != "tofino":
        raise ValueError(f"switch {sw.name} is not a tofino switch (target "
                         f"{sw.program.target if sw.program else 'bmv2'})")
    return data, i, sw


def _script(args: argparse.Namespace) -> int:
    from inagg.controller.tofino.bfrt_port_script import port_script
    _, _, sw = _load_switch(args.config, args.switch, drop_map=False)
    text = port_script(sw, args.config)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}: run it with bfshell -b {args.output}, then "
              f"inagg-tofino-ports map --config {args.config} <its output>", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _map_line(mapping: dict[int, int], toml: bool) -> str:
    """``device_ports`` as a line of the config's own format."""
    if toml:
        return "device_ports = { " + ", ".join(f'"{k}" = {v}' for k, v in mapping.items()) + " }"
    return '"device_ports": ' + json.dumps({str(k): v for k, v in mapping.items()})


def _differences(old: dict[int, int], new: dict[int, int]) -> list[str]:
    """Front-panel ports whose device port the config has wrong, missing or extra."""
    return [f"front-panel port {p}: config {old.get(p, '(none)')}, switch {new.get(p, '(none)')}"
            for p in sorted(set(old) | set(new)) if old.get(p) != new.get(p)]


def _write_map(path: str, data: dict, i: int, mapping: dict[int, int]) -> None:
    """Write ``mapping`` as switch i's device_ports into a JSON config, checked first."""
    from inagg.controller.config import parse_config
    if Path(path).suffix == ".toml":
        raise ValueError("--write rewrites JSON configs only (a TOML file's comments would be "
                         "lost): put the device_ports line above in the switch's [[switches]] block, before "
                         "its [switches.hosts] table")
    data["switches"][i]["device_ports"] = {str(k): v for k, v in mapping.items()}
    parse_config(data, Path(path).parent)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def _map(args: argparse.Namespace) -> int:
    from inagg.controller.tofino.port_map import device_ports_from, pipe_report, read_port_map
    data, i, sw = _load_switch(args.config, args.switch, drop_map=True)
    text = sys.stdin.read() if args.log == "-" else Path(args.log).read_text()
    switch_name, connectors = read_port_map(text, args.log)
    if switch_name is not None and switch_name != sw.name:
        raise ValueError(f"{args.log} is switch {switch_name}'s map, not {sw.name}'s: give "
                         f"--switch {switch_name}, or switch {sw.name}'s script output")
    mapping = device_ports_from(sw, connectors)
    lines, warnings = pipe_report(sw, mapping, [job.split(",") for job in args.job])
    print("\n".join(lines))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"switch {sw.name}: {_map_line(mapping, Path(args.config).suffix == '.toml')}")
    if args.write:
        _write_map(args.config, data, i, mapping)
        print(f"wrote device_ports of switch {sw.name} into {args.config}")
        return 0
    old = {int(k): int(v) for k, v in data["switches"][i].get("device_ports", {}).items()}
    wrong = _differences(old, mapping)
    if wrong:
        print(f"{args.config}: device_ports of switch {sw.name} differs from the switch's map: "
              + "; ".join(wrong) + ": put the line above in the config (or --write a JSON one)",
              file=sys.stderr)
        return 1
    print(f"{args.config}: device_ports of switch {sw.name} matches the switch")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _script(args) if args.cmd == "script" else _map(args)
    except (ValueError, OSError) as e:
        print(f"inagg-tofino-ports: {e}", file=sys.stderr)
        return 2
