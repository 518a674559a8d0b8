"""Graphviz pictures of μGraphs: ``to_dot(graph)`` gives DOT text, ``render(graph, path)`` a file.

Kernel level: device tensors are ellipses (inputs blue, graph outputs green), pre-defined kernels
boxes, and every graph-defined kernel a cluster whose label gives grid, threads, for-loop range
and shared memory. Inside a cluster the block graph is drawn: input iterators (imap / fmap, tile
shape), block operators, fused thread graphs (their expression), accumulators and output savers
(omap). Loop-body nodes sit in an inner "for" cluster when the loop has more than one iteration.
Edges run tensor -> kernel -> tensor, tensor -> iterator, tile -> operator, saver -> tensor::

    X (16, 4096) float16 --> [ graph kernel #0  grid (96, 1, 1) ...
                               iter X imap {} fmap 1 --> matmul --> accum.sum --> save omap {x->1} ]
                           --> Y (16, 6144) float16

The picture is drawn for invalid graphs too (that is when one needs it most): tile shapes are
then left out, the cluster label says what validation reports, and a reference to a tensor that
does not exist points at a red "undefined" node.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from dataclasses import replace
from typing import Any

from ..errors import MirageError, ToolError, ToolNotFoundError
from ..targets import get_target
from .graph import (AXES, Accum, BlockGraph, BlockOp, Fused, GraphKernel, InputIter, MaskIter,
                    KernelGraph,
                    KernelOp, OutputSaver)
from .phase import Phase

# what ``dot -T`` is asked to write, by file suffix; .dot/.gv are written without Graphviz
RENDER_FORMATS = ("svg", "png", "pdf")
TEXT_FORMATS = ("dot", "gv")

_STYLE = {
    "input": 'shape=ellipse, style=filled, fillcolor="#dbe9f6"',
    "output": 'shape=ellipse, style=filled, fillcolor="#d9f0d3", peripheries=2',
    "tensor": "shape=ellipse",
    "missing": 'shape=ellipse, style="filled,dashed", fillcolor="#f8d0d0"',
    "kernel": 'shape=box, style="rounded,filled", fillcolor="#f2f2f2"',
    "iter": 'shape=invhouse, style=filled, fillcolor="#dbe9f6"',
    "op": "shape=box",
    "fused": 'shape=box, style="rounded,filled", fillcolor="#fff3c4"',
    "accum": 'shape=doubleoctagon, style=filled, fillcolor="#fde0c5"',
    "saver": 'shape=house, style=filled, fillcolor="#d9f0d3"',
    "unknown": 'shape=box, style="filled,dashed", fillcolor="#f8d0d0"',
}


def quote(text: str) -> str:
    """``text`` as a DOT quoted string: backslashes and quotes escaped, line breaks as ``\\n``
    (so no escape sequence of Graphviz's own, like ``\\l`` or ``\\N``, can sneak in)."""
    text = str(text).replace("\\", "\\\\").replace('"', '\\"')
    return '"' + text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\\n") + '"'


def _shape(shape: Any) -> str:
    shape = tuple(shape)
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _map(m: Any) -> str:
    try:
        parts = [f"{AXES[a]}->{m[a]}" for a in range(3) if m[a] >= 0]
    except (TypeError, IndexError):
        return str(m)
    return "{" + ", ".join(parts) + "}"


def _operand(o: Any) -> str:
    return o if isinstance(o, str) else repr(o)


def _attrs(attrs: Any) -> str:
    try:
        return "".join(f" {k}={_shape(v) if isinstance(v, tuple) else v}" for k, v in attrs)
    except (TypeError, ValueError):
        return f" {attrs}"


def _wrap(text: str, width: int = 44) -> str:
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)) or text


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KB"


