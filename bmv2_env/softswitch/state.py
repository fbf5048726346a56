"""Switch state the software data plane exposes over P4Runtime: table entries validated
against the P4Info, multicast groups (the packet replication engine) and indexed counters.

Errors are ``StatusError`` carrying the gRPC status code the P4Runtime server answers with.
Reads answer as BMv2's simple_switch_grpc does (tests/test_soft_p4runtime_bmv2.py holds them to
it): a table read by key gives that key's entry only, a read of the default entry the default
entry, a missing multicast group NOT_FOUND, an unknown table or counter id INVALID_ARGUMENT, and
every value in P4Runtime's canonical bytestring (``canonical_bytes``).
A ``StateMirror`` (the native data plane's core) is told of every change as it happens, undos
included, so a copy of the state kept elsewhere never drifts from what P4Runtime reads back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import grpc
import numpy as np
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from inagg.controller.p4info import P4Info, P4Type, decode
from inagg.hostlib.wire.protocol import OWNER_DECISION, OWNER_DECISION_KEYS, SLOT_DECISION, SLOT_DECISION_KEYS


class StatusError(Exception):
    """A request the switch refuses; ``code`` is the gRPC status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def canonical_bytes(value: int) -> bytes:
    """An unsigned value as P4Runtime's canonical bytestring (the spec's "Bytestrings"): the
    fewest bytes that hold it, one for zero, whatever the field's width (as BMv2 answers)."""
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def _decode_field(value: bytes, bitwidth: int, where: str) -> int:
    """A match field's or action parameter's bytes as an integer of ``bitwidth`` bits; a value
    that does not fit is INVALID_ARGUMENT, named by ``where`` ("table.field", "action.param")."""
    try:
        return decode(value, bitwidth)
    except ValueError as e:
        raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, f"{where}: {e}") from None


def _refuse_unknown(given: dict, owner: str, kind: str) -> None:
    """INVALID_ARGUMENT when ids of ``kind`` the P4Info does not give ``owner`` are left over."""
    if given:
        raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, f"{owner}: unknown {kind} id(s) {sorted(given)}")


@dataclass(frozen=True)
class Action:
    name: str
    params: tuple[tuple[str, int], ...] = ()

    def param(self, name: str) -> int:
        return dict(self.params)[name]


class StateMirror(Protocol):
    """Receives every change of the tables and multicast groups, in order."""

    def entry_changed(self, table: str, key: tuple[int, ...], action: Action | None) -> None: ...

    def default_changed(self, table: str, action: Action | None) -> None: ...

    def group_changed(self, group: int, replicas: tuple[Replica, ...] | None) -> None: ...


# The program's const tables, by their own name (the last part of the full one): (key field
# names, entries as (key bits or None for "any", the action's one argument), action). These are
# the P4's twins, row for row (tests/test_slot_decision.py, tests/test_owner_decision.py): the
# engines decide by them.
CONST_ENTRIES = {"slot_decision": (SLOT_DECISION_KEYS, SLOT_DECISION, "set_outcome"),
                 "owner_decision": (OWNER_DECISION_KEYS, OWNER_DECISION, "set_owner_update")}
# PI numbers a const table's entries from this priority down, the first entry the highest.
_FIRST_CONST_PRIORITY = 2**31 - 2
_TERNARY = p4info_pb2.MatchField.TERNARY
# A ternary field's part of a key: (value, mask); (0, 0) matches anything (the field left out).
Ternary = tuple[int, int]


