"""Arithmetic backends: what a value is and how operators combine values.

The program reference (:meth:`Program.evaluate`) and the μGraph interpreter
(:func:`mirage_py.ugraph.interp.run`) walk their graphs and leave every piece of arithmetic to a
small *backend* object, so the same walk runs in floating point, in a finite field (the verifier's
:class:`~mirage_py.verifier.field.FieldBackend`) or on degree bounds
(:class:`~mirage_py.verifier.degree.DegreeBackend`). A backend answers:

=================================  ===========================================================
``input(array, dtype)``            a graph input, stored as a device tensor of ``dtype``
``store(x, dtype)``                round a value to what a device tensor of ``dtype`` holds
``tile(x)``                        round a block intermediate to the tile precision
``mma_operand(x, math)``           a matmul operand as the tensor cores take it (lax/precision)
``scalar(v)``                      a Python float constant
``data(array)``                    known data given exactly (the 0/1 values of a mask)
``index(array)``                   an index tensor's integers (token ids): known data that
                                   ``take`` gathers rows with (``input`` of an int32 / int64
                                   tensor lands here)
``take(table, ids)``               rows of ``table`` picked by the integers ``ids`` (range-checked)
``compute(op, args, attrs)``       any operator of the table (:mod:`mirage_py.lax.ops`) by name
``elementwise(op, args, attrs)``   an elementwise operator by name (attributes: a clamp's bounds,
                                   a pow's exponent, ...)
``matmul(a, b)``                   NumPy ``matmul`` semantics (batch dims broadcast)
``sum(x, axes, keepdims)``         sum over ``axes``
``reduce(op, x, axes, keepdims)``  any reduction of the table (sum, max, min)
``accumulate(acc, v, kind)``       for-loop accumulator step (``acc`` is None on the first one;
                                   ``kind`` "sum", "max" or "min")
``layout(x, fn)``                  apply a pure data-movement NumPy function (reshape, slice,
                                   transpose, broadcast) to a value
``combine(fn, xs)``                the same for a function of several values (stack, concat)
``rms_norm(x, eps)``               the pre-defined rms_norm kernel (``x / sqrt(mean(x^2) + eps)``)
``annotate(where)``                which operator is computed next (for diagnostics)
=================================  ===========================================================

Values need ``shape`` and ``ndim``; data movement is expressed as functions of NumPy arrays so a
backend whose value holds several arrays (the field's value mod p and mod q) applies them to each.
:class:`NumpyBackend` is the float behaviour: ``"float64"`` (exact meaning) and ``"gpu"`` (device
storage dtypes, float32 intermediates).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from . import ops as _ops
from .precision import MatmulMath


class Backend:
    """Base class: generic dispatch and the decompositions shared by every backend."""

    name = "abstract"
    where: str = ""

    # -- values ---------------------------------------------------------------------------------
    def input(self, value: Any, dtype: str) -> Any:
        raise NotImplementedError

    def index(self, value: Any) -> Any:
        """An index tensor's values: the integers themselves (known data in every backend)."""
        a = np.asarray(value)
        if a.dtype.kind not in "iu":
            from ..errors import DTypeError  # noqa: PLC0415
            raise DTypeError(f"{self.where or 'index input'}: an index tensor "
                             f"{tuple(a.shape)} must hold integers, got {a.dtype}")
        return a.astype(np.int64, copy=False)

    def store(self, x: Any, dtype: str) -> Any:
        return x

    def tile(self, x: Any) -> Any:
        return x

    def mma_operand(self, x: Any, math: MatmulMath) -> Any:
        """A matmul operand as the tensor cores take it (``math``): rounded to float16 or
        bfloat16 like a stored tile; TF32 rounding is the float backend's (exact backends keep
        the value, float32 FMA takes it as it is)."""
        if math is MatmulMath.FP16:
            return self.store(x, "float16")
        if math is MatmulMath.BF16:
            return self.store(x, "bfloat16")
        return x

    def scalar(self, v: float) -> Any:
        raise NotImplementedError

    def data(self, array: np.ndarray) -> Any:
        raise NotImplementedError

    # -- arithmetic -----------------------------------------------------------------------------
    def compute(self, op: str, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
        """Any operator of the table, dispatched on its category."""
        cat = _ops.OPS[op].category
        if cat == "matmul":
            return self.matmul(args[0], args[1])
        if cat == "reduce":
            return self.reduce(op, args[0], tuple(attrs["axes"]), bool(attrs.get("keepdims",
                                                                                  False)))
        if op == "reshape":
            shape = tuple(attrs["shape"])
            return self.layout(args[0], lambda a: a.reshape(shape))
        if op == "transpose":
            perm = tuple(attrs["perm"])
            return self.layout(args[0], lambda a: a.transpose(perm))
        if op == "slice":
            key = (slice(None),) * int(attrs["axis"]) + (slice(attrs["start"], attrs["stop"]),)
            return self.layout(args[0], lambda a: a[key])
        if op == "concat":
            return self.concat(list(args), int(attrs["axis"]))
        if op == "take":
            return self.take(args[0], args[1])
        return self.elementwise(op, list(args), attrs)

    def elementwise(self, op: str, args: list[Any], attrs: dict[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def matmul(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def sum(self, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
        raise NotImplementedError

    def reduce(self, op: str, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
        if op == "sum":
            return self.sum(x, axes, keepdims)
        raise NotImplementedError(f"{type(self).__name__}: reduction {op!r}")

    def accumulate(self, acc: Any, v: Any, kind: str = "sum") -> Any:
        """One for-loop accumulator step: ``acc + v`` ("sum"), ``maximum(acc, v)`` ("max"),
        ``minimum(acc, v)`` ("min")."""
        if acc is None:
            return v
        return self.elementwise({"sum": "add", "max": "maximum", "min": "minimum"}[kind],
                                [acc, v])

    def rescale(self, acc: Any, old: Any, new: Any) -> Any:
        """An online-softmax sum accumulator brought to a new running maximum:
        ``acc * exp(old - new)`` (``old``/``new`` broadcast to ``acc``)."""
        return self.elementwise("mul", [acc, self.elementwise(
            "exp", [self.elementwise("sub", [old, new])])])

    # -- data movement --------------------------------------------------------------------------
    def layout(self, x: Any, fn: Callable[[np.ndarray], np.ndarray]) -> Any:
        return self.combine(lambda xs: fn(xs[0]), [x])

    def combine(self, fn: Callable[[list[np.ndarray]], np.ndarray], xs: list[Any]) -> Any:
        raise NotImplementedError

    def concat(self, xs: list[Any], axis: int) -> Any:
        return self.combine(lambda arrs: np.concatenate(arrs, axis=axis), xs)

    def take(self, table: Any, ids: Any) -> Any:
        """``table[ids]``: a data movement chosen by known integers, checked against the
        table's rows first (:func:`lax.ops.check_indices`)."""
        _ops.check_indices(tuple(table.shape), ids)
        idx = np.asarray(ids, dtype=np.int64)
        return self.layout(table, lambda a: a[idx])

    # -- composite kernels ----------------------------------------------------------------------
    def rms_norm(self, x: Any, eps: float) -> Any:
        """``x / sqrt(sum(x^2, -1) / n + eps)``, the same operators :func:`lax.rms_norm` records."""
        n = x.shape[-1]
        ss = self.sum(self.elementwise("square", [x]), (x.ndim - 1,), True)
        v = self.elementwise("add", [self.elementwise("div", [ss, self.scalar(float(n))]),
                                     self.scalar(eps)])
        return self.elementwise("div", [x, self.elementwise("sqrt", [v])])

    def annotate(self, where: str) -> None:
        self.where = where


class NumpyBackend(Backend):
    """Float arithmetic with NumPy.

    ``"float64"``: every value float64 -- the exact meaning of a graph. ``"gpu"``: device tensors
    rounded to their storage dtype (returned as float32 arrays), block intermediates, accumulators
    and constants float32.
    """

    def __init__(self, precision: str = "float64"):
        if precision not in ("float64", "gpu"):
            raise ValueError(f"precision {precision!r}")
        self.precision = precision
        self.name = precision
        self.ft = np.float32 if precision == "gpu" else np.float64

    def input(self, value: Any, dtype: str) -> np.ndarray:
        if _ops.is_index(dtype):
            return self.index(value)
        return self.store(np.asarray(value), dtype)

    def store(self, x: Any, dtype: str) -> np.ndarray:
        if _ops.is_index(dtype):
            return np.asarray(x, dtype=np.int64)
        if self.precision == "gpu":
            if dtype == "float16" and isinstance(x, np.ndarray) and x.dtype == np.float16:
                return x  # float16 data as it is (tiles widen to float32 as they are read)
            return _ops.storage_round(x, dtype)
        return np.asarray(x, dtype=np.float64)

    def tile(self, x: Any) -> np.ndarray:
        return np.asarray(x).astype(self.ft, copy=False)

    def scalar(self, v: float) -> Any:
        return np.float32(v) if self.precision == "gpu" else float(v)

    def mma_operand(self, x: Any, math: MatmulMath) -> Any:
        if math is MatmulMath.TF32 and self.precision == "gpu":
            return _ops.round_tf32(x)
        return super().mma_operand(x, math)

    def data(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array, dtype=self.ft)

    def _float(self, op: str, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
        if op == "cast" and self.precision == "gpu":
            return _ops.storage_round(args[0], attrs["dtype"])
        return _ops.compute(op, list(args), attrs)

    def compute(self, op: str, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
        return self._float(op, args, attrs)

    def elementwise(self, op: str, args: list[Any], attrs: dict[str, Any] | None = None) -> Any:
        return self._float(op, args, attrs or {})

    # inf and nan are values here (check_numerics reports where they first appear)
    def matmul(self, a: Any, b: Any) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.matmul(a, b)

    def sum(self, x: Any, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.sum(x, axis=axes, keepdims=keepdims)

    def reduce(self, op: str, x: Any, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
        return _ops.compute(op, [x], {"axes": axes, "keepdims": keepdims})

    def accumulate(self, acc: Any, v: Any, kind: str = "sum") -> np.ndarray:
        v = np.asarray(v, dtype=self.ft)
        if acc is None:
            return v.copy()
        with np.errstate(over="ignore", invalid="ignore"):
            if kind == "sum":
                return acc + v
            return (np.maximum if kind == "max" else np.minimum)(acc, v)

    def layout(self, x: Any, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        return fn(x)

    def combine(self, fn: Callable[[list[np.ndarray]], np.ndarray], xs: list[Any]) -> np.ndarray:
        return fn(xs)

    def rms_norm(self, x: Any, eps: float) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) +
                               self.scalar(eps))


def get_backend(precision: str | Backend) -> Backend:
    """A backend object for a precision name, or the backend itself."""
    if isinstance(precision, Backend):
        return precision
    return NumpyBackend(precision)


__all__ = ["Backend", "NumpyBackend", "get_backend"]
