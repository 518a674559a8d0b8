"""The results database as the region layer uses it: the key an answer is stored under, the
typed answer it gives back, and the rows one structure records.

An answer is served only to the code that would have made it: its database key
(:class:`AnswerKey`) holds a fingerprint of the package's source (``version.source_fingerprint``),
the cost model, the measuring runner and every option that shapes an answer
(:class:`AnswerSettings`), next to the subprogram's structural hash and the target.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import Any

from ..errors import MirageError
from ..lax.program import Program
from ..tuning.annotations import AnnotatedGraph, Schedule, threads_of
from ..tuning.database import TuningRecord, ResultsDB
from ..tuning.runners import Measurement
from ..ugraph.graph import KernelGraph
from ..version import source_fingerprint
from .option import Option, option_key
from .result import RegionResult, SavedVerification
from .search import Explored, Settings, measures


@dataclass(frozen=True)
class AnswerSettings:
    """The options of one ``superopt`` call that shape its answers. Every field is part of the
    database key: an option that changes what comes back is one more field here (and the
    argument that sets it in ``superopt``)."""

    max_kernels: int = 3
    tune_top: int = 4
    tune_rounds: int = 8
    seed: int = 0
    verify_tests: int | None = None
    max_verify: int = 16
    measure_top: int = 4

    def search(self) -> Settings:
        """What a region's search needs of them."""
        return Settings(self.max_kernels, self.tune_top, self.tune_rounds, self.seed)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def describe(obj: Any) -> str:
    """A cost model (or runner) as text that names what makes its predictions: its class and
    its plain settings (numbers, strings, functions by name); an object can say it itself with
    an ``answer_key()`` method. The same for two processes running the same configuration."""
    own = getattr(obj, "answer_key", None)
    if callable(own):
        return str(own())
    kind = type(obj)
    parts = [f"{k}={_plain(v)}" for k, v in sorted(getattr(obj, "__dict__", {}).items())
             if not k.startswith("_") and _plain(v) is not None]
    return f"{kind.__module__}.{kind.__qualname__}({', '.join(parts)})"


def _plain(v: Any) -> str | None:
    """``v`` as stable text, or None when it has none (containers, objects: left out)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return repr(v)
    if callable(v) and hasattr(v, "__qualname__"):
        return f"{getattr(v, '__module__', '')}.{v.__qualname__}"
    return None


@dataclass(frozen=True)
class AnswerKey:
    """What made a stored answer besides its subprogram and target: the package's source, the
    cost model, the measuring runner ("" when none measures) and the settings. Answers are
    served only under an equal key (:attr:`digest`)."""

    source: str
    model: str
    runner: str
    settings: AnswerSettings

    @classmethod
    def of(cls, model: Any, runner: Any, settings: AnswerSettings) -> "AnswerKey":
        return cls(source_fingerprint(), describe(model),
                   getattr(runner, "name", type(runner).__name__) if measures(runner) else "",
                   settings)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | \
            {"settings": self.settings.to_json()}

    @cached_property
    def digest(self) -> str:
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class StoredAnswer:
    """A verified answer the database holds for a program (:func:`stored_answer`)."""

    graph: KernelGraph
    stages: tuple[int, ...]
    predicted_us: float  # by this run's cost model
    verification: SavedVerification
    schedule: Schedule | None
    measured_us: float | None
    untuned_us: float | None
    origin: str  # how it was found: "search", ...


def stored_answer(db: ResultsDB, program: Program, target, model,
                  key: AnswerKey) -> StoredAnswer | None:
    """The stored verified answer for ``program`` on ``target`` made under ``key``, or None (none
    there, or unusable)."""
    rec = db.lookup(program.structural_hash(), target.name, key.digest)
    if rec is None or not rec.verification:
        return None
    try:
        g = KernelGraph.from_json(rec.graph)
        stages = tuple(rec.annotations.get("stages", ()))
        sched = rec.annotations.get("schedule")
        return StoredAnswer(g, stages, model.predict(AnnotatedGraph(g, stages), target),
                            SavedVerification(**{k: rec.verification[k] for k in
                                                 ("equivalent", "bound", "tests_run",
                                                  "seconds")}),
                            Schedule.from_json(sched) if sched else None, rec.measured_us,
                            rec.annotations.get("untuned_us"), rec.annotations.get("source", ""))
    except (MirageError, KeyError, TypeError, ValueError):
        return None  # a damaged record: search again


def search_kind(settings: Any, floor: bool = False) -> str:
    """The database's name for a search's settings, all but its cap (``stored_exploration``)."""
    d = {k: v for k, v in asdict(settings).items() if k != "cap"}
    return ("floor:" if floor else "search:") + json.dumps(d, sort_keys=True)


def stored_exploration(db: ResultsDB, program: Program, target, key: AnswerKey,
                       settings: Any, floor: bool = False) -> Any:
    """A completed search of ``program`` made by another call under ``key`` with these
    settings (an ``Explored``), or None. A search kept under a cap serves a search whose cap is
    no higher (it kept every kernel sequence the new one would keep); an uncapped one, only an
    uncapped one."""
    got = db.kept(program.structural_hash(), target.name, key.digest,
                  search_kind(settings, floor))
    if got is None:
        return None
    cap, doc = got
    if (cap is None) != (settings.cap is None) or \
            (cap is not None and cap < settings.cap):
        return None
    try:
        return Explored.from_json(doc)
    except (MirageError, KeyError, TypeError, ValueError):
        return None  # a damaged row: search again


def keep_exploration(db: ResultsDB, program: Program, target, key: AnswerKey, settings: Any,
                     explored: Any, floor: bool = False) -> None:
    """Keep a search that ran to completion (cut-short ones are not kept) for other calls."""
    if explored.stats.timed_out or explored.stats.interrupted:
        return
    db.keep(program, target.name, key.digest, search_kind(settings, floor), settings.cap,
            explored.to_json())


def program_kind(sizes: Any, replayed: bool) -> str:
    """The kept-result kind of a whole program's answer: its valid sizes (a shape family's
    bucket) and whether it was replayed from another bucket's answer."""
    return "program:" + json.dumps({"sizes": dict(sizes or {}), "replayed": bool(replayed)},
                                   sort_keys=True)


