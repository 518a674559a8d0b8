"""The work the region layer hands out, what comes back, and the one protocol every executor
implements (:class:`Executor`: :class:`~.local.LocalExecutor`, :class:`~.cluster.RayExecutor`).

Every job is keyed by its region structure's key (the structural hash of the region's canonical
program): one structure has at most one job of a kind in flight, and a result finds its
structure by that key in any process.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..lax.program import Program
from ..tuning.runners import Measurement
from ..ugraph.graph import KernelGraph
from .search import Explored, Settings

if TYPE_CHECKING:  # the run and the verifier's result, for the signatures only
    from ..verifier import VerifyResult
    from .run import Run


def region_label(program: Program) -> str:
    """A region's name in hooks and logs: every region program is called "region", so its
    structural hash follows."""
    return f"{program.name}#{program.structural_hash()[:10]}"


@dataclass(frozen=True)
class ExploreJob:
    """Search a structure (:func:`.search.explore`, one process) or, with ``prior`` (a search
    whose tuning was deferred), tune what it left to tune."""

    key: str
    program: Program
    settings: Settings
    prior: Explored | None = None

    def expected_seconds(self) -> tuple:
        """A sort key for how long the job takes: a tuning about as long as its structure's
        search took (attention regions the longest), a search as long as its program is large."""
        if self.prior is not None:
            return (1, self.prior.stats.seconds)
        return (0, len(self.program.nodes()))


@dataclass(frozen=True)
class VerifyJob:
    """Check one option's graph against the structure's program (finite-field testing)."""

    key: str
    program: Program
    graph: KernelGraph


@dataclass(frozen=True)
class MeasureJob:
    """Time a structure's naive graph and its best options' graphs on one device."""

    key: str
    name: str  # the region's label in logs
    naive: KernelGraph
    graphs: tuple  # AnnotatedGraphs, best first


@dataclass(frozen=True)
class Measured:
    """What a :class:`MeasureJob` gives back: the naive graph's measurement and one per graph,
    in the job's order."""

    naive: Measurement
    options: tuple[Measurement, ...]


class Executor(abc.ABC):
    """Where a run's region searches, verifications and measurements happen. The region layer
    calls every executor the same way: a list of jobs in, ``{structure key: result}`` out."""

    name = "executor"

    def start(self, target: Any) -> None:
        """Called once per ``superopt`` call, before any work (connect, check the cluster)."""

    def default_workers(self) -> int:
        """How many region searches run at once when ``superopt(workers=None)``."""
        return max(1, min(os.cpu_count() or 1, 8))

    def default_runner(self, model: Any, target: Any):
        """The runner ``superopt(runner=None)`` uses with this executor."""
        from ..tuning.runners import default_runner
        return default_runner(model)

    def check_runner(self, runner: Any, target: Any) -> None:
        """Raise if ``runner``'s measurements cannot run here."""

    @abc.abstractmethod
    def explore(self, jobs: list[ExploreJob], run: "Run", *,
                progress: bool = False) -> dict[str, Explored]:
        """The jobs' results, for those that finished (all, unless the search budget ran out or
        Ctrl-C came: then ``run.interrupted`` is set); ``progress``: show a search's progress
        where it runs here."""

    @abc.abstractmethod
    def verify(self, jobs: list[VerifyJob], run: "Run") -> dict[str, "VerifyResult"]:
        """Every job's verification (one the executor could not run elsewhere is run here)."""

    @abc.abstractmethod
    def measure(self, jobs: list[MeasureJob], run: "Run") -> dict[str, Measured]:
        """The measurements that came back (the rest stay unmeasured)."""


__all__ = ["region_label", "ExploreJob", "VerifyJob", "MeasureJob", "Measured", "Executor"]
