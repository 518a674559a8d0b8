"""The shape family two static programs belong to, inferred from the two (anti-unification).

A captured PyTorch graph is static: every size is an int. Captured at two shapes -- the first
call and a call at a new sequence length, or an example and a copy of it with the dynamic dims
grown -- the same model gives two programs that differ only in some ints. :func:`generalize`
finds the symbolic program both are instances of:

* an input axis whose size differs between the two becomes a :class:`~.shapes.Dim`; axes whose
  sizes differ in the same way (16 -> 17 in both) are taken to be one dim (the keys' and the
  queries' sequence length);
* every other int that differs -- in a node's shape or an operator's attributes (a reshape's
  target, a mask's diagonal offset) -- must be ``c + k * d`` for exactly one dim ``d`` with an
  integer ``k`` (a shape entry must be a dim itself); anything else (a product ``B * S``, a
  float that changed, a different operator) means the two are not one family, and the answer is
  ``None``;
* the candidate is rebuilt from JSON (every operator re-checks its shapes with the symbols) and
  accepted only if binding its dims to each sample's sizes gives back exactly that sample
  (:meth:`~.program.Program.at`, compared by structural hash).

:func:`instance_sizes` is the converse test for a third program: the binding of the family's
dims under which the family *is* that program, or ``None``. Both are exact: nothing is assumed
about sizes that were not seen, beyond what the family's own operators (and the verifier's
shape-family argument, docs/verifier.md) guarantee.
"""

from __future__ import annotations

import numbers
import re
from typing import Any, Mapping

from ..errors import MirageError
from .program import Program
from .shapes import Affine, Dim, json_size

_NODE_KEYS = ("op", "inputs", "dtype")


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


class _Unifier:
    """Walks the samples' JSON side by side, naming dims for differing input sizes and
    expressing every other differing int in terms of them."""

    def __init__(self, ranges: Mapping[str, tuple[int, int]] | None):
        self.ranges = dict(ranges or {})
        self.dims: dict[tuple[int, ...], Dim] = {}  # the sizes across the samples -> dim

    def input_dim(self, where: str, xs: tuple[int, ...]) -> Dim:
        d = self.dims.get(xs)
        if d is None:
            name = re.sub(r"\W", "_", where)
            if not name.isidentifier():
                name = "d_" + name
            taken = {e.name for e in self.dims.values()}
            base, i = name, 1
            while name in taken:
                i += 1
                name = f"{base}_{i}"
            lo, hi = self.ranges.get(name, (1, 2**31 - 1))
            d = self.dims[xs] = Dim(name, lo, hi)
        return d

    def size(self, vs: tuple[int, ...], shape_entry: bool) -> Any:
        """The symbolic form of an int that is ``vs[i]`` in sample ``i``."""
        if len(set(vs)) == 1:
            return vs[0]
        d = self.dims.get(vs)
        if d is not None:
            return d
        if shape_entry:
            raise _Mismatch(f"a size {vs} that is no input's dim")
        fits = [f for xs, d in self.dims.items() if (f := _affine_fit(d, xs, vs)) is not None]
        if len(fits) != 1:
            raise _Mismatch(f"an int {vs} that is " +
                            ("no affine function of one dim" if not fits else
                             f"ambiguous ({', '.join(map(repr, fits))})"))
        return fits[0]

    def value(self, vals: list[Any], shape_entry: bool = False) -> Any:
        """The samples' JSON values as one value with dims where they differ."""
        a = vals[0]
        if all(_is_int(v) for v in vals):
            return json_size(self.size(tuple(int(v) for v in vals), shape_entry))
        if all(isinstance(v, list) and len(v) == len(a) for v in vals):
            return [self.value(list(xs), shape_entry) for xs in zip(*vals)]
        if all(isinstance(v, dict) and v.keys() == a.keys() for v in vals):
            if "f" in a or "dim" in a or "affine" in a:  # floats and sizes compare whole
                if any(v != a for v in vals):
                    raise _Mismatch(f"{vals}")
                return a
            return {k: self.value([v[k] for v in vals]) for k in a}
        if any(v != a or type(v) is not type(a) for v in vals):
            raise _Mismatch(f"{vals!r}")
        return a


def _affine_fit(d: Dim, xs: tuple[int, ...], vs: tuple[int, ...]) -> Affine | None:
    """``c + k * d`` (integer ``k`` != 0) taking the values ``vs`` where ``d`` is ``xs``."""
    i = next(j for j in range(1, len(xs)) if xs[j] != xs[0])
    k, rem = divmod(vs[i] - vs[0], xs[i] - xs[0])
    c = vs[0] - k * xs[0]
    if rem or not k or any(c + k * x != v for x, v in zip(xs, vs)):
        return None
    return Affine(c, ((d.name, k),))


class _Mismatch(Exception):
    pass


