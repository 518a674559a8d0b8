"""What every part of one ``superopt`` call shares: the target, the model, the settings, the
executor, the deadlines -- and every region structure met so far, by key."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..errors import MirageError
from .store import AnswerKey, AnswerSettings

# after Ctrl-C, candidates already found are still verified for this long (a small program's
# take milliseconds); the answer then comes from what is verified, within 2 s
INTERRUPT_GRACE_S = 1.0
# seconds per input element a check (verification, or numerics check) takes before any has
# been timed in this call: the 8B-size decoder's first floor group (down projection, 58.75 M
# input elements) took 4.8-8 s to verify at full size and 5.4-8.8 s for numerics on a shared
# 2-core machine (load 5-8). Verification at shrunk sizes (verifier/shrink.py) takes 0.01-0.1 s
# for the same groups, so once one check of each kind is timed, each kind is guessed from its
# own measurements (:class:`CheckTimes`).
CHECK_S_PER_ELEMENT = 1.4e-7
# ... and a verification at full size before one has been timed: the first full-size check of a
# structure computes the program's field reference at full size -- the 32-layer decoder's decode
# attention (33.6 M input elements; its floor's and untuned candidates cannot shrink, see
# docs/verifier.md) took 9.5-15 s at load 5-8, 3-4.5e-7 s per element. Guessed at 1.4e-7 it was
# checked before the down projection, whose check it then crowded out of a 100 % budget
FULL_VERIFY_S_PER_ELEMENT = 3.5e-7
# under a time budget, searches, tunings and the floor start only before the budget less this
# share of it, at least ``SEARCH_RESERVE_S`` (what is left is for the checks of what they found,
# each started only where it is guessed to end in time, and the answer's assembly). 20 % held
# back a 100 % budget on the 32-layer 8B-size decoder from the searches the unhurried call made
# in the same time (1.014x the unhurried answer, 7.5 s of the budget unused)
SEARCH_RESERVE = 0.1
SEARCH_RESERVE_S = 1.0
# ... and a check (verification and numerics check) starts only where it is guessed to end this
# share of the budget, at least ``ANSWER_RESERVE_S``, before the budget does: what follows the
# last check -- a cover solve, the kept cover's and the answer's assembly -- took 0.8-1.1 s on
# the 32-layer 8B-size decoder at load 4.5, and a check ending at the budget's end made a 9 s
# budget return after 10.1 s
ANSWER_RESERVE = 0.03
ANSWER_RESERVE_S = 0.25
# a check of at least this many input elements measures a per-element rate; smaller ones mostly
# measure fixed costs (0.1 s for 131 k elements would guess 45 s for a 58 M-element group) and
# only bound the guesses of checks at least as large
RATE_ELEMENTS = 1 << 20
# a numerics check computes its program's products in float64 (and the candidate's at GPU
# precision) on every probe: a multiply-add costs about this many input elements' worth of the
# rest of the check. KernelBench's Matmul_Mish_Mish (1024 x 8192 @ 8192 x 8192, 67 M elements
# read) took 25 s where its elements alone guessed 9.4 s, and its search overran a 20 s budget
# by 50 %: 0.0016 element per multiply-add accounts for the rest. A field check's products
# cost about the same per element's worth (``verified_work``: 5e-10 s a multiply-add on the
# 8205 x 2949 x 5921 product, at 3.5e-7 s an element)
MAC_ELEMENTS = 0.0016


@dataclass
class CheckTimes:
    """How long one kind of check (verification, or numerics check) took in this call, by its
    structure's input elements: what the next one is guessed to take."""

    rate: float | None = None  # seconds per element, the largest from checks >= RATE_ELEMENTS
    default: float = CHECK_S_PER_ELEMENT  # seconds per element before any such check
    sizes: list[tuple[int, float]] = field(default_factory=list)  # (elements, seconds)

    @property
    def longest(self) -> float:
        return max((s for _, s in self.sizes), default=0.0)

    def note(self, elements: int, seconds: float) -> None:
        self.sizes.append((elements, seconds))
        if elements >= RATE_ELEMENTS:
            self.rate = max(self.rate or 0.0, seconds / elements)

    def guess(self, elements: int) -> float:
        """Seconds a check of a structure with ``elements`` input elements is guessed to take:
        the measured rate times them (``default`` before any), and at least what a
        measured check of no more elements took (its fixed costs). Elements unknown (0, a
        symbolic program): the longest so far."""
        if elements <= 0:
            return self.longest
        rate = self.default if self.rate is None else self.rate
        return max([rate * elements] + [s for e, s in self.sizes if e <= elements])

