"""``mp.superopt``: partition -> search -> tune -> measure -> verify -> assemble, and the result.

For each part of ``partition(program, uninterpreted=True)`` that the verifier can check:

1. **database**: if the results database holds a verified answer for (the part's structural hash,
   target), it is used as is (``PartResult.source == "database"``) and nothing else runs;
2. **search**: the generator finds candidate μGraph structures (in ``workers`` processes, each
   streaming candidates back as found, so a time budget or Ctrl-C keeps what was found);
3. **tune**: ``tune_top`` structures -- the best of each kernel count and shape first -- get
   their annotations (part counts, threads, pipeline stages) tuned by the evolutionary tuner
   under the cost model (with the layout planner's shared memory); a task scheduler spends
   ``tune_rounds`` generations per part where the predicted end-to-end gain is largest;
4. **measure**: with a GPU (or any runner that measures), the ``measure_top`` best are timed and
   re-ranked by measured time;
5. **verify** in that order until one is proved equivalent (finite-field random testing).

Parts the verifier cannot check, and parts where nothing better than the naive lowering is found,
use the naive lowering (one pre-defined kernel per operator). The parts' kernel graphs are joined
into one. Every measurement and every verified answer is recorded in the database (answers of a
search cut short by the budget or Ctrl-C are recorded but not reused). Ranking is by (time,
structural hash) and the tuner is seeded, so the same seed and settings give the same answer.
"""

from __future__ import annotations

import json
import multiprocessing as mproc
import os
import queue as _queue
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from .cost_model import AnalyticModel, create as create_model
from .errors import MirageError, SerializationError
from .generator.kernel_search import Candidate, SearchStats, search, trace_from_json
from .lax.partition import partition
from .layout.plan import planned_shared_memory
from .lax.program import Program
from .targets import get_target
from .tuning.annotations import AnnotatedGraph, Schedule, threads_of
from .tuning.database import Record, ResultsDB, open_database
from .tuning.runners import Measurement, default_runner
from .tuning.scheduler import TaskScheduler
from .tuning.tuner import make_task
from .ugraph.graph import DTensor, GraphKernel, KernelGraph, KernelOp
from .ugraph.lower import naive_lowering

FORMAT = "mirage_py.optimized"
FORMAT_VERSION = 1


@dataclass
class PartResult:
    """The outcome for one subprogram."""

    program: Program
    graph: KernelGraph
    naive: KernelGraph
    source: str  # "search", "naive" (nothing better found / not verifiable), "database"
    estimated_us: float
    naive_estimated_us: float
    verification: Any = None  # a VerifyResult (equivalent, bound, tests_run, seconds)
    stats: SearchStats = field(default_factory=SearchStats)
    candidates: int = 0
    verified: int = 0
    stages: tuple[int, ...] = ()  # pipeline stages per graph-defined kernel of ``graph``
    schedule: Schedule | None = None  # the tuned annotations (None: as the generator built it)
    untuned_us: float | None = None  # the chosen structure with the generator's annotations
    best_untuned_us: float | None = None  # the best candidate before tuning
    measured_us: float | None = None  # the chosen graph timed by a measuring runner
    naive_measured_us: float | None = None
    tune_rounds: int = 0
    tune_evaluations: int = 0
    origin: str = ""  # for source == "database": how the stored answer was found

    @property
    def speedup(self) -> float:
        return self.naive_estimated_us / self.estimated_us if self.estimated_us else float("nan")

    @property
    def annotated(self) -> AnnotatedGraph:
        return AnnotatedGraph(self.graph, self.stages)


def _search_worker(args: tuple) -> None:
    prog_json, target_name, max_kernels, deadline, share, nshares, q = args
    program = Program.from_json(prog_json)
    stats = SearchStats()
    try:
        search(program, get_target(target_name), max_kernels=max_kernels, deadline=deadline,
               stats=stats, share=(share, nshares),
               on_candidate=lambda c: q.put(("cand", json.dumps(
                   {"graph": c.graph.to_json(), "trace": c.trace_json(), "worker": share,
                    "states": stats.states, "pruned": stats.pruned}))))
    except KeyboardInterrupt:
        stats.interrupted = True
    q.put(("done", json.dumps(stats.__dict__)))


