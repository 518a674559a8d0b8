"""PyTorch baselines for the benchmark programs, and CUDA-event timing.

``torch_fn(program)`` evaluates any mirage_py Program with PyTorch operators, node by node, in the
inputs' dtype: PyTorch eager. ``torch.compile`` of the same function is the compiler baseline.
``sdpa_fn(name)`` expresses the attention benchmarks with
``torch.nn.functional.scaled_dot_product_attention`` (our K is stored (.., head_dim, seq), so it
is transposed; the programs apply no 1/sqrt(d) scale, so ``scale=1``; qknorm_gqa normalises Q
and K first exactly as the program does). ``time_cuda`` times a callable with CUDA events after
warm-up and returns the median in microseconds.

The measuring core (``mirage_py.examples.measure``) builds on these; torch is optional and
imported inside the functions.
"""

from __future__ import annotations

import math
from typing import Any, Callable


def torch_fn(program) -> Callable[[dict], dict]:
    """A function of {input name: torch tensor} computing the program's outputs with torch ops."""
    import torch

    nodes = program.nodes()
    outs = program.output_tensors

    def unary(op: str, x):
        return {"neg": torch.neg, "exp": torch.exp, "sqrt": torch.sqrt, "square": torch.square,
                "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
                "relu": torch.relu}[op](x)

    def binary(op: str, a, b):
        return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[op](a, b)

    def run(inputs: dict) -> dict:
        vals: dict[str, Any] = {}
        for t in nodes:
            if t.op == "input":
                vals[t.digest] = inputs[t.name]
                continue
            if t.op == "const":
                vals[t.digest] = t.attr("value")
                continue
            args = [vals[i.digest] for i in t.inputs]
            if t.op == "matmul":
                v = torch.matmul(*args)
            elif t.op == "sum":
                v = torch.sum(args[0], dim=tuple(t.attr("axes")), keepdim=bool(t.attr("keepdims")))
            elif t.op == "reshape":
                v = torch.reshape(args[0], tuple(t.attr("shape")))
            elif t.op == "transpose":
                v = torch.permute(args[0], tuple(t.attr("perm")))
            elif len(args) == 1:
                v = unary(t.op, args[0])
            else:
                v = binary(t.op, *args)
            vals[t.digest] = v
        return {n: vals[t.digest] for n, t in outs.items()}

    return run


ATTENTION = ("gqa", "qknorm_gqa", "mha", "mqa")


def sdpa_fn(name: str) -> Callable[[dict], dict] | None:
    """The attention benchmarks through scaled_dot_product_attention (None for the others)."""
    if name not in ATTENTION:
        return None
    import torch
    import torch.nn.functional as F

    def rms(x):
        return x / torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + 1e-6)

    def run(inputs: dict) -> dict:
        q, k, v = inputs["Q"], inputs["K"].transpose(-1, -2), inputs["V"]
        if name == "qknorm_gqa":
            q, k = rms(q) * 0.125, rms(k)
        return {"O": F.scaled_dot_product_attention(q, k, v, scale=1.0)}

    return run


FLUSH_BYTES = 256 << 20  # more than any L2 (H100 50 MB, H200 60 MB)
_FLUSH: list = []


def cuda_samples(fn: Callable[[], Any], repeat: int, flush: bool = False) -> list[float]:
    """``repeat`` CUDA-event times of ``fn()`` in microseconds, sorted; with ``flush`` the L2
    cache is flushed (a 256 MiB buffer written) before each timed call, as KernelBench does."""
    import torch

    if flush and not _FLUSH:
        _FLUSH.append(torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda"))
    times = []
    for _ in range(repeat):
        if flush:
            _FLUSH[0].zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)


def time_cuda(fn: Callable[[], Any], warmup: int = 10, repeat: int = 50,
              flush: bool = False) -> float:
    """Median time of ``fn()`` in microseconds, with CUDA events, after ``warmup`` calls
    (``flush``: the L2 cache flushed before each timed call)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = cuda_samples(fn, repeat, flush)
    return times[len(times) // 2]


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (read + write)."""
    import torch

    a = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    us = time_cuda(lambda: b.copy_(a), warmup=3, repeat=20)
    return 2 * a.numel() * 2 / (us * 1e-6)


def rel_err(a, b) -> float:
    """Norm-wise relative error of ``a`` against ``b``, computed in float64."""
    import torch
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b)) / max(float(torch.linalg.vector_norm(b)),
                                                        math.ulp(1.0))
