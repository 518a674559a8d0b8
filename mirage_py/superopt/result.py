"""What ``superopt`` returns: per region and per part results, joined into one program."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from ..errors import MirageError, SerializationError
from ..generator.kernel_search import SearchStats
from ..lax.partition import partition
from ..lax.program import Program
from ..tuning.annotations import AnnotatedGraph, Schedule
from ..ugraph.graph import DTensor, GraphKernel, KernelGraph, KernelOp
from ..ugraph.lower import naive_lowering
from .search import default_model

FORMAT = "mirage_py.optimized"
FORMAT_VERSION = 2


@dataclass(frozen=True)
class SavedVerification:
    """A verification result as stored in a saved file or the results database (or the union of
    several: the bound is then the sum of the regions' bounds)."""

    equivalent: bool
    bound: float
    tests_run: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"equivalent": bool(self.equivalent), "bound": float(self.bound),
                "tests_run": int(self.tests_run), "seconds": float(self.seconds)}

    @classmethod
    def of(cls, v: Any) -> "SavedVerification":
        """Any verification result (a VerifyResult, a saved one) as stored."""
        return cls(bool(v.equivalent), float(v.bound), int(v.tests_run), float(v.seconds))


@dataclass
class Answer:
    """A program's answer: its chosen kernel graph, where it came from, its predicted time, its
    verification, and how the search for it went."""

    program: Program
    graph: KernelGraph
    source: str  # "search", "floor", "database", "naive"
    estimated_us: float
    naive_estimated_us: float
    verification: Any = None  # a VerifyResult or SavedVerification (equivalent, bound, ...)
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


@dataclass
class RegionResult(Answer):
    """The answer for one region, written for its canonical program (inputs ``r<i>``, outputs
    ``y<j>``; for the whole part, the part's own names)."""

    uses: int = 0  # regions of the program with this structure (identical layers: one search)


@dataclass
class Piece:
    """One step of a part's cover: a region's kernels, or one pre-defined kernel (``op``)."""

    kind: str  # "region" or "op"
    estimated_us: float
    kernels: int
    ops: int  # operators of the part it computes
    result: RegionResult | None = None
    op: str = ""
    # the operators it computes, as positions in the part's operator order (the same at every
    # size of a shape family: what a bucket's answer replays, superopt/family.py)
    positions: tuple[int, ...] = ()


@dataclass
class PartResult(Answer):
    """The answer for one part of the partition: the cheapest cover found (``pieces`` in run
    order) and the assembled graph. ``stats``, ``candidates``, ``verified`` and the tuning
    counts add up the full region searches of this part (the floor's quick ones are reported
    apart); ``verification`` is the chosen regions' union bound (docs/verifier.md)."""

    naive: KernelGraph | None = None
    pieces: list = field(default_factory=list)
    regions: int = 0  # regions considered (searched or not)
    searched: int = 0  # distinct region structures searched or found in the database
    floor_us: float | None = None  # the floor's cover
    floor_seconds: float = 0.0
    cover_seconds: float = 0.0  # time in the cover solver
    cover_solves: int = 0


def parts_of(program: Program):
    """The partition superopt works on: maximal parts of verifiable operators (uninterpreted
    element-wise functions included), exps nested or not -- each region is verified alone."""
    return partition(program, uninterpreted=True, split_nested_exp=False, horizontal=True)


