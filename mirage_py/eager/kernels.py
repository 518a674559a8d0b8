"""The kernels eager PyTorch launches on a CUDA GPU for a traced sequence of aten calls.

One aten call that reaches a backend launches, on CUDA, what its CUDA implementation launches
(PyTorch 2.5, float32, the library defaults KernelBench measured with):

* **no kernel**: views and aliases (``view``, ``t``, ``transpose``, ``expand``, ``select``,
  ``unbind``, ...), allocations (``empty``, ``empty_strided``), ``detach``, a ``dropout`` that is
  off (eval mode or p = 0: PyTorch returns its input), ``clone`` / ``contiguous`` of nothing;
* **GEMM** (cuBLAS, float32 on CUDA cores: PyTorch leaves TF32 off for matmuls): ``mm``, ``bmm``,
  ``addmm`` (one kernel when the bias is a contiguous vector, cuBLASLt's bias epilogue;
  otherwise the bias is copied into the output first: two), ``baddbmm``, ``addmv``, ``dot``;
  ``2 m n k`` flops;
* **convolution** (cuDNN; TF32 on parts that have it: PyTorch's default
  ``torch.backends.cudnn.allow_tf32 = True``): ``2 x (output elements, or input elements when
  transposed) x weight elements / weight.shape[0]`` flops, and a second kernel adding the bias;
* **normalisations**: ``native_layer_norm`` one kernel; ``native_batch_norm`` one kernel in
  eval mode, two in training mode (statistics, then normalise); ``native_group_norm`` three
  (row moments, fused parameters, apply);
* **softmax** / log-softmax: one kernel, which reads its input once when a row fits in shared
  memory (``SOFTMAX_SMEM_ROW`` bytes) and three times (max, sum, write) otherwise;
* layer norm, softmax and group norm's moments give each row to one block: their ``rows``
  bound how many SMs stream (16 rows of 4 M elements keep 16 blocks busy, whatever the GPU);
* everything else -- element-wise, reductions, ``cat``, copies, pooling, scans, fills, random
  numbers -- one kernel reading its tensor inputs and writing its outputs.

Composite-explicit operators whose CUDA kernel is the shared implementation (``logsumexp`` as
``amax``, ``abs``, ``eq``, ``masked_fill_``, ``sub``, ``exp_``, ``sum``, ``log_``, ``add_``;
``linalg_vector_norm`` is one reduction) are expanded here as PyTorch runs them; the tests
compare these lists with what ``torch.profiler`` records for the same modules on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from .trace import INPUT, AtenCall, TensorMeta

SOFTMAX_SMEM_ROW = 48 * 1024  # bytes: a softmax row this size or less is read once


class KernelClass(Enum):
    """What bounds a library kernel, for pricing and as a learned model's feature."""

    GEMM = "gemm"
    CONV = "conv"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    NORM = "norm"
    SOFTMAX = "softmax"
    COPY = "copy"  # clone, cat, contiguous copies, fills and random numbers
    POOL = "pool"
    SCAN = "scan"
    OTHER = "other"


@dataclass(frozen=True)
class GemmShape:
    """A GEMM as cuBLAS sees it: ``batch`` products of (m x k) by (k x n), and which operands
    arrive transposed (a non-contiguous operand: ``x.T``, or ``nn.Linear``'s weight, which
    ``addmm`` gets as ``weight.t()``). cuBLAS picks its kernel by these, and its efficiency
    differs by shape and layout (KernelBench's 4096^3-flop float32 products on an H100 PCIe:
    3.40 ms with A transposed, 4.90 ms with B transposed)."""

    batch: int
    m: int
    n: int
    k: int
    a_transposed: bool = False
    b_transposed: bool = False
    bias: bool = False  # cuBLASLt's bias epilogue (addmm with a bias vector): another kernel

    def to_json(self) -> list:
        return [self.batch, self.m, self.n, self.k, int(self.a_transposed),
                int(self.b_transposed), int(self.bias)]

    @classmethod
    def from_json(cls, d: list) -> "GemmShape":
        b, m, n, k, at, bt, bias = d
        return cls(int(b), int(m), int(n), int(k), bool(at), bool(bt), bool(bias))