def stored_program(db: ResultsDB, program: Program, target, key: AnswerKey, kind: str) -> Any:
    """A whole program's answer (``OptimizedProgram`` JSON) another call made under ``key``,
    or None."""
    got = db.kept(program.structural_hash(), target.name, key.digest, kind)
    return None if got is None else got[1]


def keep_program(db: ResultsDB, program: Program, target, key: AnswerKey, kind: str,
                 answer: Any) -> None:
    """Keep a whole program's answer (an ``OptimizedProgram``) for other calls."""
    db.keep(program, target.name, key.digest, kind, None, answer.to_json())


@dataclass(frozen=True)
class Recording:
    """What one structure leaves in the database: its naive graph (and its measurement), its
    options and their measurements (by option key), its verified answer if any, and whether its
    search ran to completion (only then is the answer marked for reuse)."""

    program: Program
    naive: KernelGraph
    naive_us: float
    naive_measured: Measurement | None
    options: list[Option]
    measured: dict[str, Measurement]
    chosen: RegionResult | None
    complete: bool


def record(db: ResultsDB, rec: Recording, target, key: AnswerKey, keep: int = 8) -> None:
    """One transaction per structure: every measurement, the ``keep`` best predictions, and the
    answer."""
    def row(ag: AnnotatedGraph, pred: float, sch, m: Measurement | None, **kw) -> TuningRecord:
        ann = {"threads": list(threads_of(ag.graph)), "stages": list(ag.stages_full()),
               "schedule": None if sch is None else sch.to_json()}
        ann.update(kw.pop("extra", {}))
        return TuningRecord(ag.graph.to_json(), target.name, ag.graph.structural_hash(), ann,
                      predicted_us=pred, measured_us=None if m is None else m.us,
                      runner=(m.runner if m is not None else "model"),
                      samples=None if m is None else list(m.samples), answer_key=key.digest,
                      **kw)

    rows: list[TuningRecord] = []
    if rec.naive_measured is not None:
        rows.append(row(AnnotatedGraph(rec.naive), rec.naive_us, None, rec.naive_measured,
                        extra={"source": "naive"}))
    for i, o in enumerate(rec.options):
        m = rec.measured.get(o.key)
        if m is not None or i < keep:
            rows.append(row(o.annotated, o.predicted_us, o.schedule, m))
    r = rec.chosen
    if r is not None:
        rows.append(row(r.annotated, r.estimated_us, r.schedule,
                        rec.measured.get(option_key(r.annotated)), chosen=rec.complete,
                        verification=SavedVerification.of(r.verification).to_json(),
                        extra={"source": r.source, "untuned_us": r.untuned_us}))
    if rows:
        db.add(rec.program, rows)


__all__ = ["AnswerSettings", "AnswerKey", "StoredAnswer", "Recording", "describe",
           "stored_answer", "record"]
