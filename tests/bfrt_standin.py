"""A minimal stand-in of bfrt_python's object model for BF Runtime's port tables, built from
tests/fixtures/bfrt_port_tables.json (field names, types and choices from open-p4studio's
bf_rt_port json): what a bring-up script run by ``bfshell -b`` sees as ``bfrt.port.*``.

As in bfrt_python (open-p4studio pkgsrc/bf-drivers/src/bf_rt/bf_rt_python/): a port table
``$PORT_HDL_INFO`` is the node ``bfrt.port.port_hdl_info``; its methods take each field as a
keyword named without the ``$`` and refuse any other; ``get(..., print_ents=False)`` returns an
entry whose ``data`` is keyed by the field's full name as bytes (``b"$DEV_PORT"``), or -1 when
there is none; ``add`` of an existing key and ``mod``/``delete`` of a missing one fail. String
fields take their choices only. It is of the SDE's API, not of inagg.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "bfrt_port_tables.json"
_PYTHON_TYPES = {"uint16": int, "uint32": int, "uint64": int, "int32": int, "bool": bool,
                 "string": str, "float": float}


class TableError(Exception):
    """What bfrt_python's BfRtTableError stands for: the driver refused the call."""


class Entry:
    def __init__(self, key: dict[bytes, object], data: dict[bytes, object]) -> None:
        self.key, self.data = key, data


class Table:
    """One port table: its rows by key, and every call made on it."""

    def __init__(self, name: str, spec: dict) -> None:
        self.name, self.spec = name, spec
        self.rows: dict[tuple, dict[bytes, object]] = {}
        self.calls: list[tuple[str, dict]] = []

    def _fields(self, part: str, given: dict, whole: bool) -> dict[bytes, object]:
        fields = {name.lstrip("$"): (name, f) for name, f in self.spec[part].items()}
        out = {}
        for param, value in given.items():
            if param not in fields:
                raise TypeError(f"{self.name}: no field {param!r} (fields: {sorted(fields)})")
            name, f = fields[param]
            if not isinstance(value, _PYTHON_TYPES[f["type"]]):
                raise TypeError(f"{self.name}.{param}: {value!r} is not {f['type']}")
            if "choices" in f and value not in f["choices"]:
                raise TableError(f"{self.name}.{param}: {value!r} is not one of {f['choices']}")
            out[name.encode()] = value
        if whole and len(out) != len(fields):
            raise TableError(f"{self.name}: key needs {sorted(fields)}, got {sorted(given)}")
        return out

    def _split(self, method: str, kwargs: dict) -> tuple[tuple, dict[bytes, object]]:
        self.calls.append((method, dict(kwargs)))
        key_params = {n.lstrip("$") for n in self.spec["key"]}
        key = self._fields("key", {k: v for k, v in kwargs.items() if k in key_params}, True)
        data = self._fields("data", {k: v for k, v in kwargs.items() if k not in key_params}, False)
        return tuple(sorted(key.items())), data

    def get(self, print_ents: bool = True, return_ents: bool = True, **kwargs):
        key, _ = self._split("get", kwargs)
        return Entry(dict(key), dict(self.rows[key])) if key in self.rows else -1

    def add(self, **kwargs) -> None:
        key, data = self._split("add", kwargs)
        if key in self.rows:
            raise TableError(f"{self.name}: add of an existing entry {key}")
        self.rows[key] = data

    def mod(self, **kwargs) -> None:
        key, data = self._split("mod", kwargs)
        if key not in self.rows:
            raise TableError(f"{self.name}: mod of a missing entry {key}")
        self.rows[key].update(data)

    def delete(self, **kwargs) -> None:
        key, _ = self._split("delete", kwargs)
        if self.rows.pop(key, None) is None:
            raise TableError(f"{self.name}: delete of a missing entry {key}")


def bfrt_with_board(board: dict[tuple[int, int], int]) -> SimpleNamespace:
    """``bfrt`` with the port tables, ``$PORT_HDL_INFO`` holding ``board``: (conn, chnl) -> dev
    port (what bf_switchd reads from the platform's port map), ``$PORT`` empty."""
    tables = json.loads(FIXTURE.read_text())["tables"]
    nodes = {name.lstrip("$").lower(): Table(name, spec) for name, spec in tables.items()}
    hdl = nodes["port_hdl_info"]
    for (conn, chnl), dev_port in board.items():
        hdl.rows[((b"$CHNL_ID", chnl), (b"$CONN_ID", conn))] = {b"$DEV_PORT": dev_port}
    return SimpleNamespace(port=SimpleNamespace(**nodes))