def generalize(*samples: Program, ranges: Mapping[str, tuple[int, int]] | None = None
               ) -> Program | None:
    """The symbolic program of which every sample is an instance (module docstring), or
    ``None`` when they differ in more than sizes. Dims are named after the input axis where they
    first appear (``x_1``: axis 1 of input ``x``); ``ranges`` may give a dim's ``(lo, hi)`` by
    that name (default ``1 .. 2**31 - 1``)."""
    if len(samples) < 2 or any(s.dims for s in samples):
        return None  # a family is generalised from two static samples or more
    names = [t.name for t in samples[0].inputs]
    docs = [_positional_json(s) for s in samples]
    first = docs[0]
    if any(len(d["nodes"]) != len(first["nodes"]) or d["outputs"] != first["outputs"]
           for d in docs):
        return None
    u = _Unifier(ranges)
    try:
        for nodes in zip(*(d["nodes"] for d in docs)):  # inputs come first: they name the dims
            n0 = nodes[0]
            if n0["op"] != "input":
                break
            if any(n["op"] != "input" or n["attrs"] != n0["attrs"] or
                   len(n["shape"]) != len(n0["shape"]) for n in nodes):
                return None
            for ax, xs in enumerate(zip(*(n["shape"] for n in nodes))):
                if len(set(xs)) > 1:
                    u.input_dim(f"{names[int(n0['id'])]}_{ax}", tuple(xs))
        if not u.dims:
            return None  # the same sizes: nothing to generalise
        out = []
        for nodes in zip(*(d["nodes"] for d in docs)):
            n0 = nodes[0]
            if any(n[k] != n0[k] for n in nodes for k in _NODE_KEYS) or \
                    any(len(n["shape"]) != len(n0["shape"]) for n in nodes):
                return None
            out.append({**n0, "attrs": u.value([n["attrs"] for n in nodes]),
                        "shape": u.value([n["shape"] for n in nodes], shape_entry=True)})
    except _Mismatch:
        return None
    try:
        fam = Program.from_json({**first, "name": samples[0].name, "nodes": out})
    except MirageError:
        return None
    if any(instance_sizes(fam, s) is None for s in samples):
        return None
    return fam


def instance_sizes(family: Program, program: Program) -> dict[str, int] | None:
    """The sizes of ``family``'s dims that make it exactly ``program`` (the same operators on
    the same inputs and outputs, matched by position), or ``None`` when no binding in the dims'
    ranges does."""
    sizes: dict[str, int] = {}
    fin, pin = family.inputs, program.inputs
    if len(fin) != len(pin) or len(family.outputs) != len(program.outputs):
        return None
    for t, got in zip(fin, pin):
        if len(got.shape) != len(t.shape) or got.dtype != t.dtype:
            return None
        for d, n in zip(t.shape, got.shape):
            if isinstance(d, Dim):
                if sizes.setdefault(d.name, n) != n or not d.lo <= n <= d.hi:
                    return None
            elif d != n:
                return None
    try:
        inst = family.at(sizes)
        same = _positional_json(inst) == _positional_json(program) or \
            _positional_json(_without_masks(inst)) == _positional_json(_without_masks(program))
    except MirageError:
        return None
    return sizes if same else None


def _keeps_all(mask: Any) -> bool:
    """Does this static position mask keep every position (a causal mask of one query row at
    the last key: what a length of 1 gives)?"""
    from .ops import mask_values
    rows, cols = mask.shape[-2:]
    if not all(_is_int(d) for d in mask.shape) or rows * cols > 1 << 20:
        return False
    attrs = mask.attr_dict
    return bool(mask_values(tuple(mask.shape), offset=attrs.get("offset", 0),
                            window=attrs.get("window", 0), valid=attrs.get("valid")).all())


def _without_masks(program: Program) -> Program:
    """``program`` with ``where(mask, a, b)`` read as ``a`` where the mask keeps every position
    and ``a`` has the result's shape: the same values (PyTorch leaves out a mask that a size
    makes all-true: no causal mask at a length of 1)."""
    from .tensor import Tensor, apply
    new: dict[str, Tensor] = {}
    out = Program(program.name)
    for t in program.nodes():
        if t.op == "input":
            new[t.digest] = out.input(t.name, t.shape, t.dtype)
        elif t.op in ("const", "mask"):
            new[t.digest] = t
        elif t.op == "where" and t.inputs[1].shape == t.shape and _keeps_all(t.inputs[0]):
            new[t.digest] = new[t.inputs[1].digest]
        else:
            new[t.digest] = apply(t.op, [new[i.digest] for i in t.inputs], dict(t.attrs),
                                  exact=False)
    for n, t in program.output_tensors.items():
        out.output(new[t.digest], n)
    return out


def _positional_json(program: Program) -> dict[str, Any]:
    """``program``'s JSON with its inputs and outputs named by position (``in0``, ``out0``):
    two captures of one region name them after graph nodes, whose numbering may differ."""
    doc = program.to_json()
    k = 0
    for n in doc["nodes"]:
        if n["op"] == "input":
            n["attrs"] = {**n["attrs"], "name": f"in{k}"}
            k += 1
    doc["outputs"] = [{**o, "name": f"out{i}"} for i, o in enumerate(doc["outputs"])]
    doc["name"] = ""
    return doc


def erased_key(program: Program) -> str:
    """What two programs of one family share whatever their sizes: operators, edges, dtypes,
    ranks, attribute names, the number of inputs and outputs (a dictionary key for finding a
    family; names of inputs and outputs are positions)."""
    doc = program.to_json()
    parts = [(n["op"], tuple(n["inputs"]), n["dtype"], len(n["shape"]),
              tuple(sorted(n["attrs"]))) for n in doc["nodes"]]
    return repr((parts, [o["node"] for o in doc["outputs"]]))


__all__ = ["generalize", "instance_sizes", "erased_key"]
