"""Numerics checks on sampled rows: fewer blocks along the dims every output element is computed
apart (issue #29).

The numerics check (numerics.py) runs a candidate in GPU precision against the float64
reference. At model size its cost is the size of its inputs -- drawing them, rounding them,
converting them, watching every intermediate for non-finite values (an 8B layer's gate and up
projections: 117 M input elements, 5-10 s) -- while what decides its verdict is how each output
element is computed, which is the same for every block along a dim no operator reduces.
:func:`sample_rows` makes, for a program ``P`` and a candidate ``G``, a pair ``(P', G')`` that
computes a sample of ``G``'s output rows exactly as ``G`` computes them, or says why not
(a :class:`~mirage_py.verifier.shrink.Shrink` with ``why``):

* a *sampled label* is a parallel dim label of ``P`` (generator/labels.py: a dim of an output)
  that no operator reduces, and every other label of its extent ``E`` is one too (the gate's
  and the up projection's columns): the dims of extent ``E`` in ``P`` are all such labels, so
  resizing the extent resizes only dims no operator reduces;
* ``P'`` is ``P`` with extent ``E`` made ``E' = E / k`` (``shrink.small_program``); ``G'`` is
  ``G`` with every grid axis or loop that cuts a dim of extent ``E`` making ``k`` times fewer
  parts, every tile kept (``shrink.small_graph``): each remaining block runs the very code a
  block of ``G`` runs on the same tile shapes, with the same loop lengths over every other dim;
  a pre-defined kernel whole over ``E`` is refused (its arithmetic may depend on the extent);
* ``k`` is the largest divisor of every cut's part count that leaves at least
  :data:`SAMPLE_BLOCKS` blocks along the label and :data:`SAMPLE_OUTPUT_ELEMENTS` output
  elements in all.

Why the verdict on ``(P', G')`` is the verdict on the sampled rows of ``(P, G)`` (docs/verifier.md,
"Numerics checks on sampled rows"): operators that read positions or extents (masks, slices,
concatenations, reshapes, gathers, ``rms_norm``) are refused as in shrink.py, so no block's
arithmetic depends on which block it is, and a tile that divides its extent leaves no partial
tail block (a padded program's tails are masks: refused, checked at full size). The label is
never reduced, so no output element of one block depends on another block's inputs: ``G'`` on
the sampled inputs computes, bit for bit, what ``G`` computes for those rows. The check's inputs
are i.i.d. draws along the label, so the sampled rows' errors are drawn from the same
distribution as every row's: the norm-wise error of the sample estimates the full one (a ratio
of sums over at least :data:`SAMPLE_OUTPUT_ELEMENTS` output elements), and a failure that
happens on a fixed fraction of rows shows in the sample too. Outlier features (the probe of
"massive activations") sit on inputs' last dims: where that dim is the sampled label they are
drawn among the sampled rows, so the rows that hold them are always checked. What the sample
cannot see is a failure confined to fewer rows than one in ``E' / E`` at random positions; the
full-size check, itself one random draw, has the same blind spot at one in ``E``.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import MirageError
from ..lax.program import Program
from ..ugraph.graph import KernelGraph
from .shrink import Shrink, _cuts, _positional_graph, _positional_program, small_graph, \
    small_program

#: a sample keeps at least this many output elements in all (the norm-wise error is a ratio of
#: sums over them) ...
SAMPLE_OUTPUT_ELEMENTS = 1024
#: ... and at least this many blocks along each sampled label (the first block of a label and
#: others are all checked; every block runs the same code)
SAMPLE_BLOCKS = 8


def _output_elements(program: Program, sizes: dict[int, int]) -> int:
    return sum(math.prod(sizes.get(d, d) for d in o.tensor.shape) for o in program.outputs)


def sampled_labels(program: Program) -> dict[str, int]:
    """The labels a numerics check may sample (module doc), by label: their extent. Empty for a
    symbolic or padded program, or one with operators that read positions or extents."""
    from ..generator.labels import infer_labels
    if program.params or program.symbolic or _positional_program(program, pins=False):
        return {}
    try:
        labels = infer_labels(program)
    except MirageError:
        return {}
    extents: dict[int, set[str | None]] = {}
    for t in program.nodes():
        for e, lab in zip(t.shape, labels.node_dims.get(t.digest, ())):
            extents.setdefault(e, set()).add(lab)
    free = labels.parallel - labels.reduced_any
    return {lab: labels.sizes[lab] for lab in free
            if extents.get(labels.sizes[lab], {None}) <= free}


def sample_extents(program: Program, parts: dict[int, int] | None = None) -> dict[int, int]:
    """Extent -> sampled extent for every label :func:`sampled_labels` allows, the longest
    first: ``E / k`` with ``k`` the largest divisor of ``parts[E]`` (the part counts of every
    cut of ``E`` have it in common; ``E`` itself when not given: one element a block) that
    keeps :data:`SAMPLE_BLOCKS` blocks of the coarsest cut and :data:`SAMPLE_OUTPUT_ELEMENTS`
    output elements."""
    sizes: dict[int, int] = {}
    for e in sorted(set(sampled_labels(program).values()), reverse=True):
        g = e if parts is None else parts.get(e, 0)
        if g <= 1:
            continue
        for k in sorted((k for k in range(2, g + 1) if g % k == 0), reverse=True):
            if g // k < SAMPLE_BLOCKS:
                continue
            trial = {**sizes, e: e // k}
            if _output_elements(program, trial) >= SAMPLE_OUTPUT_ELEMENTS:
                sizes = trial
                break
    return sizes


def _common_parts(graph: KernelGraph) -> dict[int, int]:
    """Per extent the graph cuts: the largest count that divides every cut's part count (1
    where a block or a pre-defined kernel takes the dim whole: such a label is not sampled)."""
    out: dict[int, int] = {}
    for e, t in _cuts(graph):  # a pre-defined kernel's whole dims: one part, gcd 1
        out[e] = math.gcd(out.get(e, 0), e // t if t and e % t == 0 else 0)
    return out


def sample_rows(program: Program, graph: KernelGraph, target: Any = "h100") -> Shrink:
    """The sampled pair for ``program`` and its candidate ``graph`` (module doc): a
    :class:`Shrink` whose ``sizes`` map each sampled extent to its sample; or why not."""
    from ..ugraph.validate import validate
    if program.params or program.symbolic:
        return Shrink(why="a symbolic or padded program")
    # a sample keeps no extent whole: slices, concatenations and reshapes refuse it too
    bad = sorted(set(_positional_program(program, pins=False) +
                     _positional_graph(graph, pins=False)))
    if bad:
        return Shrink(why=f"operators that read positions or extents: {bad}")
    sizes = sample_extents(program, _common_parts(graph))
    if not sizes:
        return Shrink(why="no parallel label the graph cuts into enough blocks")
    g = small_graph(graph, sizes, least=1)
    try:
        validate(g, target)
    except MirageError as e:
        return Shrink(why=f"the sampled graph is not valid: {e}")
    for (e, t), (e2, t2) in zip(_cuts(graph), _cuts(g)):
        if e2 != sizes.get(e, e) or t2 != t:
            return Shrink(why=f"extent {e}: a tile of {t} became {t2} (tiles must be kept)")
    try:
        p = small_program(program, sizes)
    except MirageError as e:
        return Shrink(why=f"the sampled program is not valid: {e}")
    return Shrink(sizes, p, g)


def sampled_like(naive: KernelGraph, sizes: dict[int, int], target: Any = "h100"
                 ) -> KernelGraph | None:
    """The program's naive lowering (one kernel per operator, the baseline a candidate's errors
    are compared with) at the sampled extents ``sizes``: the same operators on the sampled
    rows; None where it is not valid there."""
    from ..ugraph.validate import validate
    g = small_graph(naive, sizes, least=1)
    try:
        validate(g, target)
    except MirageError:
        return None
    return g


def checked_elements(program: Program) -> int:
    """Input elements a numerics check of ``program`` is guessed to read: at the extents
    :func:`sample_extents` gives one element a block (a candidate's tiles can only keep more);
    0 for symbolic sizes."""
    if any(not isinstance(d, int) for t in program.inputs for d in t.shape):
        return 0
    sizes = sample_extents(program)
    return sum(math.prod(sizes.get(d, d) for d in t.shape) for t in program.inputs)


__all__ = ["sample_rows", "sampled_like", "sampled_labels", "sample_extents", "checked_elements",
           "SAMPLE_OUTPUT_ELEMENTS", "SAMPLE_BLOCKS"]
