"""The region layer at work on one part: the floor, region searches, the cover -- anytime.

1. **Candidates.** Every operator of the naive lowering (one pre-defined kernel each); the
   floor's groups (:func:`regions.floor_groups`), each lowered to one kernel by a quick search
   (one kernel, no tuning, about a second for all of them together, whatever the budget); the
   search regions (:func:`regions.search_regions`), each one structure searched at most once
   per run (regions with the same canonical program -- identical layers -- share the search).
2. **Lazy, exact selection.** An unsearched region enters the cover at a *lower bound* of what
   any answer for it can cost under the model (``lower_bound``, the analytic model's
   :func:`~mirage_py.cost_model.lower_bound_us`: launches, memory round trips, its inputs read
   and outputs written once, and for one kernel an output element's read cone loaded by one
   block). The cheapest cover is solved; the regions in it that are unsearched get searched
   (several at once in worker processes), those searched but untuned get tuned (a sub-region's
   search defers its tuning; until tuned an option enters at its untuned cost /
   ``TUNE_SLACK``, never below what any graph of its kernel count costs), those tuned but
   unverified get their best option verified (the next one if it fails), and the cover is
   solved again, until every piece of the cover is a verified answer. The rounds decide on
   quick covers (``exact=False``: the cheapest where that is proven cheaply, else a good one);
   the loop ends only on a proven cheapest one. A region left unsearched (or untuned) then
   could not have made the cover cheaper even at its lower bound (or optimistic cost), so
   the answer is the cheapest cover by every region's best verified answer: exact under the
   cost model (given that tuning gains at most ``TUNE_SLACK``), without searching or tuning
   every region.
3. **Anytime.** After every step the best verified cover so far is known. When the search
   budget runs out or Ctrl-C arrives, no more regions are searched (those not searched leave the
   cover) and the loop finishes with verification only.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mproc
import queue as _queue
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import MirageError
from ..generator.kernel_search import SearchStats
from ..lax.program import Program
from ..regions import PartDag, Region, extract, floor_groups, search_regions
from ..regions.assemble import assemble, value_names
from ..regions.cover import Candidate as CoverCandidate, Cover, solve_cover
from ..tuning.annotations import AnnotatedGraph
from ..ugraph.graph import DTensor, KernelGraph, KernelOp
from ..ugraph.lower import naive_lowering
from .executors import _label
from .result import Piece, PartResult, RegionResult, summed_verification
from .search import (Explored, Settings, SavedVerification, _Progress, apply_measurements,
                     explore, explore_or_tune, frozen_heap, measure, measures, record,
                     stored_answer)

FLOOR_SECONDS = 1.0  # the floor's quick searches, all groups of a part together
FLOOR = Settings(max_kernels=1, tune_top=0, tune_rounds=0)
# a search of a region smaller than its part gives up after visiting this many block-level
# states without finding one candidate (on the decoder block the successful searches found
# their first candidate within 55,000 states, the hopeless ones went on to 230,000); the
# whole part, which was the only region before regions existed, is searched to the end
PATIENCE = 100_000
# ... and one with a break-even cost to beat (``_break_even``) after this many: on the decoder
# block at batch 1 and 8, four layers and a 512-token prefill, such searches found their first
# candidate under the cap within 36,000 states
CAPPED_PATIENCE = 40_000
# a region smaller than its part is searched for answers of at most this many kernels: one
# kernel, or a split reduction and its combine (flash-decoding); longer sequences of a
# sub-region mostly pass program values between kernels, which the cover composes from smaller
# regions anyway
SUB_REGION_KERNELS = 2
# what tuning can at most gain over a structure's untuned cost (the largest gain seen: 1.89x, a
# decoder block's attention region; gqa's whole part 1.73x). A sub-region's structures are
# tuned only once the cover wants them: until then they enter the cover at their best untuned
# cost over this, never below their lower bound; and a sub-region's search keeps kernel
# sequences up to its break-even cost times this (``_break_even``)
TUNE_SLACK = 2.0


@dataclass
class Run:
    """What every part of one ``superopt`` call shares."""

    target: Any
    model: Any
    runner: Any
    db: Any
    settings: Settings
    workers: int
    search_deadline: float | None
    deadline: float | None
    verify_tests: int | None
    max_verify: int
    measure_top: int
    progress: bool
    seed: int
    structures: dict = field(default_factory=dict)  # region key -> _Structure (whole run)
    interrupted: bool = False
    executor: Any = None  # where searches, verification and measurements run (None: here)

    @property
    def remote(self) -> bool:
        """Whether the executor runs work elsewhere (Ray): then region searches, their
        verification and measurements go to it as tasks, and only what comes back is kept."""
        return bool(getattr(self.executor, "remote", False))

    def expired(self) -> bool:
        return self.interrupted or (self.search_deadline is not None and
                                    time.perf_counter() > self.search_deadline)


@dataclass
class _Structure:
    """Everything known about one region structure (a canonical program)."""

    program: Program
    lb: float
    whole: bool = False  # the whole part of some part of this run
    status: str = "open"  # open, explored, verified, failed, skipped
    explored: Explored | None = None
    options: list = field(default_factory=list)  # still to verify, best first
    measured: dict = field(default_factory=dict)
    result: RegionResult | None = None
    verifier: Any = None
    tried: int = 0
    naive: tuple | None = None  # (graph, cost)
    floor: RegionResult | None = None  # the quick one-kernel lowering, when it is a floor group
    recorded: bool = False
    cap: float | None = None  # its search keeps only kernel sequences cheaper than this
    tuned_floor: float = 0.0  # what its options can cost at least once tuned (``_explored``)
    two_kernels: bool = False  # its lower bound is two kernels' (one kernel costs more)

    @property
    def cost(self) -> float:
        if self.status == "verified":
            return self.result.estimated_us
        if self.status == "explored":
            if not self.options:
                return math.inf
            if self.explored is not None and self.explored.pending:  # not tuned yet
                return max(self.lb, self.tuned_floor)
            return self.options[0][0]
        if self.status == "open":
            return self.lb
        return math.inf


def lower_bound(model, program: Program, target, kernels: int | None = None) -> float:
    """What any kernel graph for ``program`` (of ``kernels`` graph-defined kernels; None: any)
    costs at least under ``model`` (0 when the model does not say)."""
    f = getattr(model, "lower_bound", None)
    if f is None:
        return 0.0
    return float(f(program, target) if kernels is None else f(program, target, kernels))


def _structure(program: Program, model, target) -> _Structure:
    """A new structure with its lower bound, and whether that bound is two kernels' (one
    kernel would load more in a block than two kernels cost: a layer boundary's down
    projection and the next RMSNorm)."""
    lb = lower_bound(model, program, target)
    return _Structure(program, lb, two_kernels=0 < lower_bound(model, program, target, 2) <= lb)


def solve_part(part: Program, run: Run) -> PartResult:
    """The answer for one verifiable part (see the module docstring)."""
    t0 = time.perf_counter()
    tgt, model = run.target, run.model
    original = part
    part, shift_check = _max_shifted_part(part, run)
    naive = naive_lowering(part)
    naive_us = model.predict(naive, tgt)
    dag = PartDag(part)
    names = value_names(part)
    # 1. candidates: the naive operators
    lowered = [t for t in part.nodes() if t.op not in ("input", "const")]  # masks too
    op_kernels = dict(zip((t.digest for t in lowered), naive.ops))
    tensors = naive.tensors()
    op_cost = {}
    priced: dict = {}  # operators alike but for tensor names (identical layers) cost the same
    for d, k in op_kernels.items():
        ins = list(dict.fromkeys(k.inputs))
        sig = (k.op, k.attrs, k.output.shape, k.output.dtype,
               tuple((tensors[n].shape, tensors[n].dtype) for n in ins),
               tuple(ins.index(o) if isinstance(o, str) else o for o in k.operands))
        if sig not in priced:
            g = KernelGraph("op", tuple(tensors[n] for n in ins), (k,), (k.output.name,))
            priced[sig] = model.predict(g, tgt)
        op_cost[d] = priced[sig]
    inner = set(dag.by_digest)
    values = inner | set(dag.masks)  # what a pre-defined kernel may read from another

    by_digest = {t.digest: t for t in lowered}

    def op_inputs(d: str) -> list:
        return [x for x in by_digest[d].inputs if x.op != "const"]

    def reads_of(ops: frozenset, inputs) -> frozenset:
        return frozenset(v for v in inputs if v in inner)

    op_cands = [CoverCandidate(f"op:{k}", frozenset(
        x.digest for x in op_inputs(d) if x.digest in values), frozenset([d]), op_cost[d],
        frozenset([d]) if d in inner else frozenset()) for k, d in enumerate(op_kernels)]
    op_of = {f"op:{k}": d for k, d in enumerate(op_kernels)}
    # the regions: floor groups and search regions
    floor_sets = [g for g in floor_groups(dag) if len(g) > 1]
    search_sets = search_regions(dag)
    regions: dict[frozenset, Region] = {}
    for ops in floor_sets + search_sets:
        if ops not in regions:
            regions[ops] = extract(dag, ops)
    # a region the verifier cannot check alone (it nests exps) is left to smaller ones
    floor_sets = [g for g in floor_sets if regions[g].program.verifiable]
    search_sets = [g for g in search_sets if regions[g].program.verifiable]
    for r in regions.values():
        if r.key not in run.structures:
            run.structures[r.key] = _structure(r.program, model, tgt)
        run.structures[r.key].whole |= r.whole
    uses: dict[str, int] = {}
    for ops in set(search_sets) | set(floor_sets):
        uses[regions[ops].key] = uses.get(regions[ops].key, 0) + 1
    floor_keys = list(dict.fromkeys(regions[g].key for g in floor_sets))
    search_keys = list(dict.fromkeys(regions[g].key for g in search_sets))
    bar = _RegionBar(part.name, run.progress, len(search_keys))

    # 2. the floor: every group lowered by a quick one-kernel search, whatever the budget
    tf = time.perf_counter()
    for i, key in enumerate(floor_keys):
        st = run.structures[key]
        _from_database(st, run)
        if st.status == "verified" or st.floor is not None:
            continue
        share = max(0.05, (FLOOR_SECONDS - (time.perf_counter() - tf)) / (len(floor_keys) - i))
        ex = explore(st.program, tgt, model, FLOOR, time.perf_counter() + share)
        st.floor = _verify_first(st, ex.options, run, "floor", ex, tries=2)
    floor_seconds = time.perf_counter() - tf

    def cover_candidates(floor_only: bool = False) -> tuple[list, dict]:
        cands = list(op_cands)
        what: dict[str, tuple] = {}
        for ops in floor_sets:
            r = regions[ops]
            st = run.structures[r.key]
            res = st.floor if floor_only or st.status != "verified" else st.result
            if res is not None:
                k = f"floor:{dag.pos[min(ops, key=dag.pos.get)]}:{len(what)}"
                cands.append(CoverCandidate(k, reads_of(ops, r.inputs), frozenset(r.outputs),
                                            res.estimated_us, ops))
                what[k] = (r, res)
        if not floor_only:
            for ops in search_sets:
                r = regions[ops]
                st = run.structures[r.key]
                k = f"region:{len(what)}"
                cands.append(CoverCandidate(k, reads_of(ops, r.inputs), frozenset(r.outputs),
                                            st.cost, ops))
                what[k] = (r, None)
        return cands, what

    outputs = frozenset(t.digest for t in part.output_tensors.values())
    needed = frozenset(inner)  # the part's nodes are all ancestors of its outputs
    solves, solve_s = 0, 0.0
    cands, _ = cover_candidates(floor_only=True)
    floor_cover = solve_cover(cands, outputs, needed=needed)
    solves, solve_s = 1, floor_cover.seconds

    # 3. the cover, lazily: search what it wants, verify what it picks, until it settles
    while True:
        cands, what = cover_candidates()
        # a quick cover decides what to search next; the loop ends on a proven cheapest one
        cover = solve_cover(cands, outputs, needed=needed, exact=False)
        solves += 1
        solve_s += cover.seconds
        todo = _wanted(cover, what, run)
        if not todo and not cover.proven:
            cover = solve_cover(cands, outputs, needed=needed)
            solves += 1
            solve_s += cover.seconds
            todo = _wanted(cover, what, run)
        bar.update(sum(run.structures[k].status != "open" for k in search_keys), cover.cost)
        if not todo:
            break
        opened = [st for st in todo if st.status == "open"]
        if opened:
            for st in opened:
                _from_database(st, run)
            opened = [st for st in opened if st.status == "open"]
        if opened:
            if run.expired():
                for st in opened:
                    st.status = "skipped"
                continue
            # regions whose bound is two kernels' (one kernel would load too much in a block)
            # wait while others the cover wants are searched: their answers mostly pass
            # program values between the kernels, which the cover composes from smaller
            # regions, and once those are known the cover often stops wanting them
            first = [st for st in opened if not st.two_kernels]
            if first:
                opened = first
            searching = opened + _speculate(opened, run, cover_candidates, outputs, needed)
            cands, what = cover_candidates()
            verified = [c for c in cands if not c.key.startswith("region:") or
                        run.structures[what[c.key][0].key].status == "verified"]
            for st in searching:
                st.cap = _break_even(st, run, search_sets, regions, verified)
            _explore_all(searching, run, bar)
            continue
        # explored: tune those whose tuning waits for the cover to want them, then verify the
        # best remaining option (the next round, at its tuned cost, if it still is picked)
        untuned = [st for st in todo if st.status == "explored" and st.explored.pending]
        if untuned:
            if run.expired():  # no time left to tune: their untuned options stand
                for st in untuned:
                    st.explored.pending = []
                    _measured(st, run)
            else:
                _explore_all(untuned, run, bar)
            continue
        _verify_all([st for st in todo if st.status == "explored"], run)

    # 4. the answer
    pieces: list[Piece] = []
    parts_for_graph = []
    chosen_results: list[RegionResult] = []
    for k in cover.chosen:
        if k.startswith("op:"):
            d = op_of[k]
            op = op_kernels[d]
            pieces.append(Piece("op", op_cost[d], 1, 1, None, f"{op.op} -> {op.output.name}"))
            parts_for_graph.append(("op", d, op))
            continue
        region, res = what[k]
        if res is None:
            res = run.structures[region.key].result
        res.uses = uses.get(region.key, 1)
        pieces.append(Piece("region", res.estimated_us, res.graph.num_kernels, len(region.ops),
                            res))
        parts_for_graph.append(("region", region, res.annotated))
        chosen_results.append(res)
    graph, stages = assemble(part, parts_for_graph, names)
    part_us = model.predict(AnnotatedGraph(graph, stages), tgt)
    explored = [run.structures[k] for k in search_keys
                if run.structures[k].explored is not None]
    stats = SearchStats()
    for st in explored:
        for f in ("states", "pruned", "plans", "kernels", "candidates", "seconds"):
            setattr(stats, f, getattr(stats, f) + getattr(st.explored.stats, f))
        stats.timed_out |= st.explored.stats.timed_out
        stats.interrupted |= st.explored.stats.interrupted
    stats.timed_out |= any(run.structures[k].status == "skipped" for k in search_keys) and \
        not run.interrupted
    stats.interrupted |= run.interrupted
    _record_all(run, [run.structures[k] for k in search_keys])
    if part is not original:  # report against the program as written
        naive = naive_lowering(original)
        naive_us = model.predict(naive, tgt)
    out = PartResult(original, graph, _source(pieces), part_us, naive_us,
                     stats=stats, candidates=sum(st.explored.candidates for st in explored),
                     verified=sum(st.tried for st in explored), stages=tuple(stages),
                     tune_rounds=sum(st.explored.tune_rounds for st in explored),
                     tune_evaluations=sum(st.explored.tune_evaluations for st in explored),
                     naive=naive, pieces=pieces, regions=len(regions),
                     searched=sum(run.structures[k].status in ("verified", "explored", "failed")
                                  for k in search_keys),
                     floor_us=floor_cover.cost, floor_seconds=floor_seconds,
                     cover_seconds=solve_s, cover_solves=solves)
    if len(chosen_results) == 1 and len(pieces) == 1:
        r = chosen_results[0]
        out.schedule, out.untuned_us, out.best_untuned_us = r.schedule, r.untuned_us, \
            r.best_untuned_us
        out.measured_us, out.naive_measured_us, out.origin = r.measured_us, \
            r.naive_measured_us, r.origin
    if chosen_results:  # pre-defined kernels beside them compute their operators exactly
        out.verification = summed_verification(
            chosen_results + ([_ShiftCheck(shift_check)] if shift_check is not None else []))
    elif original.verifiable:
        from ..verifier import Verifier
        out.verification = Verifier(original, seed=run.seed, target=tgt).check(
            graph, tests=run.verify_tests)
    else:  # the naive lowering of a part that nests exps: the program's own operators
        out.verification = SavedVerification(True, 0.0, 0, 0.0)
    bar.close()
    return out


def _wanted(cover: Cover, what: dict, run: Run) -> list[_Structure]:
    """The structures of the cover's regions that are not verified answers yet."""
    todo: list[_Structure] = []
    for k in cover.chosen:
        if k.startswith("region:"):
            st = run.structures[what[k][0].key]
            if st.status != "verified" and st not in todo:
                todo.append(st)
    return todo


