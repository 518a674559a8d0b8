"""Numerics checks on sampled rows: fewer blocks along the dims every output element is computed
apart (issues #29, #31).

The numerics check (numerics.py) runs a candidate in GPU precision against the float64
reference. At model size its cost is the size of its inputs -- drawing them, rounding them,
converting them, watching every intermediate for non-finite values (an 8B layer's gate and up
projections: 117 M input elements, 5-10 s) -- while what decides its verdict is how each output
element is computed, which is the same for every block along a dim no operator reduces.
:func:`sample_rows` makes, for a program ``P`` and a candidate ``G``, a pair ``(P', G')`` that
computes a sample of ``G``'s output rows exactly as ``G`` computes them, or says why not
(a :class:`~mirage_py.verifier.shrink.Shrink` with ``why``):

* a *sampled label* is a parallel dim label of ``P`` (generator/labels.py: a dim of an output)
  that no operator reduces. Sampling is keyed by the label, not by the extent: a GEMM whose
  reduced ``K`` equals its columns ``N`` (KernelBench's level2/76, Llama's square projections)
  samples ``N``'s dims and keeps ``K``'s whole;
* ``P'`` is ``P`` with every dim of label ``l`` made ``E_l / k_l`` (``shrink.small_program``
  with the program's ``node_dims``), every other dim kept; ``G'`` is ``G`` with the grid axis
  or loop that cuts the dims of ``l`` making ``k_l`` times fewer parts, every tile kept
  (:func:`_sampled_graph`). ``G`` has no labels of its own: they are carried from its inputs
  (the program's inputs of the same names) through each graph kernel (:func:`_plan`): an axis
  that cuts dims of one label only is that label's, the output dims its savers cut by it carry
  it. A label is refused (kept whole) in a graph where a block reads one of its dims whole (the
  tile could not be kept), an axis cuts it together with dims of another label or of none, two
  axes of one kernel cut it, or a pre-defined kernel touches it (its arithmetic may depend on
  the extent). The naive lowering, the baseline, is all pre-defined kernels: :func:`sampled_like`
  re-infers each one's output from its resized operands with the operator's own shape rule;
* ``k_l`` is the largest divisor of the part counts of every axis that cuts ``l`` that leaves
  at least :data:`SAMPLE_BLOCKS` blocks along it and :data:`SAMPLE_OUTPUT_ELEMENTS` elements of
  each output (the longest labels first). ``G'`` must validate, keep every tile, and give
  ``P'``'s output shapes.

Why the verdict on ``(P', G')`` is the verdict on the sampled rows of ``(P, G)`` (docs/verifier.md,
"Numerics checks on sampled rows"): operators that read positions or extents (masks, slices,
concatenations, reshapes, gathers, ``rms_norm``) are refused as in shrink.py, so no block's
arithmetic depends on which block it is, and a tile that divides its extent leaves no partial
tail block (a padded program's tails are masks: refused, checked at full size). The label is
never reduced, so no output element of one block depends on another block's inputs along it;
the dims of other labels -- a reduced ``K`` of the same extent included -- keep their extents,
so each kept block runs the same loop over them. ``G'`` on the sampled inputs computes, bit for
bit, what ``G`` computes for those rows. The check's inputs
are i.i.d. draws along the label, so the sampled rows' errors are drawn from the same
distribution as every row's: the norm-wise error of the sample estimates the full one (a ratio
of sums over at least :data:`SAMPLE_OUTPUT_ELEMENTS` elements of each output), and a failure that
happens on a fixed fraction of rows shows in the sample too. Outlier features (the probe of
"massive activations") sit on inputs' last dims: where that dim is the sampled label they are
drawn among the sampled rows, so the rows that hold them are always checked. What the sample
cannot see is a failure confined to fewer rows than one in ``E' / E`` at random positions; the
full-size check, itself one random draw, has the same blind spot at one in ``E``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import MirageError
from ..lax.program import Program
from ..ugraph.graph import InputIter, KernelGraph, KernelOp, OutputSaver
from .shrink import Shrink, _cuts, _positional_graph, _positional_program, small_program, \
    view_reshape_target

#: a sample keeps at least this many elements of each output (all of a smaller one: an
#: output's norm-wise error is a ratio of sums over them) ...
SAMPLE_OUTPUT_ELEMENTS = 1024
#: ... and at least this many blocks along each sampled label (the first block of a label and
#: others are all checked; every block runs the same code) ...
SAMPLE_BLOCKS = 8
#: ... or at least two where a sample of SAMPLE_BLOCKS would hold a tensor of more than this
#: many elements: KernelBench's (4096, 393216) softmax cut into 64 blocks of 64 rows kept 512
#: rows, 201 M elements a tensor (1.5 GiB as float64), and its checks ran out of memory ...
SAMPLE_TENSOR_ELEMENTS = 1 << 24
#: ... and where even that is over it, at least this many elements of each output: a row
#: reduction's outputs are one element a row, so 1024 of them kept 1024 rows of 393,216 (402 M
#: input elements, a 56 s check guessed: the softmax's statistics were never searched)
SAMPLE_LEAST_OUTPUT_ELEMENTS = 64

Dims = tuple  # a tensor's label per dim (None: a dim that carries no sampled label)


def _labels(program: Program) -> Any:
    """The program's dim labels (generator/labels.py), or None where a sample cannot use them:
    a symbolic or padded program, or one with operators that read positions or extents."""
    from ..generator.labels import infer_labels
    if program.params or program.symbolic or _positional_program(program, pins=False):
        return None
    try:
        return infer_labels(program)
    except MirageError:
        return None


def sampled_labels(program: Program) -> dict[str, int]:
    """The labels a numerics check may sample (module doc), by label: their extent -- the
    parallel labels no operator reduces. Empty for a symbolic or padded program, or one with
    operators that read positions or extents."""
    labels = _labels(program)
    return {} if labels is None else _free(labels)


def _free(labels: Any) -> dict[str, int]:
    return {lab: labels.sizes[lab] for lab in labels.parallel - labels.reduced_any}


def _elements_at(tensors: Any, node_dims: dict, sizes: dict[str, int]) -> int:
    """Elements of ``tensors`` (program nodes) with each dim of a label in ``sizes`` resized."""
    return sum(math.prod(sizes.get(lab, d) if lab is not None else d
                         for d, lab in zip(t.shape, node_dims[t.digest])) for t in tensors)


def sample_sizes(program: Program, parts: dict[str, int] | None = None,
                 labels: Any = None) -> dict[str, int]:
    """Label -> sampled extent for every label :func:`sampled_labels` allows, the longest
    first: ``E / k`` with ``k`` the largest divisor of ``parts[label]`` (the part counts of
    every grid axis or loop that cuts the label have it in common; ``E`` itself when not given:
    one element a block) that keeps :data:`SAMPLE_BLOCKS` blocks and, in each output,
    :data:`SAMPLE_OUTPUT_ELEMENTS` elements (all of a smaller one) -- where that sample would
    hold a tensor over :data:`SAMPLE_TENSOR_ELEMENTS`, two blocks, and then
    :data:`SAMPLE_LEAST_OUTPUT_ELEMENTS` elements of each output. ``labels``: the program's
    (:func:`~mirage_py.generator.labels.infer_labels`), where the caller has them."""
    labels = labels if labels is not None else _labels(program)
    if labels is None:
        return {}
    nodes = program.nodes()
    sizes: dict[str, int] = {}
    for blocks, per_output in ((SAMPLE_BLOCKS, SAMPLE_OUTPUT_ELEMENTS),
                               (2, SAMPLE_OUTPUT_ELEMENTS), (2, SAMPLE_LEAST_OUTPUT_ELEMENTS)):
        sizes = _sizes_keeping(program, labels, parts, blocks, per_output)
        if max(_elements_at([t], labels.node_dims, sizes) for t in nodes) <= \
                SAMPLE_TENSOR_ELEMENTS:
            break
    return sizes


def _sizes_keeping(program: Program, labels: Any, parts: dict[str, int] | None,
                   blocks: int, per_output: int) -> dict[str, int]:
    """:func:`sample_sizes` keeping at least ``blocks`` blocks along each sampled label and
    ``per_output`` elements of each output (all of a smaller one)."""
    outputs = [o.tensor for o in program.outputs]
    least = [min(per_output, _elements_at([t], labels.node_dims, {})) for t in outputs]
    sizes: dict[str, int] = {}
    for lab, e in sorted(_free(labels).items(), key=lambda x: (-x[1], x[0])):
        g = e if parts is None else parts.get(lab, 0)
        if g <= 1:
            continue
        for k in sorted((k for k in range(2, g + 1) if g % k == 0), reverse=True):
            if g // k < blocks or e % k:
                continue
            trial = {**sizes, lab: e // k}
            if all(_elements_at([t], labels.node_dims, trial) >= n
                   for t, n in zip(outputs, least)):
                sizes = trial
                break
    return sizes


@dataclass
class _Plan:
    """How a graph's dims carry the sampled labels: ``dims`` (tensor name -> label per dim, None
    where no candidate label), per graph kernel (by position) the label of each grid axis
    (0, 1, 2) or loop ("loop") that cuts one, ``parts`` (label -> the part counts of the axes
    that cut it) and ``refused`` (label -> why it cannot be sampled in this graph)."""

    dims: dict[str, Dims] = field(default_factory=dict)
    axes: dict[int, dict[Any, str]] = field(default_factory=dict)
    parts: dict[str, list[int]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    def common_parts(self) -> dict[str, int]:
        """Per label not refused: the largest count that divides every cut's part count."""
        return {lab: math.gcd(*ps) for lab, ps in self.parts.items()
                if lab not in self.refused}