def _parallel_search(program: Program, target, max_kernels: int, deadline: float | None,
                     workers: int, progress) -> tuple[list[Candidate], SearchStats]:
    stats = SearchStats()
    found: list[Candidate] = []
    if workers <= 1:
        def keep(c: Candidate) -> None:
            found.append(c)
            progress(found, stats.states, stats.pruned)
        search(program, target, max_kernels=max_kernels, deadline=deadline, stats=stats,
               on_candidate=keep)
        return found, stats
    ctx = mproc.get_context("fork" if sys.platform != "win32" else "spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_search_worker,
                         args=((program.to_json(), target.name, max_kernels, deadline, w, workers,
                                q),), daemon=True) for w in range(workers)]
    t0 = time.perf_counter()
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
                s = json.loads(payload)
                for k in ("states", "pruned", "plans", "kernels", "candidates"):
                    setattr(stats, k, getattr(stats, k) + s[k])
                stats.timed_out |= s["timed_out"]
                stats.interrupted |= s["interrupted"]
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


def superopt(program: Program, *, target: Any = "h100", time_budget_s: float | None = None,
             seed: int = 0, workers: int | None = None, max_kernels: int = 3,
             verify_tests: int | None = None, max_verify: int = 16, tune_top: int = 4,
             tune_rounds: int = 8, measure_top: int = 4, progress: bool | None = None,
             database: Any = None, runner: Any = None,
             cost_model: Any = None) -> "OptimizedProgram":
    """Superoptimise ``program`` for ``target`` (see module docstring).

    ``database``: None -> the default results file (``$MIRAGE_PY_DATABASE``, else under the user
    cache directory), a path -> that file, False -> no database. ``runner``: None -> the GPU
    runner when CuPy sees a device, else the cost model. ``cost_model``: an object with
    ``predict(graph, target)`` or a name (``"analytic"``, default). ``time_budget_s`` bounds search
    (80 %) and tuning together; verification of the chosen candidate always completes.
    """
    from .verifier import Verifier

    if not isinstance(program, Program):
        raise MirageError(f"superopt: expected a Program, got {type(program).__name__}")
    tgt = get_target(target)
    model = default_model() if cost_model in (None, "analytic") else \
        create_model(cost_model) if isinstance(cost_model, str) else cost_model
    runner = runner if runner is not None else default_runner(model)
    db = open_database(database)
    if workers is None:
        workers = max(1, min(os.cpu_count() or 1, 8))
    if progress is None:
        progress = sys.stderr.isatty()
    t0 = time.perf_counter()
    deadline = t0 + time_budget_s if time_budget_s else None
    search_deadline = t0 + 0.8 * time_budget_s if time_budget_s else None
    parts = partition(program, uninterpreted=True)
    results: list[PartResult] = []
    pending: list[tuple[PartResult, list[tuple[float, Candidate]]]] = []
    bars: dict[int, _Progress] = {}
    for part in parts:
        naive = naive_lowering(part)
        naive_us = model.predict(naive, tgt)
        res = PartResult(part, naive, naive, "naive", naive_us, naive_us)
        results.append(res)
        if not part.verifiable:
            continue
        if db is not None and _from_database(res, db, tgt, model):
            continue
        bar = _Progress(f"search {part.name}", progress, model, tgt)
        try:
            found, stats = _parallel_search(part, tgt, max_kernels, search_deadline, workers, bar)
        except BaseException:
            bar.close()
            raise
        bars[id(res)] = bar  # stays open to show verification
        res.stats = stats
        ranked = _rank(found, tgt, model)
        res.candidates = len(ranked)
        res.best_untuned_us = ranked[0][0] if ranked else None
        pending.append((res, ranked))

    options = _tune_parts(pending, tgt, model, tune_top, tune_rounds, deadline, seed)
    for (res, _), opts in zip(pending, options):
        part, naive_us = res.program, res.naive_estimated_us
        measured = _measure(res, opts, runner, tgt, measure_top)
        # one Verifier per part: inputs and the program's values are computed once and reused
        # for every candidate checked
        verifier = Verifier(part, seed=seed, target=tgt)
        for opt in opts[:max_verify]:
            cost, ag, untuned, sch = opt
            m = measured.get(id(opt))
            if m is not None and res.naive_measured_us is not None:
                if m.us >= res.naive_measured_us:
                    continue
            elif cost >= naive_us:
                break
            v = verifier.check(ag.graph, tests=verify_tests)
            res.verified += 1
            if id(res) in bars:
                bars[id(res)].verified(res.verified, bool(v.equivalent))
            if v.equivalent:
                res.graph, res.source, res.estimated_us, res.verification = \
                    ag.graph, "search", cost, v
                res.stages, res.schedule, res.untuned_us = ag.stages_full(), sch, untuned
                res.measured_us = None if m is None else m.us
                if m is not None:
                    measured["chosen"] = m
                break
        if id(res) in bars:
            bars.pop(id(res)).close()
        if res.verification is None:
            res.verification = Verifier(part, seed=seed, target=tgt).check(
                res.naive, tests=verify_tests)
        if db is not None:
            _record(db, res, opts, measured, tgt, runner)
    for b in bars.values():
        b.close()
    return OptimizedProgram(program, tgt.name, results, time.perf_counter() - t0, model, parts)