@dataclass
class _ShiftCheck:
    """A verification that enters a union bound beside the regions' (``summed_verification``
    reads ``.verification``)."""

    verification: Any


def _max_shifted_part(part: Program, run: Run) -> tuple[Program, Any]:
    """The part with the row max subtracted inside every exp normalised by a sum
    (``generator.rewrite.max_shifted``), so that its regions -- an exp and its normalisation
    may land in different kernels -- never store an unshifted exp; and the verification that
    it is the same function as ``part``, which joins the regions' union bound: each shifted
    exp's cluster (``rewrite.shift_clusters``: what its factor reaches, a program of its own
    that never nests exps, even where the part does) checked against its shifted form. ``part``
    itself where there is nothing to shift or a check fails."""
    from ..generator.rewrite import max_shifted, shift_clusters
    shifted = max_shifted(part)
    if shifted is None:
        return part, None
    from ..verifier import Verifier
    dag = PartDag(part)
    checks = []
    done: dict = {}  # clusters with one canonical program (identical layers) are checked once
    for ops in shift_clusters(part):
        region = extract(dag, ops)
        if region.key not in done:
            cluster = region.program
            local = max_shifted(cluster)
            if local is None or cluster.nested_exp():
                return part, None
            done[region.key] = Verifier(cluster, seed=run.seed, target=run.target).check(
                naive_lowering(local), tests=run.verify_tests)
        if not done[region.key].equivalent:
            return part, None
        checks.append(_ShiftCheck(done[region.key]))
    return shifted, summed_verification(checks)