class _Dot:
    """Accumulates DOT statements; nodes get generated ids, so names need no escaping there."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 1

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def node(self, nid: str, label: str, style: str) -> None:
        self.emit(f"{nid} [label={quote(label)}, {_STYLE[style]}];")

    def edge(self, a: str, b: str, label: str | None = None) -> None:
        self.emit(f"{a} -> {b}" + (f" [label={quote(label)}];" if label else ";"))

    def open(self, cid: str, label: str, style: str = "") -> None:
        self.emit(f"subgraph {cid} {{")
        self.depth += 1
        self.emit(f"label={quote(label)};")
        if style:
            self.emit(style)

    def close(self) -> None:
        self.depth -= 1
        self.emit("}")


def _block_info(gk: GraphKernel, tensors: dict[str, Any]) -> tuple[Any, str | None]:
    """Tile shapes and phases from validation (target limits lifted: a picture of a graph that
    is too big for one GPU is still useful), or the validation message."""
    from .validate import check_block
    loose = replace(get_target("h100"), smem_per_block=2**62, max_threads=2**31,
                    max_grid=(2**62,) * 3)
    try:
        ins = [tensors[n] for n in gk.inputs]
        return check_block(gk.block, ins, list(gk.outputs), loose), None
    except KeyError as e:
        return None, f"undefined input tensor {e}"
    except (MirageError, TypeError, ValueError, IndexError, AttributeError) as e:
        return None, str(e)


def _draw_block(d: _Dot, k: int, gk: GraphKernel, tid: Any, tensors: dict[str, Any]) -> None:
    bg: BlockGraph = gk.block
    info, problem = _block_info(gk, tensors)
    head = f"graph kernel #{k}\ngrid {_shape(bg.grid)}  threads {bg.threads}  forloop {bg.forloop}"
    head += f"\nshared memory {_kb(info.smem_bytes)}" if info else f"\ninvalid: {_wrap(problem)}"
    d.open(f"cluster_k{k}", head, 'style="rounded"; color="#7f7f7f"; fontsize=11;')

    def tile(name: str) -> str:
        if info is None or name not in info.shapes:
            return ""
        return f"\n{_shape(info.shapes[name])} {info.dtypes[name]}"

    def phase(node: Any) -> Phase | None:
        out = getattr(node, "out", None)
        return info.phases.get(out) if info is not None and isinstance(out, str) else None

    ids: dict[str, str] = {}  # tile name -> node id
    nodes: list[tuple[str, str, str, bool]] = []  # id, label, style, in the loop body
    edges: list[tuple[str, str]] = []
    for j, n in enumerate(bg.ops):
        nid = f"k{k}_{j}"
        if isinstance(n, InputIter):
            src = gk.inputs[n.input] if isinstance(n.input, int) and \
                0 <= n.input < len(gk.inputs) else f"input #{n.input}?"
            f = f" fmap {n.fmap}" if isinstance(n.fmap, int) and n.fmap >= 0 else ""
            imap = _map(n.imap)
            imap += " (replicated)" if imap == "{}" else ""
            gsrc = gk.inputs[n.gather] if 0 <= n.gather < len(gk.inputs) else None
            rows = f"[{gsrc}]" if gsrc is not None else ""
            label, style = f"{n.out} = iter {src}{rows}\nimap {imap}{f}{tile(n.out)}", "iter"
            edges.append((tid(src), nid))
            if gsrc is not None:
                edges.append((tid(gsrc), nid))
        elif isinstance(n, MaskIter):
            f = f" fmap {n.fmap}" if isinstance(n.fmap, int) and n.fmap >= 0 else ""
            label, style = (f"{n.out} = mask {n.shape} offset {n.offset} window {n.window}\n"
                            f"imap {_map(n.imap)}{f}{tile(n.out)}"), "iter"
        elif isinstance(n, BlockOp):
            label, style = (f"{n.out} = {n.op}({', '.join(map(_operand, n.operands))})"
                            f"{_attrs(n.attrs)}{tile(n.out)}"), "op"
        elif isinstance(n, Fused):
            try:
                expr = n.thread.describe()
            except (KeyError, IndexError, TypeError, AttributeError):
                expr = f"<{len(n.thread.ops)} thread ops>"
            args = ", ".join(map(_operand, n.operands))
            label, style = f"{n.out} = thread({args})\n{_wrap(expr)}{tile(n.out)}", "fused"
        elif isinstance(n, Accum):
            label, style = f"{n.out} = {n.describe()}{tile(n.out)}", "accum"
        elif isinstance(n, OutputSaver):
            dst = gk.outputs[n.output].name if isinstance(n.output, int) and \
                0 <= n.output < len(gk.outputs) else f"output #{n.output}?"
            label, style = f"save {n.input} -> {dst}\nomap {_map(n.omap)}", "saver"
            edges.append((nid, tid(dst)))
        else:
            label, style = f"unknown block node {type(n).__name__}", "unknown"
        for o in _uses(n):
            if o in ids:
                edges.append((ids[o], nid))
        if isinstance(getattr(n, "out", None), str):
            ids[n.out] = nid
        nodes.append((nid, label, style, phase(n) is Phase.BODY))
    for nid, label, style, in_body in nodes:
        if not (in_body and bg.forloop > 1):
            d.node(nid, label, style)
    if bg.forloop > 1 and any(n[3] for n in nodes):
        d.open(f"cluster_k{k}_loop", f"for i in range({bg.forloop})",
               'style="dashed"; color="#7f7f7f"; fontsize=10;')
        for nid, label, style, in_body in nodes:
            if in_body:
                d.node(nid, label, style)
        d.close()
    d.close()
    # edges after the cluster, so that a node is not pulled into a cluster by its first mention
    for a, b in edges:
        d.edge(a, b)


def _uses(n: Any) -> list[str]:
    if isinstance(n, (BlockOp, Fused)):
        return [o for o in n.operands if isinstance(o, str)]
    if isinstance(n, Accum):
        return [x for x in (n.input, n.rescale) if isinstance(x, str)]
    if isinstance(n, OutputSaver):
        return [n.input] if isinstance(n.input, str) else []
    return []


def to_dot(graph: KernelGraph) -> str:
    """Graphviz DOT text for ``graph`` (any validity; see the module docstring)."""
    d = _Dot()
    tensors = {t.name: t for t in graph.inputs}
    for op in graph.ops:
        for t in getattr(op, "outputs", ()):
            tensors.setdefault(t.name, t)
    outputs = set(graph.outputs)
    tids: dict[str, str] = {}
    missing: list[str] = []

    def tid(name: str) -> str:
        if name not in tids:
            tids[name] = f"t{len(tids)}"
            if name not in tensors:
                missing.append(name)
        return tids[name]

    def tensor_node(t: Any, kind: str) -> None:
        d.node(tid(t.name), f"{t.name}\n{_shape(t.shape)} {t.dtype}",
               "output" if t.name in outputs else kind)

    for t in graph.inputs:
        tensor_node(t, "input")
    for op in graph.ops:
        for t in getattr(op, "outputs", ()):
            tensor_node(t, "tensor")
    for k, op in enumerate(graph.ops):
        if isinstance(op, KernelOp):
            nid = f"k{k}"
            args = ", ".join(map(_operand, op.operands))
            d.node(nid, f"{op.op}({args}){_attrs(op.attrs)}", "kernel")
            for o in op.inputs:
                d.edge(tid(o), nid)
            d.edge(nid, tid(op.output.name))
        elif isinstance(op, GraphKernel):
            _draw_block(d, k, op, tid, tensors)
        else:
            d.node(f"k{k}", f"unknown kernel node {type(op).__name__}", "unknown")
    for name in outputs - set(tensors):
        tid(name)
    for name in missing:
        d.node(tids[name], f"{name}\nundefined", "missing")
    head = [f"digraph {quote(graph.name)} {{",
            f"  graph [label={quote('kernel graph ' + graph.name)}, labelloc=t, fontsize=14, "
            'fontname="Helvetica", rankdir=TB, newrank=true];',
            '  node [fontname="Helvetica", fontsize=10];',
            '  edge [fontname="Helvetica", fontsize=9, color="#555555"];']
    return "\n".join(head + d.lines + ["}"]) + "\n"


def render(graph: KernelGraph, path: str | os.PathLike, format: str | None = None) -> str:
    """Write ``graph`` to ``path``: ``.dot``/``.gv`` as text (always works); ``.svg``, ``.png`` or
    ``.pdf`` through Graphviz's ``dot`` program (:class:`ToolNotFoundError` when it is not
    installed). ``format`` overrides the suffix. Returns the path written."""
    path = os.fspath(path)
    fmt = (format or os.path.splitext(path)[1]).lower().lstrip(".")
    if fmt not in TEXT_FORMATS + RENDER_FORMATS:
        raise ToolError(f"render: cannot write format {fmt or '(no suffix)'!r} for {path!r}; "
                        f"use one of {', '.join(TEXT_FORMATS + RENDER_FORMATS)}")
    text = to_dot(graph)
    if fmt in TEXT_FORMATS:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path
    exe = shutil.which("dot")
    if exe is None:
        raise ToolNotFoundError(
            f"render: writing {fmt} needs the 'dot' program of Graphviz, which is not on PATH; "
            "install Graphviz (apt-get install graphviz, brew install graphviz or conda install "
            "graphviz), or write a .dot file instead")
    try:
        proc = subprocess.run([exe, f"-T{fmt}", "-o", path], input=text.encode("utf-8"),
                              capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolError(f"render: running {exe} -T{fmt} failed: {e}") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()
        raise ToolError(f"render: {exe} -T{fmt} exited with {proc.returncode}: {err}")
    return path


__all__ = ["to_dot", "render", "quote", "RENDER_FORMATS", "TEXT_FORMATS"]
