"""Processes on this machine: the default executor (``superopt(executor=None)``).

Region searches (and deferred tunings) run each in one process, so a region's answer never
depends on how many run at once (a search whose plans were shared among processes would prune
differently): with one worker here, one after another; with more, each in a worker process of
its own (forked from this one), ``run.workers`` at a time, the longest first. Verification and
measurements run in this process.
"""

from __future__ import annotations

import json
import multiprocessing as mproc
import queue as _queue
import sys
import time
from typing import Any

from ..lax.program import Program
from .run import input_elements  # noqa: F401 -- where it was
from .jobs import Executor, ExploreJob, Measured, MeasureJob, VerifyJob
from .search import Explored, Settings, _Progress, explore_or_tune, frozen_heap, measure_graphs


def checked(verifier: Any, graph: Any, tests: int | None = None) -> Any:
    """``verifier.check(graph, tests)``, or where the check cannot fit in memory
    (``VerifierMemoryError``) a rejection that says so: the search goes on with the other
    candidates, and never accepts one it could not check."""
    from ..verifier.equivalence import VerifyResult
    from ..verifier.errors import VerifierMemoryError
    try:
        return verifier.check(graph, tests=tests)
    except VerifierMemoryError as e:
        return VerifyResult.refused(str(e))


def verify_here(job: VerifyJob, run: Any):
    """A verification in this process, by the structure's own verifier (kept for the run); the
    run notes how long it took (``Run.verify_times``)."""
    t0 = time.perf_counter()
    v = checked(run.verifier(job.key, job.program), job.graph, run.settings.verify_tests)
    run.note_verification(job.program, v, time.perf_counter() - t0)
    return v


class LocalExecutor(Executor):
    """Processes on this machine (``workers`` at a time): the default."""

    name = "local"

    def __repr__(self) -> str:
        return "LocalExecutor()"

    def explore(self, jobs: list[ExploreJob], run: Any, *,
                progress: bool = False) -> dict[str, Explored]:
        if run.workers <= 1:
            return self._explore_here(jobs, run, progress)
        return _run_jobs(jobs, run)

    @staticmethod
    def _explore_here(jobs: list[ExploreJob], run: Any, progress: bool) -> dict[str, Explored]:
        out: dict[str, Explored] = {}
        for job in jobs:
            if run.expired():
                continue
            prog = _Progress(f"search {len(jobs)}", progress, run.model, run.target)
            try:
                out[job.key] = explore_or_tune(job.program, run.target, run.model, job.settings,
                                               run.search_deadline, job.prior, prog)
            finally:
                prog.close()
        return out

    def verify(self, jobs: list[VerifyJob], run: Any) -> dict:
        out = {}
        for job in jobs:  # one after another, each where it can end before the budget does
            if not run.room_for_check(job.program, key=job.key, graph=job.graph):
                continue
            out[job.key] = verify_here(job, run)
        return out

    def measure(self, jobs: list[MeasureJob], run: Any) -> dict[str, Measured]:
        out = {}
        for job in jobs:
            naive, ms = measure_graphs(run.runner, job.naive, list(job.graphs), run.target)
            out[job.key] = Measured(naive, tuple(ms))
        return out


# ---- several searches at once ---------------------------------------------------------------

def _job(key: str, prog_json: dict, settings: Settings, run: Any, q,
         prior_json: dict | None = None) -> None:
    """A worker process's one job: its Explored goes back as JSON."""
    try:
        ex = explore_or_tune(Program.from_json(prog_json), run.target, run.model, settings,
                             run.search_deadline,
                             None if prior_json is None else Explored.from_json(prior_json))
    except KeyboardInterrupt:  # a search keeps nothing, a tuning its untuned options
        ex = Explored.from_json(prior_json) if prior_json is not None else Explored()
        ex.pending = []
        ex.stats.interrupted = True
    q.put((key, json.dumps(ex.to_json())))


def _receive(q, timeout: float = 0.2):
    """The next finished job from the workers (Ctrl-C arrives here while the parent waits)."""
    return q.get(timeout=timeout)


def _start(ctx, job: ExploreJob, run: Any, q):
    p = ctx.Process(target=_job, args=(job.key, job.program.to_json(), job.settings, run, q,
                                       None if job.prior is None else job.prior.to_json()),
                    daemon=True)
    p.start()
    return p


def _run_jobs(jobs: list[ExploreJob], run: Any) -> dict[str, Explored]:
    """Every job in a worker process of its own, ``run.workers`` at a time, the longest first
    (so that a round does not end on one worker finishing a long job it started last; under a
    budget in the order given); returns
    what arrived (all of it, unless the budget ran out or Ctrl-C came)."""
    ctx = mproc.get_context("fork" if sys.platform != "win32" else "spawn")
    q = ctx.Queue()
    # under a budget in the order given (the most a search can save per second of its check
    # first, PartCover._search): the searches the deadline cuts are the least worth
    pending = list(jobs) if run.budget_s is not None else \
        sorted(jobs, key=ExploreJob.expected_seconds, reverse=True)
    running: dict[str, Any] = {}
    out: dict[str, Explored] = {}
    with frozen_heap():  # the workers are forks of this process
        try:
            while pending or running:
                while pending and len(running) < run.workers and not run.expired():
                    job = pending.pop(0)
                    running[job.key] = _start(ctx, job, run, q)
                if not running:
                    break
                try:
                    key, payload = _receive(q)
                except _queue.Empty:
                    for k, p in list(running.items()):
                        if not p.is_alive() and p.exitcode not in (0, None):
                            running.pop(k)  # a worker that died: its structure is skipped
                    continue
                out[key] = Explored.from_json(json.loads(payload))
                running.pop(key).join(timeout=1)
        except KeyboardInterrupt:
            run.interrupt()
            _drain(q, out)
        finally:
            for p in running.values():
                if p.is_alive():
                    p.terminate()
                p.join(timeout=1)
    return out


def _drain(q, out: dict[str, Explored]) -> None:
    """Keep what the workers already sent."""
    while True:
        try:
            key, payload = q.get_nowait()
        except _queue.Empty:
            return
        out[key] = Explored.from_json(json.loads(payload))


__all__ = ["LocalExecutor", "verify_here"]