def _speculate(opened: list[_Structure], run: Run, cover_candidates, outputs, needed) -> list:
    """Structures to search alongside ``opened`` while workers would otherwise idle: those the
    cover would want next if ``opened`` all failed. Searching them changes no answer (the
    cover is exact over whatever has been searched); it only saves a round later."""
    extra: list[_Structure] = []
    if run.workers <= 1:
        return extra
    saved = {id(st): st.status for st in opened}
    for st in opened:
        st.status = "failed"
    try:
        while len(opened) + len(extra) < run.workers:
            cands, what = cover_candidates()
            try:
                cover = solve_cover(cands, outputs, needed=needed, exact=False)
            except MirageError:
                break
            more = [st for st in _wanted(cover, what, run) if st.status == "open"]
            if not more:
                break
            for st in more[:run.workers - len(opened) - len(extra)]:
                _from_database(st, run)
                if st.status == "open":
                    extra.append(st)
                    st.status = "failed"
    finally:
        for st in opened:
            st.status = saved[id(st)]
        for st in extra:
            st.status = "open"
    return extra


def _break_even(st: _Structure, run: Run, search_sets: list, regions: dict,
                done: list) -> float | None:
    """What an answer for a sub-region must beat to be of any use: at each place the structure
    occurs, the cheapest cover of just that region's operators by what is already verified
    (the naive operators, the floor, answered regions) -- an answer costing more could always
    be replaced by that cover, which computes the same operators, reads no more and writes at
    least the region's outputs. The largest over the places, times ``TUNE_SLACK`` (the search
    ranks untuned kernels, tuning still lowers them); None for the whole part, which is searched
    to the end as before regions existed. ``done``: the cover candidates that are verified
    answers (every one but the regions not answered yet)."""
    if st.whole:
        return None
    worst = 0.0
    solved: dict = {}  # places with the same pieces in the region's own terms cost the same
    for ops in search_sets:
        r = regions[ops]
        if run.structures[r.key] is not st:
            continue
        inside = [CoverCandidate(c.key, c.reads & ops, c.writes, c.cost, c.computes)
                  for c in done if c.computes and c.computes <= ops]
        loc = r.local
        sig = frozenset((c.cost, frozenset(loc[v] for v in c.reads),
                         frozenset(loc[v] for v in c.writes),
                         frozenset(loc[d] for d in c.computes)) for c in inside)
        if sig not in solved:
            try:
                # a quick cover costs at least the cheapest: the cap only gets looser
                solved[sig] = solve_cover(inside, frozenset(r.outputs), needed=ops,
                                          exact=False).cost
            except MirageError:
                return None  # no cover of it from verified pieces yet: search it unbounded
        worst = max(worst, solved[sig])
    return worst * TUNE_SLACK if worst > 0 else None


