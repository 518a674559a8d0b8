"""Readable text for μGraphs (``str(graph)``)."""

from __future__ import annotations

from typing import Any

from .graph import (AXES, Accum, BlockGraph, BlockOp, Fused, InputIter, KernelGraph, KernelOp,
                    MaskIter, OutputSaver)


def _operand(o: Any) -> str:
    return o if isinstance(o, str) else repr(o)


def _name(names: tuple[str, ...], i: Any) -> str:
    # an invalid graph must still print (validation errors are read next to the text)
    return names[i] if isinstance(i, int) and 0 <= i < len(names) else f"<#{i}?>"


def _map(m: tuple[int, int, int]) -> str:
    parts = [f"{AXES[a]}->{m[a]}" for a in range(3) if m[a] >= 0]
    return "{" + ", ".join(parts) + "}"


def format_block(bg: BlockGraph, inputs: tuple[str, ...], outputs: tuple[str, ...],
                 indent: str = "    ") -> list[str]:
    lines = [f"{indent}grid={bg.grid} threads={bg.threads} forloop={bg.forloop}"]
    for n in bg.ops:
        if isinstance(n, InputIter):
            f = f" fmap={n.fmap}" if n.fmap >= 0 else ""
            g = f"[{_name(inputs, n.gather)}]" if n.gather >= 0 else ""
            lines.append(f"{indent}{n.out} = iter {_name(inputs, n.input)}{g} "
                         f"imap={_map(n.imap)}{f}")
        elif isinstance(n, MaskIter):
            f = f" fmap={n.fmap}" if n.fmap >= 0 else ""
            lines.append(f"{indent}{n.out} = mask {n.shape} offset={n.offset} window={n.window} "
                         f"imap={_map(n.imap)}{f}")
        elif isinstance(n, BlockOp):
            attrs = "".join(f" {k}={v}" for k, v in n.attrs)
            lines.append(f"{indent}{n.out} = {n.op}({', '.join(map(_operand, n.operands))}){attrs}")
        elif isinstance(n, Fused):
            lines.append(f"{indent}{n.out} = thread[{n.thread.describe()}]"
                         f"({', '.join(map(_operand, n.operands))})")
        elif isinstance(n, Accum):
            lines.append(f"{indent}{n.out} = {n.describe()}")
        elif isinstance(n, OutputSaver):
            lines.append(f"{indent}save {n.input} -> {_name(outputs, n.output)} "
                         f"omap={_map(n.omap)}")
    return lines


def format_kernel_graph(g: KernelGraph) -> str:
    lines = [f"kernel graph {g.name}"]
    for t in g.inputs:
        lines.append(f"  {t.name}: {t.shape} {t.dtype}")
    for op in g.ops:
        if isinstance(op, KernelOp):
            attrs = "".join(f", {k}={v}" for k, v in op.attrs)
            lines.append(f"  {op.output.name} = {op.op}({', '.join(map(_operand, op.operands))}"
                         f"{attrs}) : {op.output.shape} {op.output.dtype}")
        else:
            outs = ", ".join(f"{t.name}: {t.shape} {t.dtype}" for t in op.outputs)
            lines.append(f"  {outs} = graph_kernel({', '.join(op.inputs)}):")
            lines += format_block(op.block, op.inputs, tuple(t.name for t in op.outputs))
    lines.append(f"  outputs: {', '.join(g.outputs)}")
    return "\n".join(lines)
