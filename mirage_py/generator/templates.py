"""Elementwise templates taken from the target program.

For every elementwise operator of the target, two templates: the operator alone (its non-constant
operands become leaves) and its whole elementwise cone (operands followed through elementwise
operators down to the first non-elementwise node or input). Constants stay inside. The block-level
search applies a template to tiles whose abstract expressions contain the leaves' expressions, and
the result becomes one fused thread-level operator (a thread graph evaluated in registers).
This is how a chain like ``x / sqrt(ss / n + eps)`` is placed in one step instead of five.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..lax.ops import OPS
from ..ugraph.graph import ThreadGraph, ThreadOp, attrs_of
from . import absexpr as ae


@dataclass(frozen=True)
class Template:
    thread: ThreadGraph
    leaf_exprs: tuple  # abstract expression of each leaf in the target

    @property
    def ninputs(self) -> int:
        return self.thread.ninputs

    def expr(self, args) -> ae.Poly:
        return _template_expr(self.thread, tuple(args))


@lru_cache(maxsize=1 << 16)
def _template_expr(thread: ThreadGraph, args: tuple) -> ae.Poly:
    env = {f"in{i}": a for i, a in enumerate(args)}
    for t in thread.ops:
        vals = [env[o] if isinstance(o, str) else ae.const(o) for o in t.operands]
        env[t.out] = ae.apply(t.op, vals, attrs=dict(t.attrs))
    return env[thread.ops[-1].out]


def _build(root, exprs, full: bool) -> Template:
    leaves: list = []
    leaf_index: dict[str, int] = {}
    ops: list[ThreadOp] = []
    names: dict[str, str] = {}

    def visit(t, top: bool) -> object:
        if t.op == "const":
            return float(t.attr("value"))
        inner = top or (full and OPS[t.op].elementwise)
        if not inner:
            if t.digest not in leaf_index:
                leaf_index[t.digest] = len(leaves)
                leaves.append(t)
            return f"in{leaf_index[t.digest]}"
        if t.digest in names:
            return names[t.digest]
        args = tuple(visit(i, False) for i in t.inputs)
        name = f"v{len(ops)}"
        ops.append(ThreadOp(name, t.op, args, attrs_of(t.attr_dict)))
        names[t.digest] = name
        return name

    visit(root, True)
    return Template(ThreadGraph(len(leaves), tuple(ops)), tuple(exprs[l.digest] for l in leaves))


def templates_of(program, exprs: dict) -> list[Template]:
    out: dict = {}
    for t in program.nodes():
        if t.op in ("input", "const") or not OPS[t.op].elementwise:
            continue
        for full in (False, True):
            tp = _build(t, exprs, full)
            if tp.ninputs == 0:
                continue
            out.setdefault((tp.thread, tp.leaf_exprs), tp)
    return list(out.values())