def _source(pieces: list[Piece]) -> str:
    srcs = {x.result.source for x in pieces if x.kind == "region"}
    if not srcs:
        return "naive"
    if srcs == {"database"}:
        return "database"
    if srcs <= {"floor", "database"} and "floor" in srcs:
        return "floor"
    return "search"


def _from_database(st: _Structure, run: Run) -> None:
    """Take a stored verified answer for the structure, if the database has one."""
    if run.db is None or st.status != "open":
        return
    got = stored_answer(run.db, st.program, run.target, run.model)
    if got is None:
        return
    g, stages, cost, v, schedule, measured, untuned, origin = got
    st.result = RegionResult(st.program, g, "database", cost,
                             _naive(st, run)[1], v, stages=stages, schedule=schedule,
                             measured_us=measured, untuned_us=untuned, origin=origin)
    st.status = "verified"
    st.recorded = True


def _naive(st: _Structure, run: Run) -> tuple:
    if st.naive is None:
        g = naive_lowering(st.program)
        st.naive = (g, run.model.predict(g, run.target))
    return st.naive


def _explore_all(sts: list[_Structure], run: Run, bar) -> None:
    """Search the structures -- or, for those searched already, tune what their search left to
    tune (``_prior``) -- each in one process: a region's answer never depends on how many
    workers there are (a search whose plans were shared among processes would prune
    differently). With one worker they run here, one after another; with more, each in a worker
    process of its own, ``run.workers`` at a time; with a remote executor, each as a task of its
    own on the cluster, ``run.workers`` in flight (then measured there too). A structure whose
    job does not come back is skipped (a search) or keeps its untuned options (a tuning)."""
    if run.remote:
        got = run.executor.explore([(id(st), st.program, _settings(st, run), _prior(st))
                                    for st in sts], run)
        for st in sts:
            _landed(st, got.get(id(st)), run)
        _measure_all([st for st in sts if id(st) in got and not st.explored.pending], run)
        return
    if run.workers <= 1:
        for st in sts:
            if run.expired():
                _landed(st, None, run)
                continue
            prog = _Progress(f"search {len(sts)}", run.progress and bar.bar is None,
                             run.model, run.target)
            try:
                ex = explore_or_tune(st.program, run.target, run.model, _settings(st, run),
                                     run.search_deadline, _prior(st), prog)
            finally:
                prog.close()
            _landed(st, ex, run)
        return
    got = _run_jobs(sts, run)
    for st in sts:
        _landed(st, got.get(id(st)), run)