@dataclass
class Table:
    """One P4 table: exact-match entries, or (a table with a ternary field: the TNA program's
    host_port_table) entries whose key holds each exact field's value, each ternary field's
    ``(value, mask)`` and, last, the entry's priority. Change it only through
    ``put``/``remove``/``set_default_action``, which keep the mirror in step."""

    name: str
    info: object  # p4info_pb2.Table
    entries: dict[tuple[int, ...], Action] = field(default_factory=dict)
    default: Action | None = None
    default_is_const: bool = False
    mirror: StateMirror | None = None

    @property
    def ternary(self) -> bool:
        """Whether a field matches ternary: entries then carry masks and a priority."""
        return any(mf.match_type == _TERNARY for mf in self.info.match_fields)

    def lookup(self, key: tuple[int, ...]) -> Action | None:
        return self.entries.get(key)

    def match(self, fields: tuple[int, ...]) -> Action | None:
        """A ternary table's lookup of a packet's ``fields`` (one value per match field): the
        action of the highest-priority entry each of whose fields matches (an exact one equal,
        a ternary one under its mask), None when none does."""
        best: tuple[int, Action] | None = None
        for key, action in self.entries.items():
            *match, priority = key
            if all(f == m if isinstance(m, int) else f & m[1] == m[0] for f, m in zip(fields, match)) \
                    and (best is None or priority > best[0]):
                best = (priority, action)
        return None if best is None else best[1]

    def put(self, key: tuple[int, ...], action: Action) -> None:
        self.entries[key] = action
        if self.mirror:
            self.mirror.entry_changed(self.name, key, action)

    def remove(self, key: tuple[int, ...]) -> None:
        del self.entries[key]
        if self.mirror:
            self.mirror.entry_changed(self.name, key, None)

    def set_default_action(self, action: Action | None) -> None:
        self.default = action
        if self.mirror:
            self.mirror.default_changed(self.name, action)


