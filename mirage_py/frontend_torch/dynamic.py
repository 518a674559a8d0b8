"""Shapes that vary in captured models: one search per region structure, not one per shape.

A captured graph is static (torch.export and make_fx give concrete sizes), so a call at a new
sequence length or batch size captures again -- capture is cheap (under a second for a small
model). What must not happen again is the *search*. Each region program of the new capture is
looked up among the known **shape families** (:func:`family_of`): a symbolic region program
(lax/generalize.py) whose dims, bound to this capture's sizes, give exactly this program; its
:class:`~mirage_py.superopt.family.FamilyProgram` then serves the region -- padded to a bucket,
built by replay the first time a bucket is used, every size verified the first time it runs --
with no search.

A family is made from two captures of one region at two shapes (:func:`superopt_family_of`):
:func:`mirage_py.lax.generalize.generalize` turns the sizes that differ into dims, and one search
at the first sample's sizes answers the family. The second sample is, per ``mp.compile``'s
``dynamic`` (torch.compile's meaning, :class:`Dynamic`):

* ``None`` (AUTO): the captures of the same structure at other shapes met before (kept by
  :func:`samples_for`): the first compile is static; the first shape change searches the family
  once; every later shape searches nothing;
* ``True`` (ALWAYS): a companion capture made at the first compile with the dynamic dims grown
  (:func:`grown_examples`): the first compile searches the family; no call searches again;
* ``False`` (NEVER): no families; one search per shape, as before.

The user's dynamic dims and their ranges come from ``dynamic_shapes`` (torch.export's form:
per argument name, a dict axis -> ``torch.export.Dim`` or ``(lo, hi)``) or
``torch._dynamo.mark_dynamic`` on the example tensors; otherwise every axis of the tensor
arguments is a candidate (:func:`grown_examples` then tries fewer axes where growing all of them
breaks the capture). A call outside a given range captures again statically, and the report says
why (:class:`DimRange`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from ..errors import OptionError


class Dynamic(Enum):
    """``mp.compile``'s ``dynamic`` (module docstring)."""

    AUTO = None
    ALWAYS = True
    NEVER = False

    @classmethod
    def parse(cls, v: Any) -> "Dynamic":
        if isinstance(v, Dynamic):
            return v
        for d in cls:
            if v is d.value:
                return d
        raise OptionError(f"compile: dynamic must be None, True or False, got {v!r}")


class AnswerOrigin(Enum):
    """Where a region's answer came from (the report's words)."""

    SEARCH = "search"
    MEMORY = "memory cache"
    DATABASE = "results database"  # a whole answer another process kept
    FAMILY_SEARCH = "shape-family search"
    FAMILY = "shape family, no search"

    @property
    def searched(self) -> bool:
        """Did this answer cost a search (a static one or a family's)?"""
        return self in (AnswerOrigin.SEARCH, AnswerOrigin.FAMILY_SEARCH)


@dataclass
class Family:
    """A symbolic region program (dims where two captures' sizes differed) and its answer."""

    program: Any  # lax Program with dims
    answer: Any  # FamilyProgram


