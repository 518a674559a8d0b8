"""``mp.superopt``: partition -> regions -> search -> tune -> measure -> verify -> cover -> join.

For each part of ``partition(program, uninterpreted=True, split_nested_exp=False,
horizontal=True)`` (maximal
groups of operators the verifier can check; a part may nest exps, no region does), the region
layer (:mod:`.part`, docs/generator.md) builds the answer:

1. **candidates**: every operator of the naive lowering (one pre-defined kernel each), the
   rule-based floor (element-wise chains, reductions with their prologue and epilogue, matmuls
   with their epilogue; each group lowered to one kernel by a quick search), and the search
   regions -- unions of up to three matmuls / reductions with the element-wise glue around them,
   plus the whole part when it is small enough for one search (the nine benchmarks are);
2. **per region**, as a part was searched before regions existed: the **results database**
   (a verified answer for the region's structural hash and the target, made by this code,
   cost model and settings -- :mod:`.store` --, is used as is), the
   **search** (``workers`` processes sharing its plans, or one process per region when several
   regions are searched at once; candidates stream back, so a time budget or Ctrl-C keeps what
   was found), **tuning** of the ``tune_top`` best structures (part counts, threads, pipeline
   stages; :mod:`mirage_py.tuning`), **measurement** with a runner that measures, and
   **verification** in that order until one is proved equivalent (finite-field random testing);
3. **the cover**: the cheapest set of verified candidates that computes the part, chosen exactly
   under the cost model (a 0/1 program, :mod:`mirage_py.regions.cover`); unsearched regions
   enter it at a lower bound, so only the regions that could still improve it get searched.

Regions with the same structure (identical layers) are searched once per run and stored in the
database by their structural hash. The parts' kernel graphs are joined into one. Ranking is by (time, structural hash) and the tuner is
seeded, so the same seed and settings give the same answer.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

from ..cost_model import create as create_model
from ..errors import MirageError, OptionError, ProgramError, SerializationError
from ..generator.kernel_search import SearchStats
from ..lax.precision import Float32Matmul
from ..lax.program import Program
from ..targets import get_target
from ..tuning.database import open_database
from .executors import ClusterError, Executor, LocalExecutor, RayExecutor, resolve
from .part import sigint_deferred, solve_part
from .result import (Answer, OptimizedProgram, PartResult, Piece, RegionResult,
                     SavedVerification, join_parts, load, parts_of)
from .run import Run, search_share
from .search import (_parallel_search, _Progress, _rank, _shape, calibrated_model,
                     default_model, tuning_choice)
from .store import AnswerSettings, keep_program, program_kind, stored_program


def _check_options(program, time_budget_s, workers, max_kernels, max_verify, tune_top,
                   tune_rounds, measure_top, verify_tests, seed) -> None:
    if not isinstance(program, Program):
        raise OptionError(f"superopt: expected a Program, got {type(program).__name__}")
    if not program.outputs:
        raise ProgramError(f"superopt: program {program.name!r} has no outputs; declare them "
                           "with Program.output")

    def whole(name: str, value: Any, least: int, none_ok: bool = False) -> None:
        if value is None and none_ok:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise OptionError(f"superopt: {name} must be an integer >= {least}"
                              f"{' or None' if none_ok else ''}, got {value!r}")
    if time_budget_s is not None and (isinstance(time_budget_s, bool) or
                                      not isinstance(time_budget_s, (int, float)) or
                                      not time_budget_s > 0):
        raise OptionError(f"superopt: time_budget_s must be a number of seconds > 0 or None, "
                          f"got {time_budget_s!r}")
    whole("workers", workers, 1, none_ok=True)
    whole("max_kernels", max_kernels, 1)
    whole("max_verify", max_verify, 1)
    whole("tune_top", tune_top, 0)
    whole("tune_rounds", tune_rounds, 0)
    whole("measure_top", measure_top, 0)
    whole("verify_tests", verify_tests, 1, none_ok=True)
    whole("seed", seed, 0)


def superopt(program: Program, *, target: Any = "h100", time_budget_s: float | None = None,
             seed: int = 0, workers: int | None = None, max_kernels: int = 3,
             verify_tests: int | None = None, max_verify: int = 16, tune_top: int = 4,
             tune_rounds: int = 8, measure_top: int = 4, progress: bool | None = None,
             database: Any = None, runner: Any = None, cost_model: Any = None,
             executor: Any = None, float32_matmul: str = "highest",
             buckets: Any = None, representative: Any = None, verify_sizes: bool = True,
             sizes: Any = None, replay: Any = None) -> OptimizedProgram:
    """Superoptimise ``program`` for ``target`` (see the module docstring).

    ``database``: None -> the default results file (``$MIRAGE_PY_DATABASE``, else under the user
    cache directory), a path -> that file, False -> no database. ``runner``: None -> the GPU
    runner when CuPy sees a device, else the cost model. ``cost_model``: an object with
    ``predict(graph, target)`` (and optionally ``lower_bound(program, target)``) or a name
    (``"analytic"``, default; ``"calibrated"``: its figures fitted to measured GPU times).
    ``time_budget_s`` bounds the whole call: region searches, tunings and the floor start only
    in its first 80 %, verification and cover solves only before its end; then the answer is
    the cheapest verified cover (the floor's, or the naive operators', at worst) and
    ``timed_out`` says so. Ctrl-C returns the best verified answer found so far, marked
    ``interrupted`` (a second Ctrl-C, or one before any candidate exists, raises
    ``KeyboardInterrupt``); what was verified is in the results database either way, so a
    second call resumes (docs/generator.md "Anytime, budgets and Ctrl-C").
    ``max_kernels`` bounds the kernels of one region's answer, ``workers`` the processes.
    ``executor``: where region searches, their verification and measurements run -- None or
    ``"local"``: processes on this machine (``workers`` default: the cores, at most 8);
    ``"ray"`` or a :class:`RayExecutor`: tasks on a Ray cluster (``workers`` default: its CPUs;
    ``runner`` default: the GPU runner when the cluster has a GPU of the target's type, as the
    custom resource ``gpu_<target>``), the database written by this process only; the same
    answer either way (docs/cluster.md). ``float32_matmul``: what a float32 matmul that does not
    say (``matmul(..., precision=)``) may lose for speed, with PyTorch's names --
    ``"highest"`` (float32 products), ``"high"`` (TF32 tensor cores), ``"medium"`` (bfloat16
    tensor cores); 16-bit matmuls always multiply in their own type (lax/precision.py). The
    answer is searched for, stored under and reports the program with that precision on its
    matmuls.

    A *symbolic* program (dims made with ``mp.dim``) gets a :class:`FamilyProgram`: one search
    at the bucket that holds ``representative`` (dim name -> size; default a middle size),
    serving every size of the dims' ranges (``buckets``: dim name -> bucket sizes, default
    powers of two); other buckets replay it without searching (superopt/family.py). Each binding
    of the sizes a call uses is verified the first time it is met (``verify_sizes``, default on:
    the stated bound then holds at every size that ran, docs/verifier.md "Shape families").
    ``sizes`` (the valid sizes a padded program's masks name) and ``replay`` (the answer whose
    cover a padded bucket replays) are how the family layer calls this function.

    Bad options raise
    :class:`~mirage_py.errors.OptionError`; a cluster that cannot do the work,
    :class:`ClusterError`.
    """
    _check_options(program, time_budget_s, workers, max_kernels, max_verify, tune_top,
                   tune_rounds, measure_top, verify_tests, seed)
    program = program.with_float32_matmul(Float32Matmul.parse(float32_matmul,
                                                              "superopt: float32_matmul"))
    if program.symbolic:
        from .family import superopt_family
        options = dict(target=target, time_budget_s=time_budget_s, seed=seed, workers=workers,
                       max_kernels=max_kernels, verify_tests=verify_tests,
                       max_verify=max_verify, tune_top=tune_top, tune_rounds=tune_rounds,
                       measure_top=measure_top, progress=progress, database=database,
                       runner=runner, cost_model=cost_model, executor=executor)
        return superopt_family(program, options, buckets, representative, bool(verify_sizes))
    missing = sorted(set(program.params) - set(sizes or {}))
    if missing:
        raise OptionError(f"superopt: program {program.name!r} has masks that name "
                          f"{', '.join(missing)}; give their sizes (sizes=...)")
    tgt = get_target(target)
    model = default_model() if cost_model in (None, "analytic") else \
        calibrated_model() if cost_model == "calibrated" else \
        create_model(cost_model) if isinstance(cost_model, str) else cost_model
    if not callable(getattr(model, "predict", None)):
        raise OptionError(f"superopt: cost_model must have predict(graph, target), got "
                          f"{type(model).__name__}")
    ex = resolve(executor)
    ex.start(tgt)
    runner = runner if runner is not None else ex.default_runner(model, tgt)
    ex.check_runner(runner, tgt)
    db = open_database(database)
    if workers is None:
        workers = ex.default_workers()
    if progress is None:
        progress = sys.stderr.isatty()
    t0 = time.perf_counter()
    # what shapes the answers, and so keys them in the results database (superopt.store)
    settings = AnswerSettings(max_kernels=max_kernels, tune_top=tune_top,
                              tune_rounds=tune_rounds, seed=seed, verify_tests=verify_tests,
                              max_verify=max_verify, measure_top=measure_top)
    run = Run(tgt, model, runner, db, settings, workers,
              t0 + search_share(time_budget_s) if time_budget_s else None,
              t0 + time_budget_s if time_budget_s else None, progress, ex,
              sizes=dict(sizes or {}), budget_s=time_budget_s)
    parts = parts_of(program)
    if replay is not None and len(replay.parts) != len(parts):
        raise OptionError(f"superopt: the answer to replay has {len(replay.parts)} part(s), "
                          f"program {program.name!r} {len(parts)}")
    # seen before (by this code, model, runner and settings): the whole answer, no cover
    kind = program_kind(sizes, replay is not None)
    if db is not None:
        doc = stored_program(db, program, tgt, run.key, kind)
        if doc is not None:
            with contextlib.suppress(SerializationError):
                opt = OptimizedProgram.from_json(doc, model=model, origin="database",
                                                 search_seconds=time.perf_counter() - t0)
                for a in [p for p in opt.parts] + [pc.result for p in opt.parts
                                                   for pc in p.pieces if pc.result is not None]:
                    # what this call did: read them (how they were found stays in origin)
                    a.origin, a.source = a.origin or a.source, "database"
                    a.stats, a.candidates, a.verified = SearchStats(), 0, 0
                return opt
    # every operator has field semantics (uninterpreted functions and max / min as random
    # functions; a part may nest exps, no region does), so every part goes to the region layer
    results = [solve_part(part, run, None if replay is None else replay.parts[i].pieces)
               for i, part in enumerate(parts)]
    opt = OptimizedProgram(program, tgt.name, results, time.perf_counter() - t0, model, parts)
    if db is not None and opt.complete and not run.interrupted:
        with sigint_deferred(run):  # a Ctrl-C now: the answer is whole, its record too
            keep_program(db, program, tgt, run.key, kind, opt)
    return opt


from .family import FamilyProgram  # noqa: E402 -- it calls back into superopt

__all__ = ["superopt", "FamilyProgram", "OptimizedProgram", "PartResult", "RegionResult", "Piece", "Answer",
           "SavedVerification", "load", "join_parts", "default_model", "tuning_choice",
           "get_target", "Executor", "LocalExecutor", "RayExecutor", "ClusterError",
           "AnswerSettings"]
