"""Binding the sizes a μGraph's masks name.

A graph searched for a padded program (lax/family.py) keeps its masks' valid sizes and offsets
as expressions of dims (``MaskIter.offset``, ``valid``; a ``mask`` kernel's attributes): one
graph serves every binding up to its bucket. :func:`params` lists the dims it needs;
:func:`bind` gives the static graph for one binding (the interpreter and the verifier take
the sizes instead: ``run(..., sizes=...)``); code generation keeps the expressions and passes
each kernel the sizes it reads (:func:`op_params`) when it runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..lax.shapes import Affine, resolve
from .graph import GraphKernel, KernelGraph, KernelOp, MaskIter

_MASK_ATTRS = ("offset", "window", "valid")


def _names(v: Any) -> set[str]:
    if isinstance(v, tuple):
        return set().union(*(_names(x) for x in v)) if v else set()
    return {n for n, _ in v.terms} if isinstance(v, Affine) else set()


def op_params(op: Any) -> tuple[str, ...]:
    """The dims one kernel of a graph reads (its masks'; sorted): the sizes its code takes
    when it runs."""
    names: set[str] = set()
    if isinstance(op, KernelOp) and op.op == "mask":
        for k in _MASK_ATTRS:
            names |= _names(op.attr(k))
    elif isinstance(op, GraphKernel):
        for n in op.block.masks():
            names |= _names((n.offset, n.window, n.valid))
    return tuple(sorted(names))


def params(graph: KernelGraph) -> tuple[str, ...]:
    """The dims the graph's masks name (sorted; empty for a static graph)."""
    return tuple(sorted({n for op in graph.ops for n in op_params(op)}))


def bind(graph: KernelGraph, sizes: Mapping[str, int]) -> KernelGraph:
    """``graph`` with every mask expression replaced by its value for ``sizes`` (anything but
    a kernel graph is handed back for the caller's own checks to reject)."""
    if not isinstance(graph, KernelGraph) or not params(graph):
        return graph
    ops = []
    for op in graph.ops:
        if isinstance(op, KernelOp) and op.op == "mask":
            op = replace(op, attrs=tuple((k, resolve(v, sizes) if k in _MASK_ATTRS else v)
                                         for k, v in op.attrs))
        elif isinstance(op, GraphKernel) and op.block.masks():
            nodes = tuple(replace(n, offset=resolve(n.offset, sizes),
                                  window=resolve(n.window, sizes),
                                  valid=None if n.valid is None else resolve(n.valid, sizes))
                          if isinstance(n, MaskIter) else n for n in op.block.ops)
            op = replace(op, block=replace(op.block, ops=nodes))
        ops.append(op)
    return replace(graph, ops=tuple(ops))


__all__ = ["params", "op_params", "bind"]