Option = tuple  # (predicted us, AnnotatedGraph, untuned us, Schedule | None)


def default_model() -> AnalyticModel:
    """The analytic cost model with shared memory as the layout planner lays it out: what
    superopt ranks, tunes and reports with."""
    return AnalyticModel(smem_planner=planned_shared_memory)


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


def _tune_parts(pending, target, model, top: int, rounds: int, deadline: float | None,
                seed: int) -> list[list[Option]]:
    """Tune the best ``top`` structures of every searched part (one task per part, rounds spread
    by the task scheduler); each part's options -- tuned bests, then the untuned rest -- ranked
    by (predicted time, structural hash)."""
    tasks, owners = [], []
    for k, (res, ranked) in enumerate(pending):
        if ranked and top > 0 and rounds > 0:
            tasks.append(make_task(res.program.name, res.program, target,
                                   tuning_choice(ranked, top), model, seed=seed))
            owners.append(k)
    if tasks:
        try:
            log = TaskScheduler(tasks, rounds=rounds * len(tasks), deadline=deadline).run()
            for k, task, n in zip(owners, tasks, log.rounds):
                pending[k][0].tune_rounds = n
        except KeyboardInterrupt:  # Ctrl-C while tuning: keep what the tuners have
            for k in owners:
                pending[k][0].stats.interrupted = True
    out: list[list[Option]] = []
    by_owner = dict(zip(owners, tasks))
    for k, (res, ranked) in enumerate(pending):
        opts: dict[str, tuple] = {}

        def add(cost: float, ag: AnnotatedGraph, untuned: float, sch) -> None:
            key = ag.graph.structural_hash() + str(ag.stages_full())
            if key not in opts or cost < opts[key][0]:
                opts[key] = (cost, ag, untuned, sch)
        task = by_owner.get(k)
        if task is not None:
            for tuner in task.tuners:
                res.tune_evaluations += len(tuner.seen)
                for ev in tuner.top(2):
                    sch = None if ev.schedule == tuner.base else ev.schedule
                    add(ev.cost, ev.graph, tuner.base_cost, sch)
        for cost, c in ranked:
            add(cost, AnnotatedGraph(c.graph), cost, None)
        out.append(sorted(opts.values(), key=lambda o: (o[0], o[1].graph.structural_hash(),
                                                         o[1].stages_full())))
    return out


def _measure(res: PartResult, opts: list[Option], runner, target,
             top: int) -> dict:
    """Time the naive graph and the ``top`` best options with a measuring runner; those options
    are then re-ordered by measured time (in place). Returns measurements by option id."""
    if not getattr(runner, "measures", False) or top <= 0 or not opts:
        return {}
    nm = runner.run(res.naive, target)
    res.naive_measured_us = nm.us if nm.ok else None
    out = {id(o): runner.run(o[1], target) for o in opts[:top]}
    head = sorted(opts[:top], key=lambda o: (out[id(o)].us, o[0]))
    opts[:top] = head
    out[-1] = nm  # the naive graph's measurement, recorded too
    return out


