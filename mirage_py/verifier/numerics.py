"""``check_numerics(program, ugraph)``: the GPU-like float interpreter against float64.

Exact field arithmetic cannot see rounding: a μGraph that accumulates in float16, or whose
intermediate overflows float16 storage, is still "equivalent". This check runs the μGraph with
the interpreter's ``"gpu"`` precision (device tensors rounded to their storage dtype, float32
intermediates and accumulators) on realistic random inputs, compares every output with the
program's float64 reference, and watches every operator for overflow, NaN and inf, naming the
first operator that produced each (not the ones that merely propagate it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..lax.backend import NumpyBackend
from ..lax.program import Program
from ..ugraph.graph import KernelGraph
from ..ugraph.interp import run
from .equivalence import check_interface

#: default tolerance on the norm-wise relative error, by the narrowest dtype involved
TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4}


@dataclass
class NumericEvent:
    """Non-finite values first produced by one operator (``kind``: overflow, nan, inf)."""

    kind: str
    where: str
    count: int
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} at {self.where}: {self.count} element(s){' ' + self.detail if self.detail else ''}"


@dataclass
class OutputError:
    """Error of one output against the float64 reference."""

    max_abs: float  # max |y - r|
    max_rel: float  # max |y - r| / max |r|
    norm_rel: float  # ||y - r||_2 / ||r||_2
    finite: bool

    def __str__(self) -> str:
        return (f"norm-wise rel {self.norm_rel:.3g}, max rel {self.max_rel:.3g}, max abs "
                f"{self.max_abs:.3g}{'' if self.finite else ', NON-FINITE'}")


@dataclass
class NumericsReport:
    """Result of :func:`check_numerics`; ``ok`` when every output is finite, within
    ``tolerance`` norm-wise, and no operator produced a non-finite value."""

    ok: bool
    outputs: dict[str, OutputError]
    events: list[NumericEvent] = field(default_factory=list)
    tolerance: float = 0.0
    precision: str = "gpu"

    @property
    def max_rel(self) -> float:
        return max((e.max_rel for e in self.outputs.values()), default=0.0)

    @property
    def norm_rel(self) -> float:
        return max((e.norm_rel for e in self.outputs.values()), default=0.0)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        lines = [f"numerics {'ok' if self.ok else 'NOT ok'} ({self.precision}, tolerance "
                 f"{self.tolerance:g} norm-wise)"]
        lines += [f"  {n}: {e}" for n, e in self.outputs.items()]
        lines += [f"  {ev}" for ev in self.events]
        return "\n".join(lines)


def _nonfinite(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind == "f" and not np.isfinite(x).all()


class CheckingBackend(NumpyBackend):
    """The float backend, recording the first producer of each non-finite value."""

    def __init__(self, precision: str = "gpu"):
        super().__init__(precision)
        self.events: list[NumericEvent] = []

    def _watch(self, result: Any, args: list[Any], op: str, divisor: Any = None) -> Any:
        if not _nonfinite(result):
            return result
        if any(_nonfinite(np.asarray(a)) for a in args):
            return result  # propagated, not produced here
        nan = int(np.count_nonzero(np.isnan(result)))
        inf = int(np.count_nonzero(np.isinf(result)))
        if nan:
            self.events.append(NumericEvent("nan", self.where or op, nan, f"({op})"))
        if inf:
            zero_div = divisor is not None and bool(np.any(np.asarray(divisor) == 0))
            kind = "inf" if zero_div else "overflow"
            detail = f"({op}: division by zero)" if zero_div else \
                f"({op}: result beyond the float{'32' if self.precision == 'gpu' else '64'} range)"
            self.events.append(NumericEvent(kind, self.where or op, inf, detail))
        return result

    def store(self, x: Any, dtype: str) -> np.ndarray:
        y = super().store(x, dtype)
        if _nonfinite(y) and not _nonfinite(np.asarray(x)):
            n = int(np.count_nonzero(~np.isfinite(y)))
            self.events.append(NumericEvent("overflow", self.where, n,
                                            f"(rounding to {dtype} storage)"))
        return y

    def compute(self, op: str, args: Any, attrs: dict[str, Any]) -> Any:
        return self._watch(super().compute(op, args, attrs), list(args), op,
                           args[1] if op == "div" else None)

    def elementwise(self, op: str, args: list[Any], attrs: dict[str, Any] | None = None) -> Any:
        return self._watch(super().elementwise(op, args, attrs), args, op,
                           args[1] if op == "div" else None)

    def matmul(self, a: Any, b: Any) -> np.ndarray:
        return self._watch(super().matmul(a, b), [a, b], "matmul")

    def sum(self, x: Any, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
        return self._watch(super().sum(x, axes, keepdims), [x], "sum")

    def reduce(self, op: str, x: Any, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
        return self._watch(super().reduce(op, x, axes, keepdims), [x], op)

    def accumulate(self, acc: Any, v: Any, kind: str = "sum") -> np.ndarray:
        return self._watch(super().accumulate(acc, v, kind), [v] if acc is None else [acc, v],
                           f"accumulate {kind}")

    def rms_norm(self, x: Any, eps: float) -> np.ndarray:
        return self._watch(super().rms_norm(x, eps), [x], "rms_norm")


def _tolerance(program: Program, graph: KernelGraph) -> float:
    dtypes = {t.dtype for t in program.inputs} | {t.dtype for t in graph.tensors().values()}
    return max(TOLERANCE.get(d, 1e-2) for d in dtypes)


def check_numerics(program: Program, ugraph: KernelGraph, inputs: Mapping[str, Any] | None = None,
                   *, seed: int = 0, scale: float = 1.0, precision: str = "gpu",
                   tolerance: float | None = None, target: Any = "h100") -> NumericsReport:
    """Run ``ugraph`` in ``precision`` ("gpu" by default) on ``inputs`` (default: the program's
    normal random inputs times ``scale``, seeded) and compare with ``program.evaluate`` in
    float64. Reports, per output, the max and norm-wise relative error, and every operator that
    first produced an overflow, NaN or inf."""
    check_interface(program, ugraph)
    if inputs is None:
        inputs = program.random_inputs(seed, scale)
    ref = program.evaluate(inputs)
    be = CheckingBackend(precision)
    out = run(ugraph, inputs, target=target, backend=be)
    tol = _tolerance(program, ugraph) if tolerance is None else float(tolerance)
    errors: dict[str, OutputError] = {}
    for name, r in ref.items():
        y = np.asarray(out[name], dtype=np.float64)
        r = np.asarray(r, dtype=np.float64)
        finite = bool(np.isfinite(y).all())
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.abs(y - r)
            max_abs = float(np.max(err)) if err.size else 0.0
            rmax = float(np.max(np.abs(r))) if r.size else 0.0
            rnorm = float(np.linalg.norm(r.ravel()))
            enorm = float(np.linalg.norm(err.ravel()))
        max_rel = max_abs / rmax if rmax > 0 else (0.0 if max_abs == 0 else float("inf"))
        norm_rel = enorm / rnorm if rnorm > 0 else (0.0 if enorm == 0 else float("inf"))
        if not finite:
            max_abs = max_rel = norm_rel = float("inf")
        errors[name] = OutputError(max_abs, max_rel, norm_rel, finite)
    ok = not be.events and all(e.finite and e.norm_rel <= tol for e in errors.values())
    return NumericsReport(ok, errors, be.events, tol, precision)


__all__ = ["check_numerics", "NumericsReport", "NumericEvent", "OutputError", "CheckingBackend"]