@dataclass(frozen=True)
class EagerKernel:
    """One kernel eager PyTorch launches."""

    op: str  # the aten call it comes from ("addmm"; "logsumexp.amax" for an expanded step)
    kind: KernelClass
    read_bytes: float
    write_bytes: float
    flops: float  # GEMM / convolution multiply-adds x 2; element-wise operations otherwise
    tensor_core: bool = False  # TF32 tensor cores (cuDNN convolutions on sm_80+)
    call: int = 0  # index of the aten call in the trace
    sources: tuple[int, ...] = ()  # indices (in the kernel list) of kernels it reads from
    rows: int = 0  # a row-per-block kernel's rows (norms, softmax); 0: spreads over the GPU
    gemm: GemmShape | None = None  # a GEMM's shape and operand layout

    @property
    def bytes(self) -> float:
        return self.read_bytes + self.write_bytes


NO_KERNEL = frozenset((
    "view", "_unsafe_view", "_reshape_alias", "reshape", "t", "transpose", "permute", "expand",
    "expand_as", "squeeze", "unsqueeze", "select", "slice", "as_strided", "alias", "detach",
    "unbind", "split", "unsafe_split", "split_with_sizes", "unsafe_split_with_sizes", "chunk",
    "narrow", "diagonal", "unfold", "lift_fresh", "view_as", "movedim", "flatten", "unflatten",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_",
    "_local_scalar_dense", "is_same_size", "result_type", "numpy_T", "real", "view_as_real",
    "_has_compatible_shallow_copy_type", "set_", "sym_size", "sym_stride", "sym_numel",
    "size", "stride", "dim", "contiguous", "clone_if_needed", "_to_copy_if_needed",
    "resolve_conj", "resolve_neg", "conj", "_conj", "_neg_view", "prim_layout",
))