def _from_database(res: PartResult, db: ResultsDB, target, model) -> bool:
    """Fill ``res`` from a stored verified answer; False if there is none (or it is unusable)."""
    rec = db.lookup(res.program.structural_hash(), target.name)
    if rec is None or not rec.verification:
        return False
    try:
        g = KernelGraph.from_json(rec.graph)
        stages = tuple(rec.annotations.get("stages", ()))
        cost = model.predict(AnnotatedGraph(g, stages), target)
        sched = rec.annotations.get("schedule")
        schedule = Schedule.from_json(sched) if sched else None
    except (MirageError, KeyError, TypeError, ValueError):
        return False  # written by another version or for another model: search again
    res.graph, res.source, res.estimated_us = g, "database", cost
    res.verification = SavedVerification(**{k: rec.verification[k] for k in
                                            ("equivalent", "bound", "tests_run", "seconds")})
    res.stages, res.schedule, res.measured_us = stages, schedule, rec.measured_us
    res.untuned_us = rec.annotations.get("untuned_us")
    res.origin = rec.annotations.get("source", "")
    return True


def _record(db: ResultsDB, res: PartResult, opts: list[Option], measured: dict, target,
            runner, keep: int = 8) -> None:
    """One transaction per part: every measurement, the best few predictions, and the answer
    (chosen only when verified and the search ran to completion)."""
    def rec(ag: AnnotatedGraph, pred: float, sch, m: Measurement | None, **kw) -> Record:
        ann = {"threads": list(threads_of(ag.graph)), "stages": list(ag.stages_full()),
               "schedule": None if sch is None else sch.to_json()}
        ann.update(kw.pop("extra", {}))
        return Record(ag.graph.to_json(), target.name, ag.graph.structural_hash(), ann,
                      predicted_us=pred, measured_us=None if m is None else m.us,
                      runner=(m.runner if m is not None else runner_name),
                      samples=None if m is None else list(m.samples), **kw)

    runner_name = "model"
    rows: list[Record] = []
    if -1 in measured:
        rows.append(rec(AnnotatedGraph(res.naive), res.naive_estimated_us, None, measured[-1],
                        extra={"source": "naive"}))
    for i, o in enumerate(opts):
        m = measured.get(id(o))
        if m is not None or i < keep:
            rows.append(rec(o[1], o[0], o[3], m))
    complete = not (res.stats.timed_out or res.stats.interrupted)
    v = res.verification
    if v is not None and v.equivalent:
        vdoc = {"equivalent": bool(v.equivalent), "bound": float(v.bound),
                "tests_run": int(v.tests_run), "seconds": float(v.seconds)}
        m = measured.get("chosen")
        rows.append(rec(res.annotated, res.estimated_us, res.schedule, m, chosen=complete,
                        verification=vdoc,
                        extra={"source": res.source, "untuned_us": res.untuned_us}))
    db.add(res.program, rows)


def join_parts(program: Program, graphs: list[KernelGraph], parts) -> KernelGraph:
    """One kernel graph for the whole program from the parts' graphs (intermediate tensors of part
    i are renamed ``p<i>_...`` so names never collide)."""
    boundary = {t.name for t in program.inputs}
    for part in parts:
        boundary |= {o.name for o in part.outputs}
    ops = []
    for i, g in enumerate(graphs):
        def rn(n: str) -> str:
            return n if n in boundary else f"p{i}_{n}"
        for op in g.ops:
            if isinstance(op, KernelOp):
                ops.append(replace(op, operands=tuple(rn(o) if isinstance(o, str) else o
                                                      for o in op.operands),
                                   output=replace(op.output, name=rn(op.output.name))))
            else:
                ops.append(GraphKernel(tuple(rn(n) for n in op.inputs),
                                       tuple(replace(t, name=rn(t.name)) for t in op.outputs),
                                       op.block))
    outputs = tuple(o.name for o in program.outputs)
    extra = []
    for name, src in parts.sources.items():  # outputs that are another value under a new name
        if src != name:
            t = program.output_tensors[name]
            extra.append(KernelOp("mul", (src, 1.0), DTensor(name, t.shape, t.dtype)))
    return KernelGraph(program.name, tuple(DTensor(t.name, t.shape, t.dtype)
                                           for t in program.inputs), tuple(ops + extra), outputs)