def _prior(st: _Structure) -> Explored | None:
    """The search whose deferred tuning is the structure's next job (None: search it)."""
    return st.explored if st.explored is not None and st.explored.pending else None


def _landed(st: _Structure, ex: Explored | None, run: Run) -> None:
    """A job's result for ``st`` (None: it did not come back)."""
    if ex is not None:
        _explored(st, ex, run)
    elif _prior(st) is not None:  # the tuning was lost: keep the untuned options
        st.explored.pending = []
        _measured(st, run)
    else:
        st.status = "skipped"


def _settings(st: _Structure, run: Run) -> Settings:
    if st.whole:
        return run.settings
    return replace(run.settings, patience=CAPPED_PATIENCE if st.cap else PATIENCE, cap=st.cap,
                   max_kernels=min(run.settings.max_kernels, SUB_REGION_KERNELS),
                   defer_tuning=True)


def _explored(st: _Structure, ex: Explored, run: Run) -> None:
    st.explored = ex
    st.options = list(ex.options)
    if ex.pending:
        # until tuned, an option enters at its untuned cost / TUNE_SLACK, but never below what
        # any graph of its kernel count costs (tuning moves part counts and schedules, never
        # the kernels): a two-kernel option untuned at 8.1 us enters at two launches' 6.0 us,
        # not 4.1
        floors: dict[int, float] = {}
        best = math.inf
        for cost, ag, *_ in st.options:
            k = ag.graph.num_kernels
            if k not in floors:
                floors[k] = lower_bound(run.model, st.program, run.target, k)
            best = min(best, max(cost / TUNE_SLACK, floors[k]))
        st.tuned_floor = best
    if ex.stats.interrupted:
        run.interrupted = True
    if not ex.pending and not run.remote:  # remote: _measure_all
        _measured(st, run)
    st.status = "explored" if st.options else "failed"


