"""``check_numerics(program, ugraph)``: the GPU-like float interpreter against float64.

Exact field arithmetic cannot see rounding: a μGraph that accumulates in float16, or whose
intermediate overflows float16 storage, is still "equivalent". This check runs the μGraph with
the interpreter's ``"gpu"`` precision (device tensors rounded to their storage dtype, float32
intermediates and accumulators, matmul operands as their math takes them) on realistic random
inputs, compares every output with the program's float64 reference, and watches every operator
for overflow, NaN and inf, naming the first operator that produced each (not the ones that
merely propagate it).

``numerics_verdict(program, candidate, naive)`` is what ``superopt`` asks of every verified
candidate: it runs the check on inputs of the magnitudes users have (:data:`PROBES`: unit
normals, inputs scaled by about 1e-3 and 1e5 where the dtype holds them -- not in float16
programs, whose own values underflow or overflow first --, and four outlier features 1024 times
the rest, as LLM residual streams have: "massive activations" of a few hundred to a few
thousand) and rejects the candidate
where it overflows or misses the tolerance while the program in its own dtype -- the naive
lowering, one kernel per operator, statistics kept in float32 as PyTorch's norms keep them --
does not (or where it is ten times less accurate than that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from ..lax.ops import is_index

from ..lax.backend import NumpyBackend
from ..lax.precision import MatmulMath
from ..lax.program import Program
from ..ugraph.bind import bind
from ..ugraph.graph import GraphKernel, KernelGraph
from ..ugraph.interp import run
from .equivalence import check_interface

#: default tolerance on the norm-wise relative error, by the narrowest dtype involved
TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4}
#: ... and by the narrowest matmul math (a float32 program that allows TF32 or bfloat16)
MATH_TOLERANCE = {MatmulMath.TF32: 2e-3, MatmulMath.BF16: 5e-2, MatmulMath.FP16: 1e-2}


# the largest scale a float16 input takes (a power of two: a 4-sigma value of 2048 leaves room
# below float16's 65504 for the operators after it)
FLOAT16_SCALE_CAP = 2.0 ** 9


@dataclass(frozen=True)
class Probe:
    """One way of drawing the inputs of the numerics check: the unit normals times ``scale``
    (at most what the input's dtype holds with room to spare), and optionally ``outliers``
    features of each input's last dim ``outlier`` times larger than the rest."""

    name: str
    scale: float = 1.0
    outlier: float = 0.0
    outliers: int = 4

    def tells(self, program: Program) -> bool:
        """Can this probe show a candidate worse than the program in its own dtype? Scaled
        inputs cannot in a float16 program: its own float16 products underflow (scaled down) or
        overflow (scaled up, 512 at most) first, and a candidate never stores a value narrower
        than the program does; outlier features can (a narrowed statistic overflows first)."""
        return self.scale == 1.0 or any(t.dtype != "float16" for t in program.inputs)

    def inputs(self, program: Program, seed: int,
               stored: Mapping[str, np.ndarray] | None = None) -> Mapping[str, np.ndarray]:
        """The probe's inputs as their device tensors hold them (float16 arrays, float32 arrays
        of bfloat16 or float32 values), derived from ``stored`` (:func:`stored_inputs` for
        ``seed``; drawn when not given): scaled by powers of two, so a value moves exactly or
        rounds as storage would. Drawn lazily, input by input, when ``stored`` is
        (:class:`LazyInputs`: inputs too large to keep)."""
        stored = stored_inputs(program, seed) if stored is None else stored
        if isinstance(stored, LazyInputs):
            index = {t.name: i for i, t in enumerate(program.inputs)}
            types = {t.name: t for t in program.inputs}
            return LazyInputs(
                list(index), lambda n: self._one(types[n], stored[n], np.random.default_rng(
                    [seed, int(self.outlier), index[n]])), keep_bytes=0)
        rng = np.random.default_rng([seed, int(self.outlier)])
        return {t.name: self._one(t, stored[t.name], rng) for t in program.inputs}

    def _one(self, t: Any, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One input under this probe (``rng`` picks its outlier features)."""
        if is_index(t.dtype):  # indices are no magnitudes: the same valid rows
            return x
        original = x
        s = min(self.scale, FLOAT16_SCALE_CAP if t.dtype == "float16" else math.inf)
        if s != 1.0:  # (float16 arithmetic in NumPy is slow: scale in float32)
            x = (x.astype(np.float32) * np.float32(s)).astype(x.dtype)
        if self.outlier and t.shape and t.shape[-1] > 2 * self.outliers:
            cols = rng.choice(t.shape[-1], self.outliers, replace=False)
            x = x.copy() if x is original else x
            x[..., cols] = (x[..., cols].astype(np.float32) *
                            np.float32(self.outlier)).astype(x.dtype)
        return x


#: the inputs of one numerics check drawn all at once up to this size (bytes as stored); a
#: larger program's are drawn input by input when read (:class:`LazyInputs`), so a check
#: holds one weight at a time
EAGER_BYTES = 1 << 30


class LazyInputs(Mapping):
    """Inputs drawn when read (``draw(name)``), kept while the kept ones stay within
    ``keep_bytes``: what a check of a model-size program reads one at a time."""

    def __init__(self, names: list[str], draw: Any, keep_bytes: int = 256 << 20):
        self.names, self.draw, self.keep_bytes = list(names), draw, keep_bytes
        self.kept: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.names:
            raise KeyError(name)
        x = self.kept.get(name)
        if x is None:
            x = self.draw(name)
            if sum(v.nbytes for v in self.kept.values()) + x.nbytes <= self.keep_bytes:
                self.kept[name] = x
        return x

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def stored_inputs(program: Program, seed: int = 0) -> Mapping[str, np.ndarray]:
    """Unit normal inputs for ``seed`` as the program's input tensors store them: float16 arrays
    for float16, float32 arrays of bfloat16 values for bfloat16, float32 arrays for float32
    (drawn in float32: a quarter to a half of float64's memory and time; the interpreter takes
    float16 data without re-rounding it, and the float64 reference sees exactly what the device
    would). Above :data:`EAGER_BYTES` a :class:`LazyInputs`, drawn input by input."""
    bounds = program.index_bounds()
    size = sum(int(np.prod(t.shape, dtype=np.int64)) * (2 if t.dtype == "float16" else 4)
               for t in program.inputs)
    if size > EAGER_BYTES:  # one input at a time, each from a seed of its own
        index = {t.name: i for i, t in enumerate(program.inputs)}
        types = {t.name: t for t in program.inputs}
        return LazyInputs(list(index), lambda n: _draw(
            types[n], bounds, np.random.default_rng([seed, index[n]]), chunked=True))
    rng = np.random.default_rng(seed)
    return {t.name: _draw(t, bounds, rng) for t in program.inputs}


#: float32 normals drawn at once when a float16 input is drawn a piece at a time
DRAW_CHUNK = 1 << 24


def _draw(t: Any, bounds: Mapping[str, int], rng: np.random.Generator,
          chunked: bool = False) -> np.ndarray:
    """One input's unit normals (valid indices for an index input) as its tensor stores them;
    ``chunked``: a float16 input filled a piece at a time (no float32 copy of all of it)."""
    from ..lax.ops import storage_round
    if t.name in bounds:  # an index input: valid indices, as random_inputs draws them
        return rng.integers(0, bounds[t.name], size=t.shape, dtype=np.int64)
    if chunked and t.dtype == "float16":
        out = np.empty(t.shape, dtype=np.float16)
        flat = out.reshape(-1)
        for i in range(0, flat.size, DRAW_CHUNK):
            j = min(flat.size, i + DRAW_CHUNK)
            flat[i:j] = rng.standard_normal(j - i, dtype=np.float32)
        return out
    x = rng.standard_normal(t.shape, dtype=np.float32)
    return x.astype(np.float16) if t.dtype == "float16" else storage_round(x, t.dtype)


#: the magnitudes the numerics check tries (module doc); powers of two, so that a scaled input
#: rounds to its storage dtype as the unit one does, scaled
PROBES = (Probe("unit normal"), Probe("inputs x 2^-10", scale=2.0 ** -10),
          Probe("inputs x 2^17", scale=2.0 ** 17), Probe("outlier features x 1024", outlier=1024.0))


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
    tol = max(TOLERANCE.get(d, 1e-2) for d in dtypes)
    for m in _explicit_maths(graph):
        tol = max(tol, MATH_TOLERANCE.get(m, 0.0))
    return tol


def _explicit_maths(graph: KernelGraph) -> set[MatmulMath]:
    """The ``math`` attributes of the graph's matmuls (float32 programs say how they multiply)."""
    found = set()
    for op in graph.ops:
        nodes = op.block.ops if isinstance(op, GraphKernel) else (op,)
        for n in nodes:
            m = dict(getattr(n, "attrs", ()) or ()).get("math") \
                if getattr(n, "op", None) == "matmul" else None
            if m is not None:
                found.add(MatmulMath(m))
    return found


def check_numerics(program: Program, ugraph: KernelGraph, inputs: Mapping[str, Any] | None = None,
                   *, seed: int = 0, scale: float = 1.0, precision: str = "gpu",
                   tolerance: float | None = None, target: Any = "h100",
                   reference: Mapping[str, Any] | None = None,
                   sizes: Mapping[str, int] | None = None) -> NumericsReport:
    """Run ``ugraph`` in ``precision`` ("gpu" by default) on ``inputs`` (default: the program's
    normal random inputs times ``scale``, seeded) and compare with ``program.evaluate`` in
    float64 (or ``reference``, that evaluation made once for several graphs). Reports, per
    output, the max and norm-wise relative error, and every operator that first produced an
    overflow, NaN or inf. ``sizes`` binds the dims a padded program's masks name."""
    if sizes:
        program, ugraph = program.at(sizes), bind(ugraph, sizes)
    check_interface(program, ugraph)
    if inputs is None:
        inputs = program.random_inputs(seed, scale)
    ref = program.evaluate(inputs) if reference is None else reference
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


@dataclass
class NumericsVerdict:
    """What :func:`numerics_verdict` decided: ``ok``, else the ``probe`` that rejected the
    candidate with both reports (``candidate``, ``naive``)."""

    ok: bool
    probe: str = ""
    candidate: NumericsReport | None = None
    naive: NumericsReport | None = None
    # dim label (generator/labels.py) -> sampled extent where the verdict came from sampled
    # rows (sample.py; a rejection is always decided at full size), empty where every row was
    # checked
    sampled: dict[str, int] = field(default_factory=dict)
    # input elements the check read (the sampled program's where sampled, then also the full)
    elements: int = 0

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            return "numerics ok on every probe" + (
                " (sampled rows: " + ", ".join(f"{e}->{n}" for e, n in sorted(
                    self.sampled.items())) + ")" if self.sampled else "")
        return (f"numerics rejected on {self.probe}: candidate {self.candidate.norm_rel:.3g}"
                f"{' ' + str(self.candidate.events[0]) if self.candidate.events else ''}, "
                f"program in its own dtype {self.naive.norm_rel:.3g}")


def _worse(c: NumericsReport, n: NumericsReport) -> bool:
    """Is the candidate's failure its own? The naive lowering passes, or fails far less."""
    if n.ok:
        return True
    if c.events and not n.events:
        return True
    return c.norm_rel > 10 * n.norm_rel


# naive lowerings' reports by (program, naive graph, probe, seed, target): every candidate of a
# structure is compared with the same program in its own dtype on the same probes
_NAIVE_REPORTS: dict[tuple, NumericsReport] = {}
_NAIVE_REPORTS_KEPT = 256


# the program's float64 outputs by (program, probe, seed): every candidate of a structure is
# compared on the same inputs, so the reference is evaluated once (its inputs drawn once)
_REFERENCES: dict[tuple, dict[str, Any]] = {}
_REFERENCES_KEPT = 64
#: ... and at most this many bytes of them (oldest dropped first): a KernelBench softmax's
#: sampled reference is 1.5 GB, 64 of them would not fit any machine
REFERENCE_BYTES = 1 << 30


def _nbytes(outputs: Mapping[str, Any]) -> int:
    return sum(int(getattr(v, "nbytes", 0)) for v in outputs.values())


def _reference(program: Program, probe: Probe, seed: int, x: Mapping[str, Any]
               ) -> dict[str, Any]:
    key = (program.structural_hash(), probe, seed)
    ref = _REFERENCES.get(key)
    if ref is None:
        ref = program.evaluate(x)
        size = _nbytes(ref)
        while _REFERENCES and (len(_REFERENCES) >= _REFERENCES_KEPT or
                               sum(map(_nbytes, _REFERENCES.values())) + size > REFERENCE_BYTES):
            _REFERENCES.pop(next(iter(_REFERENCES)))
        if size <= REFERENCE_BYTES:
            _REFERENCES[key] = ref
    return ref


def numerics_verdict(program: Program, candidate: KernelGraph, naive: KernelGraph, *,
                     seed: int = 0, target: Any = "h100",
                     probes: tuple[Probe, ...] = PROBES,
                     sizes: Mapping[str, int] | None = None,
                     sample: bool = True) -> NumericsVerdict:
    """Accept ``candidate`` unless on some probe's inputs it overflows, makes a NaN or misses
    the tolerance while ``naive`` (the program in its own dtype) does not -- or is ten times
    less accurate than it (module doc). Probes that cannot tell (:meth:`Probe.tells`) are
    skipped; each probe's float64 reference is computed once for both graphs. ``sizes`` binds
    the dims a padded program's masks name. With ``sample``, a candidate whose rows can be
    sampled (sample.py) is accepted when on its sampled rows it passes every probe or fails no
    worse than the naive lowering at the sampled extents; where it does not, or cannot be
    sampled, every row is checked (so a rejection always comes from the full size)."""
    if sizes:
        program = program.at(sizes)
        candidate, naive = bind(candidate, sizes), bind(naive, sizes)
    elements = _elements(program)
    if sample:
        from .sample import sample_rows, sampled_like
        s = sample_rows(program, candidate, target)
        small_naive = sampled_like(program, naive, s.sizes, target) if s else None
        if small_naive is not None:
            v = _verdict(s.program, s.graph, small_naive, seed, target, probes)
            if v.ok:
                return replace(v, sampled=dict(s.sizes), elements=_elements(s.program))
            elements += _elements(s.program)
    return replace(_verdict(program, candidate, naive, seed, target, probes), elements=elements)


def _elements(program: Program) -> int:
    return sum(int(np.prod(t.shape, dtype=np.int64)) for t in program.inputs)


def _verdict(program: Program, candidate: KernelGraph, naive: KernelGraph, seed: int,
             target: Any, probes: tuple[Probe, ...]) -> NumericsVerdict:
    """The verdict at the program's own sizes."""
    stored = stored_inputs(program, seed)
    for probe in probes:
        if not probe.tells(program):
            continue
        x = probe.inputs(program, seed, stored)
        ref = _reference(program, probe, seed, x)
        c = check_numerics(program, candidate, x, target=target, reference=ref)
        if c.ok:
            continue
        key = (program.structural_hash(), naive.structural_hash(), probe, seed, str(target))
        n = _NAIVE_REPORTS.get(key)
        if n is None:
            n = check_numerics(program, naive, x, target=target, reference=ref)
            if len(_NAIVE_REPORTS) >= _NAIVE_REPORTS_KEPT:
                _NAIVE_REPORTS.clear()
            _NAIVE_REPORTS[key] = n
        if _worse(c, n):
            return NumericsVerdict(False, probe.name, c, n)
    return NumericsVerdict(True)


__all__ = ["check_numerics", "numerics_verdict", "NumericsVerdict", "Probe", "PROBES",
           "stored_inputs", "LazyInputs", "EAGER_BYTES",
           "NumericsReport", "NumericEvent", "OutputError", "CheckingBackend"]
