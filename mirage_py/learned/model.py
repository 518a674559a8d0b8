"""Learned cost models behind the cost-model interface, for the tuner and superopt.

``train(records, ModelKind.GBT | ModelKind.GNN, constants)`` fits a model on any records (the
published KernelBench ones, our own measured μGraphs from the results database's export, or
both); :class:`LearnedCostModel` wraps a fitted one so that ``superopt(cost_model=...)`` and the
tuner rank μGraphs with it: a kernel graph becomes a record of its kernels (the analytic model's
per-kernel bytes and flops, a graph-defined kernel's launch shape, the data edges between
kernels) and the model predicts its time.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from ..cost_model import kernel_costs, unpack
from ..eager import DEFAULT, EagerConstants
from ..errors import LearnedModelError
from ..targets import get_target
from ..ugraph.graph import GraphKernel
from .gbt import BoostedTrees
from .gnn import GraphSage
from .records import Record, cost_node


class ModelKind(Enum):
    GBT = "gbt"
    GNN = "gnn"


def train(records: list[Record], kind: ModelKind = ModelKind.GBT,
          constants: EagerConstants = DEFAULT, **kw: Any) -> BoostedTrees | GraphSage:
    """A model of ``kind`` fitted on ``records`` (starting from the analytic model priced with
    ``constants``)."""
    if not records:
        raise LearnedModelError("train: no records")
    model = BoostedTrees(constants, **kw) if kind is ModelKind.GBT else GraphSage(constants, **kw)
    return model.fit(records)


def graph_record(graph: Any, target: Any, planner: Any = None) -> Record:
    """A μGraph (or annotated graph) as a record (measured time unknown: 0)."""
    g, _ = unpack(graph)
    costs = kernel_costs(graph, target, planner)
    producer: dict[str, int] = {}
    nodes = []
    for i, (op, c) in enumerate(zip(g.ops, costs)):
        srcs = tuple(sorted({producer[n] for n in op.inputs if n in producer}))
        if isinstance(op, GraphKernel):
            node = cost_node(True, "graph", c.bytes, c.tc_flops, c.simt_flops, srcs, i,
                             c.blocks, c.threads, c.smem, c.stages, c.forloop)
        else:
            node = cost_node(False, op.op, c.bytes, c.tc_flops, c.simt_flops, srcs, i)
        nodes.append(node)
        for o in op.outputs:
            producer[o.name] = i
    return Record("ugraph/" + g.structural_hash()[:16], "ugraph", get_target(target).name,
                  tuple(nodes), len(nodes), 0.0)


class LearnedCostModel:
    """A fitted model behind ``predict(graph, target) -> us``."""

    def __init__(self, model: BoostedTrees | GraphSage, planner: Any = None):
        self.model = model
        self.planner = planner
        self.name = f"learned-{model.kind}"

    def predict(self, graph: Any, target: Any) -> float:
        return self.model.predict([graph_record(graph, target, self.planner)])[0]

    def predict_records(self, records: list[Record]) -> list[float]:
        return self.model.predict(records)


def load_model(path: str) -> LearnedCostModel:
    """A model saved by ``BoostedTrees.save`` (JSON) or ``GraphSage.save`` (torch)."""
    import json
    try:
        with open(path) as f:
            d = json.load(f)
        if d.get("kind") != "gbt":
            raise LearnedModelError(f"{path}: not a boosted-tree model file")
        return LearnedCostModel(BoostedTrees.from_json(d))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return LearnedCostModel(GraphSage.load(path))