def _input_dims(program: Program, labels: Any, graph: KernelGraph, free: Any
                ) -> dict[str, Dims] | None:
    """The graph inputs' labels among ``free``: those of the program's inputs of the same names
    (None where the graph's inputs are not the program's)."""
    ins = {t.name: t for t in program.inputs}
    out = {}
    for t in graph.inputs:
        p = ins.get(t.name)
        if p is None or tuple(p.shape) != tuple(t.shape):
            return None
        out[t.name] = tuple(lab if lab in free else None for lab in labels.node_dims[p.digest])
    return out


def _plan(graph: KernelGraph, inputs: dict[str, Dims], kernels_whole: bool) -> _Plan:
    """Which dims of ``graph`` carry which candidate label (those in ``inputs``), label by
    label what cuts them and what refuses them. A graph kernel's grid axis or loop that cuts
    dims of one label only is that label's; an output dim its saver cuts by such an axis
    carries the label; any other output dim carries none. A label is refused where an axis
    cuts its dims with dims of another label or of none, where a kernel reads one of its dims
    whole (no axis cuts it: the tile could not be kept) or cuts it with two axes, and -- unless
    ``kernels_whole`` (the naive lowering, whose pre-defined kernels are re-inferred on the
    sampled operands) -- where a pre-defined kernel touches it."""
    plan = _Plan(dims=dict(inputs))

    def refuse(labs: Any, why: str) -> None:
        for lab in labs:
            if lab is not None:
                plan.refused.setdefault(lab, why)

    for i, op in enumerate(graph.ops):
        if isinstance(op, KernelOp):
            touched = {lab for n in op.inputs for lab in plan.dims.get(n, ())}
            if not kernels_whole:
                refuse(touched, f"the pre-defined kernel {op.op} -> {op.output.name!r} takes "
                                f"it whole")
            plan.dims[op.output.name] = (None,) * len(op.output.shape)
            continue
        cut: dict[Any, set] = {}  # axis -> labels of the dims it cuts
        for n in op.block.ops:
            if not isinstance(n, InputIter):
                continue
            # (a gathering iterator reads positions: refused before, sample_rows)
            dims = plan.dims.get(op.inputs[n.input], ())
            by = {}  # dim -> the axes that cut it
            for a in range(3):
                if 0 <= n.imap[a] < len(dims):
                    cut.setdefault(a, set()).add(dims[n.imap[a]])
                    by.setdefault(n.imap[a], []).append(a)
            if 0 <= n.fmap < len(dims):
                cut.setdefault("loop", set()).add(dims[n.fmap])
                by.setdefault(n.fmap, []).append("loop")
            for d, lab in enumerate(dims):
                if lab is not None and not by.get(d):
                    refuse({lab}, f"graph kernel #{i} reads a dim of it whole")
                elif lab is not None and len(by[d]) > 1:
                    refuse({lab}, f"graph kernel #{i} cuts a dim of it with {by[d]}")
        axes: dict[Any, str] = {}
        for a, labs in cut.items():
            if len(labs) > 1:
                refuse(labs, f"graph kernel #{i}'s axis {a} cuts dims of several labels")
            elif None not in labs:
                axes[a] = next(iter(labs))
        owners: dict[str, list] = {}
        for a, lab in axes.items():
            owners.setdefault(lab, []).append(a)
        for lab, owned in owners.items():
            if len(owned) > 1:
                refuse({lab}, f"graph kernel #{i} cuts it with {owned}")
            count = op.block.forloop if owned[0] == "loop" else op.block.grid[owned[0]]
            plan.parts.setdefault(lab, []).append(count)
        plan.axes[i] = axes
        outs: dict[int, list] = {k: [None] * len(t.shape) for k, t in enumerate(op.outputs)}
        for n in op.block.ops:
            if isinstance(n, OutputSaver):
                for a in range(3):
                    if a in axes and 0 <= n.omap[a] < len(outs[n.output]):
                        outs[n.output][n.omap[a]] = axes[a]
        for k, t in enumerate(op.outputs):
            plan.dims[t.name] = tuple(outs[k])
    return plan


