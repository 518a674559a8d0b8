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

:class:`PartCover` holds these steps as methods -- ``lay_floor``, ``candidates``, ``settle``
(searches, tunings, measurements and verifications handed to the run's executor as jobs keyed
by structure, :mod:`.jobs`) and ``answer`` (the union bound kept within 1e-9, :mod:`.bound`);
what is known about each region structure lives in a :class:`~.structure.Structure`.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
import warnings
from dataclasses import replace
from typing import Any, Iterator

from ..errors import MirageError
from ..generator.kernel_search import SearchStats
from ..lax.program import Program
from ..regions import PartDag, Region, extract, floor_groups, search_regions
from ..regions.assemble import assemble, value_names
from ..regions.cover import Cover, CoverCandidate, CoverError, LazyCovers, solve_cover
from ..tuning.annotations import AnnotatedGraph
from ..ugraph.graph import KernelGraph
from ..ugraph.lower import naive_lowering
from .jobs import ExploreJob, MeasureJob, VerifyJob, region_label
from .local import checked, verify_here
from .option import Option
from .result import PartResult, Piece, RegionResult, SavedVerification
from .run import Run
from .search import Explored, Settings, explore, measures
from .store import (Recording, keep_exploration, record, stored_answer,
                    stored_exploration)
from .structure import Status, Structure, lower_bound
from .bound import Checked, settled_verification

FLOOR_SECONDS = 1.0  # the floor's quick searches, all groups of a part together
# under a time budget, the floor's groups are laid while their guessed checks fit in this share
# of it (past ``FLOOR_SECONDS``, which any budget gets): the groups it leaves save the least
# per second of check (on the 32-layer 8B-size decoder an output projection with its residual
# saves 2.5 us a layer for a 2.4-4.5 s numerics check, the down projection 7.5 us for 5-9 s),
# and the rest of the budget goes to the searched structures the cover wants (a norm and query
# projection, the attention, the gate and up projections: 2-7 us a layer per second of check)
FLOOR_BUDGET_SHARE = 0.3
FLOOR = Settings(max_kernels=1, tune_top=0, tune_rounds=0)
# a search of a region smaller than its part gives up after visiting this many block-level
# states without finding one candidate (on the decoder block the successful searches found
# their first candidate within 55,000 states, the hopeless ones went on to 230,000); the
# whole part, which was the only region before regions existed, is searched to the end
PATIENCE = 100_000
# ... and one with a break-even cost to beat (``PartCover._break_even``) after this many: on
# the decoder block at batch 1 and 8, four layers and a 512-token prefill, such searches found
# their first candidate under the cap within 36,000 states
CAPPED_PATIENCE = 40_000
# a region smaller than its part is searched for answers of at most this many kernels: one
# kernel, or a split reduction and its combine (flash-decoding); longer sequences of a
# sub-region mostly pass program values between kernels, which the cover composes from smaller
# regions anyway
SUB_REGION_KERNELS = 2
# what tuning can at most gain over a structure's untuned cost (the largest gain seen: 1.89x, a
# decoder block's attention region; gqa's whole part 1.73x). A sub-region's structures are
# tuned only once the cover wants them: until then they enter the cover at their best untuned
# cost over this, never below their lower bound (``tuned_floor``); and a sub-region's search
# keeps kernel sequences up to its break-even cost times this (``PartCover._break_even``)
TUNE_SLACK = 2.0
# under a budget, the check of a structure's best option that cannot end in time gives way to
# the first of its next options (of this many best) whose check can (``PartCover._checkable``)
CHECK_OPTIONS = 4
# a cover solve gets at least this long even when the budget is spent (the 0/1 programs of 32
# stacked decoder layers take 0.05-1.5 s; a quick one over verified answers alone, the first)
COVER_LEAST_SECONDS = 0.5


def solve_part(part: Program, run: Run, recipe: list[Piece] | None = None) -> PartResult:
    """The answer for one verifiable part (see the module docstring); with ``recipe`` (the
    pieces of the same part of a shape family at another bucket, superopt/family.py) the cover
    is the recipe's, its regions' answers replayed at these sizes."""
    # after Ctrl-C (in an earlier part) the part is its naive operators: no regions to enumerate
    cover = PartCover(part, run, enumerate_regions=recipe is None and not run.interrupted)
    if recipe is not None:
        cover.replay(recipe)
    else:
        try:
            cover.lay_floor()
            cover.settle()
        except KeyboardInterrupt:  # the answer is what is verified so far
            run.interrupt()
        except CoverError:  # a cover solve cut short by the budget's end
            if not run.out_of_time():
                raise
    with sigint_deferred(run):  # the answer is made of what is verified: finish making it
        cover.keep_verified()
        out = cover.answer()
    out.stats.interrupted |= run.interrupted  # Ctrl-C before or while it was made
    return out


@contextlib.contextmanager
def sigint_deferred(run: Run) -> Iterator[None]:
    """Ctrl-C while a part's answer is assembled and recorded marks the run interrupted (the
    parts after this one answer at once) instead of raising in the middle of it: the answer
    is what is verified, and its records reach the results database whole. Only in the main
    thread, where Python's SIGINT handler runs. (``superopt`` writes the whole answer's record
    under it too.)"""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is None:
        yield
        return
    old = signal.signal(signal.SIGINT, lambda signum, frame: run.interrupt())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


