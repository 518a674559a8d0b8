"""Searching one program (a region): search -> rank -> tune, into ranked options
(:class:`~.option.Option`), and the runner's measurement of a few of them, wherever it runs.

``explore`` is the unit of work the region layer schedules: a pure function from a program and
settings to ranked, tuned options, so it can run in this process (its search spread over worker
processes by first-level plans) or as a job in a worker process of its own, one region each.
Verification and the results database stay with the caller (:mod:`.part`, :mod:`.store`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing as mproc
import queue as _queue
import sys
import time
from dataclasses import dataclass, field

from ..cost_model import AnalyticModel, CalibratedModel
from ..generator.kernel_search import Candidate, SearchStats, search, trace_from_json
from ..generator.rewrite import forms
from ..lax.program import Program
from ..layout.plan import planned_shared_memory
from ..targets import get_target
from ..tuning.annotations import AnnotatedGraph, Schedule, threads_of
from ..tuning.scheduler import TaskScheduler
from ..tuning.tuner import make_task
from ..ugraph.graph import GraphKernel, KernelGraph
from .option import Option, best_options


def default_model() -> AnalyticModel:
    """The analytic cost model with shared memory as the layout planner lays it out: what
    superopt ranks, tunes and reports with."""
    return AnalyticModel(smem_planner=planned_shared_memory)


def calibrated_model() -> CalibratedModel:
    """The calibrated analytic model (``cost_model="calibrated"``), with the same planner."""
    return CalibratedModel(smem_planner=planned_shared_memory)


@dataclass(frozen=True)
class Settings:
    """What a search of one program needs besides the program and the target."""

    max_kernels: int = 3
    tune_top: int = 4
    tune_rounds: int = 8
    seed: int = 0
    patience: int | None = None  # states without a candidate before a search gives up
    cap: float | None = None  # kernel sequences predicted above this are not extended
    defer_tuning: bool = False  # keep the structures to tune for :func:`tune_pending`


@dataclass
class Explored:
    """What :func:`explore` found: the options (tuned bests first, then the untuned rest, each
    ranked by (predicted time, structural hash)) and how the search went."""

    options: list[Option] = field(default_factory=list)
    stats: SearchStats = field(default_factory=SearchStats)
    candidates: int = 0
    best_untuned_us: float | None = None
    tune_rounds: int = 0
    tune_evaluations: int = 0
    # deferred tuning (``Settings.defer_tuning``): per form, the form's program and the
    # structures :func:`tuning_choice` picked, as JSON -- what :func:`tune_pending` tunes
    pending: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"options": [o.to_json() for o in self.options], "stats": self.stats.__dict__,
                "candidates": self.candidates, "best_untuned_us": self.best_untuned_us,
                "tune_rounds": self.tune_rounds, "tune_evaluations": self.tune_evaluations,
                "pending": self.pending}

    @classmethod
    def from_json(cls, d: dict) -> "Explored":
        return cls([Option.from_json(o) for o in d["options"]], SearchStats(**d["stats"]),
                   d["candidates"], d["best_untuned_us"], d["tune_rounds"],
                   d["tune_evaluations"], d.get("pending", []))


def explore(program: Program, target, model, settings: Settings, deadline: float | None,
            workers: int = 1, progress=None) -> Explored:
    """Search ``program`` and its algebraic forms (:func:`generator.rewrite.forms`: the
    one-pass statistics of a norm before a matmul), rank what was found, tune the best
    structures of each form (see the superopt module docstring). ``workers`` processes share
    each search's first-level plans. Every option computes ``program``'s outputs from its
    inputs; which form it came from does not matter to the verifier."""
    tgt = get_target(target)
    out = Explored()
    opts: list[Option] = []
    for form in forms(program):
        found, stats = _parallel_search(form, tgt, settings.max_kernels, deadline, workers,
                                        progress or (lambda *a, **k: None), settings.patience,
                                        settings.cap)
        out.stats += stats
        ranked = _rank(found, tgt, model)
        out.candidates += len(ranked)
        if ranked and (out.best_untuned_us is None or ranked[0][0] < out.best_untuned_us):
            out.best_untuned_us = ranked[0][0]
        picks = tuning_choice(ranked, settings.tune_top) \
            if settings.tune_top > 0 and settings.tune_rounds > 0 else []
        if settings.defer_tuning:
            if picks:
                out.pending.append([form.to_json(), [[c.graph.to_json(), c.trace_json()]
                                                     for c in picks]])
        else:
            opts += _tune(out, form, picks, tgt, model, settings, deadline)
        # untuned: the generator's annotations, its trace and threads (what a replay at other
        # sizes starts from, superopt/family.py)
        opts += [Option(cost, AnnotatedGraph(c.graph), cost,
                        Schedule(tuple(c.trace), threads_of(c.graph))) for cost, c in ranked]
        if out.stats.interrupted:
            break
    out.options = best_options(opts)
    return out


def explore_or_tune(program: Program, target, model, settings: Settings,
                    deadline: float | None, prior: Explored | None = None,
                    progress=None) -> Explored:
    """One job of the region layer, wherever it runs: tune what ``prior`` (a search whose
    tuning was deferred) left to tune, or else search ``program`` (:func:`explore`, one
    process)."""
    if prior is not None:
        return tune_pending(prior, target, model, settings, deadline)
    return explore(program, target, model, settings, deadline, 1, progress)


def tune_pending(ex: Explored, target, model, settings: Settings,
                 deadline: float | None) -> Explored:
    """Tune what :func:`explore` with ``defer_tuning`` left to tune: the same structures, seed
    and rounds as an eager explore, so the options come out the same (up to the deadline)."""
    tgt = get_target(target)
    opts = list(ex.options)
    for form_json, picks in ex.pending:
        form = Program.from_json(form_json)
        cands = [Candidate(KernelGraph.from_json(g), trace_from_json(t)) for g, t in picks]
        opts += _tune(ex, form, cands, tgt, model, settings, deadline)
        if ex.stats.interrupted:
            break
    ex.pending = []
    ex.options = best_options(opts)
    return ex


# ---- search ---------------------------------------------------------------------------------

def _search_worker(args: tuple) -> None:
    prog_json, target_name, max_kernels, deadline, share, nshares, q, patience, cap = args
    program = Program.from_json(prog_json)
    stats = SearchStats()
    try:
        search(program, get_target(target_name), max_kernels=max_kernels, deadline=deadline,
               stats=stats, share=(share, nshares), patience=patience, cap=cap,
               on_candidate=lambda c: q.put(("cand", json.dumps(
                   {"graph": c.graph.to_json(), "trace": c.trace_json(), "worker": share,
                    "states": stats.states, "pruned": stats.pruned}))))
    except KeyboardInterrupt:
        stats.interrupted = True
    q.put(("done", json.dumps(stats.__dict__)))


@contextlib.contextmanager
def frozen_heap():
    """While worker processes forked from this one run: what this process holds already is
    moved out of the cyclic collector's reach (``gc.freeze``), so that a collection in a worker
    does not write to -- and copy -- every page of the parent's heap, nor one here walk it. In a
    process warm from earlier searches that made runs both faster and steadier (four stacked
    decoder layers 2.5-2.9 -> 2.4-2.5 s). Nothing is done when the caller froze objects of its
    own, which unfreezing would release."""
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()


def _parallel_search(program: Program, target, max_kernels: int, deadline: float | None,
                     workers: int, progress,
                     patience: int | None = None,
                     cap: float | None = None) -> tuple[list[Candidate], SearchStats]:
    stats = SearchStats()
    found: list[Candidate] = []
    if workers <= 1:
        def keep(c: Candidate) -> None:
            found.append(c)
            progress(found, stats.states, stats.pruned)
        search(program, target, max_kernels=max_kernels, deadline=deadline, stats=stats,
               on_candidate=keep, patience=patience, cap=cap)
        return found, stats
    ctx = mproc.get_context("fork" if sys.platform != "win32" else "spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_search_worker,
                         args=((program.to_json(), target.name, max_kernels, deadline, w, workers,
                                q, patience, cap),), daemon=True) for w in range(workers)]
    t0 = time.perf_counter()
    with frozen_heap():
        return _collect(procs, q, workers, stats, found, progress, t0)


def _collect(procs: list, q, workers: int, stats: SearchStats, found: list, progress,
             t0: float) -> tuple[list[Candidate], SearchStats]:
    """Start the search workers and keep what they send until all are done (or Ctrl-C)."""
    for p in procs:
        p.start()
    done = 0
    seen: dict[int, tuple[int, int]] = {}  # worker -> (states, pruned) at its last report
    try:
        while done < workers:
            try:
                kind, payload = q.get(timeout=0.2)
            except _queue.Empty:
                if not any(p.is_alive() for p in procs) and q.empty():
                    break
                continue
            if kind == "cand":
                found.append(_cand(payload))
                d = json.loads(payload)
                seen[d["worker"]] = (d["states"], d["pruned"])
                progress(found, sum(v[0] for v in seen.values()),
                         sum(v[1] for v in seen.values()))
            else:
                done += 1
                stats += SearchStats(**json.loads(payload))  # seconds: this one's, below
    except KeyboardInterrupt:
        stats.interrupted = True
        while True:  # keep what the workers already sent
            try:
                kind, payload = q.get_nowait()
            except _queue.Empty:
                break
            if kind == "cand":
                found.append(_cand(payload))
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=1)
    stats.seconds = time.perf_counter() - t0
    return found, stats


def _cand(payload: str) -> Candidate:
    d = json.loads(payload)
    return Candidate(KernelGraph.from_json(d["graph"]), trace_from_json(d["trace"]))


class _Progress:
    """Progress on stderr (tqdm, when stderr is a terminal): candidates found, states visited and
    pruned, the best predicted time so far; then candidates verified."""

    def __init__(self, label: str, enabled: bool, model=None, target=None):
        self.bar = None
        self.model, self.target = model, target
        self.best = float("inf")
        self.seen = 0
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(desc=label, unit=" candidates", leave=False)
            except ImportError:
                self.bar = None

    def __call__(self, found: list, states: int = 0, pruned: int = 0) -> None:
        if self.bar is None:
            return
        if self.model is not None:
            for c in found[self.seen:]:
                self.best = min(self.best, self.model.predict(c.graph, self.target))
        self.seen = len(found)
        self.bar.n = len(found)
        self.bar.set_postfix(states=states, pruned=pruned,
                             best_us=f"{self.best:.1f}" if self.best < float("inf") else "-")

    def verified(self, n: int, ok: bool) -> None:
        if self.bar is not None:
            self.bar.set_description("verify")
            self.bar.set_postfix(verified=n, equivalent=ok)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---- ranking and tuning ---------------------------------------------------------------------

def _rank(cands: list[Candidate], target, model=None) -> list[tuple[float, Candidate]]:
    """Candidates by (predicted time, structural hash), duplicates dropped: deterministic."""
    model = model or default_model()
    out = {}
    for c in cands:
        h = c.graph.structural_hash()
        if h not in out:
            out[h] = (model.predict(c.graph, target), h, c)
    return [(cost, c) for cost, _, c in sorted(out.values(), key=lambda x: (x[0], x[1]))]


def _shape(graph: KernelGraph) -> tuple:
    """What the tuner can change least: per kernel, the operator or the grid's split labels
    and loop length (part counts, threads and stages are what it tunes)."""
    return tuple((op.block.grid, op.block.forloop) if isinstance(op, GraphKernel) else op.op
                 for op in graph.ops)


def tuning_choice(ranked: list[tuple[float, Candidate]], top: int) -> list[Candidate]:
    """The ``top`` structures to tune, in rank order within each pass: the best with each number
    of kernels, then the best of each kernel shape (:func:`_shape`), then the next best. The
    untuned ranking is a poor guide among near-equal candidates, and its head is often variants
    of one shape (qknorm_gqa at bs 8: eight 3-kernel variants ahead of the 2-kernel
    flash-decoding form, which tunes 27% faster)."""
    picked: list[Candidate] = []
    for key in (lambda g: len(g.ops), _shape, None):
        seen = {key(c.graph) for c in picked} if key else set()
        for _, c in ranked:
            if len(picked) >= top:
                return picked
            if any(c is p for p in picked) or key and key(c.graph) in seen:
                continue
            picked.append(c)
            if key:
                seen.add(key(c.graph))
    return picked


def _tune(out: Explored, program: Program, picks: list, target, model, settings: Settings,
          deadline: float | None) -> list[Option]:
    """Tune ``picks`` (the structures :func:`tuning_choice` chose) for ``tune_rounds``
    generations: the two best schedules of each, as options."""
    if not picks:
        return []
    task = make_task(program.name, program, target, picks, model, seed=settings.seed)
    try:
        log = TaskScheduler([task], rounds=settings.tune_rounds, deadline=deadline).run()
        out.tune_rounds += log.rounds[0]
    except KeyboardInterrupt:  # Ctrl-C while tuning: keep what the tuner has
        out.stats.interrupted = True
    opts = []
    for tuner in task.tuners:
        out.tune_evaluations += len(tuner.seen)
        for ev in tuner.top(2):
            sch = None if ev.schedule == tuner.base else ev.schedule
            opts.append(Option(ev.cost, ev.graph, tuner.base_cost, sch))
    return opts


def measures(runner) -> bool:
    """Whether ``runner`` times graphs on hardware (or stands in for it), so superopt measures."""
    return bool(getattr(runner, "measures", False))


def measure_graphs(runner, naive: KernelGraph, graphs: list, target) -> tuple:
    """(naive's measurement, one per graph, in order), wherever they run (here, or in a GPU
    task on a cluster: one device times them all)."""
    return runner.run(naive, target), [runner.run(g, target) for g in graphs]

