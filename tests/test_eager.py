"""The eager predictor: what PyTorch eager launches for a module, at full size, and its price."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mirage_py.eager import (DEFAULT, EagerConstants, GemmShape, KernelClass,  # noqa: E402
                             eager_kernels, eager_time, trace_module)
from mirage_py.errors import EagerTraceError  # noqa: E402
from mirage_py.targets import get_target  # noqa: E402

nn = torch.nn


class LinearGelu(nn.Module):
    def __init__(self, n=64, m=32):
        super().__init__()
        self.fc = nn.Linear(n, m)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x)) * 2.0


class NormMlpSoftmax(nn.Module):
    def __init__(self, n=64):
        super().__init__()
        self.ln = nn.LayerNorm(n)
        self.fc1, self.fc2 = nn.Linear(n, 2 * n), nn.Linear(2 * n, n)

    def forward(self, x):
        h = torch.tanh(self.fc1(self.ln(x)))
        return torch.softmax(self.fc2(h), dim=-1) + x


class LogSumExp(nn.Module):
    def forward(self, x):
        return torch.logsumexp(x @ x.transpose(0, 1), dim=1, keepdim=True).relu()


class BatchedAttention(nn.Module):
    def forward(self, q, k, v):
        s = torch.matmul(q, k.transpose(-2, -1)) / 8.0
        return torch.matmul(torch.softmax(s, dim=-1), v).sum(dim=1)


CASES = [(LinearGelu, [(8, 64)]), (NormMlpSoftmax, [(4, 16, 64)]), (LogSumExp, [(32, 16)]),
         (BatchedAttention, [(2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 8)])]


def _predicted(module, shapes):
    with torch.device("meta"):
        m = module()
        xs = [torch.randn(*s) for s in shapes]
    return eager_kernels(trace_module(m, xs))


def _profiled(module, shapes, names):
    """The aten calls ``torch.profiler`` records on the CPU whose names are ``names``, outermost
    only (a call inside another such call is part of it), in order."""
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    m = module()
    xs = [torch.randn(*s) for s in shapes]
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        m(*xs)
    out = []
    for e in prof.events():
        name = e.name.removeprefix("aten::")
        if name not in names:
            continue
        p, inside = e.cpu_parent, False
        while p is not None:
            inside |= p.name.removeprefix("aten::") in names
            p = p.cpu_parent
        if not inside:
            out.append((e.time_range.start, name))
    return [n for _, n in sorted(out)]


@pytest.mark.parametrize("module,shapes", CASES, ids=[c[0].__name__ for c in CASES])
def test_kernel_list_is_what_pytorch_eager_calls(module, shapes):
    """The predictor's kernels, traced on the meta device, are the aten calls torch.profiler
    sees eager PyTorch make on the CPU (the CUDA path makes the same calls for these operators:
    cuBLAS for addmm / mm / bmm, one kernel for each element-wise operator, softmax and layer
    norm; logsumexp's shared implementation in nine steps)."""
    ks = _predicted(module, shapes)
    ops = [k.op.split(".")[-1] for k in ks]
    assert ops == _profiled(module, shapes, set(ops))
    assert len(ops) == len(ks) > 0


def test_kernel_lists_of_known_modules():
    assert [k.op for k in _predicted(LinearGelu, [(8, 64)])] == ["addmm", "gelu", "mul"]
    lse = [k.op for k in _predicted(LogSumExp, [(32, 16)])]
    assert lse[0] == "mm" and lse[-1] == "relu" and len(lse) == 11
    assert lse[1:-1] == ["logsumexp." + s for s in ("amax", "abs", "eq", "masked_fill_", "sub",
                                                   "exp_", "sum", "log_", "add_")]


def test_full_size_traces_on_the_meta_device_with_data_edges():
    """A 16384 x 16384 linear layer on 8192 rows (2 GiB of weights): nothing is allocated, the
    GEMM has its full flops and the activation reads the GEMM's output."""
    with torch.device("meta"):
        m = LinearGelu(16384, 16384)
        x = torch.randn(8192, 16384)
    calls = trace_module(m, [x])
    ks = eager_kernels(calls)
    gemm = ks[0]
    assert gemm.kind is KernelClass.GEMM and gemm.flops == 2.0 * 8192 * 16384 * 16384
    assert gemm.write_bytes == 8192 * 16384 * 4
    assert ks[1].sources == (0,) and ks[2].sources == (1,)
    assert all(k.call < len(calls) for k in ks)


def test_gemms_carry_their_shape_and_operand_layout():
    """What cuBLAS picks its kernel by: nn.Linear is (rows x in) by weight.t() -- B transposed
    -- with the bias epilogue; ``A.T @ B`` has A transposed; a bmm its batch; the second
    GEMM of attention takes ``k.transpose`` as B."""
    gemm = _predicted(LinearGelu, [(8, 64)])[0].gemm
    assert gemm == GemmShape(1, 8, 32, 64, False, True, True)
    assert GemmShape.from_json(gemm.to_json()) == gemm

    class TransposedA(nn.Module):
        def forward(self, a, b):
            return torch.matmul(a.T, b)
    assert _predicted(TransposedA, [(24, 16), (24, 8)])[0].gemm == \
        GemmShape(1, 16, 8, 24, True, False, False)
    qk, pv = [k.gemm for k in _predicted(BatchedAttention, [(2, 4, 16, 8)] * 3)
              if k.kind is KernelClass.GEMM]
    assert (qk.batch, qk.m, qk.n, qk.k, qk.b_transposed) == (8, 16, 16, 8, True)
    assert (pv.batch, pv.m, pv.n, pv.k, pv.b_transposed) == (8, 16, 8, 16, False)
    assert all(k.gemm is None for k in _predicted(LogSumExp, [(32, 16)])[1:])


def test_bias_that_is_not_a_vector_costs_a_copy_kernel():
    class AddMM(nn.Module):
        def forward(self, b, x, w):
            return torch.addmm(b, x, w)
    ks = _predicted(AddMM, [(16, 32), (16, 8), (8, 32)])
    assert [k.kind for k in ks] == [KernelClass.COPY, KernelClass.GEMM]


def test_convolutions_use_tf32_where_the_part_has_it():
    """cuDNN runs float32 convolutions on TF32 tensor cores by PyTorch's default (not on a T4);
    the bias is a kernel of its own."""
    class Conv(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(64, 128, 3)

        def forward(self, x):
            return self.c(x)
    with torch.device("meta"):
        m, x = Conv(), torch.randn(64, 64, 128, 128)
    calls = trace_module(m, [x])
    conv, bias = eager_kernels(calls)
    assert conv.kind is KernelClass.CONV and conv.tensor_core and bias.op == "convolution.bias"
    assert conv.flops == 2.0 * 64 * 128 * 126 * 126 * 64 * 9
    assert not eager_kernels(calls, tf32=False)[0].tensor_core
    a100 = eager_time([conv], 1, "a100").gpu_us
    assert a100 == pytest.approx(2.5 + 1e6 * conv.flops / get_target("a100").tf32_flops, rel=1e-3)


def test_eager_time_is_host_bound_for_many_small_kernels_and_gpu_bound_for_big_ones():
    small = _predicted(NormMlpSoftmax, [(4, 16, 64)])
    t = eager_time(small, 30, "h100")
    assert t.us == pytest.approx(t.host_us) and t.host_us > t.gpu_us
    with torch.device("meta"):
        x = torch.randn(8192, 65536)
    big = eager_kernels(trace_module(torch.nn.ReLU(), [x]))
    t = eager_time(big, 1, "h100")
    assert t.us == pytest.approx(2.5 + 1e6 * 2 * x.numel() * 4 / 3.0e12 + 6.0, rel=1e-3)
    slower = eager_time(big, 1, "h100", EagerConstants(mem_eff=0.5))
    assert slower.gpu_us - 2.5 == pytest.approx(2 * (t.gpu_us - 2.5))
    assert DEFAULT == EagerConstants.from_dict(DEFAULT.as_dict())


def test_untraceable_module_raises_a_typed_error():
    class Item(nn.Module):
        def forward(self, x):
            return x * x.sum().item()
    with torch.device("meta"):
        x = torch.randn(4)
    with pytest.raises(EagerTraceError, match="Item"):
        trace_module(Item(), [x], name="Item")