class PartCover:
    """The region layer at work on one part, in named steps: :meth:`lay_floor`, then
    :meth:`settle` (the lazy cover: :meth:`candidates` in, searches, tunings and verifications
    out, until the cover is made of verified answers), then :meth:`answer`."""

    def __init__(self, part: Program, run: Run, enumerate_regions: bool = True):
        self.run = run
        self.original = part
        self.part, self.shift_check = _max_shifted_part(part, run)
        self.naive = naive_lowering(self.part)
        self.dag = PartDag(self.part)
        self.inner = frozenset(self.dag.by_digest)  # the part's nodes: all feed its outputs
        self.outputs = frozenset(t.digest for t in self.part.output_tensors.values())
        self._naive_candidates()
        if enumerate_regions:
            self._regions()
        else:  # a replayed cover (:meth:`replay`) needs none
            self.regions, self.uses = {}, {}
            self.floor_sets, self.search_sets, self.floor_keys, self.search_keys = [], [], [], []
        self.bar = _RegionBar(self.part.name, run.progress, len(self.search_keys))
        self.covers = LazyCovers(self.outputs, self.inner)  # the cover solves, counted
        self.floor_seconds = 0.0
        self.floor_cover: Cover | None = None
        self.floor_what: dict = {}
        self.cut_short = False  # the budget (or Ctrl-C) ended the floor or the cover early
        self.cover: Cover | None = None
        self.what: dict = {}
        self._names: dict | None = None  # digest -> tensor name in the assembled graph
        self._graphs: dict = {}  # id(cover) -> (cover, what _assembled made of it)
        self._verified_costs: dict = {}  # (structure, verified candidates) -> _verified_cost
        self._places: dict[str, list] = {}  # structure key -> its search regions' operators
        self._region_io: dict[frozenset, tuple] = {}  # a region's operators -> :meth:`_io`
        self._done_ops: tuple | None = None  # (verified candidates, operator -> their indices)

    # -- the candidates ---------------------------------------------------------------------
    def _naive_candidates(self) -> None:
        """Every operator of the naive lowering as a pre-defined kernel of its own; operators
        alike but for tensor names (identical layers) are priced once."""
        model, tgt = self.run.model, self.run.target
        lowered = [t for t in self.part.nodes() if t.op not in ("input", "const")]  # masks too
        self.op_kernels = dict(zip((t.digest for t in lowered), self.naive.ops))
        tensors = self.naive.tensors()
        self.op_cost: dict[str, float] = {}
        priced: dict = {}
        for d, k in self.op_kernels.items():
            ins = list(dict.fromkeys(k.inputs))
            sig = (k.op, k.attrs, k.output.shape, k.output.dtype,
                   tuple((tensors[n].shape, tensors[n].dtype) for n in ins),
                   tuple(ins.index(o) if isinstance(o, str) else o for o in k.operands))
            if sig not in priced:
                g = KernelGraph("op", tuple(tensors[n] for n in ins), (k,), (k.output.name,))
                priced[sig] = model.predict(g, tgt)
            self.op_cost[d] = priced[sig]
        values = self.inner | set(self.dag.masks)  # what a pre-defined kernel may read
        by_digest = {t.digest: t for t in lowered}
        self.op_cands = [CoverCandidate(
            f"op:{k}", frozenset(x.digest for x in by_digest[d].inputs
                                 if x.op != "const" and x.digest in values),
            frozenset([d]), self.op_cost[d], frozenset([d]) if d in self.inner else frozenset())
            for k, d in enumerate(self.op_kernels)]
        self.op_of = {f"op:{k}": d for k, d in enumerate(self.op_kernels)}

    def _regions(self) -> None:
        """The floor groups and the search regions, each with its structure (one per canonical
        program for the whole run); a region the verifier cannot check alone (it nests exps)
        is left to smaller ones."""
        run = self.run
        floor_sets = [g for g in floor_groups(self.dag) if len(g) > 1]
        search_sets = search_regions(self.dag)
        self.regions: dict[frozenset, Region] = {}
        for ops in floor_sets + search_sets:
            if ops not in self.regions:
                self.regions[ops] = extract(self.dag, ops)
        verifiable: dict[str, bool] = {}  # by structure: identical layers' regions ask once
        for r in self.regions.values():
            if r.key not in verifiable:
                verifiable[r.key] = r.program.verifiable
        self.floor_sets = [g for g in floor_sets if verifiable[self.regions[g].key]]
        self.search_sets = [g for g in search_sets if verifiable[self.regions[g].key]]
        for r in self.regions.values():
            if r.key not in run.structures:
                run.structures[r.key] = Structure.of(r.program, run.model, run.target)
            run.structures[r.key].whole |= r.whole
        self.uses: dict[str, int] = {}
        for ops in set(self.search_sets) | set(self.floor_sets):
            self.uses[self.regions[ops].key] = self.uses.get(self.regions[ops].key, 0) + 1
        self.floor_keys = list(dict.fromkeys(self.regions[g].key for g in self.floor_sets))
        self.search_keys = list(dict.fromkeys(self.regions[g].key for g in self.search_sets))

    def candidates(self, floor_only: bool = False,
                   left_out: frozenset = frozenset()) -> tuple[list, dict]:
        """The cover's candidates -- the naive operators, the floor's answers (a verified
        search answer in their place), and unless ``floor_only`` the search regions at their
        structures' costs (``left_out`` structures: at none) -- and what each key stands for:
        (region, its floor answer or None)."""
        cands = list(self.op_cands)
        what: dict[str, tuple] = {}
        for ops in self.floor_sets:
            r = self.regions[ops]
            st = self.run.structures[r.key]
            res = st.floor if floor_only or st.status is not Status.VERIFIED else st.result
            if res is not None:
                k = f"floor:{self.dag.pos[min(ops, key=self.dag.pos.get)]}:{len(what)}"
                cands.append(CoverCandidate(k, *self._io(r), res.estimated_us, ops))
                what[k] = (r, res)
        if not floor_only:
            for ops in self.search_sets:
                r = self.regions[ops]
                st = self.run.structures[r.key]
                k = f"region:{len(what)}"
                cands.append(CoverCandidate(k, *self._io(r),
                                            math.inf if r.key in left_out else st.cost, ops))
                what[k] = (r, None)
        return cands, what

    def _io(self, r: Region) -> tuple[frozenset, frozenset]:
        """What a region reads of the part's values, and what it writes (kept per region)."""
        got = self._region_io.get(r.ops)
        if got is None:
            got = self._region_io[r.ops] = (frozenset(v for v in r.inputs if v in self.inner),
                                            frozenset(r.outputs))
        return got

    def _solve(self, cands: list, exact: bool = True) -> Cover:
        return self.covers.solve(cands, exact=exact, time_limit_s=self._solve_limit())

    def _solve_limit(self) -> float:
        limit = self.run.seconds_left(at_least=COVER_LEAST_SECONDS)
        return 60.0 if limit is None else min(60.0, limit)

    # -- 1. the floor -----------------------------------------------------------------------
    def lay_floor(self) -> None:
        """Every floor group lowered by a quick one-kernel search, whatever the budget, and
        the cheapest cover by them and the naive operators."""
        run = self.run
        tf = time.perf_counter()
        budget = run.budget_s
        spent = 0.0  # guessed seconds of the checks of the groups laid so far
        for i, key in enumerate(self._floor_order()):
            st = run.structures[key]
            self._from_database(st)
            if st.status is Status.VERIFIED or st.floor is not None:
                continue
            share = max(0.05, (FLOOR_SECONDS - (time.perf_counter() - tf)) /
                        (len(self.floor_keys) - i))
            if run.interrupted or (time.perf_counter() - tf > FLOOR_SECONDS and run.expired()):
                self.cut_short = True  # the naive operators cover the remaining groups
                break
            if time.perf_counter() - tf <= FLOOR_SECONDS:  # any budget gets this much floor,
                # unless the check a search is guessed to need could not end in it or the budget
                # (at the 8B size a floor group's numerics check took 5-9 s)
                left = run.seconds_left()
                fits = run.check_guess(st.program) <= max(FLOOR_SECONDS,
                                                        math.inf if left is None else left)
            else:
                fits = run.room_for_check(st.program, extra_s=share)
            if fits and budget is not None:
                fits = spent + run.check_guess(st.program) <= FLOOR_BUDGET_SHARE * budget
            if not fits:  # this group stays naive operators; a cheaper check may still fit
                self.cut_short = True
                continue
            ex = None if run.db is None else \
                stored_exploration(run.db, st.program, run.target, run.key, FLOOR, floor=True)
            if ex is None:
                end = time.perf_counter() + share
                if run.search_deadline is not None:
                    end = min(end, max(run.search_deadline, tf + FLOOR_SECONDS))
                ex = explore(st.program, run.target, run.model, FLOOR, end)
                if ex.stats.interrupted:  # Ctrl-C in the search, which kept what it had
                    run.interrupt()
                if run.db is not None:
                    keep_exploration(run.db, st.program, run.target, run.key, FLOOR, ex,
                                     floor=True)
            spent += run.check_guess(st.program)
            st.floor = self._first_verified(st, ex.options, "floor", ex, tries=2)
        self.floor_seconds = time.perf_counter() - tf
        cands, self.floor_what = self.candidates(floor_only=True)
        self.floor_cover = self._solve(cands)

    def _floor_order(self) -> list[str]:
        """The floor's structures, the most time they can save per second of their check
        first: what their naive lowering costs above their lower bound at every place they
        occur, over the check :meth:`Run.check_guess` guesses for them (at the 8B size a
        numerics check takes 1e-7 s per input element, a gate-and-up group twice what a
        norm does and saves less). When the budget ends in the floor, what it has laid is
        the most it could have saved in that time."""
        run = self.run

        def rate(k: str) -> float:
            st = run.structures[k]
            saves = self.uses.get(k, 1) * max(0.0, st.naive(run.model, run.target).us - st.lb)
            return saves / max(run.check_guess(st.program), 1e-3)
        return sorted(self.floor_keys, key=lambda k: -rate(k))

    # -- 2. the lazy cover ------------------------------------------------------------------
    def settle(self) -> None:
        """Search what the cover wants, tune and verify what it picks, until every piece of
        the cover is a verified answer (see the module docstring); under a time budget in
        rounds of :meth:`_budget_round`."""
        while not self.run.out_of_time():
            if self.run.expired() and not any(self.run.structures[k].status is Status.EXPLORED
                                              for k in self.search_keys):
                return  # no search may start and nothing found waits for its check
            todo = self._wanted_now()
            if not todo:
                return
            opened = [st for st in todo if st.status is Status.OPEN]
            for st in opened:
                self._from_database(st)
            if self.run.budget_s is not None:
                if not self._budget_round(todo):
                    return  # nothing could be done before the budget ends
                continue
            opened = [st for st in opened if st.status is Status.OPEN]
            if opened:
                self._search(opened)
                continue
            # explored: tune those whose tuning waits for the cover to want them, then verify
            # the best remaining option (the next round, at its tuned cost, if still picked)
            untuned = [st for st in todo if st.status is Status.EXPLORED and st.prior is not None]
            if untuned:
                self._tune(untuned)
                continue
            if not self.run.room_for_check():
                return  # no check could end before the budget does (keep_verified answers)
            self._verify_all([st for st in todo if st.status is Status.EXPLORED])

    def _budget_round(self, todo: list[Structure]) -> bool:
        """One round of the cover loop under a time budget, where the checks (a numerics check
        at the 8B size: 1-3e-7 s per input element) are what the time goes to: of the wanted
        structures, one search per worker (:meth:`_search`: the most they can save per second
        of their check first, only those whose check can still end in time), one tuning per
        worker (a worker left idle searching the next structure the cover wants, tuned the
        next round), and the check of every tuned one that can end in time, the most worth per
        second first -- so what a round finds is checked before the next round searches, and
        the answer at any moment has the structures worth the most (each verified structure
        serves every place it occurs: identical layers). False when nothing could be done."""
        run = self.run
        opened = [st for st in todo if st.status is Status.OPEN]
        if opened:
            self._search(opened)
        untuned = [st for st in todo if st.status is Status.EXPLORED and st.prior is not None]
        if untuned:
            done = self._verified_candidates()
            tuning = sorted(untuned, key=lambda st: -self._saving_rate(st, done))[
                :max(1, run.workers)]
            # a worker the tunings leave idle searches the next structure the cover wants
            # (tuned and checked the next round): a tuning took 0.3-0.8 s of a round on the
            # 32-layer decoder with the other worker idle
            spare = max(0, run.workers - len(tuning))
            more = [st for st in todo if st.status is Status.OPEN]
            extra = self._searches(more, limit=spare, speculate=False) \
                if spare and more and not run.expired() else []
            self._tune(tuning, extra)
        ready = [st for st in todo if st.status is Status.EXPLORED and st.prior is None and
                 self._checkable(st)]
        if ready:
            self._verify_all(ready)
        return bool(opened or untuned or ready)

    def _checkable(self, st: Structure) -> bool:
        """Can the check of one of the structure's best ``CHECK_OPTIONS`` options end before
        the budget does? The first that can is put first: an option a little dearer that is
        checked now beats the best one whose check cannot end (on the 32-layer 8B-size decoder
        some tuned attention candidates verify at shrunk sizes in 0.1 s, others only at full
        size, 8-15 s: with the best one first the attention was never checked in 40 % of the
        unhurried time)."""
        for i, o in enumerate(st.options[:CHECK_OPTIONS]):
            if self.run.room_for_check(st.program, key=st.key, graph=o.graph):
                if i:
                    st.options.insert(0, st.options.pop(i))
                return True
        return False

    def _quick_option(self, cands: list, what: dict) -> list[tuple[Cover, dict]]:
        """A quick cover of ``cands`` as one more option for the answer kept at the end, or
        none when it cannot be had in time (a cover already among the options stands)."""
        try:
            return [(solve_cover(cands, self.outputs, needed=self.inner, exact=False,
                                 time_limit_s=COVER_LEAST_SECONDS), what)]
        except (MirageError, KeyboardInterrupt):
            return []

    def keep_verified(self) -> None:
        """When the budget ended or Ctrl-C came with the cover still wanting unverified
        regions: the cheapest cover by the verified answers alone (a quick solve), or the
        floor's, or the naive operators' -- whichever costs least; every one of them is a
        verified answer."""
        run = self.run
        if self.cover is not None and not _wanted(self.cover, self.what, run):
            return
        self.cut_short = True
        options: list[tuple[Cover, dict]] = [(self._naive_cover(), {})]
        if self.floor_cover is not None:
            options.append((self.floor_cover, self.floor_what))
        elif any(run.structures[self.regions[g].key].floor is not None for g in self.floor_sets):
            # Ctrl-C in the floor: the groups laid so far (they were lost with it, and an
            # interrupt 20 s into the 32-layer 8B-size decoder answered with the naive operators)
            options += self._quick_option(*self.candidates(floor_only=True))
        left_out = frozenset(k for k in self.search_keys
                             if run.structures[k].status is not Status.VERIFIED)
        if len(left_out) < len(self.search_keys):
            options += self._quick_option(*self.candidates(left_out=left_out))
        # by what the assembled graph is predicted to cost, which is what the answer reports
        # (a cover's summed cost prices each piece alone; assembling can widen statistics to
        # float32, drop a duplicate write, copy an output -- on the 16-layer decoder the two
        # agreed to 0.01 us: its "512 kernels, 1321 us against 480 naive, 1241 us" after an
        # early Ctrl-C was the naive cover of the max-shifted part against the naive lowering
        # of the program as written, two operators fewer per attention and an unshifted exp)
        self.cover, self.what = min(options, key=lambda o: self._predicted(*o))
        self.bar.update(sum(run.structures[k].status is not Status.OPEN
                            for k in self.search_keys), self.cover.cost)

    def _naive_cover(self) -> Cover:
        """Every operator its own pre-defined kernel, in the part's order."""
        keys = list(self.op_of)
        return Cover(keys, sum(self.op_cost[self.op_of[k]] for k in keys))

    def _wanted_now(self) -> list[Structure]:
        """The structures the cheapest cover wants that are not verified answers yet: a quick
        cover decides; where it wants none, a proven cheapest one (:class:`LazyCovers`: earlier
        proofs, and ties to the verified cover)."""
        cands, self.what = self.candidates()
        unsettled = frozenset(k for k, (r, res) in self.what.items() if res is None and
                              self.run.structures[r.key].status is not Status.VERIFIED)
        self.cover = self.covers.next(cands, unsettled, time_limit_s=self._solve_limit())
        todo = _wanted(self.cover, self.what, self.run)
        self.bar.update(sum(self.run.structures[k].status is not Status.OPEN
                            for k in self.search_keys), self.cover.cost)
        return todo

    def _search(self, opened: list[Structure]) -> None:
        """Search the opened structures (and what the cover would want next while workers
        idle), each under its break-even cap."""
        self._explore_all(self._searches(opened))

    def _searches(self, opened: list[Structure], limit: int | None = None,
                  speculate: bool = True) -> list[Structure]:
        """Of the opened structures, those to search now, each with its break-even cap: under
        a budget at most ``limit`` (default one per worker), and unless ``speculate`` is
        False, what the cover would want next while workers idle."""
        run = self.run
        if run.expired():  # no search starts again: every unsearched structure is out at once
            # (skipping only the wanted ones cost a cover solve per round for each next few the
            # cover then wanted: 1.1 s after a Ctrl-C on the 32-layer decoder, 2.0 s in all)
            for st in opened + [run.structures[k] for k in self.search_keys]:
                if st.status is Status.OPEN:
                    st.skip()
            return []
        if run.budget_s is not None:  # a search only where its answer's check could end in
            # time, the most it can save per second of that check first. Before a search there
            # is no candidate: its check is guessed at the size the naive lowering's would run
            # at (shrunk where the program allows it); each candidate found is then checked
            # only if its own verification fits (``local.explore``). A program with an exp was
            # guessed at full size: KernelBench's Matmul_Mish_Mish (75 M input elements, 26 s)
            # never searched in a 20 s budget, where its answer verifies shrunk in 0.4 s.
            for st in opened:
                if not run.room_for_check(st.program, key=st.key,
                                          graph=st.naive(run.model, run.target).graph):
                    st.skip()
            # one search per worker a round: what they find is checked before the next ones
            # start, not after every wanted structure has been searched
            done = self._verified_candidates()
            opened = sorted((st for st in opened if st.status is Status.OPEN),
                            key=lambda st: -self._potential_rate(st, done))[
                                :max(1, run.workers) if limit is None else limit]
            if not opened:
                return []
        # regions whose bound is two kernels' (one kernel would load too much in a block) wait
        # while others the cover wants are searched: their answers mostly pass program values
        # between the kernels, which the cover composes from smaller regions, and once those
        # are known the cover often stops wanting them
        first = [st for st in opened if not st.two_kernels]
        if first:
            opened = first
        searching = opened + (self._speculate(opened) if speculate else [])
        verified = self._verified_candidates()
        for st in searching:
            st.cap = self._break_even(st, verified)
        return searching

    def _tune(self, untuned: list[Structure], searches: list[Structure] = ()) -> None:
        """Tune the structures whose tuning waits (with ``searches`` beside them, searched
        alike: :meth:`_searches`)."""
        if self.run.expired():  # no time left to tune: their untuned options stand
            for st in untuned:
                st.drop_tuning()
            self._measure_all(untuned)
        else:
            self._explore_all(list(untuned) + list(searches))

    def _speculate(self, opened: list[Structure]) -> list[Structure]:
        """Structures to search alongside ``opened`` while workers would otherwise idle: those
        the cover would want next if ``opened`` all failed. Searching them changes no answer
        (the cover is exact over whatever has been searched); it only saves a round later."""
        run = self.run
        extra: list[Structure] = []
        left_out = {st.key for st in opened}
        while run.workers > 1 and len(opened) + len(extra) < run.workers:
            cands, what = self.candidates(left_out=frozenset(left_out))
            try:
                cover = solve_cover(cands, self.outputs, needed=self.inner, exact=False)
            except MirageError:
                break
            more = [st for st in _wanted(cover, what, run)
                    if st.status is Status.OPEN and st.key not in left_out]
            if not more:
                break
            for st in more[:run.workers - len(opened) - len(extra)]:
                self._from_database(st)
                if st.status is Status.OPEN:
                    extra.append(st)
                    left_out.add(st.key)
        return extra

    def _break_even(self, st: Structure, done: list) -> float | None:
        """What an answer for a sub-region must beat to be of any use: at each place the
        structure occurs, the cheapest cover of just that region's operators by what is already
        verified (:meth:`_verified_cost`) -- an answer costing more could always be replaced by
        that cover, which computes the same operators, reads no more and writes at least the
        region's outputs. The largest over the places, times ``TUNE_SLACK`` (the search ranks
        untuned kernels, tuning still lowers them); None for the whole part, which is searched
        to the end as before regions existed. ``done``: the cover candidates that are verified
        answers."""
        if st.whole:
            return None
        worst = self._verified_cost(st, done)
        return worst * TUNE_SLACK if worst else None

    def _verified_cost(self, st: Structure, done: list) -> float | None:
        """At each place the structure occurs, the cheapest cover of just that region's
        operators by the verified candidates ``done`` (naive operators, the floor, answered
        regions); the largest over the places (None: no such cover yet). Kept per structure
        while the verified candidates stay the same (pricing a dozen structures of 32 layers
        took a round 3-4 s otherwise)."""
        # what is verified only grows (a structure verified, a floor group laid)
        memo = (st.key, len(done), sum((x.status is Status.VERIFIED) + (x.floor is not None)
                                       for x in self.run.structures.values()))
        if memo not in self._verified_costs:
            self._verified_costs[memo] = self._cheapest_verified(st, done)
        return self._verified_costs[memo]

    def _cheapest_verified(self, st: Structure, done: list) -> float | None:
        worst = 0.0
        solved: dict = {}  # places with the same pieces in the region's own terms cost the same
        if not self._places:
            for ops in self.search_sets:
                self._places.setdefault(self.regions[ops].key, []).append(ops)
        for ops in self._places.get(st.key, []):
            r = self.regions[ops]
            inside = [CoverCandidate(c.key, c.reads & ops, c.writes, c.cost, c.computes)
                      for c in self._computing_within(done, ops)]
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
        return worst or None

    def _computing_within(self, done: list, ops: frozenset) -> list:
        """The candidates of ``done`` that compute operators of ``ops`` only (some), in
        ``done``'s order; ``done`` indexed by operator once (32 layers: 5,400 candidates for
        each of a structure's 32 places took a round 0.3 s)."""
        if self._done_ops is None or self._done_ops[0] is not done:
            by_op: dict[str, list[int]] = {}
            for i, c in enumerate(done):
                for d in c.computes:
                    by_op.setdefault(d, []).append(i)
            self._done_ops = (done, by_op)
        by_op = self._done_ops[1]
        near = sorted({i for d in ops for i in by_op.get(d, ())})
        return [done[i] for i in near if done[i].computes <= ops]

    def _verified_candidates(self) -> list:
        """The cover's candidates that are verified answers (all but unverified regions)."""
        cands, what = self.candidates()
        return [c for c in cands if not c.key.startswith("region:") or
                self.run.structures[what[c.key][0].key].status is Status.VERIFIED]

    # -- jobs: explore, measure, verify ---------------------------------------------------------
    def _explore_all(self, sts: list[Structure]) -> None:
        """Search the structures -- or, for those searched already, tune what their search left
        to tune -- as jobs of the run's executor; then measure the options that are final. A
        structure whose job does not come back is skipped (a search) or keeps its untuned
        options (a tuning)."""
        run = self.run
        settings = {st.key: _settings(st, run) for st in sts}
        got: dict = {}
        if run.db is not None:  # searches another call completed: no search
            for st in sts:
                if st.prior is None:
                    ex = stored_exploration(run.db, st.program, run.target, run.key,
                                            settings[st.key])
                    if ex is not None:
                        got[st.key] = ex
        jobs = [ExploreJob(st.key, st.program, settings[st.key], st.prior) for st in sts
                if st.key not in got]
        kept = set(got)
        got.update(run.executor.explore(jobs, run,
                                        progress=run.progress and self.bar.bar is None))
        ready = []
        for st in sts:
            ex = got.get(st.key)
            if ex is not None and ex.stats.interrupted:
                run.interrupt()
            if ex is not None and run.db is not None and st.key not in kept:
                keep_exploration(run.db, st.program, run.target, run.key, settings[st.key], ex)
            floor = tuned_floor(ex.options, st.program, run.model, run.target) \
                if ex is not None and ex.pending else 0.0
            if st.land(ex, floor):
                ready.append(st)
        self._measure_all(ready)

    def _measure_all(self, sts: list[Structure]) -> None:
        """Time the structures' naive graphs and ``measure_top`` best options with a measuring
        runner (one job per structure); what does not come back stays ranked by prediction."""
        run = self.run
        top = run.settings.measure_top
        todo = [st for st in sts if st.options]
        if not measures(run.runner) or top <= 0 or not todo:
            return
        got = run.executor.measure(
            [MeasureJob(st.key, region_label(st.program), st.naive(run.model, run.target).graph,
                        tuple(o.annotated for o in st.options[:top])) for st in todo], run)
        for st in todo:
            if st.key in got:
                st.take_measurements(got[st.key], top)

    def _verify_all(self, sts: list[Structure]) -> None:
        """Each structure's best remaining option verified (by the executor, all at once); on
        success it is the structure's answer."""
        run = self.run
        if run.budget_s is not None:  # the most worth per second of check first
            done = self._verified_candidates()
            sts = sorted(sts, key=lambda st: -self._saving_rate(st, done))
        jobs = [VerifyJob(st.key, st.program, st.options[0].graph) for st in sts
                if st.options and st.tried < run.settings.max_verify]
        got = run.executor.verify(jobs, run) if jobs else {}
        for st in sts:
            if not st.options or st.tried >= run.settings.max_verify:
                st.fail()
                continue
            if st.key not in got and not run.room_for_check(st.program, **self._candidate(st)):
                continue  # no time to verify it before the budget ends: it stays out
            res = self._first_verified(st, st.options, "search", st.explored, tries=1,
                                       known=got.get(st.key))
            if res is not None:
                st.answered(res)
            elif not st.options or st.tried >= run.settings.max_verify:
                st.fail()

    def _potential_rate(self, st: Structure, done: list) -> float:
        """What an unsearched structure can save at most per second of its answer's check:
        at every place it occurs, what the verified candidates ``done`` cover its operators
        for (:meth:`_verified_cost`) above its lower bound, over :meth:`Run.check_guess` --
        guessed, as the search's gate guesses it (:meth:`_searches`), at the size its naive
        lowering's check would run at. (Guessed without a graph, a program with an exp was
        guessed at full size: 12.9 s for the 32-layer 8B-size decoder's attention, whose tuned
        candidates verify shrunk in 0.1 s; ranked last, it was never searched in 40 % of the
        unhurried time.)"""
        run = self.run
        return self._rate(st, done, st.lb,
                          dict(key=st.key, graph=st.naive(run.model, run.target).graph))

    def _saving_rate(self, st: Structure, done: list) -> float:
        """What checking an explored structure's best option can save per second of its
        check: at every place it occurs, what the verified candidates ``done`` cover its
        operators for above the option's cost, over :meth:`Run.check_guess`. A budget that
        cannot check every wanted structure checks the ones worth the most per second first
        (at the 8B size a norm and query projection saves 20 us a layer over its naive
        operators for a 3 s check, the gate and up projections 25 us for an 11 s one)."""
        return self._rate(st, done, st.options[0].predicted_us if st.options else math.inf,
                          self._candidate(st))

    def _candidate(self, st: Structure) -> dict:
        """The next option of ``st`` to check, as :meth:`Run.check_guess` takes it (its
        verification guessed at the size it will run at); none before a search found one."""
        return dict(key=st.key, graph=st.options[0].graph) if st.options else {}

    def _rate(self, st: Structure, done: list, cost: float, candidate: dict | None = None
              ) -> float:
        run = self.run
        base = self._verified_cost(st, done)
        if base is None:
            base = st.naive(run.model, run.target).us
        saves = self.uses.get(st.key, 1) * max(0.0, base - cost)
        return saves / max(run.check_guess(st.program, **(candidate or {})), 1e-3)

    def _first_verified(self, st: Structure, options: list[Option], source: str,
                        ex: Explored | None, tries: int, known: Any = None) -> RegionResult | None:
        """Verify ``options`` in order (popping each tried one) until one is equivalent and
        numerically safe; ``known``: the first one's verification, done already."""
        run = self.run
        while options and tries > 0:
            if source == "search" and not run.room_for_check(
                    st.program, known=known is not None, key=st.key, graph=options[0].graph):
                return None  # no time left to check it: the structure stays unverified
            opt = options.pop(0)
            tries -= 1
            st.tried += source == "search"
            v = known if known is not None else \
                verify_here(VerifyJob(st.key, st.program, opt.graph), run)
            known = None
            if not v.equivalent or not _finite(st, opt.graph, run):
                continue
            return st.result_for(opt, v, source, ex, st.naive(run.model, run.target).us)
        return None

    def _from_database(self, st: Structure) -> None:
        """Take a stored verified answer for the structure, if the database has one."""
        run = self.run
        if run.db is None or st.status is not Status.OPEN:
            return
        got = stored_answer(run.db, st.program, run.target, run.model, run.key)
        if got is not None:
            st.answered(RegionResult(
                st.program, got.graph, "database", got.predicted_us,
                st.naive(run.model, run.target).us, got.verification, stages=got.stages,
                schedule=got.schedule, measured_us=got.measured_us, untuned_us=got.untuned_us,
                origin=got.origin), stored=True)

    # -- or: a shape family's cover, replayed --------------------------------------------------
    def replay(self, recipe: list[Piece]) -> None:
        """The cover of a shape family's answer at another bucket (superopt/family.py): the
        representative's pieces at the same places of this part, each region's answer replayed
        from the representative's schedule at these sizes -- no search -- and verified for this
        run's sizes. A region whose replay does not apply (or does not verify) is searched
        here; one that finds nothing falls back to its naive operators."""
        run = self.run
        op_key = {d: k for k, d in self.op_of.items()}
        chosen: list[str] = []
        self.what = {}
        for piece in recipe:
            if piece.kind == "op":
                chosen.append(op_key[self._node_at(piece.positions[0])])
                continue
            ops = frozenset(self._node_at(i) for i in piece.positions)
            region = extract(self.dag, ops)
            if region.key not in run.structures:
                run.structures[region.key] = Structure.of(region.program, run.model, run.target)
            st = run.structures[region.key]
            self._from_database(st)
            if st.status is not Status.VERIFIED:
                res = _replayed(st, piece.result, run)
                if res is not None:
                    st.answered(res)
                else:
                    self._search_alone(st)
            if st.status is Status.VERIFIED:
                k = f"replay:{len(self.what)}"
                self.what[k] = (region, st.result)
                chosen.append(k)
            else:  # nothing verified for it at these sizes: its operators one by one
                chosen += [op_key[d] for d in sorted(ops, key=self.dag.pos.get)]
        cost = sum(self.what[k][1].estimated_us if k in self.what else
                   self.op_cost[self.op_of[k]] for k in chosen)
        self.cover = self.floor_cover = Cover(chosen, cost)

    def _search_alone(self, st: Structure) -> None:
        """Search, tune and verify one structure to the end (a replay that did not apply)."""
        st.whole = True
        self._explore_all([st])
        while st.status is Status.EXPLORED and self.run.room_for_check(st.program):
            self._verify_all([st])

    # -- 3. the answer ------------------------------------------------------------------------
    def answer(self) -> PartResult:
        """The cover's pieces assembled into the part's graph, with what the searches did, the
        structures recorded in the database, and the chosen pieces' verification."""
        run, part = self.run, self.part
        pieces, graph, stages, chosen = self._assembled(self.cover, self.what)
        explored = [run.structures[k] for k in self.search_keys
                    if run.structures[k].explored is not None]
        stats = SearchStats()
        for st in explored:
            stats += st.explored.stats
        stats.timed_out |= not run.interrupted and (self.cut_short or any(
            run.structures[k].status is Status.SKIPPED for k in self.search_keys))
        verification = self._verification(chosen)  # before recording: maybe stronger
        self._record_all([run.structures[k] for k in self.search_keys])
        naive = self.naive if part is self.original else naive_lowering(self.original)
        out = PartResult(
            self.original, graph, _source(pieces),
            self._predicted(self.cover, self.what),
            run.model.predict(naive, run.target), stats=stats,
            candidates=sum(st.explored.candidates for st in explored),
            verified=sum(st.tried for st in explored), stages=tuple(stages),
            tune_rounds=sum(st.explored.tune_rounds for st in explored),
            tune_evaluations=sum(st.explored.tune_evaluations for st in explored),
            naive=naive, pieces=pieces, regions=len(self.regions),
            searched=sum(run.structures[k].searched for k in self.search_keys),
            floor_us=None if self.floor_cover is None else self.floor_cover.cost,
            floor_seconds=self.floor_seconds,
            cover_seconds=self.covers.seconds, cover_solves=self.covers.solves)
        if len(chosen) == 1 and len(pieces) == 1:
            r = chosen[0]
            out.schedule, out.untuned_us, out.best_untuned_us = r.schedule, r.untuned_us, \
                r.best_untuned_us
            out.measured_us, out.naive_measured_us, out.origin = r.measured_us, \
                r.naive_measured_us, r.origin
        out.verification = verification
        self.bar.close()
        return out

    def _position(self, d: str) -> int:
        """Where node ``d`` stands in the part, the same at every size of a shape family: its
        position among the operators, or for a mask -(1 + its position among the masks)."""
        if d in self.dag.pos:
            return self.dag.pos[d]
        return -1 - list(self.dag.masks).index(d)

    def _node_at(self, position: int) -> str:
        """The digest of the node at ``position`` (:meth:`_position`)."""
        if position >= 0:
            return self.dag.nodes[position].digest
        return list(self.dag.masks)[-1 - position]

    def _assembled(self, cover: Cover, what: dict
                   ) -> tuple[list[Piece], KernelGraph, list, list[RegionResult]]:
        """A cover assembled into the part's graph (memoised per cover): its pieces, the graph,
        its graph kernels' pipeline stages, and the region answers among the pieces."""
        key = id(cover)
        if key not in self._graphs:
            pieces, body, chosen = self._pieces(cover, what)
            if self._names is None:
                self._names = value_names(self.part)
            graph, stages = assemble(self.part, body, self._names)
            self._graphs[key] = (cover, (pieces, graph, stages, chosen))
        return self._graphs[key][1]

    def _predicted(self, cover: Cover, what: dict) -> float:
        """What the cost model predicts for a cover's assembled graph."""
        _, graph, stages, _ = self._assembled(cover, what)
        return self.run.model.predict(AnnotatedGraph(graph, stages), self.run.target)

    def _pieces(self, cover: Cover, what: dict) -> tuple[list[Piece], list, list[RegionResult]]:
        """A cover in run order: its pieces, what ``assemble`` builds the graph from, and the
        region answers among them."""
        pieces: list[Piece] = []
        body: list = []
        chosen: list[RegionResult] = []
        for k in cover.chosen:
            if k.startswith("op:"):
                d = self.op_of[k]
                op = self.op_kernels[d]
                pieces.append(Piece("op", self.op_cost[d], 1, 1, None,
                                    f"{op.op} -> {op.output.name}", (self._position(d),)))
                body.append(("op", d, op))
                continue
            region, res = what[k]
            if res is None:
                res = self.run.structures[region.key].result
            res.uses = self.uses.get(region.key, 1)
            pieces.append(Piece("region", res.estimated_us, res.graph.num_kernels,
                                len(region.ops), res,
                                positions=tuple(sorted(self.dag.pos[d] for d in region.ops))))
            body.append(("region", region, res.annotated))
            chosen.append(res)
        return pieces, body, chosen

    def _verification(self, chosen: list[RegionResult]) -> Any:
        """The part's verification: the union bound of its verified pieces (the pre-defined
        kernels beside them compute their operators exactly) and of the max-shift check,
        within the stated bound (:func:`.bound.settled_verification`) -- for a cover of naive
        operators alone the max-shift check is the whole bound (they compute the shifted part
        exactly). A cover of the program's own operators alone, unshifted, is exact on the
        same ground (bound 0, no test): it used to be checked whole, at full size and past the
        time budget -- 51 s of field matmuls for KernelBench's 4096 x 4096 triangular matmul
        under a 20 s budget, to confirm the one-kernel-per-operator lowering."""
        if chosen or self.shift_check:
            return settled_verification(chosen, self.shift_check, self.run)
        return SavedVerification(True, 0.0, 0, 0.0)

    def _record_all(self, sts: list[Structure]) -> None:
        """One database transaction per structure searched (cut-short searches are recorded
        but their answer is not marked for reuse)."""
        run = self.run
        if run.db is None:
            return
        for st in sts:
            if st.recorded or st.explored is None:
                continue
            st.recorded = True
            ex = st.explored
            chosen = st.result if st.status is Status.VERIFIED and \
                st.result.source == "search" else None
            naive = st.naive(run.model, run.target)
            record(run.db, Recording(st.program, naive.graph, naive.us, st.naive_measured,
                                     list(ex.options), st.measured, chosen,
                                     not (ex.stats.timed_out or ex.stats.interrupted)),
                   run.target, run.key)