def _measured(st: _Structure, run: Run) -> None:
    """Time the structure's best options (tuned, or for good untuned) with a measuring runner
    (a remote executor's are timed by :func:`_measure_all`)."""
    st.options = list(st.explored.options)
    if st.options and measures(run.runner) and not run.remote:
        st.measured = measure(st.options, _naive(st, run)[0], run.runner, run.target,
                              run.measure_top)


def _measure_all(sts: list[_Structure], run: Run) -> None:
    """Measure the explored structures' best options with a remote executor: one GPU task per
    structure (its naive graph and ``measure_top`` best options timed on one device), all
    submitted at once; what does not come back stays unmeasured (ranked by prediction)."""
    if not measures(run.runner) or run.measure_top <= 0:
        return
    todo = [st for st in sts if st.options]
    if not todo:
        return
    got = run.executor.measure([(id(st), _label(st.program), _naive(st, run)[0],
                                 [o[1] for o in st.options[:run.measure_top]]) for st in todo],
                               run)
    for st in todo:
        if id(st) in got:
            st.measured = apply_measurements(st.options, run.measure_top, *got[id(st)])


class _Checked:
    """A structure's verifier with results computed elsewhere put in front (a remote
    executor's verification tasks): ``check`` answers each handed-in graph once from
    ``known`` (by structural hash) and asks a local :class:`Verifier` for anything else."""

    def __init__(self, local, program: Program, run: Run):
        self.local, self.program, self.run = local, program, run
        self.known: dict[str, Any] = {}

    def check(self, graph: KernelGraph, tests: int | None = None):
        got = self.known.pop(graph.structural_hash(), None)
        if got is not None:
            return got
        if self.local is None:
            from ..verifier import Verifier
            self.local = Verifier(self.program, seed=self.run.seed, target=self.run.target)
        return self.local.check(graph, tests=tests)