def search_share(budget_s: float) -> float:
    """Seconds into a budget of ``budget_s`` that searches may start until."""
    return max(0.0, budget_s - max(SEARCH_RESERVE_S, SEARCH_RESERVE * budget_s))


def multiply_adds(program: Any, shrunk: dict[int, int] | None = None) -> int:
    """The multiply-adds of a program's matrix products (0 for symbolic sizes); with
    ``shrunk`` (extent -> shrunk extent) at the sizes a shrunk check runs."""
    from ..errors import ShapeError
    at = shrunk or {}
    try:
        return sum(int(math.prod(at.get(d, d) for d in t.shape) *
                       at.get(t.inputs[0].shape[-1], t.inputs[0].shape[-1]))
                   for t in program.nodes() if t.op == "matmul")
    except (ShapeError, TypeError):  # a symbolic size
        return 0


def verified_work(program: Any, shrunk: dict[int, int] | None = None) -> int:
    """The work of a field check of ``program`` in input elements (what ``verify_times`` and
    ``verify_full_times`` are kept by): its input elements and its products' multiply-adds at
    ``MAC_ELEMENTS`` each, at the ``shrunk`` sizes where given. KernelBench's 8205 x 2949 @
    2949 x 5921 product (odd extents: nothing shrinks) was guessed at its 41 M input elements,
    14 s, and its candidate's check ran past the 300 s limit on 143 G multiply-adds a test."""
    return input_elements(program, shrunk) + int(MAC_ELEMENTS * multiply_adds(program, shrunk))


def input_elements(program: Any, shrunk: dict[int, int] | None = None) -> int:
    """The elements of a program's inputs (0 for symbolic sizes: no guess from them); with
    ``shrunk`` (extent -> shrunk extent, verifier/shrink.py) at the sizes a shrunk check runs."""
    from ..errors import ShapeError
    try:
        if not shrunk:
            return sum(t.size for t in program.inputs)
        return sum(math.prod(shrunk.get(d, d) for d in t.shape) for t in program.inputs)
    except ShapeError:
        return 0


if TYPE_CHECKING:
    from .jobs import Executor
    from .structure import Structure


