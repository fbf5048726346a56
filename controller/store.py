"""SQLite persistence of jobs, workers and grants, so a restarted controller rebuilds the
switch from it and running jobs keep their grants.

Every failure of the database (full, read-only, missing folder, I/O error) is a ``StoreError``
naming the file, what could not be done and what to do, with the gRPC status a request it fails
is answered with; the store is written once at open, so one the controller cannot write is found
at start."""

from __future__ import annotations

import errno
import functools
import json
import sqlite3
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable, TypeVar

import grpc

from inagg.controller.allocator import Demand, JobState, Placement

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id INTEGER PRIMARY KEY, name TEXT NOT NULL, token TEXT NOT NULL,
    switch TEXT, job_index INTEGER, state TEXT, transport TEXT NOT NULL DEFAULT 'udp',
    host_only INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS workers (
    job_id INTEGER NOT NULL, rank INTEGER NOT NULL, address TEXT NOT NULL, mac TEXT NOT NULL,
    qp INTEGER NOT NULL DEFAULT 0, rkey INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, rank)
);
CREATE TABLE IF NOT EXISTS activations (
    job_id INTEGER NOT NULL, epoch INTEGER NOT NULL, boundary INTEGER NOT NULL,
    activated INTEGER NOT NULL, PRIMARY KEY (job_id, epoch, boundary)
);
"""
# Columns added since the first schema: (table, column, declaration). A store written by an
# older controller gets them with their defaults, so its jobs keep running after an upgrade.
ADDED_COLUMNS = (
    ("jobs", "transport", "TEXT NOT NULL DEFAULT 'udp'"),
    ("jobs", "host_only", "INTEGER NOT NULL DEFAULT 0"),
    ("workers", "qp", "INTEGER NOT NULL DEFAULT 0"),
    ("workers", "rkey", "INTEGER NOT NULL DEFAULT 0"),
    ("jobs", "tree", "TEXT"),
    ("jobs", "nonce", "TEXT NOT NULL DEFAULT ''"),
    ("jobs", "stall", "TEXT NOT NULL DEFAULT '{}'"),
)


def state_to_json(s: JobState) -> str:
    return json.dumps(asdict(s))


def state_from_dict(d: dict) -> JobState:
    """A JobState as ``asdict`` wrote it (the fields a tree added absent from older rows)."""
    return JobState(d["job_id"], Demand(**d["demand"]), Placement(**d["active"]),
                    Placement(**d["pending"]) if d["pending"] else None, d["drained"], d["order"],
                    d.get("fixed", False), d.get("children", 0))


def state_from_json(text: str) -> JobState:
    return state_from_dict(json.loads(text))


class StoreError(RuntimeError):
    """The controller's database failed; ``code``: how a request it fails is answered."""

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.code = code


# sqlite error name -> (gRPC code, what the operator does about it)
_REMEDIES = {
    "SQLITE_FULL": (grpc.StatusCode.RESOURCE_EXHAUSTED, "free space on its filesystem"),
    "SQLITE_READONLY": (grpc.StatusCode.UNAVAILABLE,
                        "make the file and its folder writable by the controller's user"),
    "SQLITE_CANTOPEN": (grpc.StatusCode.UNAVAILABLE,
                        "check that its folder exists and the controller's user may write there"),
}


def store_error(path: str, doing: str, e: sqlite3.Error) -> StoreError:
    """``e`` as a StoreError naming the database, what failed and what to do."""
    name = getattr(e, "sqlite_errorname", "")
    code, remedy = next((v for k, v in _REMEDIES.items() if name.startswith(k)),
                        (grpc.StatusCode.UNAVAILABLE, "check its filesystem"))
    return StoreError(f"controller database {path}: cannot {doing}: {e}; {remedy}", code)


F = TypeVar("F", bound=Callable)