def _verify_all(sts: list[_Structure], run: Run) -> None:
    """:func:`_verify_next` for each structure; with a remote executor their checks run first
    as tasks, all at once (a check the cluster does not answer is done here)."""
    if run.remote:
        jobs = [(id(st), st.program, st.options[0][1].graph) for st in sts
                if st.options and st.tried < run.max_verify]
        got = run.executor.verify(jobs, run) if jobs else {}
        for st in sts:
            if id(st) in got:
                if not isinstance(st.verifier, _Checked):
                    st.verifier = _Checked(st.verifier, st.program, run)
                st.verifier.known[st.options[0][1].graph.structural_hash()] = got[id(st)]
    for st in sts:
        _verify_next(st, run)


def _verify_next(st: _Structure, run: Run) -> None:
    """Verify the structure's best remaining option; on success it is the answer."""
    if not st.options or st.tried >= run.max_verify:
        st.status = "failed"
        return
    res = _verify_first(st, st.options, run, "search", st.explored, tries=1)
    if res is not None:
        st.result, st.status = res, "verified"
    elif not st.options or st.tried >= run.max_verify:
        st.status = "failed"


def _verify_first(st: _Structure, options: list, run: Run, source: str, ex: Explored | None,
                  tries: int) -> RegionResult | None:
    """Verify ``options`` in order (popping each tried one) until one is equivalent."""
    from ..verifier import Verifier
    if st.verifier is None:
        st.verifier = Verifier(st.program, seed=run.seed, target=run.target)
    while options and tries > 0:
        opt = options.pop(0)
        tries -= 1
        st.tried += source == "search"
        cost, ag, untuned, sch = opt
        v = st.verifier.check(ag.graph, tests=run.verify_tests)
        if not v.equivalent or not _finite(st, ag.graph, run):
            continue
        m = st.measured.get(id(opt))
        nm = st.measured.get(-1)
        if m is not None:
            st.measured["chosen"] = m
        return RegionResult(st.program, ag.graph, source, cost, _naive(st, run)[1], v,
                            ex.stats if ex else SearchStats(), ex.candidates if ex else 0,
                            st.tried, ag.stages_full(), sch, untuned,
                            ex.best_untuned_us if ex else None,
                            None if m is None else m.us, None if nm is None else nm.us,
                            ex.tune_rounds if ex else 0, ex.tune_evaluations if ex else 0)
    return None


