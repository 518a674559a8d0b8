"""Runners: one interface that turns a candidate into a time.

``runner.run(graph, target) -> Measurement``, where ``graph`` is a KernelGraph or an
:class:`AnnotatedGraph`.

* :class:`ModelRunner` -- the cost model's prediction; no GPU. ``measured`` is False.
* :class:`GpuRunner` -- compiles the graph (``mirage_py.codegen_cuda.CompiledGraph``), runs it on
  random inputs through CuPy: ``warmup`` calls, then ``repeats`` calls each timed with CUDA events;
  the time is the median. Only this class imports CuPy, and only when it runs.
* :class:`FakeRunner` -- test double: a given function of the graph (default: the model's
  prediction times a deterministic per-graph factor), counting calls.

:func:`default_runner` picks the GPU runner when CuPy sees a device, else the model runner.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from ..cost_model import AnalyticModel, unpack
from ..errors import MirageError
from ..ugraph.graph import index_bounds


@dataclass(frozen=True)
class Measurement:
    us: float
    runner: str
    measured: bool  # True: timed on hardware (or a fake standing in for it)
    samples: tuple[float, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and math.isfinite(self.us)


class ModelRunner:
    name = "model"
    measures = False

    def __init__(self, model=None):
        self.model = model or AnalyticModel()

    def run(self, graph: Any, target: Any) -> Measurement:
        try:
            return Measurement(float(self.model.predict(graph, target)), self.name, False)
        except MirageError as e:
            return Measurement(math.inf, self.name, False, error=str(e))


class FakeRunner:
    """Stands in for a GPU in tests: ``fn(graph, target) -> us``; default: the analytic model
    times a factor in [0.5, 1.5) drawn from the graph's hash (a noisy 'measurement')."""

    name = "fake"
    measures = True

    def __init__(self, fn: Callable[[Any, Any], float] | None = None):
        self.fn = fn or self._default
        self.calls: list[str] = []

    @staticmethod
    def _default(graph: Any, target: Any) -> float:
        g, stages = unpack(graph)
        h = int(hashlib.sha256(f"{g.structural_hash()}{stages}".encode()).hexdigest()[:8], 16)
        return AnalyticModel().predict(graph, target) * (0.5 + (h % 1000) / 1000)

    def run(self, graph: Any, target: Any) -> Measurement:
        g, _ = unpack(graph)
        self.calls.append(g.structural_hash())
        us = float(self.fn(graph, target))
        return Measurement(us, self.name, True, (us,))


@dataclass
class GpuRunner:
    """Times compiled graphs on the GPU with CUDA events (see module doc)."""

    warmup: int = 3
    repeats: int = 20
    seed: int = 0
    name: str = "gpu"
    measures: bool = True
    _inputs: dict = field(default_factory=dict, repr=False)

    def _random_inputs(self, g, cp) -> dict:
        key = tuple((t.name, t.shape, t.dtype) for t in g.inputs)
        if key not in self._inputs:
            rs = cp.random.RandomState(self.seed)
            arrays = {}
            bounds = index_bounds(g)
            for t in g.inputs:
                if t.name in bounds:  # indices: valid rows of the tables they pick from
                    a = rs.randint(0, bounds[t.name], size=t.shape).astype(t.dtype)
                elif t.dtype == "bfloat16":  # raw bits of small values: 0x3c00 ~ 0.0078
                    a = (rs.randint(0, 0x3c00, size=t.shape)).astype(cp.uint16)
                else:
                    a = (rs.standard_normal(t.shape) * 0.1).astype(t.dtype)
                arrays[t.name] = a
            self._inputs[key] = arrays
        return self._inputs[key]

    def run(self, graph: Any, target: Any) -> Measurement:
        g, _stages = unpack(graph)  # stages: code generation does not pipeline yet
        try:
            import cupy as cp

            from ..codegen_cuda import CompiledGraph
            compiled = CompiledGraph(g, target)
            x = self._random_inputs(g, cp)
            for _ in range(self.warmup):
                compiled(x)
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            samples = []
            for _ in range(self.repeats):
                start.record()
                compiled(x)
                stop.record()
                stop.synchronize()
                samples.append(cp.cuda.get_elapsed_time(start, stop) * 1e3)  # ms -> us
        except Exception as e:  # compile error, launch failure, no device: recorded, not fatal
            return Measurement(math.inf, self.name, True, error=f"{type(e).__name__}: {e}")
        return Measurement(statistics.median(samples), self.name, True, tuple(samples))


def gpu_present() -> bool:
    try:
        from ..codegen_cuda import gpu_available
    except Exception:  # codegen or CuPy unusable: no GPU path
        return False
    try:
        return bool(gpu_available())
    except Exception:
        return False


def default_runner(model=None):
    """The GPU runner when CuPy finds a device, else the model runner."""
    return GpuRunner() if gpu_present() else ModelRunner(model)


_RUNNERS = {"model": ModelRunner, "gpu": GpuRunner, "fake": FakeRunner}


def create(name: str, **kw: Any):
    try:
        return _RUNNERS[name](**kw)
    except KeyError:
        raise MirageError(f"unknown runner {name!r}; choose one of {', '.join(_RUNNERS)}") \
            from None
