"""Results database: every candidate measured or chosen, keyed by subprogram and target.

SQLite (stdlib ``sqlite3``) in WAL mode, so several processes can read and write one file at once;
every write is one ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction, so a process killed mid-write
leaves the file as it was before that transaction. Tables::

    meta(key, value)                 format = "mirage_py.results", schema_version = 2
    workloads(id, hash, name, program_json, created)
        hash: Program.structural_hash() of the subprogram; program_json: its JSON
    records(id, workload_id, target, graph_hash, graph_json, annotations_json,
            predicted_us, measured_us, runner, samples_json, chosen, verification_json,
            tool_version, created, answer_key)
        annotations_json: {"threads": [...], "stages": [...], "schedule": {...} or null}
        answer_key: what made the record besides its program and target -- the package's
            source, the cost model, the settings (``superopt.store.AnswerKey``)
        chosen = 1: superopt's verified answer for (workload, target, answer_key); the latest
            one is reused
    kept(workload_id, target, answer_key, kind, cap, doc_json, created)
        a result kept whole: a completed search's options, a whole program's answer
    captures(key, program, constants, created)
        the torch frontend's captured graphs (``frontend_torch/capture_cache.py``): key: what
        the capture depends on (module code and state, input signature, versions); program:
        torch.export's serialised graph without weights; constants: its non-buffer constants

A file of schema 1 is upgraded in place when opened (its records get an empty answer key, so
they stay in the file as training data and are never served as answers); schema 2 gains the
``kept`` table, 3 the ``captures`` table.

Default file: ``$MIRAGE_PY_DATABASE`` if set (``off``/``0``/empty disables it), else
``$XDG_CACHE_HOME/mirage_py/results.sqlite`` (``~/.cache`` when XDG_CACHE_HOME is unset).
A file that is not SQLite, an SQLite file of another program, or one written by a newer schema
raises :class:`~mirage_py.errors.DatabaseError` naming the file, never a raw sqlite3 error.

One writer per file on a cluster: ``superopt`` writes only in the driver process (never in Ray
tasks), and the file should live on the driver's local disk, not a shared file system (SQLite's
locks are unreliable on NFS). To reuse results on another machine, ship a copy:
:meth:`ResultsDB.snapshot` writes a consistent single file, :meth:`ResultsDB.merge` adds another
file's records, each once (docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import random
import sqlite3
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from ..errors import DatabaseError

FORMAT = "mirage_py.results"
SCHEMA_VERSION = 4
ENV = "MIRAGE_PY_DATABASE"
_OFF = ("", "0", "off", "none", "false", "no")

# results kept whole for other calls (schema 3), one per (subprogram, target, answer key, kind):
# a completed search's options ("search:<settings>", "floor:<settings>"; ``cap``: the bound its
# kernel sequences were kept under, NULL: none) or a whole program's answer ("program:...")
_KEPT = (
    "CREATE TABLE IF NOT EXISTS kept (workload_id INTEGER NOT NULL REFERENCES "
    "workloads(id), target TEXT NOT NULL, answer_key TEXT NOT NULL, kind TEXT NOT NULL, "
    "cap REAL, doc_json TEXT NOT NULL, created TEXT NOT NULL, "
    "PRIMARY KEY (workload_id, target, answer_key, kind))")

# captured torch graphs (schema 4), one per capture key (``frontend_torch/capture_cache.py``)
_CAPTURES = (
    "CREATE TABLE IF NOT EXISTS captures (key TEXT PRIMARY KEY, program BLOB NOT NULL, "
    "constants BLOB NOT NULL, created TEXT NOT NULL)")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS workloads (id INTEGER PRIMARY KEY, hash TEXT NOT NULL UNIQUE, "
    "name TEXT, program_json TEXT NOT NULL, created TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY, "
    "workload_id INTEGER NOT NULL REFERENCES workloads(id), target TEXT NOT NULL, "
    "graph_hash TEXT NOT NULL, graph_json TEXT NOT NULL, annotations_json TEXT NOT NULL, "
    "predicted_us REAL, measured_us REAL, runner TEXT, samples_json TEXT, "
    "chosen INTEGER NOT NULL DEFAULT 0, verification_json TEXT, tool_version TEXT NOT NULL, "
    "created TEXT NOT NULL, answer_key TEXT NOT NULL DEFAULT '')",
    "CREATE INDEX IF NOT EXISTS records_lookup ON records(workload_id, target, chosen)",
    _KEPT,
    _CAPTURES,
)


def default_path() -> str | None:
    """Where ``superopt`` keeps results when not told (None: disabled by the environment)."""
    env = os.environ.get(ENV)
    if env is not None:
        return None if env.strip().lower() in _OFF else os.path.expanduser(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mirage_py", "results.sqlite")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _tool_version() -> str:
    from ..version import __version__
    return __version__


def _num(x: Any) -> float | None:
    """NaN/inf are not JSON and SQLite stores inf as REAL fine, but keep NULL for unknowns."""
    return None if x is None else float(x)


@dataclass
class TuningRecord:
    """One row of ``records`` (``graph`` and ``annotations`` as JSON documents)."""

    graph: dict
    target: str
    graph_hash: str
    annotations: dict = field(default_factory=dict)
    predicted_us: float | None = None
    measured_us: float | None = None
    runner: str | None = None
    samples: list | None = None
    chosen: bool = False
    verification: dict | None = None
    tool_version: str = ""
    created: str = ""
    workload_hash: str = ""
    id: int | None = None
    answer_key: str = ""  # what made it besides program and target (superopt.store.AnswerKey)


@dataclass(frozen=True)
class Workload:
    hash: str
    name: str
    program: dict


class ResultsDB:
    """A results database file (see module doc). Safe to share between processes; one object per
    process (a forked child reopens its own connection)."""

    def __init__(self, path: str, timeout: float = 30.0):
        self.path = os.path.abspath(os.path.expanduser(str(path)))
        self.timeout = timeout
        self._con: sqlite3.Connection | None = None
        self._pid = -1
        self._connect()

    # -- connection and schema ----------------------------------------------------------------
    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.DatabaseError as e:
            msg = str(e)
            if "not a database" in msg or "malformed" in msg or "corrupt" in msg:
                raise DatabaseError(f"{self.path}: not a usable mirage_py results database "
                                    f"({msg}) while trying to {what}; delete the file or use "
                                    "another path") from None
            if "locked" in msg or "busy" in msg:
                raise DatabaseError(f"{self.path}: database busy for more than {self.timeout} s "
                                    f"while trying to {what}") from None
            raise DatabaseError(f"{self.path}: cannot {what}: {msg}") from None

    def _connect(self) -> sqlite3.Connection:
        if self._con is not None and self._pid == os.getpid():
            return self._con
        d = os.path.dirname(self.path)
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            raise DatabaseError(f"{self.path}: cannot create directory {d} ({e.strerror})") \
                from None
        if os.path.isdir(self.path):
            raise DatabaseError(f"{self.path} is a directory, not a results database file")
        # SQLite answers "locked" at once, without waiting out the busy timeout, when opening
        # races another process that creates the schema or switches the journal to WAL: retry
        # until the timeout is spent (a fork-started CI run hit it with four writers)
        deadline = time.monotonic() + self.timeout
        with self._guard("open it"):
            while True:
                con = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                                      check_same_thread=False)
                try:
                    self._check_or_create(con)  # first: never switch a foreign file to WAL
                    con.execute("PRAGMA journal_mode=WAL")
                    con.execute("PRAGMA synchronous=NORMAL")
                    con.execute("PRAGMA foreign_keys=ON")
                    break
                except sqlite3.OperationalError as e:
                    con.close()
                    busy = "locked" in str(e) or "busy" in str(e)
                    if not busy or time.monotonic() > deadline:
                        raise
                    time.sleep(0.02 + 0.08 * random.random())
                except BaseException:
                    con.close()
                    raise
        self._con, self._pid = con, os.getpid()
        return con

    def _tables(self, con: sqlite3.Connection) -> set[str]:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def _check_or_create(self, con: sqlite3.Connection) -> None:
        tables = self._tables(con)
        if not tables:
            con.execute("BEGIN IMMEDIATE")  # another process may be creating it right now
            try:
                tables = self._tables(con)
                if not tables:
                    for stmt in _SCHEMA:
                        con.execute(stmt)
                    con.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)",
                                    [("format", FORMAT), ("schema_version", str(SCHEMA_VERSION)),
                                     ("created", _now())])
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            tables = self._tables(con)
        if "meta" not in tables:
            raise DatabaseError(f"{self.path} is an SQLite file of another program (tables: "
                                f"{', '.join(sorted(tables))}), not a mirage_py results database; "
                                "use another path")
        meta = dict(con.execute("SELECT key, value FROM meta"))
        if meta.get("format") != FORMAT:
            raise DatabaseError(f"{self.path} is not a mirage_py results database (format "
                                f"{meta.get('format')!r}); use another path")
        try:
            version = int(meta.get("schema_version", ""))
        except ValueError:
            raise DatabaseError(f"{self.path}: schema version {meta.get('schema_version')!r} "
                                "is not a number") from None
        if version > SCHEMA_VERSION:
            raise DatabaseError(f"{self.path} was written by a newer mirage_py (schema {version}, "
                                f"this one reads {SCHEMA_VERSION}); upgrade or use another path")
        missing = {"workloads", "records"} - tables
        if missing:
            raise DatabaseError(f"{self.path}: results database lacks table(s) "
                                f"{', '.join(sorted(missing))}; delete the file")
        if version < SCHEMA_VERSION:
            self._upgrade(con)

    @staticmethod
    def _upgrade(con: sqlite3.Connection) -> None:
        """Schema 1 -> 2: records gain ``answer_key`` (empty for the old ones, which are then
        never served: nothing says which code made them); 2 -> 3: the ``kept`` table; 3 -> 4: the
        ``captures`` table."""
        con.execute("BEGIN IMMEDIATE")  # another process may be upgrading it right now
        try:
            cols = {r[1] for r in con.execute("PRAGMA table_info(records)")}
            if "answer_key" not in cols:
                con.execute("ALTER TABLE records ADD COLUMN answer_key TEXT NOT NULL DEFAULT ''")
            con.execute(_KEPT)
            con.execute(_CAPTURES)
            con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                        (str(SCHEMA_VERSION),))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def close(self) -> None:
        if self._con is not None and self._pid == os.getpid():
            self._con.close()
        self._con = None

    def __enter__(self) -> "ResultsDB":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ResultsDB({self.path!r})"

    # -- writing ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _writing(self, program: Any, what: str) -> Iterator[tuple[sqlite3.Connection, int]]:
        """One write transaction for subprogram ``program`` (a Program, or (hash, name, json)):
        its workload row made if new, ``(connection, workload id)`` handed to the body, all of
        it committed or -- if anything fails or the process dies -- none."""
        if isinstance(program, tuple):
            h, name, pjson = program
        else:
            h, name, pjson = program.structural_hash(), program.name, program.to_json()
        con = self._connect()
        with self._guard(what):
            con.execute("BEGIN IMMEDIATE")
            try:
                con.execute("INSERT OR IGNORE INTO workloads (hash, name, program_json, created) "
                            "VALUES (?, ?, ?, ?)", (h, name, json.dumps(pjson), _now()))
                wid = con.execute("SELECT id FROM workloads WHERE hash = ?", (h,)).fetchone()[0]
                yield con, wid
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    con.execute("ROLLBACK")
                raise

    def add(self, program: Any, records: Iterable[TuningRecord]) -> list[int]:
        """Store ``records`` for subprogram ``program`` (a Program, or (hash, name, json)) in one
        transaction: all of them or, if anything fails or the process dies, none."""
        ids: list[int] = []
        with self._writing(program, "write records") as (con, wid):
            version = _tool_version()
            for r in records:
                cur = con.execute(
                    "INSERT INTO records (workload_id, target, graph_hash, graph_json, "
                    "annotations_json, predicted_us, measured_us, runner, samples_json, "
                    "chosen, verification_json, tool_version, created, answer_key) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (wid, r.target, r.graph_hash, json.dumps(r.graph, sort_keys=True),
                     json.dumps(r.annotations, sort_keys=True), _num(r.predicted_us),
                     _num(r.measured_us), r.runner,
                     None if r.samples is None else json.dumps(list(r.samples)),
                     int(bool(r.chosen)),
                     None if r.verification is None else json.dumps(r.verification),
                     r.tool_version or version, r.created or _now(), r.answer_key))
                ids.append(cur.lastrowid)
        return ids

    def keep(self, program: Any, target: str, answer_key: str, kind: str,
             cap: float | None, doc: dict) -> None:
        """Keep a result of ``program`` whole (a completed search's options, a program's
        answer: ``doc`` as JSON) made under ``answer_key``, as ``kind``, replacing an earlier
        one (a tuning that finished what its search left pending is the newer one)."""
        if not answer_key:
            return
        with self._writing(program, "keep a result") as (con, wid):
            con.execute("INSERT OR REPLACE INTO kept (workload_id, target, answer_key, kind, "
                        "cap, doc_json, created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (wid, target, answer_key, kind, _num(cap),
                         json.dumps(doc, sort_keys=True), _now()))

    def kept(self, workload: str, target: str, answer_key: str,
             kind: str) -> tuple[float | None, dict] | None:
        """The result kept for subprogram ``workload`` (its hash), target, answer key and kind:
        ``(cap, doc)``, or None."""
        if not answer_key:
            return None
        with self._guard("look up a kept result"):
            row = self._connect().execute(
                "SELECT k.cap, k.doc_json FROM kept k JOIN workloads w ON w.id = k.workload_id "
                "WHERE w.hash = ? AND k.target = ? AND k.answer_key = ? AND k.kind = ?",
                (workload, target, answer_key, kind)).fetchone()
        if row is None:
            return None
        try:
            return row[0], json.loads(row[1])
        except ValueError:
            return None  # a damaged row: compute it again

    def keep_capture(self, key: str, program: bytes, constants: bytes) -> None:
        """Keep a captured graph under ``key`` (``frontend_torch/capture_cache.py``)."""
        with self._guard("keep a captured graph"):
            con = self._connect()
            con.execute("BEGIN IMMEDIATE")
            try:
                con.execute("INSERT OR REPLACE INTO captures (key, program, constants, created) "
                            "VALUES (?, ?, ?, ?)", (key, program, constants, _now()))
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    con.execute("ROLLBACK")
                raise

    def capture(self, key: str) -> tuple[bytes, bytes] | None:
        """The captured graph kept under ``key``: ``(program, constants)``, or None."""
        with self._guard("look up a captured graph"):
            row = self._connect().execute(
                "SELECT program, constants FROM captures WHERE key = ?", (key,)).fetchone()
        return None if row is None else (bytes(row[0]), bytes(row[1]))

    # -- reading ------------------------------------------------------------------------------
    _COLS = ("r.id, w.hash, r.target, r.graph_hash, r.graph_json, r.annotations_json, "
             "r.predicted_us, r.measured_us, r.runner, r.samples_json, r.chosen, "
             "r.verification_json, r.tool_version, r.created, r.answer_key")

    @staticmethod
    def _record(row: tuple) -> TuningRecord:
        (rid, wh, target, gh, gj, aj, pred, meas, runner, sj, chosen, vj, tv, created,
         key) = row
        return TuningRecord(json.loads(gj), target, gh, json.loads(aj), pred, meas, runner,
                      None if sj is None else json.loads(sj), bool(chosen),
                      None if vj is None else json.loads(vj), tv, created, wh, rid, key)

    def records(self, *, workload: str | None = None, target: str | None = None,
                measured: bool | None = None, chosen: bool | None = None) -> list[TuningRecord]:
        """Records in insertion order, optionally filtered."""
        where, args = [], []
        if workload is not None:
            where.append("w.hash = ?")
            args.append(workload)
        if target is not None:
            where.append("r.target = ?")
            args.append(target)
        if measured is not None:
            where.append("r.measured_us IS NOT NULL" if measured else "r.measured_us IS NULL")
        if chosen is not None:
            where.append("r.chosen = ?")
            args.append(int(chosen))
        sql = (f"SELECT {self._COLS} FROM records r JOIN workloads w ON w.id = r.workload_id"
               + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.id")
        with self._guard("read records"):
            rows = self._connect().execute(sql, args).fetchall()
            return [self._record(row) for row in rows]

    def lookup(self, workload: str, target: str, answer_key: str) -> TuningRecord | None:
        """The latest chosen (verified) record for (subprogram hash, target) made under
        ``answer_key`` (the code, cost model and settings: ``superopt.store.AnswerKey``), or
        None. Answers made under other keys stay in the file (training data) but are not
        reused: their search space, cost model, code generation or settings differ."""
        if not answer_key:
            return None  # records without a key (schema 1) never answer
        with self._guard("look up a result"):
            row = self._connect().execute(
                f"SELECT {self._COLS} FROM records r JOIN workloads w ON w.id = r.workload_id "
                "WHERE w.hash = ? AND r.target = ? AND r.chosen = 1 AND r.answer_key = ? "
                "ORDER BY r.id DESC LIMIT 1", (workload, target, answer_key)).fetchone()
            return None if row is None else self._record(row)

    def workloads(self) -> list[Workload]:
        with self._guard("read workloads"):
            rows = self._connect().execute(
                "SELECT hash, name, program_json FROM workloads ORDER BY id").fetchall()
            return [Workload(h, n, json.loads(p)) for h, n, p in rows]

    def count(self) -> int:
        with self._guard("count records"):
            return self._connect().execute("SELECT COUNT(*) FROM records").fetchone()[0]

    def check(self) -> str:
        """SQLite's integrity check ("ok" when the file is consistent)."""
        with self._guard("check integrity"):
            return self._connect().execute("PRAGMA integrity_check").fetchone()[0]

    # -- shipping between machines (docs/cluster.md) -------------------------------------------
    def snapshot(self, path: str) -> str:
        """A consistent single-file copy of this database at ``path`` (SQLite's online backup,
        safe while other processes write; a plain ``cp`` can miss the ``-wal`` file): the file
        to ship to another machine whose runs should reuse these results."""
        dest = os.path.abspath(os.path.expanduser(str(path)))
        if dest == self.path:
            raise DatabaseError(f"{self.path}: cannot snapshot a database onto itself")
        if os.path.exists(dest):
            raise DatabaseError(f"{dest} exists; snapshot writes a new file")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with self._guard(f"copy it to {dest}"):
            out = sqlite3.connect(dest)
            try:
                self._connect().backup(out)
            finally:
                out.close()
        return dest

    _KEY = ("target", "graph_hash", "graph", "annotations", "predicted_us", "measured_us",
            "runner", "samples", "chosen", "verification", "tool_version", "created",
            "answer_key")

    def merge(self, other: "ResultsDB | str") -> int:
        """Add the records, kept results and captured graphs of another results database (a
        snapshot made elsewhere) that this one lacks; a record already here (same workload and every field but
        the row id) is not added again, so merging the same file twice adds nothing; a kept
        result (a completed search, a whole program's answer) or captured graph is added where
        this database has none under the same key. Returns the number of rows added."""
        src = other if isinstance(other, ResultsDB) else ResultsDB(os.fspath(other))
        if src.path == self.path:
            return 0
        programs = {w.hash: w for w in src.workloads()}
        have = {self._record_key(r) for r in self.records()}
        by_workload: dict[str, list[TuningRecord]] = {}
        for r in src.records():
            k = self._record_key(r)
            if k not in have:
                have.add(k)
                by_workload.setdefault(r.workload_hash, []).append(r)
        added = 0
        for h, recs in by_workload.items():
            w = programs[h]
            added += len(self.add((w.hash, w.name, w.program), recs))
        for h, target, key, kind, cap, doc in src._kept_rows():
            if self.kept(h, target, key, kind) is None:
                w = programs[h]
                self.keep((w.hash, w.name, w.program), target, key, kind, cap, doc)
                added += 1
        for key, program, constants in src._capture_rows():
            if self.capture(key) is None:
                self.keep_capture(key, program, constants)
                added += 1
        return added

    def _capture_rows(self) -> list[tuple[str, bytes, bytes]]:
        with self._guard("read captured graphs"):
            return [(k, bytes(p), bytes(c)) for k, p, c in self._connect().execute(
                "SELECT key, program, constants FROM captures ORDER BY key").fetchall()]

    def _kept_rows(self) -> list[tuple[str, str, str, str, float | None, dict]]:
        """Every kept result: (workload hash, target, answer key, kind, cap, doc)."""
        with self._guard("read kept results"):
            rows = self._connect().execute(
                "SELECT w.hash, k.target, k.answer_key, k.kind, k.cap, k.doc_json FROM kept k "
                "JOIN workloads w ON w.id = k.workload_id ORDER BY w.id").fetchall()
        return [(h, t, a, k, c, json.loads(d)) for h, t, a, k, c, d in rows]

    @classmethod
    def _record_key(cls, r: TuningRecord) -> tuple:
        return (r.workload_hash,) + tuple(json.dumps(getattr(r, f), sort_keys=True)
                                          for f in cls._KEY)


def open_database(database: Any = None) -> ResultsDB | None:
    """``superopt``'s ``database`` argument as a ResultsDB: None -> the default file (or none if
    disabled by ``$MIRAGE_PY_DATABASE``), False -> none, a path -> that file, a ResultsDB -> it."""
    if database is False:
        return None
    if isinstance(database, ResultsDB):
        return database
    if database is None or database is True:
        path = default_path()
        if path is None:
            return None
        try:
            return ResultsDB(path)
        except DatabaseError as e:
            if not os.access(os.path.dirname(path) or ".", os.W_OK) or "cannot create" in str(e):
                # the default place is not writable (read-only home, sandbox): carry on without
                warnings.warn(f"results database disabled: {e}", RuntimeWarning, stacklevel=2)
                return None
            raise  # a corrupt or foreign file: say so
    return ResultsDB(os.fspath(database))
