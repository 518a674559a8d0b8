"""The measuring core every GPU benchmark path shares: run our graph and the PyTorch baselines
on the same inputs, check each result against PyTorch eager and a float64 evaluation, and time
each per call and as a CUDA-graph replay.

Its callers keep their own jobs -- what they search or load and what they write:
``mirage-py bench`` (``bench.measure_gpu``: searches, then measures in one process),
``benchmarks/gpu_measure.py`` (its ``bench``, ``tuning``, ``best``, ``variants`` and
``kernelbench`` steps: answers stored by ``gpu_prepare``) and ``benchmarks/tuning_table.py``
(``measure_candidates``: the search's candidate structures).

* :class:`Device` -- where it runs (a CUDA device, or the CPU for a dry run: PyTorch on CPU
  tensors, our graphs on the μGraph interpreter, wall-clock timing) and how it times (warm-up,
  runs, a budget of seconds per variant, the L2 cache flushed before each timed call or not);
  ``timer`` gives a :class:`Timing`.
* :class:`References` -- PyTorch eager's outputs and the program evaluated in float64, on the
  same inputs (:func:`references`); :func:`check` compares a result with them (:class:`Check`).
* :class:`Ours` -- a graph compiled (``CompiledGraph``; a :class:`Build` may turn TMA or
  warpgroup MMA off) or, dry, interpreted, writing into NaN-poisoned outputs.
* :func:`measure_ours`, :func:`measure_baselines` and :func:`time_graph` give a
  :class:`MeasuredSystem` per system: its check, its times, what failed.

Only PyTorch, and CuPy on a GPU, are needed; both are imported inside the functions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

from .torch_baselines import cuda_samples, rel_err

ATOL = RTOL = 1e-2  # torch.allclose's tolerances, as KernelBench checks


# ---- where and how it times -------------------------------------------------------------------

@dataclass(frozen=True)
class Timing:
    """One system's timed calls: the median and the fastest (us), and how many were timed."""

    us: float
    min_us: float
    runs: int

    def to_json(self) -> dict:
        return {"us": self.us, "min_us": self.min_us, "runs": self.runs}