def _finite(st: _Structure, graph: KernelGraph, run: Run) -> bool:
    """An equivalent candidate is still rejected when, run in GPU precision on inputs of the
    magnitudes users have (unit normals, scaled ones, outlier features), it overflows, makes a
    NaN or misses the tolerance where the program's own naive lowering does not
    (``numerics_verdict``: attention without its max, say, whose exp overflows float16; a sum
    of squares stored in float16)."""
    from ..verifier import numerics_verdict
    return numerics_verdict(st.program, graph, _naive(st, run)[0], seed=run.seed,
                            target=run.target).ok


def _record_all(run: Run, sts: list[_Structure]) -> None:
    """One database transaction per structure searched in full (cut-short searches are
    recorded but their answer is not marked for reuse)."""
    if run.db is None:
        return
    for st in sts:
        if st.recorded or st.explored is None:
            continue
        st.recorded = True
        ex = st.explored
        complete = not (ex.stats.timed_out or ex.stats.interrupted)
        chosen = None
        if st.status == "verified" and st.result.source == "search":
            r = st.result
            chosen = (r.annotated, r.estimated_us, r.schedule, r.verification, r.source,
                      r.untuned_us)
        record(run.db, st.program, _naive(st, run), list(ex.options), st.measured, chosen,
               complete, run.target)


# ---- several searches at once -------------------------------------------------------------

def _job(key: int, prog_json: dict, settings: Settings, run: Run, q,
         prior_json: dict | None = None) -> None:
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


def _expected_seconds(st: _Structure) -> tuple:
    """A sort key for how long the structure's next job takes (longer last in the order)."""
    prior = _prior(st)
    if prior is not None:
        return (1, prior.stats.seconds)
    return (0, len(st.program.nodes()))


def _run_jobs(sts: list[_Structure], run: Run) -> dict[int, Explored]:
    """Explore every structure in a worker process of its own, ``run.workers`` at a time;
    returns what arrived (all of it, unless interrupted)."""
    ctx = mproc.get_context("fork" if sys.platform != "win32" else "spawn")
    q = ctx.Queue()
    # the longest jobs first, so that the round does not end on one worker finishing a long job
    # it started last: a tuning takes about as long as its structure's search took (attention
    # regions the longest), a search as long as its program is large
    pending = sorted(sts, key=_expected_seconds, reverse=True)
    running: dict[int, Any] = {}
    out: dict[int, Explored] = {}
    with frozen_heap():  # the workers are forks of this process
        try:
            while pending or running:
                while pending and len(running) < run.workers and not run.expired():
                    st = pending.pop(0)
                    prior = _prior(st)
                    p = ctx.Process(target=_job, args=(id(st), st.program.to_json(),
                                                       _settings(st, run), run, q,
                                                       None if prior is None else prior.to_json()),
                                    daemon=True)
                    p.start()
                    running[id(st)] = p
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
            run.interrupted = True
            while True:
                try:
                    key, payload = q.get_nowait()
                except _queue.Empty:
                    break
                out[key] = Explored.from_json(json.loads(payload))
        finally:
            for p in running.values():
                if p.is_alive():
                    p.terminate()
                p.join(timeout=1)
    return out


class _RegionBar:
    """Progress over a part's regions (tqdm on a terminal): structures searched of all, and the
    best cover so far."""

    def __init__(self, label: str, enabled: bool, total: int):
        self.bar = None
        if enabled and total > 1:
            try:
                from tqdm import tqdm
                self.bar = tqdm(desc=f"regions {label}", total=total, unit=" regions",
                                leave=False)
            except ImportError:
                self.bar = None

    def update(self, done: int, cover_us: float) -> None:
        if self.bar is not None:
            self.bar.n = done
            self.bar.set_postfix(cover_us=f"{cover_us:.1f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