def tuned_floor(options: list[Option], program: Program, model: Any, target: Any) -> float:
    """What a structure's untuned options can cost at least once tuned: each its untuned cost
    over ``TUNE_SLACK``, but never below what any graph of its kernel count costs (tuning moves
    part counts and schedules, never the kernels: a two-kernel option untuned at 8.1 us enters
    at two launches' 6.0 us, not 4.1)."""
    floors: dict[int, float] = {}
    best = math.inf
    for o in options:
        k = o.graph.num_kernels
        if k not in floors:
            floors[k] = lower_bound(model, program, target, k)
        best = min(best, max(o.predicted_us / TUNE_SLACK, floors[k]))
    return best


def _settings(st: Structure, run: Run) -> Settings:
    """A structure's search settings: the run's for a whole part; a sub-region's searches give
    up sooner, keep at most ``SUB_REGION_KERNELS`` kernels under its break-even cap, and defer
    their tuning until the cover wants them."""
    if st.whole:
        return run.settings.search()
    return replace(run.settings.search(), patience=CAPPED_PATIENCE if st.cap else PATIENCE,
                   cap=st.cap, max_kernels=min(run.settings.max_kernels, SUB_REGION_KERNELS),
                   defer_tuning=True)


def _wanted(cover: Cover, what: dict, run: Run) -> list[Structure]:
    """The structures of the cover's regions that are not verified answers yet."""
    todo: list[Structure] = []
    for k in cover.chosen:
        if k.startswith("region:"):
            st = run.structures[what[k][0].key]
            if st.status is not Status.VERIFIED and st not in todo:
                todo.append(st)
    return todo


