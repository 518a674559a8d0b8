"""Dead-code elimination on kernel graphs: drop kernel outputs nobody reads (with the savers and
block operators that only fed them) and kernels left with no outputs."""

from __future__ import annotations

from dataclasses import replace

from .graph import (BlockGraph, GraphKernel, InputIter, KernelGraph, KernelOp,
                            OutputSaver, tiles_read)


def _prune_block(gk: GraphKernel, keep: list[int]) -> GraphKernel:
    bg = gk.block
    remap = {old: new for new, old in enumerate(keep)}
    savers = [replace(s, output=remap[s.output]) for s in bg.savers() if s.output in remap]
    live = {s.input for s in savers}
    body = [o for o in bg.ops if not isinstance(o, OutputSaver)]
    kept = []
    for o in reversed(body):
        if o.out in live:
            kept.append(o)
            live.update(tiles_read(o))
    kept.reverse()
    used_inputs = sorted({i for o in kept if isinstance(o, InputIter)
                          for i in (o.input, o.gather) if i >= 0})
    imap = {old: new for new, old in enumerate(used_inputs)}
    kept = [replace(o, input=imap[o.input], gather=imap[o.gather] if o.gather >= 0 else -1)
            if isinstance(o, InputIter) else o for o in kept]
    return GraphKernel(tuple(gk.inputs[i] for i in used_inputs),
                       tuple(gk.outputs[i] for i in keep),
                       BlockGraph(bg.grid, bg.threads, bg.forloop, tuple(kept + savers)))


def eliminate_dead(g: KernelGraph) -> KernelGraph:
    needed = set(g.outputs)
    new_ops = []
    for op in reversed(g.ops):
        if isinstance(op, KernelOp):
            if op.output.name in needed:
                new_ops.append(op)
                needed.update(op.inputs)
            continue
        keep = [j for j, t in enumerate(op.outputs) if t.name in needed]
        if not keep:
            continue
        gk = _prune_block(op, keep)  # also drops unused block ops and iterators
        new_ops.append(gk)
        needed.update(gk.inputs)
    new_ops.reverse()
    return KernelGraph(g.name, g.inputs, tuple(new_ops), g.outputs)
