"""The operator vocabulary and its semantics: one table shared by every stage.

Each operator has one :class:`OpSpec` entry that says what kind of operator it is (elementwise,
matmul, reduction, shape change), how it sits in the Lax fragment, and how to compute it on NumPy
arrays. The program reference (:meth:`Program.evaluate`), the μGraph interpreter and the verifier
all compute through this table, so an operator means the same thing everywhere. The verifier adds
finite-field versions beside the float ones (``OpSpec.field``), keyed by the same names.

Lax classes:

* ``multilinear`` -- sums and products of the inputs (add, sub, mul, neg, square, matmul, sum,
  reshape, transpose, constants): polynomials, so random testing over a field applies directly.
* ``div``         -- division, computed with modular inverses in the field.
* ``exp``         -- exponentiation; Lax as long as it is not nested inside another exp.
* ``uf``          -- non-Lax elementwise functions (sqrt, silu, gelu, relu). They split a program
  into Lax subprograms; the verifier can still treat them as uninterpreted functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

# dtypes a device tensor may have, with their storage size in bytes
DTYPES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4}

_erf = np.frompyfunc(math.erf, 1, 1)


def _gelu(x: np.ndarray) -> np.ndarray:
    # exact (erf-based) GELU, the default of PyTorch
    x = np.asarray(x)
    return 0.5 * x * (1.0 + np.asarray(_erf(x / math.sqrt(2.0)), dtype=x.dtype))


def _silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def _sum(x: np.ndarray, *, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sum(x, axis=axes, keepdims=keepdims)


@dataclass(frozen=True)
class OpSpec:
    """One operator: its category, Lax class and float semantics.

    ``compute(*arrays, **attrs)`` evaluates it on NumPy arrays in whatever float dtype they have.
    ``field`` is filled by :mod:`mirage_py.verifier.field` (``register()``, run when the verifier
    is imported) with the finite-field version: ``field["compute"](backend, *values, **attrs)``
    on field values, and ``field["uninterpreted"] = True`` for the non-Lax elementwise operators,
    which the field models as random functions (docs/verifier.md).
    """

    name: str
    category: str  # "leaf", "unary", "binary", "matmul", "reduce", "shape"
    lax: str  # "multilinear", "div", "exp", "uf"
    compute: Callable[..., np.ndarray] | None
    symbol: str = ""  # infix symbol for printing binary ops
    field: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def elementwise(self) -> bool:
        return self.category in ("unary", "binary")

    @property
    def is_lax(self) -> bool:
        return self.lax != "uf"


def _table(*specs: OpSpec) -> dict[str, OpSpec]:
    return {s.name: s for s in specs}


OPS: dict[str, OpSpec] = _table(
    OpSpec("input", "leaf", "multilinear", None),
    OpSpec("const", "leaf", "multilinear", None),
    # unary elementwise
    OpSpec("neg", "unary", "multilinear", np.negative),
    OpSpec("square", "unary", "multilinear", np.square),
    OpSpec("exp", "unary", "exp", np.exp),
    OpSpec("sqrt", "unary", "uf", np.sqrt),
    OpSpec("silu", "unary", "uf", _silu),
    OpSpec("gelu", "unary", "uf", _gelu),
    OpSpec("relu", "unary", "uf", lambda x: np.maximum(x, 0)),
    # binary elementwise, numpy broadcasting
    OpSpec("add", "binary", "multilinear", np.add, "+"),
    OpSpec("sub", "binary", "multilinear", np.subtract, "-"),
    OpSpec("mul", "binary", "multilinear", np.multiply, "*"),
    OpSpec("div", "binary", "div", np.divide, "/"),
    # contractions and reductions
    OpSpec("matmul", "matmul", "multilinear", np.matmul, "@"),
    OpSpec("sum", "reduce", "multilinear", _sum),
    # element-order-preserving shape changes
    OpSpec("reshape", "shape", "multilinear", lambda x, *, shape: np.reshape(x, shape)),
    OpSpec("transpose", "shape", "multilinear", lambda x, *, perm: np.transpose(x, perm)),
)

UNARY_OPS = tuple(n for n, s in OPS.items() if s.category == "unary")
BINARY_OPS = tuple(n for n, s in OPS.items() if s.category == "binary")


def spec(name: str) -> OpSpec:
    """The table entry for ``name``; a KeyError here is a bug, not user input."""
    return OPS[name]


def compute(op: str, args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """Evaluate one operator on float arrays (errors from inf/nan are the caller's to check)."""
    s = OPS[op]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return s.compute(*args, **attrs)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    # round-to-nearest-even from float32 to bfloat16, kept in float32
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = rounded.view(np.float32)
    return np.where(np.isnan(f), f, out)


def storage_round(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float values to what a device tensor of ``dtype`` stores, returned as float32."""
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "float16":
            return np.asarray(x).astype(np.float16).astype(np.float32)
        if dtype == "bfloat16":
            return _round_bf16(np.asarray(x, dtype=np.float32))
        if dtype == "float32":
            return np.asarray(x, dtype=np.float32)
    raise KeyError(dtype)