def _replayed(st: Structure, rep: RegionResult | None, run: Run) -> RegionResult | None:
    """The structure's answer rebuilt from ``rep`` -- the same region's answer at another
    bucket of a shape family -- by replaying its schedule at these sizes with the size change
    given to the part and trip counts or to the tiles and loop chunks, in the shares
    ``GROWTHS`` (``rescale_trace``; the best tile at one size is not the best at another), the
    cheapest first under the cost model; the first that verifies for this run's sizes and is
    numerically safe is the answer. None when no replay applies."""
    from ..generator.kernel_search import GROWTHS, Searcher, rescale_trace
    from ..generator.labels import label_correspondences
    from ..generator.rewrite import forms
    from ..tuning.tuner import replay_schedule
    if rep is None or rep.schedule is None:
        return None
    tried, options = set(), []
    for form, (old, new) in enumerate(zip(forms(rep.program), forms(st.program))):
        old_labels = Searcher(old, run.target).labels
        new_labels = Searcher(new, run.target).labels
        # the labels' names where they match, then every way the two name the same dims
        maps = [None, *label_correspondences(old, old_labels, new, new_labels)]
        for labels, growth in ((m, g) for m in maps for g in GROWTHS):
            trace = rescale_trace(rep.schedule.trace, old_labels.sizes, new_labels.sizes,
                                  growth, labels)
            # a trace replays the search's steps on one algebraic form: on another form the
            # same trace is another graph (one that may not compute the program at all)
            if trace is None or (form, trace) in tried:
                continue
            tried.add((form, trace))
            sched = replace(rep.schedule, trace=trace)
            try:
                ag = replay_schedule(new, run.target, sched)
            except MirageError:
                ag = None
            if ag is not None:
                options.append((run.model.predict(ag, run.target), len(options), ag, sched))
    for us, _, ag, sched in sorted(options, key=lambda o: o[:2]):
        v = checked(run.new_verifier(st.program), ag.graph, run.settings.verify_tests)
        if v.equivalent and _finite(st, ag.graph, run):
            return RegionResult(st.program, ag.graph, "replay", us,
                                st.naive(run.model, run.target).us, v,
                                stages=ag.stages_full(), schedule=sched)
    return None


