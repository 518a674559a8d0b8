"""Trace what PyTorch eager dispatches for a module's forward, at full size, on the meta device.

A :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every aten call after autograd
and the composite-implicit decompositions (``linear`` arrives as ``t`` + ``addmm``, ``reshape``
as ``view`` or ``clone``), that is the calls that reach a backend kernel, in the order eager
PyTorch makes them. On the meta device nothing is allocated, so KernelBench's full sizes (a
4096 x 393216 softmax) trace in milliseconds. Each call keeps its tensors' shapes, dtypes and
contiguity, its non-tensor arguments, and which earlier call produced each input tensor (views
and in-place calls pass their producer on), so a later stage can build the operator graph.

The module runs as it is (training or eval mode, as the caller left it) under ``no_grad``:
KernelBench measured its models in their default training mode under ``torch.no_grad()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import EagerTraceError

INPUT = -1  # producer of a tensor no traced call made (a program input, parameter or buffer)


@dataclass(frozen=True)
class TensorMeta:
    """What the pricing needs of one tensor."""

    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the prefix: "float32", "int64", "bool"
    itemsize: int
    contiguous: bool

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class AtenCall:
    """One aten call as eager PyTorch dispatches it to a backend."""

    index: int
    op: str  # overload packet name: "addmm", "convolution", "relu_"
    inputs: tuple[TensorMeta, ...]  # tensor arguments, in order (lists flattened)
    outputs: tuple[TensorMeta, ...]
    args: tuple[Any, ...]  # positional arguments, tensors as None, lists of tensors as ()
    sources: tuple[int, ...]  # per input: the index of the call that produced it, or INPUT
    inplace_of: int | None = None  # output aliases input k (in-place or out= call, or a view)


def _meta(t: Any) -> TensorMeta:
    return TensorMeta(tuple(int(d) for d in t.shape), str(t.dtype).removeprefix("torch."),
                      int(t.element_size()), bool(t.is_contiguous()))


def _plain(a: Any, torch: Any) -> Any:
    """A non-tensor argument as plain data (tensors and lists of them become None / ())."""
    if isinstance(a, torch.Tensor):
        return None
    if isinstance(a, (list, tuple)):
        if any(isinstance(x, torch.Tensor) for x in a):
            return ()
        return tuple(_plain(x, torch) for x in a)
    if isinstance(a, (bool, int, float, str)) or a is None:
        return a
    return str(a)


def _tensors(xs: Any, torch: Any) -> list:
    out = []
    for x in xs:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out.extend(_tensors(x, torch))
    return out


class _TooLong(Exception):
    pass


def trace_module(module: Any, inputs: tuple | list, *, name: str = "module",
                 max_calls: int | None = None) -> list[AtenCall]:
    """The aten calls of ``module(*inputs)`` (tensors on the meta device), in dispatch order.
    ``max_calls``: give up (``EagerTraceError``) past that many calls -- an LSTM on the meta
    device unrolls into tens of thousands of per-step calls where CUDA runs a few cuDNN
    kernels."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[AtenCall] = []
    producer: dict[int, int] = {}  # id of a storage-owning or view tensor -> producing call
    keep: list = []  # tensors whose ids are keys above: alive, so that ids are not reused

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            ins = _tensors(list(args) + list(kwargs.values()), torch)
            outs = _tensors(out if isinstance(out, (list, tuple)) else [out], torch)
            k = len(calls)
            alias = None
            for j, t in enumerate(ins):
                if any(o is t for o in outs):  # in-place or out=: the output is this input
                    alias = j
                    break
            schema = getattr(func, "_schema", None)
            if alias is None and schema is not None and outs and ins and any(
                    r.alias_info is not None and not r.alias_info.is_write
                    for r in schema.returns):
                alias = 0  # a view of its first argument
            calls.append(AtenCall(
                k, func.overloadpacket.__name__, tuple(_meta(t) for t in ins),
                tuple(_meta(t) for t in outs), tuple(_plain(a, torch) for a in args),
                tuple(producer.get(id(t), INPUT) for t in ins), alias))
            for t in outs:
                producer[id(t)] = k
                keep.append(t)
            if max_calls is not None and len(calls) > max_calls:
                raise _TooLong()
            return out

    try:
        with torch.no_grad(), Recorder():
            module(*inputs)
    except _TooLong:
        raise EagerTraceError(f"{name}: more than {max_calls} aten calls") from None
    except Exception as e:
        where = f" at call {len(calls)} (after aten.{calls[-1].op})" if calls else ""
        raise EagerTraceError(f"{name}: the eager run could not be traced on the meta "
                              f"device{where}: {type(e).__name__}: {str(e)[:300]}") from e
    return calls