class TableStore:
    """All tables of the program, written and read with P4Runtime ``TableEntry`` messages."""

    def __init__(self, p4info: P4Info, mirror: StateMirror | None = None) -> None:
        self.p4info = p4info
        self.tables: dict[str, Table] = {}
        for t in p4info.message.tables:
            name = p4info.local_name(t.preamble.name)   # the same names for BMv2 and TNA P4Infos
            self.tables[name] = Table(name, t, default_is_const=bool(t.const_default_action_id),
                                      mirror=mirror)
            self.tables[name].set_default_action(self._initial_default(t))

    def _initial_default(self, info) -> Action | None:
        """The default action the P4Info gives a table (its const one when it has no other)."""
        call = info.initial_default_action
        action_id = call.action_id or info.const_default_action_id
        if not action_id:
            return None
        return self._action_call(action_id, {a.param_id: a.value for a in call.arguments})

    def __getitem__(self, name: str) -> Table:
        return self.tables[name]

    def set_default(self, table: str, action: Action) -> None:
        """The default action the program declares (read from the BMv2 JSON at load time)."""
        self.tables[table].set_default_action(action)

    # -- decoding --------------------------------------------------------------------------

    def table_name(self, table_id: int) -> str:
        return self._table(table_id).name

    def _table(self, table_id: int) -> Table:
        for t in self.tables.values():
            if t.info.preamble.id == table_id:
                return t
        raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, f"no table with id {table_id}")

    def _key(self, table: Table, entry: p4runtime_pb2.TableEntry) -> tuple:
        """The entry's key (``Table``); INVALID_ARGUMENT for a field missing or of the wrong
        kind, a ternary value with bits outside its mask, or a priority the table does not take
        (exact) or needs (ternary, P4Runtime's rule)."""
        given = {m.field_id: m for m in entry.match}
        values: list = []
        for mf in table.info.match_fields:
            m, where = given.pop(mf.id, None), f"{table.name}.{mf.name}"
            if mf.match_type == _TERNARY:
                values.append(_ternary(m, mf.bitwidth, where))
                continue
            if m is None:
                raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"{table.name}: missing match field {mf.name}")
            if not m.HasField("exact"):
                raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"{table.name}: field {mf.name} must be an exact match")
            values.append(_decode_field(m.exact.value, mf.bitwidth, where))
        _refuse_unknown(given, table.name, "match field")
        if not table.ternary:
            if entry.priority:
                raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"{table.name}: exact-match entries take no priority")
            return tuple(values)
        if entry.priority <= 0:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{table.name}: a ternary table's entries need a priority above 0")
        return (*values, entry.priority)

    def _action(self, table: Table, entry: p4runtime_pb2.TableEntry) -> Action:
        if not entry.action.HasField("action"):
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{table.name}: only direct actions are supported")
        a = entry.action.action
        allowed = {ref.id for ref in table.info.action_refs}
        if a.action_id not in allowed:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{table.name}: action id {a.action_id} not allowed in this table")
        return self._action_call(a.action_id, {p.param_id: p.value for p in a.params})

    def _action_call(self, action_id: int, given: dict[int, bytes]) -> Action:
        """The action ``action_id`` with its parameters' bytestrings (by parameter id) decoded."""
        info = self.p4info.by_id(action_id)
        params = []
        for p in info.params:
            if p.id not in given:
                raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"{info.preamble.name}: missing parameter {p.name}")
            params.append((p.name, _decode_field(given.pop(p.id), p.bitwidth, f"{info.preamble.name}.{p.name}")))
        _refuse_unknown(given, info.preamble.name, "parameter")
        return Action(info.preamble.name, tuple(params))

    # -- P4Runtime ---------------------------------------------------------------------------

    def write(self, update_type: int, entry: p4runtime_pb2.TableEntry):
        """Apply one update; returns a function that undoes it."""
        table = self._table(entry.table_id)
        U = p4runtime_pb2.Update
        if entry.is_default_action:
            if update_type != U.MODIFY:
                raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"{table.name}: the default entry can only be modified")
            if table.default_is_const:
                raise StatusError(grpc.StatusCode.PERMISSION_DENIED,
                                  f"{table.name}: the default action is const")
            old = table.default
            table.set_default_action(self._action(table, entry))
            return lambda: table.set_default_action(old)
        if table.info.is_const_table:
            raise StatusError(grpc.StatusCode.PERMISSION_DENIED,
                              f"{table.name}: its entries are the program's (const entries)")
        key = self._key(table, entry)
        old = table.entries.get(key)
        if update_type == U.INSERT:
            if old is not None:
                raise StatusError(grpc.StatusCode.ALREADY_EXISTS, f"{table.name}: entry {key} exists")
            table.put(key, self._action(table, entry))
            return lambda: table.remove(key)
        if old is None:
            raise StatusError(grpc.StatusCode.NOT_FOUND, f"{table.name}: no entry {key}")
        if update_type == U.MODIFY:
            table.put(key, self._action(table, entry))
        elif update_type == U.DELETE:
            table.remove(key)
        else:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, f"bad update type {update_type}")
        return lambda: table.put(key, old)

    def read(self, query: p4runtime_pb2.TableEntry) -> list[p4runtime_pb2.TableEntry]:
        """What a TableEntry query asks for: the default entry (``is_default_action``), the
        entry of the key its match fields give (none when absent), or every entry; of one table,
        or of every table for table_id 0 (a wildcard read, which takes no key)."""
        if query.table_id == 0 and query.match:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, "a read by key needs a table id")
        tables = self.tables.values() if query.table_id == 0 else [self._table(query.table_id)]
        found = []
        for table in tables:
            if query.is_default_action:
                found.append(self._default_message(table))
                continue
            if table.info.is_const_table:
                found += self._const_entries(table, query.match)
                continue
            entries = table.entries
            if query.match:
                key = self._key(table, query)
                entries = {key: entries[key]} if key in entries else {}
            found += [self._entry_message(table, key, action) for key, action in entries.items()]
        return found

    def _const_entries(self, table: Table, match) -> list[p4runtime_pb2.TableEntry]:
        """A const table's entries as BMv2 reads them, from their twin (``CONST_ENTRIES``): a
        field that matches anything left out, PI's priorities; with ``match``, the entries whose
        match is exactly that."""
        twin = CONST_ENTRIES.get(table.name.rsplit(".", 1)[-1])
        if twin is None:
            raise StatusError(grpc.StatusCode.UNIMPLEMENTED,
                              f"{table.name}: this data plane has no twin of its const entries to read "
                              f"(the compiler's output lists them)")
        names, rows, action_name = twin
        ids = {mf.name: mf.id for mf in table.info.match_fields}
        action = self.p4info.obj(P4Type.action, action_name)
        found = []
        for index, (key, argument) in enumerate(rows):
            e = p4runtime_pb2.TableEntry(table_id=table.info.preamble.id, priority=_FIRST_CONST_PRIORITY - index)
            for name, bit in zip(names, key):
                if bit is not None:
                    e.match.add(field_id=ids[name]).ternary.CopyFrom(
                        p4runtime_pb2.FieldMatch.Ternary(value=canonical_bytes(bit), mask=canonical_bytes(1)))
            e.action.action.action_id = action.preamble.id
            e.action.action.params.add(param_id=action.params[0].id, value=canonical_bytes(int(argument)))
            if not match or list(e.match) == list(match):
                found.append(e)
        return found

    def _entry_message(self, table: Table, key, action: Action) -> p4runtime_pb2.TableEntry:
        e = p4runtime_pb2.TableEntry(table_id=table.info.preamble.id)
        if table.ternary:
            *key, e.priority = key
        for mf, value in zip(table.info.match_fields, key):
            if isinstance(value, int):
                e.match.add(field_id=mf.id).exact.value = canonical_bytes(value)
            elif value[1]:                     # a don't-care field is left out
                e.match.add(field_id=mf.id).ternary.CopyFrom(p4runtime_pb2.FieldMatch.Ternary(
                    value=canonical_bytes(value[0]), mask=canonical_bytes(value[1])))
        self._set_action(e, action)
        return e

    def _default_message(self, table: Table) -> p4runtime_pb2.TableEntry:
        e = p4runtime_pb2.TableEntry(table_id=table.info.preamble.id, is_default_action=True)
        if table.default is not None:
            self._set_action(e, table.default)
        return e

    def _set_action(self, entry: p4runtime_pb2.TableEntry, action: Action) -> None:
        info = self.p4info.obj(P4Type.action, action.name)
        entry.action.action.action_id = info.preamble.id
        ids = {p.name: p.id for p in info.params}
        for name, value in action.params:
            entry.action.action.params.add(param_id=ids[name], value=canonical_bytes(value))