def _resized(shape: tuple, dims: Dims, factors: dict[str, int]) -> tuple:
    return tuple(d // factors[lab] if lab in factors else d for d, lab in zip(shape, dims))


def _sampled_graph(graph: KernelGraph, plan: _Plan, factors: dict[str, int]) -> KernelGraph:
    """``graph`` with each label's dims ``factors[label]`` times shorter: the grid axis or loop
    that cuts them makes that many times fewer parts (its tiles kept), a pre-defined kernel's
    output re-inferred from its resized operands (:func:`~mirage_py.ugraph.validate.
    kernel_op_shape`: the operator's own shape rule)."""
    from ..ugraph.validate import kernel_op_shape
    tensors = graph.tensors()
    shapes = {t.name: _resized(t.shape, plan.dims[t.name], factors) for t in graph.inputs}
    ops = []
    for i, op in enumerate(graph.ops):
        if isinstance(op, KernelOp):
            args = [replace(tensors[o], shape=shapes[o]) if isinstance(o, str) else o
                    for o in op.operands]
            if op.op == "reshape":  # a view (sample_rows refuses any other): its target too
                target = view_reshape_target(tensors[op.operands[0]].shape, op.output.shape,
                                             args[0].shape)
                op = replace(op, attrs=tuple((k, target if k == "shape" else v)
                                             for k, v in op.attrs))
            out = replace(op.output, shape=tuple(kernel_op_shape(op, args)) if op.operands
                          else op.output.shape)
            shapes[out.name] = out.shape
            ops.append(replace(op, output=out))
            continue
        grid, loop = list(op.block.grid), op.block.forloop
        for a, lab in plan.axes[i].items():
            k = factors.get(lab, 1)
            if a == "loop":
                loop //= k
            else:
                grid[a] //= k
        outs = tuple(replace(t, shape=_resized(t.shape, plan.dims[t.name], factors))
                     for t in op.outputs)
        shapes.update((t.name, t.shape) for t in outs)
        ops.append(replace(op, outputs=outs,
                           block=replace(op.block, grid=tuple(grid), forloop=loop)))
    return KernelGraph(graph.name, tuple(replace(t, shape=shapes[t.name]) for t in graph.inputs),
                       tuple(ops), graph.outputs)


def _same_outputs(program: Program, graph: KernelGraph) -> str:
    """Why ``graph``'s outputs are not ``program``'s shapes ("" where they are)."""
    tensors = graph.tensors()
    for o in program.outputs:
        got = tensors[o.name].shape if o.name in tensors else None
        if got != tuple(o.tensor.shape):
            return f"output {o.name!r}: the sampled graph gives {got}, the program {o.tensor.shape}"
    return ""


def sample_rows(program: Program, graph: KernelGraph, target: Any = "h100") -> Shrink:
    """The sampled pair for ``program`` and its candidate ``graph`` (module doc): a
    :class:`Shrink` whose ``sizes`` map each sampled label to its sampled extent; or why
    not."""
    from ..ugraph.validate import validate
    if program.params or program.symbolic:
        return Shrink(why="a symbolic or padded program")
    # a sample keeps no extent whole: slices, concatenations and reshapes refuse it too
    bad = sorted(set(_positional_program(program, pins=False) +
                     _positional_graph(graph, pins=False)))
    if bad:
        return Shrink(why=f"operators that read positions or extents: {bad}")
    labels = _labels(program)
    inputs = None if labels is None else _input_dims(program, labels, graph, set(_free(labels)))
    if inputs is None:
        return Shrink(why="the graph's inputs are not the program's, or it has no labels")
    plan = _plan(graph, inputs, kernels_whole=False)
    sizes = sample_sizes(program, plan.common_parts(), labels)
    if not sizes:
        return Shrink(why="no parallel label the graph cuts into enough blocks")
    factors = {lab: labels.sizes[lab] // n for lab, n in sizes.items()}
    g = _sampled_graph(graph, plan, factors)
    try:
        validate(g, target)
    except MirageError as e:
        return Shrink(why=f"the sampled graph is not valid: {e}")
    for (e, t), (e2, t2) in zip(_cuts(graph), _cuts(g)):
        if t2 != t:
            return Shrink(why=f"extent {e}: a tile of {t} became {t2} (tiles must be kept)")
    try:
        p = small_program(program, sizes, labels.node_dims)
    except MirageError as e:
        return Shrink(why=f"the sampled program is not valid: {e}")
    why = _same_outputs(p, g)
    if why:
        return Shrink(why=why)
    return Shrink(sizes, p, g)


def sampled_like(program: Program, naive: KernelGraph, sizes: dict[str, int],
                 target: Any = "h100") -> KernelGraph | None:
    """The program's naive lowering (one kernel per operator, the baseline a candidate's errors
    are compared with) at the sampled sizes ``sizes`` (label -> sampled extent, as
    :func:`sample_rows` gives them): the same operators on the sampled rows, each pre-defined
    kernel's output re-inferred from its resized operands; None where it is not valid there."""
    from ..ugraph.validate import validate
    labels = _labels(program)
    inputs = None if labels is None else _input_dims(program, labels, naive, set(sizes))
    if inputs is None:
        return None
    plan = _plan(naive, inputs, kernels_whole=True)
    if set(plan.refused) & set(sizes):
        return None
    try:
        g = _sampled_graph(naive, plan, {lab: labels.sizes[lab] // n for lab, n in sizes.items()})
        validate(g, target)
        p = small_program(program, sizes, labels.node_dims)
    except MirageError:
        return None
    return None if _same_outputs(p, g) else g


def sampled_program(program: Program) -> Program:
    """``program`` at the sizes :func:`sample_sizes` gives one element a block (what a
    numerics check is guessed to read and compute; a candidate's tiles can only keep more);
    ``program`` itself where nothing can be sampled."""
    labels = _labels(program)
    sizes = sample_sizes(program, labels=labels) if labels is not None else {}
    if not sizes:
        return program
    try:
        return small_program(program, sizes, labels.node_dims)
    except MirageError:
        return program


def checked_elements(program: Program) -> int:
    """Input elements a numerics check of ``program`` is guessed to read: those of
    :func:`sampled_program`; 0 for symbolic sizes."""
    if any(not isinstance(d, int) for t in program.inputs for d in t.shape):
        return 0
    return sum(math.prod(t.shape) for t in sampled_program(program).inputs)


__all__ = ["sample_rows", "sampled_like", "sampled_labels", "sample_sizes", "sampled_program",
           "checked_elements",
           "SAMPLE_OUTPUT_ELEMENTS", "SAMPLE_BLOCKS", "SAMPLE_TENSOR_ELEMENTS",
           "SAMPLE_LEAST_OUTPUT_ELEMENTS"]