def summed_verification(results: list) -> SavedVerification | None:
    """The union bound of independently verified pieces (docs/verifier.md)."""
    vs = [r.verification for r in results]
    if not vs:
        return None
    if len(vs) == 1:
        return vs[0]
    return SavedVerification(all(bool(v.equivalent) for v in vs),
                             min(1.0, sum(float(v.bound) for v in vs)),
                             sum(int(v.tests_run) for v in vs), sum(float(v.seconds) for v in vs))


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
                 search_seconds: float, model: Any = None, partitioned: Any = None,
                 origin: str = "search"):
        self.program = program
        self.target = target
        self.parts = parts
        self.search_seconds = search_seconds
        # "search": made by this call; "database": another call's whole answer, kept
        self.origin = origin
        self.model = model or default_model()
        # superopt hands over the partition it already made; a loaded result makes it again
        self.partition = partitioned if partitioned is not None else parts_of(program)
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
    def complete(self) -> bool:
        """Every part verified and no search cut short (by the time budget or an interrupt):
        an answer other calls may be given whole."""
        return all(p.verification is not None and bool(p.verification.equivalent)
                   and not p.stats.timed_out and not p.stats.interrupted for p in self.parts)

    @property
    def interrupted(self) -> bool:
        """Ctrl-C came during the call: the answer is the best verified one found until then."""
        return any(p.stats.interrupted for p in self.parts)

    @property
    def timed_out(self) -> bool:
        """The time budget ended before every region worth searching was searched: the answer
        is the best verified one found within it."""
        return any(p.stats.timed_out for p in self.parts)

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
            from ..codegen_cuda import CompiledGraph
            self._compiled = CompiledGraph(self.annotated, self.target)
        return self._compiled(inputs)

    def export_cuda(self, directory: str) -> None:
        """Write .cu/.h files and a PyTorch extension for the chosen graph into ``directory``."""
        from ..codegen_cuda import export_cuda
        export_cuda(self.annotated, directory, target=self.target)

    def to_dot(self) -> str:
        """Graphviz picture of the chosen kernels, one box per piece of each part's cover."""
        from ..ugraph.dot import to_dot
        return to_dot(self.graph)

    # -- reporting ------------------------------------------------------------------------------
    def summary(self) -> str:
        lines = [f"mirage_py superopt: {self.program.name} on {self.target}",
                 f"  kernels: {self.naive_num_kernels} naive -> {self.num_kernels}",
                 f"  estimated time: {self.naive_estimated_time_us:.1f} us naive -> "
                 f"{self.estimated_time_us:.1f} us "
                 f"({self.naive_estimated_time_us / self.estimated_time_us:.2f}x)",
                 f"  search: {self.search_seconds:.2f} s"
                 + (" (the whole answer from the results database)"
                    if self.origin == "database" else "")]
        if self.interrupted:
            lines.append("  interrupted (Ctrl-C): the best verified answer found until then; "
                         "what was verified is in the results database")
        elif self.timed_out:
            lines.append("  time budget hit: the best verified answer found within it")
        for i, p in enumerate(self.parts):
            lines += _part_lines(i, p)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"OptimizedProgram({self.program.name!r}, target={self.target!r}, "
                f"kernels {self.naive_num_kernels}->{self.num_kernels})")

    # -- persistence ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        parts = []
        for p in self.parts:
            d = _answer_json(p)
            d["pieces"] = [_piece_json(x) for x in p.pieces]
            d.update(regions=p.regions, searched=p.searched, floor_us=p.floor_us)
            parts.append(d)
        return {"format": FORMAT, "version": FORMAT_VERSION, "target": self.target,
                "program": self.program.to_json(), "search_seconds": self.search_seconds,
                "parts": parts}

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], model: Any = None, origin: str = "search",
                  search_seconds: float | None = None) -> "OptimizedProgram":
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
            raise SerializationError("not a saved mirage_py superopt result")
        if doc.get("version") not in (1, FORMAT_VERSION):
            raise SerializationError(f"result format version {doc.get('version')!r} is not "
                                     "supported")
        try:
            program = Program.from_json(doc["program"])
            parts = []
            for d in doc["parts"]:
                p = _answer_from_json(PartResult, d)
                p.naive = naive_lowering(p.program)
                p.pieces = [_piece_from_json(x) for x in d.get("pieces", ())]
                p.regions, p.searched = d.get("regions", 0), d.get("searched", 0)
                p.floor_us = d.get("floor_us")
                parts.append(p)
            return cls(program, doc["target"], parts,
                       doc["search_seconds"] if search_seconds is None else search_seconds,
                       model, origin=origin)
        except (KeyError, TypeError, MirageError) as e:
            if isinstance(e, SerializationError):
                raise
            raise SerializationError(f"malformed superopt result: {type(e).__name__}: {e}") \
                from None


def _verification_json(v) -> dict | None:
    return None if v is None else SavedVerification.of(v).to_json()


def _answer_json(a: Answer) -> dict:
    return {"program": a.program.to_json(), "graph": a.graph.to_json(), "source": a.source,
            "estimated_us": a.estimated_us, "naive_estimated_us": a.naive_estimated_us,
            "candidates": a.candidates, "verified": a.verified, "stats": a.stats.__dict__,
            "stages": list(a.stages),
            "schedule": None if a.schedule is None else a.schedule.to_json(),
            "untuned_us": a.untuned_us, "measured_us": a.measured_us, "origin": a.origin,
            "verification": _verification_json(a.verification)}