def _ternary(m: p4runtime_pb2.FieldMatch | None, bitwidth: int, where: str) -> Ternary:
    """A ternary field's ``(value, mask)``: (0, 0) when left out (don't care; P4Runtime leaves
    such a field out, so an all-zero mask is refused, as are value bits outside the mask)."""
    if m is None:
        return 0, 0
    if not m.HasField("ternary"):
        raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, f"{where}: must be a ternary match")
    value = _decode_field(m.ternary.value, bitwidth, where)
    mask = _decode_field(m.ternary.mask, bitwidth, where)
    if not mask or value & ~mask:
        raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{where}: a ternary match needs a non-zero mask covering every value bit "
                          f"(value {value:#x}, mask {mask:#x}); leave a don't-care field out")
    return value, mask


@dataclass(frozen=True)
class Replica:
    port: int
    instance: int


class MulticastGroups:
    """The packet replication engine's multicast groups."""

    def __init__(self, mirror: StateMirror | None = None) -> None:
        self.groups: dict[int, tuple[Replica, ...]] = {}
        self.mirror = mirror

    def _set(self, gid: int, replicas: tuple[Replica, ...] | None) -> None:
        if replicas is None:
            self.groups.pop(gid, None)
        else:
            self.groups[gid] = replicas
        if self.mirror:
            self.mirror.group_changed(gid, replicas)

    def write(self, update_type: int, entry: p4runtime_pb2.MulticastGroupEntry):
        gid = entry.multicast_group_id
        U = p4runtime_pb2.Update
        if gid == 0:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, "multicast group 0 is reserved")
        replicas = tuple(Replica(r.egress_port, r.instance) for r in entry.replicas)
        if len(set(replicas)) != len(replicas):
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                              f"multicast group {gid}: duplicate replicas")
        old = self.groups.get(gid)
        if update_type == U.INSERT and old is not None:
            raise StatusError(grpc.StatusCode.ALREADY_EXISTS, f"multicast group {gid} exists")
        if update_type in (U.MODIFY, U.DELETE) and old is None:
            raise StatusError(grpc.StatusCode.NOT_FOUND, f"no multicast group {gid}")
        self._set(gid, None if update_type == U.DELETE else replicas)
        return lambda: self._set(gid, old)

    def read(self, query: p4runtime_pb2.MulticastGroupEntry):
        """The group the query names (NOT_FOUND when there is none), or every group for id 0."""
        if query.multicast_group_id and query.multicast_group_id not in self.groups:
            raise StatusError(grpc.StatusCode.NOT_FOUND, f"no multicast group {query.multicast_group_id}")
        for gid, replicas in sorted(self.groups.items()):
            if query.multicast_group_id in (0, gid):
                e = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=gid)
                for r in replicas:
                    e.replicas.add(egress_port=r.port, instance=r.instance)
                yield e