def does(doing: str) -> Callable[[F], F]:
    """A Store method whose sqlite errors become ``StoreError``s saying it could not ``doing``."""
    def wrap(method: F) -> F:
        @functools.wraps(method)
        def guarded(self: "Store", *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except sqlite3.Error as e:
                raise store_error(self.path, doing, e) from None
        return guarded  # type: ignore[return-value]
    return wrap


class Store:
    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        self._open()

    @does("open it for writing")
    def _open(self) -> None:
        """Connect, bring the schema up to date, and write once (a read-only file opens
        without a word: its first write would fail)."""
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.db.executescript(SCHEMA)
        for table, column, decl in ADDED_COLUMNS:
            have = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('writer', 'inagg-controller')")

    @property
    def mark_path(self) -> Path | None:
        """The job-id high-water mark's own file beside the database (``<database>.ids``), or
        None for an in-memory database."""
        return None if self.path == ":memory:" or self.path.startswith("file:") else Path(self.path + ".ids")

    def _read_mark(self) -> int:
        """The next job id the mark file holds (0: none, or unreadable: the database and the
        switches still count)."""
        try:
            return int(self.mark_path.read_text().strip()) if self.mark_path else 0
        except (OSError, ValueError):
            return 0

    def _write_mark(self, next_id: int) -> None:
        """Write the mark file (a new file renamed over the old: never half written); a failure
        is a StoreError, as the database's own."""
        if self.mark_path is None:
            return
        tmp = self.mark_path.with_name(self.mark_path.name + ".tmp")
        try:
            tmp.write_text(f"{next_id}\n")
            tmp.replace(self.mark_path)
        except OSError as e:
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            remedy = ("free space on its filesystem" if full else
                      _REMEDIES["SQLITE_READONLY"][1] if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
                      else "check its filesystem")
            raise StoreError(f"controller database {self.path}: cannot write its job id mark {self.mark_path}"
                             f"{' (its filesystem is full)' if full else ''}: {e}; {remedy}",
                             grpc.StatusCode.RESOURCE_EXHAUSTED if full else grpc.StatusCode.UNAVAILABLE) from None

    @does("allocate a job id")
    def next_job_id(self, floor: int = 1) -> int:
        """A job id never used before (a slot's owner tag must never match a past job): above
        the database's mark, the mark file's (``<database>.ids``, which outlives a database
        that was deleted or emptied) and ``floor`` (the controller's: above every job a switch
        holds). The mark file is written before the id is handed out."""
        with self.db:
            row = self.db.execute("SELECT value FROM meta WHERE key='next_job_id'").fetchone()
            job_id = max(int(row[0]) if row else 1, self._read_mark(), floor)
            if job_id > 0xFFFF:
                raise RuntimeError("job ids exhausted (65535 jobs created)")
            self._write_mark(job_id + 1)
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('next_job_id', ?)", (str(job_id + 1),))
        return job_id

    @does("read the job id mark")
    def job_id_mark(self) -> int:
        """The next job id as the database and the mark file know it (1: neither knows one)."""
        row = self.db.execute("SELECT value FROM meta WHERE key='next_job_id'").fetchone()
        return max(int(row[0]) if row else 1, self._read_mark(), 1)

    @does("record a new job")
    def create_job(self, job_id: int, name: str, token: str, demand: Demand, transport: str,
                   host_only: bool = False, nonce: str = "") -> None:
        self.db.execute("INSERT INTO jobs (job_id, name, token, state, transport, host_only, nonce) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (job_id, name, token, json.dumps({"demand": asdict(demand)}), transport,
                         int(host_only), nonce))

    @does("record a joining rank")
    def add_worker(self, job_id: int, rank: int, member: tuple[str, str, int, int]) -> None:
        """``member``: the worker's address, MAC, QP and rkey (service.Member)."""
        self.db.execute("INSERT OR REPLACE INTO workers (job_id, rank, address, mac, qp, rkey) "
                        "VALUES (?, ?, ?, ?, ?, ?)", (job_id, rank, *member))

    @does("save the jobs' grants")
    def save(self, states: Iterable[tuple[JobState, str | None, int | None, str | None, str]],
             gone: Iterable[int]) -> None:
        """In one transaction: each (state, switch, job index, tree record or None, stall
        record: ``jobs.stall_record``), and the rows of the jobs ``gone`` (ended or failed)
        deleted."""
        with self.db:
            self.db.executemany("UPDATE jobs SET state=?, switch=?, job_index=?, tree=?, stall=? WHERE job_id=?",
                                [(state_to_json(s), switch, index, tree, stall, s.job_id)
                                 for s, switch, index, tree, stall in states])
            for job_id in gone:
                for table in ("jobs", "workers", "activations"):
                    self.db.execute(f"DELETE FROM {table} WHERE job_id=?", (job_id,))

    @does("read the job ids")
    def job_ids(self) -> set[int]:
        return {row[0] for row in self.db.execute("SELECT job_id FROM jobs")}

    @does("record an activation")
    def record_activation(self, job_id: int, epoch: int, boundary: int, activated: bool) -> bool:
        """The first decision for (job, epoch, boundary) wins; returns the recorded one."""
        self.db.execute("INSERT OR IGNORE INTO activations VALUES (?, ?, ?, ?)",
                        (job_id, epoch, boundary, int(activated)))
        row = self.db.execute("SELECT activated FROM activations WHERE job_id=? AND epoch=? AND boundary=?",
                              (job_id, epoch, boundary)).fetchone()
        return bool(row[0])

    @does("read an activation")
    def activation(self, job_id: int, epoch: int, boundary: int) -> bool | None:
        row = self.db.execute("SELECT activated FROM activations WHERE job_id=? AND epoch=? AND boundary=?",
                              (job_id, epoch, boundary)).fetchone()
        return None if row is None else bool(row[0])

    @does("count activations")
    def activation_counts(self) -> dict[int, int]:
        """Grant changes each job's workers activated: {job_id: distinct epochs activated}."""
        rows = self.db.execute("SELECT job_id, COUNT(DISTINCT epoch) FROM activations "
                               "WHERE activated=1 GROUP BY job_id").fetchall()
        return dict(rows)

    @does("read the jobs")
    def jobs(self) -> list[dict]:
        rows = self.db.execute(
            "SELECT job_id, name, token, switch, job_index, state, transport, host_only, tree, nonce, stall "
            "FROM jobs").fetchall()
        out = []
        for job_id, name, token, switch, job_index, state, transport, host_only, tree, nonce, stall in rows:
            workers = self.db.execute("SELECT rank, address, mac, qp, rkey FROM workers "
                                      "WHERE job_id=? ORDER BY rank", (job_id,)).fetchall()
            out.append({"job_id": job_id, "name": name, "token": token, "switch": switch,
                        "job_index": job_index, "state": state, "workers": workers,
                        "transport": transport, "host_only": bool(host_only), "tree": tree,
                        "nonce": nonce, "stall": stall})
        return out