class OptimizedProgram:
    """What ``superopt`` returns: the chosen μGraphs per subprogram, joined into one graph."""

    def __init__(self, program: Program, target: str, parts: list[PartResult],
                 search_seconds: float, model: Any = None, partitioned: Any = None):
        self.program = program
        self.target = target
        self.parts = parts
        self.search_seconds = search_seconds
        self.model = model or default_model()
        # superopt hands over the partition it already made; a loaded result makes it again
        self.partition = partitioned if partitioned is not None else \
            partition(program, uninterpreted=True)
        self.graph = join_parts(program, [p.graph for p in parts], self.partition)
        self.naive_graph = join_parts(program, [p.naive for p in parts], self.partition)
        # pipeline stages of the joined graph's graph-defined kernels, part by part
        self.stages = tuple(s for p in parts for s in p.annotated.stages_full())
        self._compiled = None

    # -- numbers --------------------------------------------------------------------------------
    @property
    def num_kernels(self) -> int:
        return self.graph.num_kernels

    @property
    def naive_num_kernels(self) -> int:
        return self.naive_graph.num_kernels

    @property
    def annotated(self) -> AnnotatedGraph:
        """The joined graph with its pipeline stages (what the cost model and codegen read)."""
        return AnnotatedGraph(self.graph, self.stages)

    @property
    def estimated_time_us(self) -> float:
        return self.model.predict(self.annotated, self.target)

    @property
    def naive_estimated_time_us(self) -> float:
        return self.model.predict(self.naive_graph, self.target)

    @property
    def measured_time_us(self) -> float | None:
        """Sum of the parts' measured times, when a GPU runner timed every part's choice."""
        ms = [p.measured_us for p in self.parts]
        return sum(ms) if ms and all(m is not None for m in ms) else None

    @property
    def verification(self) -> list:
        return [p.verification for p in self.parts]

    # -- running --------------------------------------------------------------------------------
    def run_numpy(self, inputs: Mapping[str, Any], precision: str = "gpu") -> dict[str, np.ndarray]:
        """Execute the chosen μGraphs on the CPU interpreter (GPU-like precision by default)."""
        arrays = self.program.check_inputs(inputs)
        return self.graph.run(arrays, precision=precision)

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run on the GPU (compiled CUDA through CuPy); inputs are CuPy arrays or DLPack tensors."""
        if self._compiled is None:
            from .codegen_cuda import CompiledGraph
            self._compiled = CompiledGraph(self.annotated, self.target)
        return self._compiled(inputs)

    def export_cuda(self, directory: str) -> None:
        """Write .cu/.h files and a PyTorch extension for the chosen graph into ``directory``."""
        from .codegen_cuda import export_cuda
        export_cuda(self.annotated, directory, target=self.target)

    # -- reporting ------------------------------------------------------------------------------
    def summary(self) -> str:
        lines = [f"mirage_py superopt: {self.program.name} on {self.target}",
                 f"  kernels: {self.naive_num_kernels} naive -> {self.num_kernels}",
                 f"  estimated time: {self.naive_estimated_time_us:.1f} us naive -> "
                 f"{self.estimated_time_us:.1f} us "
                 f"({self.naive_estimated_time_us / self.estimated_time_us:.2f}x)",
                 f"  search: {self.search_seconds:.2f} s"]
        for i, p in enumerate(self.parts):
            v = p.verification
            vb = (f"verified, bound {v.bound:.1e} ({v.tests_run} tests)"
                  if v is not None and v.equivalent else "not verified")
            kinds = "Lax" if p.program.is_lax else ("Lax + uninterpreted "
                                                    + ",".join(sorted(p.program.uninterpreted_ops))
                                                    if p.program.verifiable else "non-Lax")
            src = p.source + (f" ({p.origin})" if p.origin else "")
            lines.append(f"  part {i} [{kinds}] {src}: {p.naive.num_kernels} -> "
                         f"{p.graph.num_kernels} kernels, {p.naive_estimated_us:.1f} -> "
                         f"{p.estimated_us:.1f} us ({p.speedup:.2f}x); {vb}")
            if p.source == "database":
                lines.append("    from the results database (no search)")
            else:
                lines.append(f"    {p.candidates} candidates, {p.verified} verified; "
                             f"{p.stats.states} states, {p.stats.pruned} pruned, "
                             f"{p.stats.plans} plans in {p.stats.seconds:.2f} s"
                             + (" (time budget hit)" if p.stats.timed_out else "")
                             + (" (interrupted)" if p.stats.interrupted else ""))
            if p.untuned_us is not None and p.source != "naive":
                lines.append(f"    tuning: {p.untuned_us:.1f} -> {p.estimated_us:.1f} us"
                             + ("" if p.source == "database" else
                                f" ({p.tune_rounds} rounds, {p.tune_evaluations} schedules)"))
            if p.measured_us is not None:
                lines.append(f"    measured: {p.measured_us:.1f} us"
                             + (f" (naive {p.naive_measured_us:.1f} us)"
                                if p.naive_measured_us is not None else ""))
            gk = 0
            stages = p.annotated.stages_full()
            for op in p.graph.ops:
                if isinstance(op, GraphKernel):
                    bg = op.block
                    lines.append(f"    graph kernel -> {', '.join(t.name for t in op.outputs)}: "
                                 f"grid {bg.grid}, {bg.threads} threads, forloop {bg.forloop}, "
                                 f"{stages[gk]} stage(s), {len(bg.ops)} block ops")
                    gk += 1
                else:
                    lines.append(f"    kernel {op.op} -> {op.output.name}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"OptimizedProgram({self.program.name!r}, target={self.target!r}, "
                f"kernels {self.naive_num_kernels}->{self.num_kernels})")

    # -- persistence ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        parts = []
        for p in self.parts:
            v = p.verification
            parts.append({
                "program": p.program.to_json(), "graph": p.graph.to_json(),
                "source": p.source, "estimated_us": p.estimated_us,
                "naive_estimated_us": p.naive_estimated_us,
                "candidates": p.candidates, "verified": p.verified, "stats": p.stats.__dict__,
                "stages": list(p.stages),
                "schedule": None if p.schedule is None else p.schedule.to_json(),
                "untuned_us": p.untuned_us, "measured_us": p.measured_us,
                "verification": None if v is None else {
                    "equivalent": bool(v.equivalent), "bound": float(v.bound),
                    "tests_run": int(v.tests_run), "seconds": float(v.seconds)}})
        return {"format": FORMAT, "version": FORMAT_VERSION, "target": self.target,
                "program": self.program.to_json(), "search_seconds": self.search_seconds,
                "parts": parts}

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "OptimizedProgram":
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
            raise SerializationError("not a saved mirage_py superopt result")
        if doc.get("version") != FORMAT_VERSION:
            raise SerializationError(f"result format version {doc.get('version')!r} is not "
                                     "supported")
        try:
            program = Program.from_json(doc["program"])
            parts = []
            for d in doc["parts"]:
                sub = Program.from_json(d["program"])
                naive = naive_lowering(sub)
                v = d["verification"]
                sched = d.get("schedule")
                parts.append(PartResult(
                    sub, KernelGraph.from_json(d["graph"]), naive, d["source"],
                    d["estimated_us"], d["naive_estimated_us"],
                    None if v is None else SavedVerification(**v),
                    SearchStats(**d["stats"]), d["candidates"], d["verified"],
                    stages=tuple(d.get("stages", ())),
                    schedule=None if not sched else Schedule.from_json(sched),
                    untuned_us=d.get("untuned_us"), measured_us=d.get("measured_us")))
            return cls(program, doc["target"], parts, doc["search_seconds"])
        except (KeyError, TypeError) as e:
            raise SerializationError(f"malformed superopt result: {type(e).__name__}: {e}") \
                from None


@dataclass(frozen=True)
class SavedVerification:
    """A verification result as stored in a saved file."""

    equivalent: bool
    bound: float
    tests_run: int
    seconds: float


def load(path: str) -> OptimizedProgram:
    """Load a result written by ``OptimizedProgram.save``."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise SerializationError(f"{path}: not JSON ({e})") from None
    return OptimizedProgram.from_json(doc)
