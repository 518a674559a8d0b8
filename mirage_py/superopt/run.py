"""What every part of one ``superopt`` call shares: the target, the model, the settings, the
executor, the deadlines -- and every region structure met so far, by key."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from .store import AnswerKey, AnswerSettings

# after Ctrl-C, candidates already found are still verified for this long (a small program's
# take milliseconds); the answer then comes from what is verified, within 2 s
INTERRUPT_GRACE_S = 1.0
# seconds per input element a full-size check (verification, or numerics check) takes before
# any has been timed: the 8B-size decoder's first floor group (down projection, 58.75 M input
# elements) took 4.8-8 s to verify and 5.7-7 s for numerics on a shared 2-core machine (load
# 5-6). (Timing the part's max-shift checks instead measured their fixed costs: 0.1 s for
# 131 k elements, a 45 s guess for that group, which kept budgeted runs from laying the floor.)
CHECK_S_PER_ELEMENT = 1.4e-7

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
    # the longest verification and numerics check of one candidate so far in this call (at the
    # 8B size 1-4 s each on a shared machine): one is started only where it can end in time
    verify_s: float = 0.0
    numerics_s: float = 0.0
    # before the first of them, a check of a structure is guessed to take this many seconds
    # per input element (CHECK_S_PER_ELEMENT)
    check_s_per_element: float = CHECK_S_PER_ELEMENT
    # the binding of the dims a padded program's masks name (lax/family.py): what its regions
    # are verified and checked for
    sizes: dict = field(default_factory=dict)

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

    def room_for_check(self, known: bool = False, extra_s: float = 0.0,
                       elements: int = 0) -> bool:
        """Can a candidate's check (its verification -- unless ``known`` -- and numerics check,
        after ``extra_s`` of other work) start and, as long as the longest so far, end before
        the budget (or the grace after Ctrl-C) does? Before any such check: as long as
        ``check_s_per_element`` times ``elements`` (its structure's input elements) each."""
        if self.out_of_time():
            return False
        left = self.seconds_left()
        guess = self.check_s_per_element * elements
        return left is None or extra_s + (self.numerics_s or guess) + \
            (0.0 if known else self.verify_s or guess) <= left

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


__all__ = ["Run"]