def _answer_from_json(cls, d: Mapping[str, Any]):
    v = d["verification"]
    sched = d.get("schedule")
    return cls(Program.from_json(d["program"]), KernelGraph.from_json(d["graph"]), d["source"],
               d["estimated_us"], d["naive_estimated_us"],
               None if v is None else SavedVerification(**v), SearchStats(**d["stats"]),
               d["candidates"], d["verified"], stages=tuple(d.get("stages", ())),
               schedule=None if not sched else Schedule.from_json(sched),
               untuned_us=d.get("untuned_us"), measured_us=d.get("measured_us"),
               origin=d.get("origin", ""))


def _piece_json(x: Piece) -> dict:
    d = {"kind": x.kind, "estimated_us": x.estimated_us, "kernels": x.kernels, "ops": x.ops,
         "op": x.op, "positions": list(x.positions)}
    if x.result is not None:
        d["result"] = _answer_json(x.result)
        d["result"]["uses"] = x.result.uses
    return d


def _piece_from_json(d: Mapping[str, Any]) -> Piece:
    res = None
    if d.get("result") is not None:
        res = _answer_from_json(RegionResult, d["result"])
        res.uses = d["result"].get("uses", 0)
    return Piece(d["kind"], d["estimated_us"], d["kernels"], d["ops"], res, d.get("op", ""),
                 tuple(d.get("positions", ())))


def _vtext(v) -> str:
    return (f"verified, bound {v.bound:.1e} ({v.tests_run} tests)"
            if v is not None and v.equivalent else "not verified")


def _part_lines(i: int, p: PartResult) -> list[str]:
    kinds = "Lax" if p.program.is_lax else ("Lax + uninterpreted "
                                            + ",".join(sorted(p.program.uninterpreted_ops))
                                            if p.program.verifiable else "non-Lax")
    src = p.source + (f" ({p.origin})" if p.origin else "")
    nk = p.naive.num_kernels if p.naive is not None else 0
    lines = [f"  part {i} [{kinds}] {src}: {nk} -> {p.graph.num_kernels} kernels, "
             f"{p.naive_estimated_us:.1f} -> {p.estimated_us:.1f} us ({p.speedup:.2f}x); "
             f"{_vtext(p.verification)}"]
    if p.source == "database":
        lines.append("    from the results database (no search)")
    else:
        lines.append(f"    {p.candidates} candidates, {p.verified} verified; "
                     f"{p.stats.states} states, {p.stats.pruned} pruned, "
                     f"{p.stats.plans} plans in {p.stats.seconds:.2f} s"
                     + (" (time budget hit)" if p.stats.timed_out else "")
                     + (" (interrupted)" if p.stats.interrupted else ""))
    if p.regions:
        lines.append(f"    regions: {p.searched} of {p.regions} searched; cover of "
                     f"{len(p.pieces)} piece(s)"
                     + (f"; floor {p.floor_us:.1f} us" if p.floor_us is not None else ""))
    if p.untuned_us is not None and p.source not in ("naive",):
        lines.append(f"    tuning: {p.untuned_us:.1f} -> {p.estimated_us:.1f} us"
                     + ("" if p.source == "database" else
                        f" ({p.tune_rounds} rounds, {p.tune_evaluations} schedules)"))
    if p.measured_us is not None:
        lines.append(f"    measured: {p.measured_us:.1f} us"
                     + (f" (naive {p.naive_measured_us:.1f} us)"
                        if p.naive_measured_us is not None else ""))
    if len(p.pieces) > 1 or (p.pieces and p.pieces[0].kind == "region" and p.regions > 1):
        for x in p.pieces:
            if x.kind == "op":
                lines.append(f"    - kernel {x.op}: {x.estimated_us:.1f} us")
            else:
                r = x.result
                lines.append(f"    - region of {x.ops} operator(s), {r.source}"
                             + (f" (shared by {r.uses} regions)" if r.uses > 1 else "")
                             + f": {x.kernels} kernel(s), {x.estimated_us:.1f} us, "
                             f"{_vtext(r.verification)}")
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
    return lines


def load(path: str) -> OptimizedProgram:
    """Load a result written by ``OptimizedProgram.save``."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise SerializationError(f"{path}: not JSON ({e})") from None
    except OSError as e:
        raise SerializationError(f"{path}: cannot read ({e.strerror or e})") from None
    return OptimizedProgram.from_json(doc)
