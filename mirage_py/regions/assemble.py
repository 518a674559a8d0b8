"""One kernel graph for a part from the pieces of its cover.

Each piece is either a pre-defined kernel of the naive lowering (one operator) or a region's
kernel graph, written for the region's canonical program (inputs ``r<i>``, outputs ``y<j>``).
Pieces come in run order. Their boundary tensors take the part's value names -- the part's input
and output names, and for intermediates the name the naive lowering gives them (``t<k>``) --
and every tensor inside a piece gets the piece's prefix (``c<k>_``), so names never collide.
A value two pieces both write (their regions overlap) is read from the first; the second
writes it under a name of its own, which dead-code elimination then drops where it can.
Statistics crossing between pieces (sums, squares and their element-wise functions in a 16-bit
program) are stored in float32 (lax/precision.py).
"""

from __future__ import annotations

from dataclasses import replace

from ..lax.precision import storage_dtype
from ..lax.program import Program
from ..ugraph.graph import DTensor, GraphKernel, KernelGraph, KernelOp
from ..ugraph.lower import naive_lowering
from ..ugraph.dce import eliminate_dead
from .region import Region


def value_names(part: Program) -> dict[str, str]:
    """Digest -> device tensor name, as the naive lowering names them."""
    naive = naive_lowering(part)
    dag_nodes = [t for t in part.nodes() if t.op not in ("input", "const")]
    names = {t.digest: t.name for t in part.inputs}
    for t, op in zip(dag_nodes, naive.ops):
        names[t.digest] = op.output.name
    return names


def _widen_statistics(part: Program, names: dict[str, str], ops: list) -> list:
    """``ops`` with the statistics that cross between pieces stored in float32 (sums, squares
    and what is computed from them in a 16-bit program, lax/precision.py): a region's answer
    writes its outputs in the program's dtype, and a sum of squares of activations of 300 does
    not fit float16. Storage only: what the kernels compute is unchanged, and readers read
    whatever dtype a tensor has."""
    memo: dict[str, bool] = {}
    outputs = set(part.output_tensors)
    wide = {names[t.digest] for t in part.nodes() if t.op not in ("input", "const", "mask")
            and t.digest in names and storage_dtype(t, memo) != t.dtype} - outputs

    def widened(t: DTensor) -> DTensor:
        return replace(t, dtype="float32") if t.name in wide else t
    out = []
    for op in ops:
        if isinstance(op, KernelOp) and op.output.name in wide and op.op != "cast":
            op = replace(op, output=widened(op.output))
        elif isinstance(op, GraphKernel) and any(t.name in wide for t in op.outputs):
            op = replace(op, outputs=tuple(widened(t) for t in op.outputs))
        out.append(op)
    return out


def assemble(part: Program, pieces: list, names: dict[str, str]) -> tuple[KernelGraph, list]:
    """The part's kernel graph from ``pieces`` in run order -- each ``("op", digest, KernelOp)``
    or ``("region", Region, annotated graph)`` -- and the pipeline stages of its graph-defined
    kernels (each keeps its region's)."""
    ops: list = []
    stage_of: list[tuple[frozenset, int]] = []  # per graph kernel: output names, stages
    written: set[str] = set()
    for k, (kind, what, body) in enumerate(pieces):
        if kind == "op":
            if names[what] in written:
                continue
            ops.append(body)
            written.add(names[what])
            continue
        region: Region = what
        body, stages = body.graph, body.stages_full()
        rename = {region.input_name(i): names[d] for i, d in enumerate(region.inputs)}
        rename.update({region.output_name(j): names[d] for j, d in enumerate(region.outputs)})
        for n in list(rename):
            if n in {region.output_name(j) for j in range(len(region.outputs))} \
                    and rename[n] in written:
                rename[n] = f"c{k}_dup_{n}"  # already written by an earlier piece

        stage_of_piece: list = []

        def rn(n: str, k=k, rename=rename) -> str:
            return rename.get(n, f"c{k}_{n}")
        for op in body.ops:
            if isinstance(op, KernelOp):
                ops.append(replace(op, operands=tuple(rn(o) if isinstance(o, str) else o
                                                      for o in op.operands),
                                   output=replace(op.output, name=rn(op.output.name))))
            else:
                gk = GraphKernel(tuple(rn(n) for n in op.inputs),
                                 tuple(replace(t, name=rn(t.name)) for t in op.outputs),
                                 op.block)
                ops.append(gk)
                stage_of.append((frozenset(t.name for t in gk.outputs),
                                 stages[len(stage_of_piece)]))
                stage_of_piece.append(gk)
        written |= {rename[region.output_name(j)] for j in range(len(region.outputs))}
    extra = []  # an output that is another output's value under a second name
    defined = {t.name for op in ops for t in op.outputs}
    for name, t in part.output_tensors.items():
        if name not in defined:
            extra.append(KernelOp("mul", (names[t.digest], 1.0), DTensor(name, t.shape, t.dtype)))
    ops = _widen_statistics(part, names, ops + extra)
    g = KernelGraph(part.name, tuple(DTensor(t.name, t.shape, t.dtype) for t in part.inputs),
                    tuple(ops), tuple(part.output_tensors))
    g = eliminate_dead(g)
    # dead-code elimination keeps the kernels' order and may drop outputs: match each
    # surviving graph kernel to the first unmatched one that wrote its outputs
    stages, j = [], 0
    for gk in g.graph_kernels():
        names_ = {t.name for t in gk.outputs}
        while not names_ <= stage_of[j][0]:
            j += 1
        stages.append(stage_of[j][1])
        j += 1
    return g, stages