def _in_range(index: int, array: np.ndarray) -> int:
    """``index`` when ``array`` has that cell, else OUT_OF_RANGE (BMv2 answers UNKNOWN here; the
    code gRPC has for it names the problem)."""
    if not 0 <= index < array.size:
        raise StatusError(grpc.StatusCode.OUT_OF_RANGE, f"counter index {index} >= {array.size}")
    return index


class Counters:
    """Indexed packet counters, sized from the P4Info; ``arrays`` gives their cells when they
    live elsewhere (read-only views of the native core's counters)."""

    def __init__(self, p4info: P4Info, arrays: dict[str, np.ndarray] | None = None,
                 set_cell: Callable[[str, int, int], None] | None = None) -> None:
        """``set_cell(name, index, value)`` writes a cell of ``arrays`` when they are views."""
        self.p4info = p4info
        self.arrays: dict[str, np.ndarray] = arrays or {
            p4info.local_name(c.preamble.name): np.zeros(c.size, dtype=np.int64)
            for c in p4info.message.counters
        }
        self._set_cell = set_cell or (lambda name, index, value: self.arrays[name].__setitem__(index, value))
        self._by_id = {c.preamble.id: p4info.local_name(c.preamble.name) for c in p4info.message.counters}

    def _name(self, counter_id: int) -> str:
        """The counter of ``counter_id``; INVALID_ARGUMENT (as BMv2) when the P4Info has none."""
        if counter_id not in self._by_id:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, f"no counter with id {counter_id}")
        return self._by_id[counter_id]

    def count(self, name: str, index: int) -> None:
        array = self.arrays[name]
        if 0 <= index < array.size:  # BMv2 ignores out-of-range counter indices too
            array[index] += 1

    def write(self, update_type: int, entry: p4runtime_pb2.CounterEntry):
        """MODIFY one indexed counter's packet count (as BMv2 allows); returns an undo."""
        if update_type != p4runtime_pb2.Update.MODIFY:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, "counter entries can only be modified")
        name = self._name(entry.counter_id)
        array = self.arrays[name]
        if not entry.HasField("index"):
            raise StatusError(grpc.StatusCode.UNIMPLEMENTED, "writing every index of a counter is not supported")
        i = _in_range(entry.index.index, array)
        old = int(array[i])
        self._set_cell(name, i, entry.data.packet_count)
        return lambda: self._set_cell(name, i, old)

    def read(self, query: p4runtime_pb2.CounterEntry):
        ids = [query.counter_id] if query.counter_id else list(self._by_id)
        for cid in ids:
            array = self.arrays[self._name(cid)]
            indices = [_in_range(query.index.index, array)] if query.HasField("index") else range(array.size)
            for i in indices:
                e = p4runtime_pb2.CounterEntry(counter_id=cid)
                e.index.index = i
                e.data.packet_count = int(array[i])
                yield e
