"""Annotations: the knobs of a μGraph structure that the tuner sets.

The generator's μGraph structure is the *sketch*; its annotations are

* part counts -- grid dims and loop range of each kernel, set through the search trace (one
  ``(Plan, group)`` per kernel, replayed by :meth:`Searcher.replay`);
* threads per block -- ``BlockGraph.threads`` of each graph-defined kernel;
* pipeline stages -- how many loop iterations of input tiles are in flight at once. Stages do not
  change what a graph computes, so they are not a field of the μGraph: an
  :class:`AnnotatedGraph` carries them next to it (one per graph-defined kernel, in launch order),
  the cost model reads them, the results database stores them, and code generation can read
  them from there;
* storage precision of *complete* intermediates -- a tensor one kernel saves and a later one reads
  whose value is a subexpression of the program (``exp(X @ A)``, not the partial sums of a split
  reduction): float32 as the generator saves it, or the program's own 16-bit dtype, which halves
  its round trip through memory. The exact (finite-field) meaning is the same; the verifier's
  float check judges the rounding.

A :class:`Schedule` is one point of that space for one structure, serialisable to JSON::

    {"trace": [[grid, loop, group], ...], "threads": [128, 256], "stages": [2, 1],
     "store": ["float16"]}
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..cost_model import DEFAULT_STAGES
from ..errors import SerializationError
from ..generator.kernel_search import trace_from_json
from ..ugraph.graph import GraphKernel, KernelGraph

THREAD_CHOICES = (64, 128, 256, 512, 1024)
MAX_STAGES = 4


@dataclass(frozen=True)
class AnnotatedGraph:
    """A kernel graph and its pipeline stages per graph-defined kernel (missing ones: the cost
    model's ``DEFAULT_STAGES``, double buffering)."""

    graph: KernelGraph
    stages: tuple[int, ...] = ()

    def stages_full(self) -> tuple[int, ...]:
        n = len(self.graph.graph_kernels())
        return tuple(self.stages[i] if i < len(self.stages) else DEFAULT_STAGES
                     for i in range(n))

    def annotations(self) -> dict[str, Any]:
        return {"threads": [gk.block.threads for gk in self.graph.graph_kernels()],
                "stages": list(self.stages_full())}

    def to_json(self) -> dict[str, Any]:
        """The graph (``KernelGraph.to_json``) and its stages as given."""
        return {"graph": self.graph.to_json(), "stages": list(self.stages)}

    @classmethod
    def from_json(cls, doc: Any) -> "AnnotatedGraph":
        try:
            return cls(KernelGraph.from_json(doc["graph"]), tuple(int(s) for s in doc["stages"]))
        except (KeyError, TypeError, ValueError) as e:
            raise SerializationError(f"malformed annotated graph: {type(e).__name__}: {e}") \
                from None


def with_storage(graph: KernelGraph, dtypes: dict[str, str]) -> KernelGraph:
    """The same graph with the named graph-kernel outputs stored in other dtypes."""
    if not dtypes:
        return graph
    ops = []
    for op in graph.ops:
        if isinstance(op, GraphKernel) and any(t.name in dtypes for t in op.outputs):
            op = replace(op, outputs=tuple(replace(t, dtype=dtypes.get(t.name, t.dtype))
                                           for t in op.outputs))
        ops.append(op)
    return replace(graph, ops=tuple(ops))


def threads_of(graph: KernelGraph) -> tuple[int, ...]:
    return tuple(gk.block.threads for gk in graph.graph_kernels())


def with_threads(graph: KernelGraph, threads: tuple[int, ...]) -> KernelGraph:
    """The same graph with each graph-defined kernel's thread count replaced (missing: kept)."""
    if not threads:
        return graph
    ops, i = [], 0
    for op in graph.ops:
        if isinstance(op, GraphKernel):
            if i < len(threads) and threads[i] != op.block.threads:
                op = replace(op, block=replace(op.block, threads=threads[i]))
            i += 1
        ops.append(op)
    return replace(graph, ops=tuple(ops))


@dataclass(frozen=True)
class Schedule:
    """Annotations of one structure: the trace (part counts), threads and stages per kernel, and
    the storage dtype of each complete intermediate (in order of definition)."""

    trace: tuple
    threads: tuple[int, ...] = ()
    stages: tuple[int, ...] = ()
    store: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"trace": [[[list(g) for g in plan.grid], list(plan.loop), grp]
                          for plan, grp in self.trace],
                "threads": list(self.threads), "stages": list(self.stages),
                "store": list(self.store)}

    @classmethod
    def from_json(cls, doc: Any) -> "Schedule":
        try:
            return cls(trace_from_json(doc["trace"]), tuple(int(x) for x in doc["threads"]),
                       tuple(int(x) for x in doc["stages"]),
                       tuple(str(x) for x in doc.get("store", ())))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise SerializationError(f"malformed schedule: {type(e).__name__}: {e}") from None

    def sort_key(self) -> str:
        """A total order independent of hash seeds (ties in the tuner break on it)."""
        import json
        return json.dumps(self.to_json(), sort_keys=True)
