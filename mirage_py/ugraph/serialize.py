"""JSON for μGraphs (exact round trip) and canonical renaming for structural hashing.

Each node is written as an object with a ``"node"`` tag naming its type and its fields; tuples
become lists and are turned back into tuples on load; floats are written with ``repr`` (exact in
JSON). Loading checks the format tag and version and reports malformed input as
:class:`~mirage_py.errors.SerializationError`.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from typing import Any

from ..errors import SerializationError
from .graph import (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel, InputIter,
                    KernelGraph, KernelOp, OutputSaver, ThreadGraph, ThreadOp)

FORMAT = "mirage_py.ugraph"
FORMAT_VERSION = 1

_TYPES = {c.__name__: c for c in (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel,
                                  InputIter, KernelOp, OutputSaver, ThreadGraph, ThreadOp)}


def _enc(v: Any) -> Any:
    if type(v).__name__ in _TYPES:
        d = {"node": type(v).__name__}
        for f in fields(v):
            d[f.name] = _enc(getattr(v, f.name))
        return d
    if isinstance(v, tuple):
        return [_enc(x) for x in v]
    if isinstance(v, float):
        return {"f": repr(v)}
    return v


def _dec(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) == {"f"}:
            return float(v["f"])
        cls = _TYPES.get(v.get("node"))
        if cls is None:
            raise SerializationError(f"unknown μGraph node type {v.get('node')!r}")
        kw = {k: _dec(x) for k, x in v.items() if k != "node"}
        names = {f.name for f in fields(cls)}
        if set(kw) != names:
            raise SerializationError(f"{cls.__name__}: fields {sorted(kw)} != {sorted(names)}")
        return cls(**kw)
    if isinstance(v, list):
        return tuple(_dec(x) for x in v)
    return v


def kernel_graph_to_json(g: KernelGraph) -> dict[str, Any]:
    return {"format": FORMAT, "version": FORMAT_VERSION, "name": g.name,
            "inputs": _enc(g.inputs), "ops": _enc(g.ops), "outputs": list(g.outputs)}


def kernel_graph_from_json(doc: dict[str, Any]) -> KernelGraph:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SerializationError(f"not a serialized μGraph (format="
                                 f"{doc.get('format') if isinstance(doc, dict) else None!r})")
    if doc.get("version") != FORMAT_VERSION:
        raise SerializationError(f"μGraph format version {doc.get('version')!r} is not supported")
    try:
        return KernelGraph(str(doc["name"]), _dec(doc["inputs"]), _dec(doc["ops"]),
                           tuple(doc["outputs"]))
    except SerializationError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise SerializationError(f"malformed μGraph JSON: {type(e).__name__}: {e}") from None


def loads(text: str) -> KernelGraph:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise SerializationError(f"μGraph JSON does not parse: {e}") from None
    return kernel_graph_from_json(doc)


def _ren_operands(ops: tuple[Any, ...], m: dict[str, str]) -> tuple[Any, ...]:
    return tuple(m.get(o, o) if isinstance(o, str) else o for o in ops)


def _canon_block(bg: BlockGraph) -> BlockGraph:
    m: dict[str, str] = {}
    nodes = []
    for n in bg.ops:
        if isinstance(n, OutputSaver):
            nodes.append(replace(n, input=m[n.input]))
            continue
        new = f"s{len(m)}"
        if isinstance(n, InputIter):
            nodes.append(replace(n, out=new))
        elif isinstance(n, (BlockOp, Fused)):
            nodes.append(replace(n, out=new, operands=_ren_operands(n.operands, m)))
        elif isinstance(n, Accum):
            nodes.append(replace(n, out=new, input=m[n.input]))
        m[n.out] = new
    return replace(bg, ops=tuple(nodes))


def canonicalize(g: KernelGraph) -> KernelGraph:
    keep = {t.name for t in g.inputs} | set(g.outputs)
    m: dict[str, str] = {n: n for n in keep}
    ops = []
    for op in g.ops:
        def ren_out(t: DTensor) -> DTensor:
            if t.name not in m:
                m[t.name] = f"t{len([k for k in m if k not in keep])}"
            return replace(t, name=m[t.name])
        if isinstance(op, KernelOp):
            operands = _ren_operands(op.operands, m)
            ops.append(replace(op, operands=operands, output=ren_out(op.output)))
        else:
            inputs = tuple(m.get(n, n) for n in op.inputs)
            ops.append(GraphKernel(inputs, tuple(ren_out(t) for t in op.outputs),
                                   _canon_block(op.block)))
    return KernelGraph(g.name, g.inputs, tuple(ops), g.outputs)