@dataclass
class Device:
    """Where a measurement runs -- a CUDA device, or the CPU for a dry run -- and how it times:
    ``warmup`` calls, then ``repeat`` timed calls (fewer when ``budget_s`` of timed calls would
    not hold them; ``None``: no budget), each with CUDA events (the L2 cache flushed first with
    ``flush``) or, dry, with the wall clock."""

    dry: bool
    budget_s: float | None = 3.0
    flush: bool = True
    warmup: int = 5
    repeat: int = 50

    @property
    def torch_device(self) -> str:
        return "cpu" if self.dry else "cuda"

    def sync(self) -> None:
        if not self.dry:
            import torch
            torch.cuda.synchronize()

    def timer(self, fn: Callable[[], Any], warmup: int | None = None, repeat: int | None = None,
              budget_s: float | None = None) -> Timing:
        """``fn()`` timed after warm-up (``warmup``, ``repeat`` and ``budget_s`` default to the
        device's; the smaller of two budgets holds)."""
        warmup = self.warmup if warmup is None else warmup
        repeat = self.repeat if repeat is None else repeat
        budgets = [b for b in (budget_s, self.budget_s) if b is not None]
        for _ in range(warmup):
            fn()
        self.sync()
        if budgets:  # one call, timed by the wall clock, sizes the runs
            t0 = time.perf_counter()
            fn()
            self.sync()
            one = time.perf_counter() - t0
            repeat = max(5, min(repeat, int(min(budgets) / max(one, 1e-6))))
        if self.dry:
            samples = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e6)
            samples.sort()
        else:
            samples = cuda_samples(fn, repeat, flush=self.flush)
        return Timing(samples[len(samples) // 2], samples[0], len(samples))


def torch_graph(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` (PyTorch work) captured as a CUDA graph: a callable that replays it."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


# ---- inputs, references and checks ------------------------------------------------------------

def _torch_dtypes() -> dict:
    import torch
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
            "int32": torch.int32, "int64": torch.int64}


def torch_inputs(program: Any, x: dict, device: str, dtype: Any = None) -> dict:
    """A program's inputs ``x`` (NumPy arrays by name) as torch tensors on ``device``, in the
    program's dtypes (or all in ``dtype``)."""
    import torch
    dt = _torch_dtypes()
    return {t.name: torch.from_numpy(x[t.name]).to(device, dtype or dt[t.dtype])
            for t in program.inputs}


def random_inputs(graph: Any, dev: Device, seed: int = 0) -> dict:
    """Random torch inputs of a (annotated) graph: normals x 0.1, valid rows for indices."""
    import torch

    from ..ugraph.graph import index_bounds
    g = getattr(graph, "graph", graph)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    bounds = index_bounds(g)
    dt = _torch_dtypes()
    out = {}
    for t in g.inputs:
        if t.name in bounds:
            v = torch.randint(0, bounds[t.name], t.shape, generator=gen)
        else:
            v = torch.randn(t.shape, generator=gen) * 0.1
        out[t.name] = v.to(dev.torch_device, dt[t.dtype])
    return out


def close(a: Any, b: Any) -> bool:
    """``torch.allclose`` with KernelBench's tolerances (compared in float32)."""
    import torch
    return bool(torch.allclose(a.float(), b.float(), atol=ATOL, rtol=RTOL))


@dataclass(frozen=True)
class References:
    """What a result is checked against: PyTorch eager's outputs (the program's dtypes) and,
    where known, the same computation in float64."""

    eager: dict
    float64: dict | None = None


def references(program: Any, inputs: dict, x: dict, dev: Device) -> References:
    """The program's :class:`References` on ``inputs`` (torch tensors made from ``x``)."""
    import torch

    from .torch_baselines import torch_fn
    with torch.no_grad():
        eager = torch_fn(program)(inputs)
        ref64 = torch_fn(program)(torch_inputs(program, x, dev.torch_device, torch.float64))
    return References(eager, ref64)


@dataclass(frozen=True)
class Check:
    """A result against the :class:`References`, worst output first: norm-wise relative error
    against eager and against float64 (``None`` without a float64 reference), every output
    ``torch.allclose`` to eager's, every element finite."""

    rel_err_vs_eager: float
    rel_err_vs_float64: float | None
    allclose_eager: bool
    finite: bool


def check(got: dict, refs: References) -> Check:
    """``got`` (outputs by name; those the references hold are compared) against ``refs``."""
    import torch
    names = [k for k in refs.eager if k in got]
    return Check(
        rel_err_vs_eager=max(rel_err(got[k], refs.eager[k]) for k in names),
        rel_err_vs_float64=None if refs.float64 is None else
        max(rel_err(got[k], refs.float64[k]) for k in names),
        allclose_eager=all(close(got[k], refs.eager[k]) for k in names),
        finite=all(bool(torch.isfinite(got[k].float()).all()) for k in names))


# ---- systems measured -------------------------------------------------------------------------

@dataclass
class MeasuredSystem:
    """One system measured on one set of inputs: its check, its time per call and as a CUDA
    graph replay (GPU only), what it took to build; ``error``: it failed (nothing after the
    failure was measured), ``graph_error``: only its CUDA-graph capture or replay failed."""

    label: str
    check: Check | None = None
    call: Timing | None = None
    graph: Timing | None = None
    graph_check: Check | None = None
    compile_s: float | None = None
    built_for: str | None = None
    tma: bool | None = None
    error: str | None = None
    graph_error: str | None = None


def failure(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class Build(Enum):
    """How our graph is compiled: as the runtime builds it (TMA and warpgroup MMA on an sm_90
    GPU), with every tile by cp.async, or with mma.sync instead of warpgroup MMA."""

    DEFAULT = "default"
    NO_TMA = "no_tma"
    NO_WGMMA = "no_wgmma"

    @property
    def env(self) -> str | None:
        """The runtime's switch for this build (read when a graph is compiled)."""
        return {Build.NO_TMA: "MIRAGE_PY_NO_TMA", Build.NO_WGMMA: "MIRAGE_PY_NO_WGMMA"}.get(self)


def _on_device(inputs: dict) -> dict:
    """Torch CUDA tensors as CuPy arrays over the same memory (DLPack)."""
    import cupy as cp
    return {k: cp.from_dlpack(v.contiguous()) for k, v in inputs.items()}


class Ours:
    """A graph compiled (or, dry, interpreted) with poisoned output buffers:
    ``ours.prepare(inputs)()`` -> {output name: torch tensor}."""

    def __init__(self, graph: Any, target: Any, dev: Device, build: Build = Build.DEFAULT):
        self.graph, self.dev = graph, dev
        self.compile_s = 0.0
        self.built_for: str | None = None
        self.tma: bool | None = None
        if not dev.dry:
            import os

            from ..codegen_cuda.runtime import CompiledGraph
            t0 = time.perf_counter()
            if build.env:
                os.environ[build.env] = "1"
            try:
                self.compiled = CompiledGraph(graph, target)
            finally:
                if build.env:
                    del os.environ[build.env]
            self.compile_s = time.perf_counter() - t0
            self.built_for = self.compiled.built_for
            self.tma = self.compiled.tma

    def _plain(self) -> Any:
        return getattr(self.graph, "graph", self.graph)

    def poisoned(self) -> dict:
        """Output buffers full of NaN (bfloat16: its NaN's bits)."""
        import cupy as cp
        import numpy as np
        g = self._plain()
        out = {}
        for n in g.outputs:
            t = g.tensors()[n]
            if t.dtype == "bfloat16":
                out[n] = cp.full(t.shape, 0x7FC0, cp.uint16)
            else:
                out[n] = cp.full(t.shape, np.nan, t.dtype)
        return out

    def prepare(self, inputs: dict) -> Callable[[], dict]:
        """A no-argument call on ``inputs`` (torch tensors), outputs poisoned first."""
        import torch
        if self.dev.dry:
            import numpy as np
            g = self._plain()
            x = {k: v.detach().float().numpy() for k, v in inputs.items()}

            def run_cpu() -> dict:
                res = g.run(x, precision="gpu")
                return {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in res.items()}
            return run_cpu
        cx = _on_device(inputs)
        outs = self.poisoned()
        compiled = self.compiled

        def run_gpu() -> dict:
            compiled(cx, outputs=outs)
            return outs
        return run_gpu

    def graph_call(self, inputs: dict) -> Callable[[], dict]:
        """The call on ``inputs`` recorded as a CUDA graph (``CompiledGraph.capture``)."""
        return self.compiled.capture(_on_device(inputs), self.poisoned())

    def check_call(self, inputs: dict) -> dict:
        """One call with poisoned outputs and workspace: the outputs as torch tensors."""
        import torch
        if self.dev.dry:
            return self.prepare(inputs)()
        import cupy as cp
        outs = self.poisoned()
        self.compiled(_on_device(inputs), outputs=outs, poison=True)
        cp.cuda.Device().synchronize()
        return {k: torch.from_dlpack(v) for k, v in outs.items()}


def _as_torch(outs: dict) -> dict:
    import torch
    return {k: v if isinstance(v, torch.Tensor) else torch.from_dlpack(v)
            for k, v in outs.items()}


def _graph_timing(dev: Device, m: MeasuredSystem, make: Callable[[], Callable[[], Any]],
                  refs: References | None) -> None:
    """``m``'s CUDA-graph replay (made by ``make``) checked against ``refs`` and timed."""
    try:
        replay = make()
        if refs is not None:
            got = _as_torch(replay())
            dev.sync()
            m.graph_check = check(got, refs)
        m.graph = dev.timer(replay)
    except Exception as e:  # noqa: BLE001 -- a capture failure is a result too
        m.graph_error = failure(e)


def measure_ours(dev: Device, graph: Any, target: Any, inputs: dict, refs: References,
                 label: str = "ours", build: Build = Build.DEFAULT,
                 graphs: bool = True) -> MeasuredSystem:
    """Our ``graph`` on ``inputs``: one call with poisoned outputs and workspace checked
    against ``refs``, then timed per call and (on a GPU, with ``graphs``) as a CUDA graph
    replay, itself checked. A failure to build or run raises."""
    ours = Ours(graph, target, dev, build)
    m = MeasuredSystem(label, compile_s=ours.compile_s, built_for=ours.built_for, tma=ours.tma)
    m.check = check(ours.check_call(inputs), refs)
    m.call = dev.timer(ours.prepare(inputs))
    if graphs and not dev.dry:
        _graph_timing(dev, m, lambda: ours.graph_call(inputs), refs)
    return m


def measure_baselines(dev: Device, name: str, program: Any, inputs: dict, refs: References,
                      graphs: bool = True) -> list[MeasuredSystem]:
    """PyTorch eager (its check: against float64 only, by definition), ``torch.compile`` of it
    (a compiler failure is its ``error``) and, for the attention benchmarks,
    ``scaled_dot_product_attention``, on ``inputs``: each checked and timed per call and (on a
    GPU, with ``graphs``) as a CUDA graph replay."""
    import torch

    from .torch_baselines import sdpa_fn, torch_fn
    eager = torch_fn(program)
    out = []
    with torch.no_grad():
        def timed(label: str, fn: Callable[[], dict], result: dict,
                  compile_s: float | None = None) -> MeasuredSystem:
            m = MeasuredSystem(label, check=check(result, refs), compile_s=compile_s)
            m.call = dev.timer(fn)
            if graphs and not dev.dry:
                _graph_timing(dev, m, lambda: torch_graph(fn), None)
            return m
        out.append(timed("eager", lambda: eager(inputs), refs.eager))
        try:
            t0 = time.perf_counter()
            compiled = torch.compile(eager)
            result = compiled(inputs)
            out.append(timed("torch_compile", lambda: compiled(inputs), result,
                             round(time.perf_counter() - t0, 2)))
        except Exception as e:  # noqa: BLE001 -- a compiler failure is a result too
            out.append(MeasuredSystem("torch_compile", error=failure(e)))
        sd = sdpa_fn(name)
        if sd is not None:
            out.append(timed("sdpa", lambda: sd(inputs), sd(inputs)))
    return out


def time_graph(dev: Device, graph: Any, target: Any, label: str = "ours",
               inputs: dict | None = None, seed: int = 0, warmup: int | None = None,
               repeat: int | None = None, budget_s: float | None = None) -> MeasuredSystem:
    """Our ``graph`` timed per call on ``inputs`` (default: :func:`random_inputs`), unchecked:
    a schedule against the cost model. A graph that fails to build or run is a
    :class:`MeasuredSystem` with its ``error``."""
    try:
        ours = Ours(graph, target, dev)
        call = ours.prepare(inputs if inputs is not None else random_inputs(graph, dev, seed))
        return MeasuredSystem(label, call=dev.timer(call, warmup, repeat, budget_s),
                        compile_s=ours.compile_s, built_for=ours.built_for, tma=ours.tma)
    except Exception as e:  # noqa: BLE001 -- compile error, launch failure: recorded
        return MeasuredSystem(label, error=failure(e))
