"""One way to compute a region: a kernel graph with its annotations, and what it costs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..tuning.annotations import AnnotatedGraph, Schedule
from ..ugraph.graph import KernelGraph


def option_key(annotated: AnnotatedGraph) -> str:
    """What tells two options of one region apart: the graph's structural hash and its
    pipeline stages (the same graph with other stages is another option)."""
    return annotated.graph.structural_hash() + str(annotated.stages_full())


@dataclass(frozen=True, eq=False)
class Option:
    """A candidate answer of a region's search, tuned or not.

    ``predicted_us``: what the cost model says it costs (with its annotations);
    ``untuned_us``: its structure with the generator's annotations; ``schedule``: its
    annotations -- the tuned ones, or for an untuned option the generator's trace and threads
    (None: unknown, an option from an older database)."""

    predicted_us: float
    annotated: AnnotatedGraph
    untuned_us: float
    schedule: Schedule | None = None

    @property
    def graph(self) -> KernelGraph:
        return self.annotated.graph

    @cached_property
    def key(self) -> str:
        """Unique among a region's options (:func:`option_key`): measurements are kept by it."""
        return option_key(self.annotated)

    @property
    def rank(self) -> tuple:
        """Options are ranked by (predicted time, structural hash, stages): deterministic."""
        return (self.predicted_us, self.graph.structural_hash(), self.annotated.stages_full())

    def to_json(self) -> dict[str, Any]:
        return {"predicted_us": self.predicted_us, "graph": self.graph.to_json(),
                "stages": list(self.annotated.stages), "untuned_us": self.untuned_us,
                "schedule": None if self.schedule is None else self.schedule.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Option":
        return cls(d["predicted_us"], AnnotatedGraph(KernelGraph.from_json(d["graph"]),
                                                     tuple(d["stages"])),
                   d["untuned_us"],
                   None if d["schedule"] is None else Schedule.from_json(d["schedule"]))


def best_options(options: list[Option]) -> list[Option]:
    """The cheapest option of each key (structure and stages), ranked (:attr:`Option.rank`)."""
    best: dict[str, Option] = {}
    for o in options:
        if o.key not in best or o.predicted_us < best[o.key].predicted_us:
            best[o.key] = o
    return sorted(best.values(), key=lambda o: o.rank)


__all__ = ["Option", "option_key", "best_options"]
