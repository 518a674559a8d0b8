"""Export the results database as a training set for a learned cost model.

One row per record: graph features, annotations, predicted and measured time. Features come
from the analytic model's per-kernel quantities (what a learned model would otherwise have to
rediscover) plus the block graph's shape::

    per kernel: kind (graph / op), op, blocks, threads, forloop, stages, smem, blocks_per_sm,
                waves, bytes, tc_flops, simt_flops, intermediate_bytes, n_block_ops, n_matmuls,
                tile shapes of the input iterators, grid, sources (the earlier kernels whose
                outputs it reads: the operator graph's edges)
    graph:      kernels, graph_kernels, sums of blocks / bytes / flops, max smem

JSONL keeps the per-kernel lists (a GraphSAGE-style model can use them); CSV flattens to the
graph-level columns plus the first kernel's block annotations. ``measured_only`` keeps the rows a
model can learn from (timed on a GPU).

    python -m mirage_py.tuning.export RESULTS.sqlite out.jsonl [--measured-only]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from typing import Any

from ..cost_model import kernel_costs
from ..errors import MirageError
from ..ugraph.graph import BlockOp, GraphKernel, InputIter, KernelGraph, iter_source
from .annotations import AnnotatedGraph
from .database import TuningRecord, ResultsDB

CSV_COLUMNS = ("record_id", "workload", "target", "graph_hash", "runner", "chosen",
               "predicted_us", "measured_us", "kernels", "graph_kernels", "blocks", "bytes",
               "tc_flops", "simt_flops", "intermediate_bytes", "max_smem", "threads",
               "stages", "forloop", "grid")


def graph_features(graph: Any, target: str) -> dict[str, Any]:
    """Features of a KernelGraph or AnnotatedGraph (see module doc)."""
    g = graph.graph if isinstance(graph, AnnotatedGraph) else graph
    costs = kernel_costs(graph, target)
    tensors = g.tensors()
    kernels = []
    producer: dict[str, int] = {}
    for i, (op, c) in enumerate(zip(g.ops, costs)):
        k = {"kind": c.kind, "op": getattr(op, "op", "graph"), "blocks": c.blocks,
             "threads": c.threads, "forloop": c.forloop, "stages": c.stages, "smem": c.smem,
             "blocks_per_sm": c.blocks_per_sm,
             "waves": c.waves if math.isfinite(c.waves) else None, "bytes": c.bytes,
             "tc_flops": c.tc_flops, "simt_flops": c.simt_flops,
             "intermediate_bytes": c.intermediate_bytes, "predicted_us": c.us,
             "sources": sorted({producer[n] for n in op.inputs if n in producer})}
        for o in op.outputs:
            producer[o.name] = i
        if isinstance(op, GraphKernel):
            bg = op.block
            k["grid"] = list(bg.grid)
            k["n_block_ops"] = len(bg.ops)
            k["n_matmuls"] = sum(isinstance(o, BlockOp) and o.op == "matmul" for o in bg.ops)
            ins = [tensors[n] for n in op.inputs]
            k["tiles"] = [list(_tile(iter_source(o, ins).shape, bg, o))
                          for o in bg.ops if isinstance(o, InputIter)]
        kernels.append(k)
    gks = [k for k in kernels if k["kind"] == "graph"]
    return {
        "kernels": len(kernels), "graph_kernels": len(gks),
        "blocks": sum(k["blocks"] for k in kernels), "bytes": sum(k["bytes"] for k in kernels),
        "tc_flops": sum(k["tc_flops"] for k in kernels),
        "simt_flops": sum(k["simt_flops"] for k in kernels),
        "intermediate_bytes": sum(k["intermediate_bytes"] for k in kernels),
        "max_smem": max((k["smem"] for k in kernels), default=0),
        "per_kernel": kernels}


def _tile(shape, bg, it: InputIter) -> tuple[int, ...]:
    from ..ugraph.graph import iter_tile_shape
    return iter_tile_shape(tuple(shape), bg.grid, it.imap, it.fmap, bg.forloop)


def record_row(r: TuningRecord) -> dict[str, Any]:
    g = KernelGraph.from_json(r.graph)
    ag = AnnotatedGraph(g, tuple(r.annotations.get("stages", ())))
    try:
        feats = graph_features(ag, r.target)
    except MirageError as e:
        feats = {"error": str(e)}
    return {"record_id": r.id, "workload": r.workload_hash, "target": r.target,
            "graph_hash": r.graph_hash, "runner": r.runner, "chosen": r.chosen,
            "annotations": r.annotations, "predicted_us": r.predicted_us,
            "measured_us": r.measured_us, "tool_version": r.tool_version,
            "answer_key": r.answer_key,
            "created": r.created, "features": feats}


def export_training_set(db: ResultsDB | str, path: str, *, fmt: str | None = None,
                        measured_only: bool = False, target: str | None = None) -> int:
    """Write the records of ``db`` to ``path`` as JSONL or CSV (by suffix unless ``fmt``);
    returns the number of rows."""
    if not isinstance(db, ResultsDB):
        db = ResultsDB(db)
    fmt = fmt or ("csv" if path.endswith(".csv") else "jsonl")
    if fmt not in ("csv", "jsonl"):
        raise MirageError(f"export: unknown format {fmt!r}; use jsonl or csv")
    rows = [record_row(r) for r in db.records(target=target,
                                              measured=True if measured_only else None)]
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w", newline="") as f:
        if fmt == "jsonl":
            for row in rows:
                f.write(json.dumps(row, sort_keys=True) + "\n")
        else:
            w = csv.DictWriter(f, CSV_COLUMNS)
            w.writeheader()
            for row in rows:
                feats = row["features"]
                first = next((k for k in feats.get("per_kernel", []) if k["kind"] == "graph"),
                             {})
                flat = {c: row.get(c) for c in CSV_COLUMNS}
                for c in ("kernels", "graph_kernels", "blocks", "bytes", "tc_flops",
                          "simt_flops", "intermediate_bytes", "max_smem"):
                    flat[c] = feats.get(c)
                for c in ("threads", "stages", "forloop"):
                    flat[c] = first.get(c)
                flat["grid"] = "x".join(map(str, first["grid"])) if "grid" in first else ""
                w.writerow(flat)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mirage_py.tuning.export",
                                 description="Export a results database as a training set.")
    ap.add_argument("database")
    ap.add_argument("out", help="output file: .jsonl or .csv")
    ap.add_argument("--measured-only", action="store_true")
    ap.add_argument("--target", default=None)
    args = ap.parse_args(argv)
    n = export_training_set(args.database, args.out, measured_only=args.measured_only,
                            target=args.target)
    print(f"wrote {n} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
