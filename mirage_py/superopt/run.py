"""What every part of one ``superopt`` call shares: the target, the model, the settings, the
executor, the deadlines -- and every region structure met so far, by key."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from .store import AnswerKey, AnswerSettings

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
    deadline: float | None
    progress: bool
    executor: "Executor"
    structures: dict[str, "Structure"] = field(default_factory=dict)  # by region key
    verifiers: dict[str, Any] = field(default_factory=dict)  # this process's, by region key
    interrupted: bool = False
    # the binding of the dims a padded program's masks name (lax/family.py): what its regions
    # are verified and checked for
    sizes: dict = field(default_factory=dict)

    @cached_property
    def key(self) -> AnswerKey:
        """The database key of this run's answers (code, model, runner, settings)."""
        return AnswerKey.of(self.model, self.runner, self.settings)

    def expired(self) -> bool:
        return self.interrupted or (self.search_deadline is not None and
                                    time.perf_counter() > self.search_deadline)

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