REDUCTIONS = frozenset((
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "var", "std",
    "var_mean", "std_mean", "norm", "linalg_vector_norm", "any", "all", "aminmax", "count_nonzero",
    "nll_loss_forward", "nll_loss2d_forward", "_euclidean_dist", "median", "mode", "kthvalue",
))
SCANS = frozenset(("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "sort", "topk"))
POOLS = frozenset(("max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool2d",
                   "avg_pool3d", "avg_pool1d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d",
                   "adaptive_avg_pool3d", "_adaptive_avg_pool3d", "adaptive_max_pool2d",
                   "adaptive_max_pool3d", "max_pool1d", "max_pool2d", "max_pool3d",
                   "max_unpool2d", "max_unpool3d"))
COPIES = frozenset(("clone", "copy_", "_to_copy", "cat", "stack", "zeros", "zeros_like", "ones",
                    "ones_like", "full", "full_like", "fill_", "zero_", "new_zeros", "new_ones",
                    "new_full", "arange", "randn", "rand", "randn_like", "rand_like", "normal_",
                    "uniform_", "bernoulli_", "native_dropout", "flip", "roll", "repeat",
                    "index_select", "gather", "scatter", "scatter_add", "embedding",
                    "constant_pad_nd", "tril", "triu", "diag_embed", "masked_select", "index",
                    "_unsafe_index", "lift_fresh_copy", "pixel_shuffle", "channel_shuffle"))
# CUDA-core operations per output element of element-wise operators that are several
ELEMENTWISE_COST = {"gelu": 8, "mish": 7, "silu": 4, "softplus": 5, "elu": 4, "selu": 4,
                    "hardswish": 4, "hardsigmoid": 3, "sigmoid": 4, "tanh": 4, "erf": 6,
                    "exp": 2, "log": 2, "pow": 3, "sqrt": 2, "rsqrt": 2, "xlogy": 4,
                    "smooth_l1_loss": 4, "huber_loss": 4, "leaky_relu": 2, "hardtanh": 2,
                    "clamp": 2, "div": 2, "logit": 3, "log_sigmoid_forward": 5}


def _out_bytes(c: AtenCall) -> float:
    return float(sum(t.nbytes for t in c.outputs))


def _in_bytes(c: AtenCall) -> float:
    return float(sum(t.nbytes for t in c.inputs))


def _elems(c: AtenCall) -> float:
    return float(max((t.numel for t in c.outputs), default=0) or
                 max((t.numel for t in c.inputs), default=0))


def _k(c: AtenCall, kind: KernelClass, read: float, write: float, flops: float = 0.0,
       op: str | None = None, tc: bool = False, rows: int = 0,
       gemm: GemmShape | None = None) -> EagerKernel:
    return EagerKernel(op or c.op, kind, read, write, flops, tc, c.index, (), rows, gemm)


def _gemm_shape(a: TensorMeta, b: TensorMeta, out: TensorMeta) -> GemmShape:
    m = a.shape[-2] if len(a.shape) >= 2 else 1
    k = a.shape[-1] if a.shape else 1
    n = b.shape[-1] if len(b.shape) >= 2 else 1
    batch = max(out.numel // max(m * n, 1), 1)
    return GemmShape(batch, m, n, k, len(a.shape) >= 2 and not a.contiguous,
                     len(b.shape) >= 2 and not b.contiguous)


def _gemm(c: AtenCall) -> list[EagerKernel]:
    ins = c.inputs
    op = c.op.rstrip("_")
    if op in ("mm", "bmm"):
        a, b = ins[0], ins[1]
    elif op in ("addmm", "baddbmm", "addmv", "addbmm"):
        a, b = ins[1], ins[2]
    else:  # dot, mv, matmul leftovers: a vector product
        a, b = ins[0], ins[1]
    out = c.outputs[0] if c.outputs else a
    k = a.shape[-1] if a.shape else 1
    flops = 2.0 * out.numel * k
    read = a.nbytes + b.nbytes
    shape = _gemm_shape(a, b, out)
    if op in ("addmm", "baddbmm", "addmv", "addbmm"):
        bias = ins[0]
        fused = op == "addmm" and len(bias.shape) == 1 and bias.contiguous and \
            len(out.shape) == 2 and min(out.shape) > 1
        if fused:  # cuBLASLt with the bias epilogue
            return [_k(c, KernelClass.GEMM, read + bias.nbytes, out.nbytes, flops,
                       gemm=replace(shape, bias=True))]
        # the bias (broadcast) is copied into the output, then the GEMM accumulates onto it
        return [_k(c, KernelClass.COPY, bias.nbytes, out.nbytes, 0.0, f"{c.op}.bias"),
                _k(c, KernelClass.GEMM, read + out.nbytes, out.nbytes, flops, gemm=shape)]
    return [_k(c, KernelClass.GEMM, read, out.nbytes, flops, gemm=shape)]


def _conv(c: AtenCall, tf32: bool) -> list[EagerKernel]:
    x, w = c.inputs[0], c.inputs[1]
    out = c.outputs[0]
    transposed = bool(c.args[6]) if len(c.args) > 6 and isinstance(c.args[6], bool) else False
    per = w.numel / max(w.shape[0], 1)
    flops = 2.0 * (x.numel if transposed else out.numel) * per
    ks = [_k(c, KernelClass.CONV, x.nbytes + w.nbytes, out.nbytes, flops, tc=tf32)]
    if len(c.inputs) > 2:  # the bias, added by a kernel of its own after cuDNN's
        b = c.inputs[2]
        ks.append(_k(c, KernelClass.ELEMENTWISE, out.nbytes + b.nbytes, out.nbytes,
                     float(out.numel), f"{c.op}.bias"))
    return ks


def _norm(c: AtenCall) -> list[EagerKernel]:
    x = c.inputs[0]
    y = c.outputs[0].nbytes if c.outputs else x.nbytes
    params = sum(t.nbytes for t in c.inputs[1:])
    n = float(x.numel)
    rows = c.outputs[1].numel if len(c.outputs) > 1 else 0  # the per-row mean: one per block
    if c.op == "native_group_norm":
        return [_k(c, KernelClass.REDUCTION, x.nbytes, 0.0, 2 * n, "native_group_norm.moments",
                   rows=rows),
                _k(c, KernelClass.ELEMENTWISE, params, params, 0.0,
                   "native_group_norm.params"),
                _k(c, KernelClass.NORM, x.nbytes + params, y, 2 * n)]
    if c.op in ("native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm") and \
            _training(c):
        return [_k(c, KernelClass.REDUCTION, x.nbytes, params, 2 * n,
                   f"{c.op}.statistics"),
                _k(c, KernelClass.NORM, x.nbytes + params, y, 2 * n)]
    if c.op == "native_layer_norm":
        return [_k(c, KernelClass.NORM, x.nbytes + params, y, 4 * n, rows=rows)]
    return [_k(c, KernelClass.NORM, x.nbytes + params, y, 4 * n)]


def _training(c: AtenCall) -> bool:
    """The ``training`` flag of a batch-norm call (the first bool among its arguments)."""
    for a in c.args:
        if isinstance(a, bool):
            return a
    return False


def _softmax(c: AtenCall) -> list[EagerKernel]:
    x = c.inputs[0]
    dim = c.args[1] if len(c.args) > 1 and isinstance(c.args[1], int) else -1
    row = x.shape[dim] * x.itemsize if x.shape else x.itemsize
    passes = 1 if row <= SOFTMAX_SMEM_ROW else 3
    rows = x.numel // x.shape[dim] if x.shape and x.shape[dim] else 0
    return [_k(c, KernelClass.SOFTMAX, passes * x.nbytes, _out_bytes(c), 4.0 * x.numel,
               rows=rows)]


def _logsumexp(c: AtenCall) -> list[EagerKernel]:
    """PyTorch's logsumexp: amax, then (maxes.abs() == inf) masked to 0, (x - max).exp_(),
    sum, log_, add_ -- nine kernels (the shared CPU / CUDA implementation)."""
    x = c.inputs[0]
    out = _out_bytes(c)
    n = float(x.numel)
    steps = [("amax", KernelClass.REDUCTION, x.nbytes, out, n),
             ("abs", KernelClass.ELEMENTWISE, out, out, 0.0),
             ("eq", KernelClass.ELEMENTWISE, out, out / 4, 0.0),
             ("masked_fill_", KernelClass.ELEMENTWISE, out + out / 4, out, 0.0),
             ("sub", KernelClass.ELEMENTWISE, x.nbytes + out, x.nbytes, n),
             ("exp_", KernelClass.ELEMENTWISE, x.nbytes, x.nbytes, 2 * n),
             ("sum", KernelClass.REDUCTION, x.nbytes, out, n),
             ("log_", KernelClass.ELEMENTWISE, out, out, 0.0),
             ("add_", KernelClass.ELEMENTWISE, 2 * out, out, 0.0)]
    return [_k(c, kind, r, w, f, f"logsumexp.{name}") for name, kind, r, w, f in steps]


def _dropout_off(c: AtenCall) -> bool:
    return c.op in ("dropout", "feature_dropout", "alpha_dropout")


def call_kernels(c: AtenCall, tf32: bool = True) -> list[EagerKernel]:
    """The kernels one aten call launches on CUDA (see the module docstring). ``tf32``: the
    part has TF32 tensor cores (cuDNN uses them for float32 convolutions by default)."""
    op = c.op
    if op in NO_KERNEL or _dropout_off(c):
        return []
    if op in ("mm", "bmm", "addmm", "baddbmm", "addmv", "addbmm", "dot", "mv", "vdot"):
        return _gemm(c)
    if op in ("convolution", "_convolution", "cudnn_convolution",
              "cudnn_convolution_transpose", "convolution_overrideable"):
        return _conv(c, tf32)
    if op in ("native_layer_norm", "native_batch_norm", "_native_batch_norm_legit",
              "_native_batch_norm_legit_no_training", "native_group_norm", "cudnn_batch_norm"):
        return _norm(c)
    if op in ("_softmax", "_log_softmax", "softmax", "log_softmax", "_safe_softmax"):
        return _softmax(c)
    if op == "logsumexp":
        return _logsumexp(c)
    read, write = _in_bytes(c), _out_bytes(c)
    if op in REDUCTIONS:
        return [_k(c, KernelClass.REDUCTION, read, write, float(max(
            (t.numel for t in c.inputs), default=0)))]
    if op in SCANS:
        return [_k(c, KernelClass.SCAN, read, write, _elems(c))]
    if op in POOLS:
        return [_k(c, KernelClass.POOL, read, write, float(max(
            (t.numel for t in c.inputs), default=0)))]
    if op in COPIES:
        return [_k(c, KernelClass.COPY, read, write)]
    if not c.outputs and not c.inputs:
        return []
    per = ELEMENTWISE_COST.get(op.rstrip("_"), 1)
    return [_k(c, KernelClass.ELEMENTWISE, read, write, per * _elems(c))]


def eager_kernels(calls: list[AtenCall], tf32: bool = True) -> list[EagerKernel]:
    """The kernels of a trace, in launch order, each with the kernels it reads from (through
    views and aliases: a kernel reading a view reads what produced the viewed tensor)."""
    last: dict[int, int] = {}  # call index -> index of the last kernel it launched
    out: list[EagerKernel] = []
    for c in calls:
        srcs = []
        for s in c.sources:
            while s != INPUT and s not in last:
                s = _first_source(calls[s])
            if s != INPUT and last[s] not in srcs:
                srcs.append(last[s])
        ks = call_kernels(c, tf32)
        for j, k in enumerate(ks):
            prev = (len(out) - 1,) if j else ()  # steps of one call run in order
            out.append(EagerKernel(k.op, k.kind, k.read_bytes, k.write_bytes, k.flops,
                                   k.tensor_core, c.index, tuple(srcs) + prev, k.rows,
                                   k.gemm))
        if ks:
            last[c.index] = len(out) - 1
    return out


def _first_source(c: AtenCall) -> int:
    """What a call that launched nothing (a view) passes on: its first input's producer."""
    return c.sources[0] if c.sources else INPUT
