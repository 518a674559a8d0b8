"""``mp.superopt``: partition -> search -> verify -> rank -> assemble, and the result object.

For each part of ``partition(program, uninterpreted=True)`` that the verifier can check, the
generator searches for fused kernel graphs; candidates are ranked by the cost model and verified
in that order until one is proved equivalent (finite-field random testing). Parts the verifier
cannot check, and parts where nothing better than the naive lowering is found, use the naive
lowering (one pre-defined kernel per operator). The parts' kernel graphs are joined into one.

Search work is spread over processes (``workers``): each takes a share of the first-level plans
and streams every complete candidate back as it is found, so a time budget or Ctrl-C keeps
everything already found. Results are ordered by (estimated time, structural hash): the same
seed and settings give the same answer.
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

from .cost_model import estimate_us
from .errors import MirageError, SerializationError
from .generator.kernel_search import (Candidate, Searcher, SearchStats, search,
                                      trace_from_json)
from .lax.partition import partition
from .lax.program import Program
from .targets import get_target
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

    @property
    def speedup(self) -> float:
        return self.naive_estimated_us / self.estimated_us if self.estimated_us else float("nan")


def _search_worker(args: tuple) -> None:
    prog_json, target_name, max_kernels, deadline, share, nshares, q = args
    program = Program.from_json(prog_json)
    stats = SearchStats()
    try:
        search(program, get_target(target_name), max_kernels=max_kernels, deadline=deadline,
               stats=stats, share=(share, nshares),
               on_candidate=lambda c: q.put(("cand", json.dumps(
                   {"graph": c.graph.to_json(), "trace": c.trace_json()}))))
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
            progress(len(found))
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
                progress(len(found))
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
    """A progress line on stderr (tqdm when installed and stderr is a terminal)."""

    def __init__(self, label: str, enabled: bool):
        self.bar = None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(desc=label, unit=" candidates", leave=False)
            except ImportError:
                self.bar = None

    def __call__(self, n: int) -> None:
        if self.bar is not None:
            self.bar.n = n
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def superopt(program: Program, *, target: Any = "h100", time_budget_s: float | None = None,
             seed: int = 0, workers: int | None = None, max_kernels: int = 3,
             verify_tests: int | None = None, max_verify: int = 16, tune_top: int = 4,
             progress: bool | None = None) -> "OptimizedProgram":
    """Superoptimise ``program`` for ``target`` (see module docstring)."""
    from .verifier import verify

    if not isinstance(program, Program):
        raise MirageError(f"superopt: expected a Program, got {type(program).__name__}")
    tgt = get_target(target)
    if workers is None:
        workers = max(1, min(os.cpu_count() or 1, 8))
    if progress is None:
        progress = sys.stderr.isatty()
    t0 = time.perf_counter()
    deadline = t0 + time_budget_s if time_budget_s else None
    parts = partition(program, uninterpreted=True)
    results: list[PartResult] = []
    for part in parts:
        naive = naive_lowering(part)
        naive_us = estimate_us(naive, tgt)
        res = PartResult(part, naive, naive, "naive", naive_us, naive_us)
        if part.verifiable:
            bar = _Progress(f"search {part.name}", progress)
            try:
                found, stats = _parallel_search(part, tgt, max_kernels, deadline, workers, bar)
            finally:
                bar.close()
            res.stats = stats
            ranked = _rank(found, tgt)
            res.candidates = len(ranked)
            ranked = _tune(part, tgt, ranked, tune_top, deadline)
            for cost, g in ranked[:max_verify]:
                if cost >= naive_us:
                    break
                v = verify(part, g, tests=verify_tests, seed=seed)
                res.verified += 1
                if v.equivalent:
                    res.graph, res.source, res.estimated_us, res.verification = g, "search", cost, v
                    break
            if res.verification is None:
                res.verification = verify(part, naive, tests=verify_tests, seed=seed)
        results.append(res)
    return OptimizedProgram(program, tgt.name, results, time.perf_counter() - t0)


def _rank(cands: list[Candidate], target) -> list[tuple[float, Candidate]]:
    """Candidates by (estimated time, structural hash), duplicates dropped: deterministic."""
    out = {}
    for c in cands:
        h = c.graph.structural_hash()
        if h not in out:
            out[h] = (estimate_us(c.graph, target), h, c)
    return [(cost, c) for cost, _, c in sorted(out.values(), key=lambda x: (x[0], x[1]))]


def _tune(part: Program, target, ranked: list[tuple[float, Candidate]], top: int,
          deadline: float | None) -> list[tuple[float, KernelGraph]]:
    """Tune the part counts of the best ``top`` candidates; all candidates re-ranked."""
    searcher = Searcher(part, target, deadline)
    cost = lambda g: estimate_us(g, target)  # noqa: E731
    tuned = [searcher.tune(c, cost) for _, c in ranked[:top]] + [c for _, c in ranked[top:]]
    return [(cost, c.graph) for cost, c in _rank(tuned, target)]


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
                 search_seconds: float):
        self.program = program
        self.target = target
        self.parts = parts
        self.search_seconds = search_seconds
        self.partition = partition(program, uninterpreted=True)
        self.graph = join_parts(program, [p.graph for p in parts], self.partition)
        self.naive_graph = join_parts(program, [p.naive for p in parts], self.partition)
        self._compiled = None

    # -- numbers --------------------------------------------------------------------------------
    @property
    def num_kernels(self) -> int:
        return self.graph.num_kernels

    @property
    def naive_num_kernels(self) -> int:
        return self.naive_graph.num_kernels

    @property
    def estimated_time_us(self) -> float:
        return estimate_us(self.graph, self.target)

    @property
    def naive_estimated_time_us(self) -> float:
        return estimate_us(self.naive_graph, self.target)

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
            self._compiled = CompiledGraph(self.graph, self.target)
        return self._compiled(inputs)

    def export_cuda(self, directory: str) -> None:
        """Write .cu/.h files and a PyTorch extension for the chosen graph into ``directory``."""
        from .codegen_cuda import export_cuda
        export_cuda(self.graph, directory, target=self.target)

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
            lines.append(f"  part {i} [{kinds}] {p.source}: {p.naive.num_kernels} -> "
                         f"{p.graph.num_kernels} kernels, {p.naive_estimated_us:.1f} -> "
                         f"{p.estimated_us:.1f} us ({p.speedup:.2f}x); {vb}")
            lines.append(f"    {p.candidates} candidates, {p.verified} verified; "
                         f"{p.stats.states} states, {p.stats.pruned} pruned, "
                         f"{p.stats.plans} plans in {p.stats.seconds:.2f} s"
                         + (" (time budget hit)" if p.stats.timed_out else "")
                         + (" (interrupted)" if p.stats.interrupted else ""))
            for op in p.graph.ops:
                if isinstance(op, GraphKernel):
                    bg = op.block
                    lines.append(f"    graph kernel -> {', '.join(t.name for t in op.outputs)}: "
                                 f"grid {bg.grid}, {bg.threads} threads, forloop {bg.forloop}, "
                                 f"{len(bg.ops)} block ops")
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
                parts.append(PartResult(
                    sub, KernelGraph.from_json(d["graph"]), naive, d["source"],
                    d["estimated_us"], d["naive_estimated_us"],
                    None if v is None else SavedVerification(**v),
                    SearchStats(**d["stats"]), d["candidates"], d["verified"]))
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