def _finite(st: Structure, graph: KernelGraph, run: Run) -> bool:
    """An equivalent candidate is still rejected when, run in GPU precision on inputs of the
    magnitudes users have (unit normals, scaled ones, outlier features), it overflows, makes a
    NaN or misses the tolerance where the program's own naive lowering does not
    (``numerics_verdict``: attention without its max, say, whose exp overflows float16; a sum
    of squares stored in float16)."""
    from ..verifier import numerics_verdict
    t0 = time.perf_counter()
    try:
        v = numerics_verdict(st.program, graph, st.naive(run.model, run.target).graph,
                             seed=run.settings.seed, target=run.target, sizes=run.sizes)
    except MemoryError as e:  # the candidate is not accepted; the search goes on
        warnings.warn(f"superopt: a candidate's numerics check did not fit in memory ({e}); "
                      "the candidate is rejected", RuntimeWarning, stacklevel=2)
        return False
    run.numerics_times.note(v.elements, time.perf_counter() - t0)
    return v.ok


def _max_shifted_part(part: Program, run: Run) -> tuple[Program, list[Checked]]:
    """The part with the row max subtracted inside every exp normalised by a sum
    (``generator.rewrite.max_shifted``), so that its regions -- an exp and its normalisation
    may land in different kernels -- never store an unshifted exp; and the verification that
    it is the same function as ``part``, which joins the regions' union bound: each shifted
    exp's cluster (``rewrite.shift_clusters``: what its factor reaches, a program of its own
    that never nests exps, even where the part does) checked against its shifted form, one term
    per cluster. ``part`` itself where there is nothing to shift or a check fails."""
    from ..generator.rewrite import max_shifted, shift_clusters
    shifted = max_shifted(part)
    if shifted is None:
        return part, []
    dag = PartDag(part)
    checks: list[Checked] = []
    done: dict[str, Checked] = {}  # clusters with one canonical program are checked once
    for ops in shift_clusters(part):
        region = extract(dag, ops)
        if region.key not in done:
            cluster = region.program
            local = max_shifted(cluster)
            if local is None or cluster.nested_exp():
                return part, []
            g = naive_lowering(local)
            done[region.key] = Checked(cluster, g, checked(run.new_verifier(cluster), g,
                                                           run.settings.verify_tests))
        if not done[region.key].verification.equivalent:
            return part, []
        checks.append(done[region.key])
    return shifted, checks


def _source(pieces: list[Piece]) -> str:
    srcs = {x.result.source for x in pieces if x.kind == "region"}
    if not srcs:
        return "naive"
    if srcs == {"database"}:
        return "database"
    if srcs <= {"floor", "database"} and "floor" in srcs:
        return "floor"
    return "search"


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
