"""JSON for μGraphs (exact round trip) and canonical renaming for structural hashing.

Each node is written as an object with a ``"node"`` tag naming its type and its fields; tuples
become lists and are turned back into tuples on load; floats are written with ``repr`` (exact in
JSON). Fields at their default that older documents lack (a thread op's ``attrs``) are left
out, so graphs without them keep their JSON and structural hash. Loading checks the format tag
and version and reports malformed input as :class:`~mirage_py.errors.SerializationError`.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import fields, replace
from typing import Any

from ..errors import SerializationError
from ..lax.shapes import Affine, json_size, size_from_json
from .graph import (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel, InputIter,
                    KernelGraph, KernelOp, MaskIter, OutputSaver, ThreadGraph, ThreadOp)

FORMAT = "mirage_py.ugraph"
FORMAT_VERSION = 1

_TYPES = {c.__name__: c for c in (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel,
                                  InputIter, KernelOp, MaskIter, OutputSaver, ThreadGraph,
                                  ThreadOp)}
# fields written only when they differ from these defaults
_OPTIONAL: dict[type, dict[str, Any]] = {ThreadOp: {"attrs": ()},
                                          Accum: {"running": False, "rescale": None},
                                          MaskIter: {"valid": None},
                                          InputIter: {"gather": -1}}


# field types checked on load, so that foreign JSON with the right keys is still rejected here
# rather than deep inside validation or the interpreter
def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _operand(v: Any) -> bool:
    return isinstance(v, (str, float)) or _int(v)


def _size_expr(v: Any) -> bool:
    """An int, or an expression of dims bound when the graph runs (a mask's offset)."""
    return _int(v) or isinstance(v, Affine)


def _tuple_of(check: Any, n: int | None = None) -> Any:
    return lambda v: isinstance(v, tuple) and (n is None or len(v) == n) and all(map(check, v))


def _is(*classes: type) -> Any:
    return lambda v: isinstance(v, classes)


def _attrs(v: Any) -> bool:
    return isinstance(v, tuple) and all(isinstance(kv, tuple) and len(kv) == 2 and _str(kv[0])
                                        for kv in v)


_BLOCK_NODE = _is(InputIter, MaskIter, BlockOp, Fused, Accum, OutputSaver)
_FIELDS: dict[type, dict[str, Any]] = {
    DTensor: {"name": _str, "shape": _tuple_of(_int), "dtype": _str},
    ThreadOp: {"out": _str, "op": _str, "operands": _tuple_of(_operand), "attrs": _attrs},
    ThreadGraph: {"ninputs": _int, "ops": _tuple_of(_is(ThreadOp))},
    InputIter: {"out": _str, "input": _int, "imap": _tuple_of(_int, 3), "fmap": _int,
                "gather": _int},
    MaskIter: {"out": _str, "shape": _tuple_of(_int, 2), "offset": _size_expr,
               "window": _size_expr, "imap": _tuple_of(_int, 3), "fmap": _int,
               "valid": lambda v: v is None or (isinstance(v, tuple) and len(v) == 2 and
                                                all(_size_expr(x) for x in v))},
    BlockOp: {"out": _str, "op": _str, "operands": _tuple_of(_operand), "attrs": _attrs},
    Fused: {"out": _str, "operands": _tuple_of(_operand), "thread": _is(ThreadGraph)},
    Accum: {"out": _str, "input": _str, "kind": _str, "running": lambda v: isinstance(v, bool),
            "rescale": lambda v: v is None or _str(v)},
    OutputSaver: {"input": _str, "output": _int, "omap": _tuple_of(_int, 3)},
    BlockGraph: {"grid": _tuple_of(_int, 3), "threads": _int, "forloop": _int,
                 "ops": _tuple_of(_BLOCK_NODE)},
    KernelOp: {"op": _str, "operands": _tuple_of(_operand), "output": _is(DTensor),
               "attrs": _attrs},
    GraphKernel: {"inputs": _tuple_of(_str), "outputs": _tuple_of(_is(DTensor)),
                  "block": _is(BlockGraph)},
}


def _enc(v: Any) -> Any:
    if type(v).__name__ in _TYPES:
        d = {"node": type(v).__name__}
        optional = _OPTIONAL.get(type(v), {})
        for f in fields(v):
            x = getattr(v, f.name)
            if f.name in optional and x == optional[f.name]:
                continue
            d[f.name] = _enc(x)
        return d
    if isinstance(v, tuple):
        return [_enc(x) for x in v]
    if isinstance(v, float):
        return {"f": repr(float(v))}  # float(): repr(np.float64(x)) is not a Python literal
    if isinstance(v, Affine):
        return json_size(v)
    return v


def _dec(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) == {"f"}:
            return float(v["f"])
        if set(v) == {"affine"}:
            return size_from_json(v)
        cls = _TYPES.get(v.get("node"))
        if cls is None:
            raise SerializationError(f"unknown μGraph node type {v.get('node')!r}")
        kw = {k: _dec(x) for k, x in v.items() if k != "node"}
        for k, default in _OPTIONAL.get(cls, {}).items():
            kw.setdefault(k, default)
        names = {f.name for f in fields(cls)}
        if set(kw) != names:
            raise SerializationError(f"{cls.__name__}: fields {sorted(kw)} != {sorted(names)}")
        for k, check in _FIELDS[cls].items():
            if not check(kw[k]):
                raise SerializationError(f"{cls.__name__}: field {k!r} has a bad value {kw[k]!r}")
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
        g = KernelGraph(str(doc["name"]), _dec(doc["inputs"]), _dec(doc["ops"]),
                        tuple(doc["outputs"]))
        if not _tuple_of(_is(DTensor))(g.inputs) or \
                not _tuple_of(_is(KernelOp, GraphKernel))(g.ops) or not _tuple_of(_str)(g.outputs):
            raise SerializationError("μGraph JSON: inputs must be DTensors, ops KernelOps or "
                                     "GraphKernels, outputs names")
        return g
    except SerializationError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SerializationError(f"malformed μGraph JSON: {type(e).__name__}: {e}") from None


def loads(text: str) -> KernelGraph:
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        raise SerializationError(f"μGraph JSON does not parse: {e}") from None
    return kernel_graph_from_json(doc)


def _ren_operands(ops: tuple[Any, ...], m: dict[str, str]) -> tuple[Any, ...]:
    return tuple(m.get(o, o) if isinstance(o, str) else o for o in ops)


def _canon_thread(tg: ThreadGraph) -> ThreadGraph:
    # thread values are named by position too (v0, v1, ...); the inputs in0, in1, ... stay
    m: dict[str, str] = {}
    ops = []
    for t in tg.ops:
        new = f"v{len(ops)}"
        ops.append(ThreadOp(new, t.op, _ren_operands(t.operands, m), t.attrs))
        m[t.out] = new
    return ThreadGraph(tg.ninputs, tuple(ops))


def _canon_block(bg: BlockGraph) -> BlockGraph:
    m: dict[str, str] = {}
    nodes = []
    for n in bg.ops:
        if isinstance(n, OutputSaver):
            nodes.append(replace(n, input=m.get(n.input, n.input)))
            continue
        new = f"s{len(m)}"
        if isinstance(n, (InputIter, MaskIter)):
            nodes.append(replace(n, out=new))
        elif isinstance(n, BlockOp):
            nodes.append(replace(n, out=new, operands=_ren_operands(n.operands, m)))
        elif isinstance(n, Fused):
            nodes.append(replace(n, out=new, operands=_ren_operands(n.operands, m),
                                 thread=_canon_thread(n.thread)))
        elif isinstance(n, Accum):
            nodes.append(replace(n, out=new, input=m.get(n.input, n.input),
                                 rescale=m.get(n.rescale, n.rescale) if n.rescale else None))
        else:  # not a block node: left for validation to report
            nodes.append(n)
            continue
        m[n.out] = new
    return replace(bg, ops=tuple(nodes))


def canonicalize(g: KernelGraph) -> KernelGraph:
    """Rename intermediates ``t0, t1, ...`` (skipping input and output names, so that a renamed
    tensor never collides with one that keeps its name), tiles ``s0, s1, ...`` and thread values
    ``v0, v1, ...``, each in order of definition."""
    keep = {t.name for t in g.inputs} | set(g.outputs)
    m: dict[str, str] = {n: n for n in keep}
    fresh = (f"t{i}" for i in itertools.count() if f"t{i}" not in keep)

    def ren_out(t: DTensor) -> DTensor:
        if t.name not in m:
            m[t.name] = next(fresh)
        return replace(t, name=m[t.name])

    ops = []
    for op in g.ops:
        if isinstance(op, KernelOp):
            operands = _ren_operands(op.operands, m)
            ops.append(replace(op, operands=operands, output=ren_out(op.output)))
        elif isinstance(op, GraphKernel):
            inputs = tuple(m.get(n, n) for n in op.inputs)
            ops.append(GraphKernel(inputs, tuple(ren_out(t) for t in op.outputs),
                                   _canon_block(op.block)))
        else:
            ops.append(op)
    return KernelGraph(g.name, g.inputs, tuple(ops), g.outputs)
