"""Everything the region layer knows about one region structure (a canonical program shared by
every region with that program: identical layers are one structure), and its lifecycle::

    OPEN --database answer--> VERIFIED
    OPEN --explored--> EXPLORED --(tuned, measured) verified--> VERIFIED
                                 \\--no option left to verify--> FAILED
    OPEN --no time left, or its job lost--> SKIPPED
    OPEN --explored, nothing found--> FAILED

An open structure enters the cover at its lower bound, an explored one at its best option (or,
while its tuning waits, at what its options can cost at least once tuned), a verified one at its
answer; failed and skipped ones leave the cover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..generator.kernel_search import SearchStats
from ..lax.program import Program
from ..tuning.runners import Measurement
from ..ugraph.graph import KernelGraph
from ..ugraph.lower import naive_lowering
from .jobs import Measured
from .option import Option
from .result import RegionResult
from .search import Explored


class Status(Enum):
    OPEN = "open"  # not searched yet
    EXPLORED = "explored"  # searched: options to verify (their tuning may still wait)
    VERIFIED = "verified"  # an answer: searched and verified, or from the database
    FAILED = "failed"  # searched, and nothing verified
    SKIPPED = "skipped"  # never searched: the budget ran out, or its job was lost


@dataclass(frozen=True)
class Naive:
    """A program's naive lowering (one pre-defined kernel per operator) and its predicted time."""

    graph: KernelGraph
    us: float


def lower_bound(model: Any, program: Program, target: Any, kernels: int | None = None) -> float:
    """What any kernel graph for ``program`` (of ``kernels`` graph-defined kernels; None: any)
    costs at least under ``model`` (0 when the model does not say)."""
    f = getattr(model, "lower_bound", None)
    if f is None:
        return 0.0
    return float(f(program, target) if kernels is None else f(program, target, kernels))


@dataclass
class Structure:
    key: str  # the structural hash of ``program``: jobs and answers are keyed by it
    program: Program
    lb: float  # what any answer costs at least
    two_kernels: bool = False  # its lower bound is two kernels' (one kernel costs more)
    whole: bool = False  # the whole part of some part of this run
    status: Status = Status.OPEN
    explored: Explored | None = None
    options: list[Option] = field(default_factory=list)  # still to verify, best first
    measured: dict[str, Measurement] = field(default_factory=dict)  # by Option.key
    naive_measured: Measurement | None = None
    result: RegionResult | None = None
    tried: int = 0  # options of its search verified so far
    floor: RegionResult | None = None  # the quick one-kernel lowering, when a floor group
    recorded: bool = False  # in the database already
    cap: float | None = None  # its search keeps only kernel sequences cheaper than this
    tuned_floor: float = 0.0  # what its options can cost at least once tuned
    _naive: Naive | None = field(default=None, repr=False)

    @classmethod
    def of(cls, program: Program, model: Any, target: Any) -> "Structure":
        """A new structure with its lower bound, and whether that bound is two kernels' (one
        kernel would load more in a block than two kernels cost: a layer boundary's down
        projection and the next RMSNorm)."""
        lb = lower_bound(model, program, target)
        return cls(program.structural_hash(), program, lb,
                   two_kernels=0 < lower_bound(model, program, target, 2) <= lb)

    # -- what the cover sees ----------------------------------------------------------------
    @property
    def cost(self) -> float:
        if self.status is Status.VERIFIED:
            return self.result.estimated_us
        if self.status is Status.EXPLORED:
            if not self.options:
                return math.inf
            if self.prior is not None:  # not tuned yet
                return max(self.lb, self.tuned_floor)
            return self.options[0].predicted_us
        if self.status is Status.OPEN:
            return self.lb
        return math.inf

    @property
    def prior(self) -> Explored | None:
        """The search whose deferred tuning is the structure's next job (None: none waits)."""
        return self.explored if self.explored is not None and self.explored.pending else None

    @property
    def searched(self) -> bool:
        return self.status in (Status.VERIFIED, Status.EXPLORED, Status.FAILED)

    def naive(self, model: Any, target: Any) -> Naive:
        if self._naive is None:
            g = naive_lowering(self.program)
            self._naive = Naive(g, model.predict(g, target))
        return self._naive

    # -- the lifecycle ------------------------------------------------------------------------
    def answered(self, result: RegionResult, *, stored: bool = False) -> None:
        """A verified answer: from its search, or (``stored``) from the database."""
        self.result, self.status = result, Status.VERIFIED
        self.recorded |= stored

    def land(self, ex: Explored | None, tuned_floor: float = 0.0) -> bool:
        """A job's result (None: it did not come back): a search's options, or a tuning's. True
        when the options are final (tuned, or for good untuned): time to measure them."""
        if ex is not None:
            self.explored, self.options = ex, list(ex.options)
            if ex.pending:
                self.tuned_floor = tuned_floor
            self.status = Status.EXPLORED if self.options else Status.FAILED
            return not ex.pending
        if self.prior is not None:  # the tuning was lost: keep the untuned options
            self.drop_tuning()
            return True
        self.status = Status.SKIPPED
        return False

    def drop_tuning(self) -> None:
        """Its untuned options stand (no time left to tune them, or the tuning was lost)."""
        self.explored.pending = []
        self.options = list(self.explored.options)

    def take_measurements(self, m: Measured, top: int) -> None:
        """Measurements of the naive graph and of the ``top`` best options (in order): those
        options are re-ranked by (measured time, predicted time)."""
        head = self.options[:top]
        self.measured = {o.key: t for o, t in zip(head, m.options)}
        self.options[:top] = sorted(head, key=lambda o: (self.measured[o.key].us,
                                                          o.predicted_us))
        self.naive_measured = m.naive

    def fail(self) -> None:
        self.status = Status.FAILED

    def skip(self) -> None:
        self.status = Status.SKIPPED

    def result_for(self, opt: Option, verification: Any, source: str, ex: Explored | None,
                   naive_us: float) -> RegionResult:
        """The structure's answer if ``opt`` (verified) is chosen."""
        m = self.measured.get(opt.key)
        nm = self.naive_measured
        return RegionResult(
            self.program, opt.graph, source, opt.predicted_us, naive_us, verification,
            stats=ex.stats if ex else SearchStats(), candidates=ex.candidates if ex else 0,
            verified=self.tried, stages=opt.annotated.stages_full(), schedule=opt.schedule,
            untuned_us=opt.untuned_us, best_untuned_us=ex.best_untuned_us if ex else None,
            measured_us=None if m is None else m.us,
            naive_measured_us=None if nm is None else nm.us,
            tune_rounds=ex.tune_rounds if ex else 0,
            tune_evaluations=ex.tune_evaluations if ex else 0)


__all__ = ["Structure", "Status", "Naive", "lower_bound"]