@dataclass
class Run:
    target: Any
    model: Any
    runner: Any
    db: Any  # a ResultsDB, or None
    settings: AnswerSettings
    workers: int
    search_deadline: float | None  # region searches and tunings start only before it
    deadline: float | None  # nothing but the answer from what is verified after it
    progress: bool
    executor: "Executor"
    structures: dict[str, "Structure"] = field(default_factory=dict)  # by region key
    verifiers: dict[str, Any] = field(default_factory=dict)  # this process's, by region key
    interrupted_at: float | None = None  # when Ctrl-C came (None: it did not)
    # how long verifications and numerics checks took in this call, by input elements (at the
    # 8B size: verification at shrunk sizes 0.01-0.1 s, numerics checks on sampled rows 0.1-2 s,
    # at full size 1-11 s, on a shared machine; a numerics check by the elements it read):
    # a check is started only where it is guessed to end in time
    verify_times: CheckTimes = field(default_factory=CheckTimes)  # at shrunk sizes
    verify_full_times: CheckTimes = field(  # at full size
        default_factory=lambda: CheckTimes(default=FULL_VERIFY_S_PER_ELEMENT))
    numerics_times: CheckTimes = field(default_factory=CheckTimes)
    # the binding of the dims a padded program's masks name (lax/family.py): what its regions
    # are verified and checked for
    sizes: dict = field(default_factory=dict)
    budget_s: float | None = None  # the call's time_budget_s (None: unhurried)
    # input elements a numerics check of a program reads, by structural hash (checked_elements)
    _checked: dict = field(default_factory=dict, repr=False)
    # (structure key, candidate hash) -> the extents its verification shrinks (None: full size)
    _shrunk_sizes: dict = field(default_factory=dict, repr=False)
    # whether a program's field check fits in memory at full size, by structural hash
    _fits: dict = field(default_factory=dict, repr=False)

    @cached_property
    def key(self) -> AnswerKey:
        """The database key of this run's answers (code, model, runner, settings)."""
        return AnswerKey.of(self.model, self.runner, self.settings)

    @property
    def interrupted(self) -> bool:
        return self.interrupted_at is not None

    def interrupt(self) -> None:
        """Ctrl-C came: no more searches or tunings; what was found is verified for
        ``INTERRUPT_GRACE_S`` more, then the answer is assembled from what is verified."""
        if self.interrupted_at is None:
            self.interrupted_at = time.perf_counter()

    def expired(self) -> bool:
        return self.interrupted or (self.search_deadline is not None and
                                    time.perf_counter() > self.search_deadline)

    def out_of_time(self) -> bool:
        """Past the whole budget (or Ctrl-C came): no more verification or cover solves, the
        answer is assembled from what is verified."""
        now = time.perf_counter()
        return (self.interrupted and now > self.interrupted_at + INTERRUPT_GRACE_S) or \
            (self.deadline is not None and now > self.deadline)

    def check_guess(self, program: Any, known: bool = False, key: str | None = None,
                    graph: Any = None) -> float:
        """Seconds a candidate's check -- its verification, unless ``known``, and its numerics
        check -- is guessed to take for a structure with this ``program``: by its input
        elements, from this call's checks (:class:`CheckTimes`). A program with an exp is
        guessed as long as a verification at full size: on the 32-layer 8B-size decoder a
        decode attention candidate's verification took 12.9 s (33.5 M input elements) where
        the others took 0.01-0.1 s at shrunk sizes (why is not analysed; on one layer its
        verifications ran at shrunk sizes). With the candidate ``graph`` of structure ``key``,
        its verification is guessed at the size it will run at (:meth:`shrunk_sizes`);
        without one, a program without an exp -- or with one whose full-size check could not
        fit in memory (:meth:`full_check_fits`) -- at the size its naive lowering would run at
        (:meth:`naive_shrunk_sizes`)."""
        verify = 0.0
        if not known:
            has_exp = any(t.op == "exp" for t in program.nodes())
            if graph is not None:
                sizes = self.shrunk_sizes(key, program, graph)
            elif not has_exp or not self.full_check_fits(program):
                sizes = self.naive_shrunk_sizes(program)
            else:
                sizes = None
            if sizes is not None:  # at shrunk sizes: by the work it verifies there
                verify = self.verify_times.guess(verified_work(program, sizes))
            else:
                work = verified_work(program)
                verify = self.verify_times.guess(work)
                if graph is not None or has_exp:
                    verify = max(verify, self.verify_full_times.guess(work))
        return self.numerics_times.guess(self.checked_elements(program)) + verify

    def full_check_fits(self, program: Any) -> bool:
        """Could a field check of ``program`` at full size fit in memory
        (``verifier.memory.fits``)? One that cannot is refused, not slow: an exp program
        guessed at full size is guessed shrunk instead -- KernelBench's 4096 x 393216 softmax
        was guessed at 1.6 G full-size elements and none of its regions was ever checked."""
        from ..verifier.memory import fits
        key = program.structural_hash()
        if key not in self._fits:
            self._fits[key] = fits(program)
        return self._fits[key]

    def naive_shrunk_sizes(self, program: Any) -> dict[int, int] | None:
        """The extents the program's naive lowering would be verified at (None: full size): a
        structure's candidates are guessed to shrink alike before one exists -- KernelBench's
        64 x 64 x 512 x 512 BatchNorm verifies at shrunk sizes in a fraction of a second, but
        guessed at its 1 G input elements no search of it was ever started. The structure's own
        naive lowering and verifier where the program is a structure's (a region's key is its
        program's structural hash): the same noted sizes the search's gate asks for."""
        key = program.structural_hash()
        st = self.structures.get(key)
        if st is not None:
            graph = st.naive(self.model, self.target).graph
        else:
            from ..ugraph.lower import naive_lowering
            try:
                graph = naive_lowering(program)
            except MirageError:
                return None
        return self.shrunk_sizes(key, program, graph)

    def shrunk_sizes(self, key: str, program: Any, graph: Any) -> dict[int, int] | None:
        """The extents the candidate ``graph`` of structure ``key`` will be verified at
        (``Verifier.shrunk_sizes``, noted per candidate; None: full size). The decode
        attention's floor and untuned candidates run at full size (a first full-size
        verification: 8-15 s on 32 layers), its tuned ones mostly shrunk (0.1 s)."""
        k = (key, graph.structural_hash())
        if k not in self._shrunk_sizes:
            self._shrunk_sizes[k] = self.verifier(key, program).shrunk_sizes(graph)
        return self._shrunk_sizes[k]

    def checked_elements(self, program: Any) -> int:
        """The work of a numerics check of ``program`` in input elements (what
        ``numerics_times`` is kept by): the elements it reads -- its sampled rows' where it can
        be sampled (verifier/sample.py) -- and its products' multiply-adds at ``MAC_ELEMENTS``
        each, in the same share; noted per program."""
        from ..verifier.sample import checked_elements
        key = program.structural_hash()
        n = self._checked.get(key)
        if n is None:
            n = checked_elements(program)
            whole = input_elements(program)
            if whole > 0:
                n += int(MAC_ELEMENTS * multiply_adds(program) * n / whole)
            self._checked[key] = n
        return n

    def note_verification(self, program: Any, result: Any, seconds: float) -> None:
        """A verification took ``seconds``: at shrunk sizes (kept by the elements it verified
        there) or at full size (``result``)."""
        shrunk = getattr(result, "shrunk", None)
        if shrunk:
            self.verify_times.note(verified_work(program, shrunk), seconds)
        else:
            self.verify_full_times.note(verified_work(program), seconds)

    def room_for_check(self, program: Any = None, known: bool = False,
                       extra_s: float = 0.0, key: str | None = None, graph: Any = None) -> bool:
        """Can a candidate's check for ``program`` (:meth:`check_guess`, of ``graph`` where
        given; None: as long as the longest so far), after ``extra_s`` of other work, start and
        end before the budget (less ``ANSWER_RESERVE`` of it for the answer) or the grace after
        Ctrl-C does?"""
        if self.out_of_time():
            return False
        left = self.seconds_left()
        if left is None:
            return True
        if self.budget_s is not None and not self.interrupted:  # room for the answer after it
            left -= max(ANSWER_RESERVE_S, ANSWER_RESERVE * self.budget_s)
        guess = self.check_guess(program, known, key, graph) if program is not None else \
            self.numerics_times.longest + (0.0 if known else max(
                self.verify_times.longest, self.verify_full_times.longest))
        return extra_s + guess <= left

    def seconds_left(self, at_least: float = 0.0) -> float | None:
        """Seconds to the whole budget's end or the interrupt's grace (None: neither), at
        least ``at_least``."""
        ends = [t for t in (self.deadline, None if self.interrupted_at is None else
                            self.interrupted_at + INTERRUPT_GRACE_S) if t is not None]
        if not ends:
            return None
        return max(at_least, min(ends) - time.perf_counter())

    def new_verifier(self, program: Any, **kw: Any):
        """A verifier of ``program`` with this run's seed, target and sizes."""
        from ..verifier import Verifier
        return Verifier(program, seed=self.settings.seed, target=self.target, sizes=self.sizes,
                        **kw)

    def verifier(self, key: str, program: Any):
        """The verifier of the structure ``key`` in this process, built once: it keeps the
        program's side of every test for the structure's next candidates."""
        v = self.verifiers.get(key)
        if v is None:
            v = self.verifiers[key] = self.new_verifier(program)
        return v


__all__ = ["Run", "CheckTimes", "input_elements", "verified_work", "search_share"]