class FamilyRegion:
    """A region of one capture served by a shape family's answer: the family names its inputs
    and outputs by position (``in0``, ``out0``: lax/generalize.py), the capture by graph nodes;
    calls translate. Reports read the family's answer (kernels, predicted time, verification
    of the representative bucket)."""

    def __init__(self, answer: Any, program: Any):
        self.answer = answer
        self.program = program  # the region's static program at this capture
        self._ins = {t.name: f"in{k}" for k, t in enumerate(program.inputs)}
        self._outs = {f"out{k}": o.name for k, o in enumerate(program.outputs)}

    @property
    def dims(self) -> dict[str, Any]:
        return self.answer.program.dims

    def _positional(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {self._ins[n]: v for n, v in inputs.items()}

    def _named(self, outputs: Mapping[str, Any]) -> dict[str, Any]:
        return {self._outs[k]: v for k, v in outputs.items()}

    def run_numpy(self, inputs: Mapping[str, Any], precision: str = "gpu") -> dict[str, Any]:
        return self._named(self.answer.run_numpy(self._positional(inputs), precision))

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return self._named(self.answer(self._positional(inputs)))

    def __getattr__(self, name: str) -> Any:  # num_kernels, estimated_time_us, verification...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.answer, name)


#: shape families by (the structure with sizes erased, options)
_FAMILIES: dict[tuple, list[Family]] = {}

#: the static region programs met per (erased structure, options), by structural hash, in the
#: order met: the samples a program at another shape is generalised with
_SAMPLES: dict[tuple, dict[str, Any]] = {}


def forget_families() -> None:
    _FAMILIES.clear()
    _SAMPLES.clear()


def family_of(program: Any, key: tuple) -> tuple[Family, dict[str, int]] | None:
    """A known family ``program`` is an instance of, with the sizes of its dims there: those of
    its erased structure first, then the others under the same options (a capture at a size
    of 1 has a structure of its own -- an all-true mask left out, a max over one element
    dropped -- and may still be an instance, :func:`~mirage_py.lax.generalize.instance_sizes`)."""
    from ..lax.generalize import instance_sizes
    rest = [f for k, fams in _FAMILIES.items() if k != key and k[1:] == key[1:] for f in fams]
    for fam in list(_FAMILIES.get(key, ())) + rest:
        sizes = instance_sizes(fam.program, program)
        if sizes is not None:
            return fam, sizes
    return None


def samples_for(key: tuple, program: Any) -> list[Any]:
    """The static programs met before with ``key``, newest first (remembering ``program``)."""
    seen = _SAMPLES.setdefault(key, {})
    h = program.structural_hash()
    others = [s for k, s in reversed(seen.items()) if k != h]
    seen.setdefault(h, program)
    return others


def superopt_family_of(program: Any, samples: list[Any], key: tuple, options: dict[str, Any],
                       budget_s: float | None = None) -> Family | None:
    """The widest family of ``program`` and some of ``samples`` (captures of one region at other
    shapes, tried in order, each kept if the family still generalises), searched once at the
    sizes of the first of them met (the shape compiled for; within ``budget_s`` when given); ``None`` when no sample differs from
    it in sizes only. An answer cut short by Ctrl-C is not kept: KeyboardInterrupt."""
    from ..lax.generalize import generalize, instance_sizes
    from ..superopt import superopt
    chosen, sym = [program], None
    for s in samples:
        wider = generalize(*chosen, s)
        if wider is not None:
            chosen.append(s)
            sym = wider
    if sym is None:
        return None
    sym.name = program.name
    # searched at the first shape met (the one compiled for), else at this call's
    first = next((s for s in _SAMPLES.get(key, {}).values() if any(s is c for c in chosen)),
                 program)
    answer = superopt(sym, representative=instance_sizes(sym, first),
                      **(options if budget_s is None else {**options, "time_budget_s": budget_s}))
    if getattr(answer.answer, "interrupted", False):
        raise KeyboardInterrupt
    fam = Family(sym, answer)
    _FAMILIES.setdefault(key, []).append(fam)
    return fam


# ---- the user's dynamic dims ------------------------------------------------------------------

@dataclass(frozen=True)
class DimRange:
    """A dynamic axis of a user argument, with the sizes it may take."""

    leaf: int  # position among the flattened (args, kwargs) leaves
    axis: int
    name: str
    lo: int = 1
    hi: int = 2**31 - 1

    def holds(self, size: int) -> bool:
        return self.lo <= size <= self.hi


def _range_of(spec: Any, where: str) -> tuple[str | None, int, int]:
    """``(name, lo, hi)`` of one entry of ``dynamic_shapes``: a ``torch.export.Dim``, a
    ``(lo, hi)`` pair, or None / True for any size."""
    if spec is None or spec is True:
        return None, 1, 2**31 - 1
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and \
            all(isinstance(v, int) and not isinstance(v, bool) for v in spec):
        return None, max(1, spec[0]), spec[1]
    lo, hi = getattr(spec, "min", None), getattr(spec, "max", None)
    if lo is None and hi is None and not hasattr(spec, "__name__"):
        raise OptionError(f"compile: dynamic_shapes entry {where} is {spec!r}; give a "
                          "torch.export.Dim, a (lo, hi) pair or None")
    name = getattr(spec, "__name__", None)
    lo = 1 if lo is None else max(1, int(lo))
    hi = 2**31 - 1 if hi is None or hi > 2**31 - 1 else int(hi)
    return name, lo, hi


def dim_ranges(names: list[str], leaves: list[Any], dynamic_shapes: Any) -> list[DimRange]:
    """The dynamic axes the user named: ``dynamic_shapes`` (argument name -> {axis: Dim or
    (lo, hi)}) and ``torch._dynamo.mark_dynamic`` marks on the example tensors."""
    import torch
    out: list[DimRange] = []
    by_name = {n: i for i, n in enumerate(names)}
    if dynamic_shapes is not None:
        if not isinstance(dynamic_shapes, Mapping):
            raise OptionError("compile: dynamic_shapes must be a dict: argument name -> "
                              "{axis: torch.export.Dim or (lo, hi)}")
        for arg, axes in dynamic_shapes.items():
            if arg not in by_name:
                raise OptionError(f"compile: dynamic_shapes names {arg!r}, which is not a tensor "
                                  f"argument (they are: {', '.join(names)})")
            i = by_name[arg]
            rank = leaves[i].dim()
            for ax, spec in dict(axes or {}).items():
                if not isinstance(ax, int) or not -rank <= ax < rank:
                    raise OptionError(f"compile: dynamic_shapes[{arg!r}] axis {ax!r} is not an "
                                      f"axis of its shape {tuple(leaves[i].shape)}")
                nm, lo, hi = _range_of(spec, f"{arg}[{ax}]")
                out.append(DimRange(i, ax % rank, nm or f"{arg}_{ax % rank}", lo, hi))
    for i, t in enumerate(leaves):
        if not isinstance(t, torch.Tensor):
            continue
        ranges = {r.dim: r for r in getattr(t, "_dynamo_dynamic_range", ()) or ()}
        for ax in sorted(getattr(t, "_dynamo_dynamic_indices", ()) or ()):
            if any(r.leaf == i and r.axis == ax for r in out):
                continue
            r = ranges.get(ax)
            lo = 1 if r is None or r.min is None else max(1, int(r.min))
            hi = 2**31 - 1 if r is None or r.max is None else int(r.max)
            out.append(DimRange(i, ax, f"{names[i] if i < len(names) else i}_{ax}", lo, hi))
    return out


def out_of_range(ranges: list[DimRange], leaves: list[Any]) -> str | None:
    """Why a call's sizes are outside the user's ranges (the report's words), or None."""
    for r in ranges:
        t = leaves[r.leaf]
        size = int(t.shape[r.axis])
        if not r.holds(size):
            return f"{r.name} = {size} is outside its range {r.lo} .. {r.hi}"
    return None


def grown_examples(leaves: list[Any], ranges: list[DimRange]) -> list[list[Any]]:
    """Copies of the example leaves with the dynamic axes grown, to capture the graph a second
    time: ``ranges`` when the user named dims, else candidate sets from every axis of every
    tensor argument down to the axes past the first of index (token id) tensors. Axes of one
    size grow together (they are taken to be one dim: a sequence length shared by two inputs);
    groups grow by different amounts (1, 3, 7, ...) so that a size derived from one is not
    mistaken for another. Index tensors are filled with zeros (a valid token id), others with
    zeros too: capture needs shapes, not values."""
    import torch
    tensors = [(i, t) for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
    if ranges:
        candidates = [[(r.leaf, r.axis, r.hi) for r in ranges]]
    else:
        every = [(i, ax, 2**31 - 1) for i, t in tensors for ax in range(t.dim())]
        not_last = [(i, ax, h) for i, ax, h in every
                    if not leaves[i].is_floating_point() or ax < leaves[i].dim() - 1]
        index_seq = [(i, ax, h) for i, ax, h in every
                     if not leaves[i].is_floating_point() and ax > 0]
        candidates = [c for c in (every, not_last, index_seq) if c]
    out = []
    for axes in candidates:
        grow: dict[int, int] = {}
        for i, ax, _ in axes:
            size = int(leaves[i].shape[ax])
            grow.setdefault(size, 2 ** (len(grow) + 1) - 1)
        new = list(leaves)
        ok = True
        for i, t in tensors:
            shape = list(t.shape)
            for j, ax, hi in axes:
                if j == i:
                    shape[ax] = int(t.shape[ax]) + grow[int(t.shape[ax])]
                    ok = ok and shape[ax] <= hi
            if shape != list(t.shape):
                new[i] = torch.zeros(shape, dtype=t.dtype, device=t.device)
        if ok:
            out.append(new)
    return out


__all__ = ["Dynamic", "AnswerOrigin", "Family", "FamilyRegion", "family_of", "samples_for",
           "superopt_family_of", "forget_families", "DimRange", "dim_ranges", "out_of_range",
           "grown_examples"]
