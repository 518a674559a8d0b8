"""Shape families: one static program that computes a symbolic program at every size up to a
bucket's.

A symbolic program (lax/shapes.py) is searched, verified and compiled as *padded* programs, one
per bucket of sizes: every symbolic dim ``S`` is padded to the bucket's size ``P`` (a power of
two by default), inputs are zero-filled past ``S``, and the valid size ``S`` -- known only when
the program runs -- appears in masks alone (``Program.params``). Everything downstream (the
search, the verifier, the cost model, code generation) sees an ordinary static program whose
masks name ``S``; the padded program's outputs, cut back to the valid sizes, are the symbolic
program's at ``S``.

What keeps the padding out of the valid results: elementwise operators never mix positions, so
padded positions only matter where a reduction or a contraction runs along a padded dim. There
the padded elements must contribute the reduction's identity:

* a sum, or a matmul contracting the dim, is left alone when an operand is known to be zero
  there -- a zero-filled input, or anything computed from one by operators that keep zeros
  (products, ``f(0) = 0`` functions such as silu, gelu, relu, tanh, squares; reductions along
  other dims; reshapes and transposes) -- and otherwise its operand becomes ``where(valid, x,
  0)``;
* a max (min) always gets ``where(valid, x, lowest)`` (highest): a zero may exceed every valid
  value;
* every mask of the program also hides padded rows and columns (its ``valid`` attribute).

``valid`` is a mask (``lax.valid_mask``) -- known data, computed from indices -- so the verifier
checks padded programs exactly, per binding of the valid sizes, and a fused kernel computes it
on the fly. A reduction along a symbolic dim that is not one of its operand's last two cannot be
masked that way and raises a ShapeError (as does the mean over a symbolic dim: its count is not a
constant).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from ..errors import ShapeError
from . import ops as _ops
from .program import Program
from .shapes import Affine, Dim, resolve
from .tensor import Tensor, _fmt, apply, const, mask_from_attrs, valid_mask, where

# f(0) = 0: a zero-filled position stays zero through these
_ZERO_KEEPING = {"neg", "square", "sqrt", "silu", "gelu", "relu", "tanh", "abs", "mish",
                 "leaky_relu", "cast", "reshape", "transpose"}
# the lowest / highest finite value a dtype stores: the identity of a max / min over padding
_EXTREME = {"float16": 65504.0, "bfloat16": 3.0e38, "float32": 3.0e38}


def buckets(d: Dim, sizes: Any = None) -> tuple[int, ...]:
    """The bucket sizes of dim ``d``: ``sizes`` if given (sorted, within the range, the last
    covering ``d.hi``), else the powers of two from the first that holds ``d.lo`` up to the
    first that holds ``d.hi``."""
    if sizes is not None:
        out = tuple(sorted({int(s) for s in sizes}))
        if not out or out[0] < 1 or out[-1] < d.hi:
            raise ShapeError(f"buckets of dim {d.name}: {list(out)} must be positive sizes, the "
                             f"largest at least {d.hi}")
        return out
    lo = 1 << max(0, math.ceil(math.log2(d.lo)))
    hi = 1 << max(0, math.ceil(math.log2(d.hi)))
    out, p = [], lo
    while p <= hi:
        out.append(p)
        p *= 2
    return tuple(out)


def bucket_of(size: int, bucket_sizes: tuple[int, ...], name: str = "") -> int:
    """The smallest bucket that holds ``size``."""
    for b in bucket_sizes:
        if b >= size:
            return b
    raise ShapeError(f"size {size} of dim {name} is beyond its largest bucket {bucket_sizes[-1]}")


def _zeros(x: Tensor, info: dict) -> tuple[bool, ...]:
    return info.get(x.digest, (False,) * x.ndim)


def _aligned(ts: list[Tensor], nd: int, info: dict) -> list[tuple[bool | None, ...]]:
    """Each operand's zero flags aligned right to ``nd`` axes (None: the operand broadcasts
    there, so its value along padding is not zero)."""
    out = []
    for t in ts:
        z = _zeros(t, info)
        out.append((None,) * (nd - len(z)) + tuple(
            None if t.shape[i] == 1 else z[i] for i in range(len(z))))
    return out


def _zero_flags(t: Tensor, info: dict) -> tuple[bool, ...]:
    """Which axes of the (padded) node ``t`` are known zero at padded positions."""
    op, nd = t.op, t.ndim
    if op in ("const", "mask"):
        return (False,) * nd
    if op in _ZERO_KEEPING or (op == "pow" and float(t.attr("exponent")) > 0) or \
            (op == "clamp" and (t.attr("lo") is None or t.attr("lo") <= 0) and
             (t.attr("hi") is None or t.attr("hi") >= 0)):
        x = t.inputs[0]
        if op == "transpose":
            return tuple(_zeros(x, info)[p] for p in t.attr("perm"))
        if op == "reshape":
            return (False,) * nd  # which axes carry a dim is re-derived by the caller
        return _zeros(x, info)
    if op in ("mul", "div", "add", "sub", "maximum", "minimum"):
        a, b = _aligned(list(t.inputs), nd, info)
        if op == "mul":
            return tuple(bool(x) or bool(y) for x, y in zip(a, b))
        if op == "div":  # 0 / y is 0 unless y is zero there too
            return tuple(bool(x) and not y for x, y in zip(a, b))
        return tuple(bool(x) and bool(y) for x, y in zip(a, b))
    if op in ("sum", "max", "min"):
        z = _zeros(t.inputs[0], info)
        axes = set(t.attr("axes"))
        if t.attr("keepdims"):
            return tuple(False if i in axes else z[i] for i in range(len(z)))
        return tuple(z[i] for i in range(len(z)) if i not in axes)
    if op == "matmul":
        za, zb = _zeros(t.inputs[0], info), _zeros(t.inputs[1], info)
        batch = tuple(bool(x) or bool(y) for x, y in zip(
            ((None,) * (nd - len(za)) + za)[:nd - 2], ((None,) * (nd - len(zb)) + zb)[:nd - 2]))
        return batch + (za[-2], zb[-1])
    return (False,) * nd


class _Padder:
    """Builds the padded program node by node (module doc)."""

    def __init__(self, program: Program, padded: Mapping[str, int]):
        self.program = program
        self.padded = dict(padded)
        self.dims = program.dims
        missing = sorted(set(self.dims) - set(self.padded))
        if missing:
            raise ShapeError(f"padded: no bucket size for dim(s) {', '.join(missing)} of "
                             f"program {program.name!r}")
        for n, d in self.dims.items():
            if self.padded[n] < d.lo:
                raise ShapeError(f"padded: bucket size {self.padded[n]} of dim {n} is below its "
                                 f"range {d.lo} .. {d.hi}")
        self.new: dict[str, Tensor] = {}
        self.zero: dict[str, tuple[bool, ...]] = {}  # padded node digest -> zero flags
        self.symdims: dict[str, tuple] = {}  # padded node digest -> the original dims

    def size(self, d: Any) -> int:
        return self.padded[d.name] if isinstance(d, Dim) else int(d)

    def valid(self, t: Tensor, rows_axis: int, cols_axis: int) -> Tensor:
        """The valid mask over axes ``rows_axis``, ``cols_axis`` of the padded node ``t``."""
        dims = self.symdims[t.digest]
        rv, cv = dims[rows_axis], dims[cols_axis]
        return valid_mask(t.shape[rows_axis], t.shape[cols_axis],
                          rv if isinstance(rv, Dim) else t.shape[rows_axis],
                          cv if isinstance(cv, Dim) else t.shape[cols_axis])

    def masked(self, t: Tensor, axes: set[int], fill: float, why: str) -> Tensor:
        """``where(valid, t, fill)`` hiding the padding along ``axes`` (of the last two)."""
        nd = t.ndim
        if any(a < nd - 2 for a in axes):
            raise ShapeError(f"padded: {why} runs along a symbolic dim at axis "
                             f"{min(axes)} of {_fmt(self.symdims[t.digest])}, not one of its "
                             "last two; a mask cannot hide that padding")
        if nd < 2:
            raise ShapeError(f"padded: {why} of a 1-D value along a symbolic dim "
                             f"{_fmt(self.symdims[t.digest])} cannot be masked")
        out = where(self.valid(t, nd - 2, nd - 1), t, fill)
        self._note(out, self.symdims[t.digest], tuple(
            True if fill == 0.0 and i in axes else z
            for i, z in enumerate(self.zero.get(t.digest, (False,) * nd))))
        return out

    def _note(self, t: Tensor, dims: tuple, zero: tuple[bool, ...]) -> None:
        self.symdims[t.digest] = dims
        self.zero[t.digest] = zero

    def node(self, t: Tensor) -> Tensor:
        if t.op == "const":
            self._note(t, (), ())
            return t
        if t.op == "mask":
            attrs = t.attr_dict
            rows, cols = t.shape
            new = mask_from_attrs((self.size(rows), self.size(cols)), {
                **attrs, "valid": (rows, cols) if attrs.get("valid") is None else attrs["valid"]})
            self._note(new, t.shape, (False, False))
            return new
        args = [self.new[i.digest] for i in t.inputs]
        if t.op in ("sum", "max", "min"):
            args[0] = self._reduction(t, args[0])
        elif t.op == "matmul":
            args[0] = self._contraction(t, args[0], args[1])
        attrs = {k: (tuple(self.size(d) for d in v) if k == "shape" else v)
                 for k, v in t.attrs}
        new = apply(t.op, args, attrs, exact=False)  # a bucket of size 1 drops no-ops
        if new.op != t.op:  # what the operand was, seen through the no-op
            self._note(new, t.shape, self.zero.get(new.digest, (False,) * new.ndim)
                       if new.ndim == t.ndim else (False,) * new.ndim)
            return new
        self._note(new, t.shape, self._zeros_of(t, new))
        return new

    def _zeros_of(self, t: Tensor, new: Tensor) -> tuple[bool, ...]:
        if t.op == "reshape":  # a symbolic dim reappears whole: it keeps its flag
            src = t.inputs[0]
            z = self.zero[self.new[src.digest].digest]
            by_dim = {d: z[i] for i, d in enumerate(src.shape) if isinstance(d, Dim)}
            return tuple(by_dim.get(d, False) if isinstance(d, Dim) else False for d in t.shape)
        return _zero_flags(new, self.zero)

    def _reduction(self, t: Tensor, x: Tensor) -> Tensor:
        src = t.inputs[0]
        axes = {a for a in t.attr("axes") if isinstance(src.shape[a], Dim)}
        if not axes:
            return x
        if t.op == "sum" and all(self.zero[x.digest][a] for a in axes):
            return x
        fill = 0.0 if t.op == "sum" else _EXTREME[x.dtype] * (-1 if t.op == "max" else 1)
        return self.masked(x, axes, fill, f"{t.op} over {_fmt(src.shape)}")

    def _contraction(self, t: Tensor, a: Tensor, b: Tensor) -> Tensor:
        k = t.inputs[0].shape[-1]
        if not isinstance(k, Dim) or self.zero[a.digest][-1] or self.zero[b.digest][-2]:
            return a
        return self.masked(a, {a.ndim - 1}, 0.0,
                           f"matmul contracting {k} of {_fmt(t.inputs[0].shape)}")

    def run(self) -> Program:
        out = Program(self.program.name)
        for t in self.program.nodes():
            if t.op == "input":  # zero-filled past the valid sizes when it runs
                new = out.input(t.name, tuple(self.size(d) for d in t.shape), t.dtype)
                self._note(new, t.shape, tuple(isinstance(d, Dim) for d in t.shape))
            else:
                new = self.node(t)
            self.new[t.digest] = new
        for n, t in self.program.output_tensors.items():
            out.output(self.new[t.digest], n)
        return out


def padded(program: Program, padded_sizes: Mapping[str, int]) -> Program:
    """``program`` (symbolic) at the bucket ``padded_sizes`` (dim name -> padded size): a static
    program whose masks name the valid sizes (its ``params``); see the module docstring. Its
    outputs, cut back to the valid sizes, equal ``program``'s for every binding up to the
    bucket."""
    if not program.symbolic:
        return program
    return _Padder(program, padded_sizes).run()


def pad_inputs(program: Program, inputs: Mapping[str, Any],
               padded_sizes: Mapping[str, int], xp: Any = np) -> dict[str, Any]:
    """``inputs`` of the symbolic ``program`` zero-filled to the bucket's sizes (arrays of the
    array module ``xp``: NumPy, or CuPy for device arrays)."""
    out = {}
    for t in program.inputs:
        a = inputs[t.name] if xp is not np else np.asarray(inputs[t.name])
        target = tuple(padded_sizes[d.name] if isinstance(d, Dim) else d for d in t.shape)
        if tuple(a.shape) == target:
            out[t.name] = a
            continue
        z = xp.zeros(target, dtype=a.dtype)
        z[tuple(slice(0, n) for n in a.shape)] = a
        out[t.name] = z
    return out


def cut_outputs(program: Program, outputs: Mapping[str, Any],
                sizes: Mapping[str, int]) -> dict[str, Any]:
    """The padded program's ``outputs`` cut back to the valid ``sizes``."""
    out = {}
    for name, t in program.output_tensors.items():
        a = outputs[name]
        out[name] = a[tuple(slice(0, resolve(d, sizes)) for d in t.shape)]
    return out


__all__ = ["buckets", "bucket_of", "padded", "pad_inputs", "cut_outputs"]
