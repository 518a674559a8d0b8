"""mp.from_torch: capture (torch.export, make_fx where export fails), the aten mapping, names,
typed errors. Every case compares the program's float64 reference (``Program.evaluate``) with
eager PyTorch in float32 on the same inputs; nothing here searches (test_torch_compile.py does).
"""

import math
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import mirage_py as mp  # noqa: E402
from mirage_py.errors import MirageError, TorchCaptureError, UnsupportedOperatorError  # noqa: E402


def _check(fn, *args, rtol=1e-4, atol=1e-4, **kwargs):
    """from_torch(fn) evaluated in float64 equals fn in eager PyTorch; returns the program."""
    p = mp.from_torch(fn, args, kwargs or None)
    with torch.no_grad():
        want = fn(*args, **kwargs)
    wants = list(want) if isinstance(want, (tuple, list)) else [want]
    got = p.evaluate(p.bind(fn, *args, **kwargs))
    assert len(got) == len(wants)
    for i, w in enumerate(wants):
        g = got[f"out{i}"]
        assert g.shape == tuple(w.shape), (g.shape, w.shape)
        np.testing.assert_allclose(g, w.double().numpy(), rtol=rtol, atol=atol)
    return p


def _r(*shape, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed + sum(shape))
    x = torch.randn(*shape, generator=g)
    return x.abs() + 0.1 if positive else x


def _causal(s):
    return torch.ones(s, s, dtype=torch.bool).tril()


# name -> (function, inputs)
CASES = {
    "add_sub_scalars": (lambda x, y: (x + 2) * (y - 0.5) - 3 / (x * x + 1) + (1 - y), (4, 8), (4, 8)),
    "add_alpha_rsub": (lambda x, y: torch.add(x, y, alpha=2) + torch.rsub(x, 1.5), (4, 8), (8,)),
    "div_neg_reciprocal": (lambda x, y: -x / (y * y + 1) + torch.reciprocal(y * y + 2), (4, 8), (1, 8)),
    "exp_log_sqrt_rsqrt": (lambda x: torch.exp(x) + torch.log(x) + torch.sqrt(x) + torch.rsqrt(x),
                           ("pos", 4, 8)),
    "pow": (lambda x: x ** 3 + x.pow(0.5) + torch.pow(x, -1.5) + x ** 2, ("pos", 4, 8)),
    "activations": (lambda x: F.relu(x) + F.gelu(x) + F.gelu(x, approximate="tanh") + F.silu(x)
                    + torch.sigmoid(x) + torch.tanh(x) + F.softplus(x) + F.mish(x), (4, 8)),
    "activations2": (lambda x: F.leaky_relu(x, 0.2) + F.hardtanh(x, -0.5, 0.5) + torch.abs(x)
                     + torch.clamp(x, min=-0.3) + x.clamp(max=0.4) + F.relu6(x * 4)
                     + F.elu(x) + F.hardswish(x) + F.hardsigmoid(x), (4, 8)),
    "maximum_minimum": (lambda x, y: torch.maximum(x, y) - torch.minimum(x, 0.5 * y), (4, 8), (8,)),
    "reductions": (lambda x: (x.sum(-1, keepdim=True) + x.mean(dim=(0, 2), keepdim=True)
                              + x.amax(-1, keepdim=True) - x.amin(1, keepdim=True)
                              + torch.logsumexp(x, -1, keepdim=True)), (2, 4, 8)),
    "full_reductions": (lambda x: (x.sum(), x.mean(), x.max(-1).values, x.var(-1), x.std(0)),
                        (4, 8)),
    "softmax": (lambda x: F.softmax(x, -1) + F.log_softmax(x, dim=1) + torch.softmax(x, 0),
                (4, 8)),
    "layer_norm": (nn.LayerNorm(8), (2, 4, 8)),
    "group_norm": (nn.GroupNorm(2, 4), (2, 4, 6)),
    "batch_norm_eval": (nn.BatchNorm1d(4).eval(), (3, 4, 5)),
    "rms_norm": (nn.RMSNorm(8, eps=1e-6), (2, 4, 8)),
    "where_tril_mask": (lambda x: torch.where(_causal(6), x, torch.zeros(()) - 1e4), (2, 6, 6)),
    "masked_fill_triu": (lambda x: x.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1),
                                                 float("-inf")).softmax(-1), (2, 6, 6)),
    "arange_causal": (lambda x: x.masked_fill(torch.arange(6)[None, :] > torch.arange(6)[:, None],
                                              -1e9).softmax(-1), (1, 6, 6)),
    "tril_of_tensor": (lambda x: torch.tril(x) + torch.triu(x, 1) * 2, (3, 5, 5)),
    "cat_slice_split": (lambda x: torch.cat([x[..., 4:], -x[..., :4]], -1)
                        + sum(x.split(2, dim=-1)).repeat(1, 4)
                        + torch.cat(x.chunk(2, dim=0), 1)[:, :8].repeat(2, 1)
                        + x.narrow(1, 0, 8), (4, 8)),
    "stack_unbind_select": (lambda x: torch.stack(x.unbind(0), dim=1).sum(1) + x[1] + x[:, 2:3],
                            (3, 3)),
    "views": (lambda x: x.view(2, 4, 4).transpose(1, 2).reshape(8, 4).unsqueeze(0).squeeze(0)
              .t().flatten().unflatten(0, (4, 8)).permute(1, 0).expand(3, 8, 4).sum(0), (8, 4)),
    "expand_broadcast": (lambda x, b: x.unsqueeze(1).expand(4, 3, 8) * b.expand(4, 3, 8), (4, 8),
                         (3, 1)),
    "matmuls": (lambda a, b, c: torch.bmm(a, b) + a @ c + torch.matmul(a[0], b[1]), (2, 4, 8),
                (2, 8, 6), (8, 6)),
    "addmm_linear": (lambda x, w, b: torch.addmm(b, x, w.t(), beta=0.5, alpha=2)
                     + F.linear(x, w, b) + F.linear(x, w), (4, 8), (6, 8), (6,)),
    "matvec": (lambda m, v: m @ v + torch.mv(m, v), (4, 8), (8,)),
    "casts": (lambda x: (x.half().float() + x.to(torch.bfloat16).to(torch.float32)
                         + x.type_as(x)).detach().clone().contiguous(), (4, 8)),
    "constants": (lambda x: x + torch.ones(4, 8) * 2 + torch.zeros_like(x) + torch.full((8,), 0.5)
                  + torch.ones_like(x).cumsum(0)[0], (4, 8)),
    "dropout_eval": (nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.3), nn.GELU()).eval(), (4, 8)),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    (1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 6, 8)),
    "sdpa_bool_mask": (lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.ones(4, 6, dtype=torch.bool).tril(2), scale=0.3),
        (1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8)),
    "sdpa_float_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                        (1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8), (4, 6)),
    "sdpa_gqa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                enable_gqa=True),
                 (1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)),
    "instance_norm": (nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 4)),
    "batch_norm_no_running_stats": (nn.BatchNorm1d(4, track_running_stats=False), (6, 4)),
    "vector_norms": (lambda x: torch.linalg.vector_norm(x, dim=-1, keepdim=True)
                     + torch.norm(x, p=1, dim=0) + torch.linalg.vector_norm(x, ord=float("inf"))
                     + torch.linalg.vector_norm(x, ord=3, dim=1, keepdim=True), (4, 8)),
    "pooling": (lambda x: F.avg_pool2d(x, 2) + F.max_pool2d(x, 2)
                + F.avg_pool1d(x.flatten(2), 5).view(2, 3, 2, 2), (2, 3, 5, 4)),
    "pooling3d": (lambda x: F.avg_pool3d(x, 2) * F.max_pool3d(x, (1, 2, 2)).mean(2, keepdim=True),
                  (1, 2, 4, 4, 4)),
    # a patch projection (stride = kernel, ViT's patch embedding): patches @ weight
    "patch_conv2d": (nn.Conv2d(3, 8, 4, stride=4), (2, 3, 8, 12)),
    "patch_conv1d_no_bias": (nn.Conv1d(2, 5, 3, stride=3, bias=False), (1, 2, 9)),
    # an empty slice past a 4-wide rotary part is a constant that the concatenation skips
    "empty_slice_cat": (lambda x: torch.cat([x[..., :4] * 2, x[..., 4:]], -1), (2, 3, 4)),
    "additive_mask": (lambda s: (s + torch.full((5, 5), float("-inf")).triu(1)).softmax(-1),
                      (2, 5, 5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_operator_mapping_matches_eager(name):
    fn, *shapes = CASES[name]
    args = [_r(*s[1:], seed=i, positive=True) if s and s[0] == "pos" else _r(*s, seed=i)
            for i, s in enumerate(shapes)]
    torch.manual_seed(0)
    if isinstance(fn, nn.Module):
        fn.eval()
        for prm in fn.parameters():  # not the default ones and zeros
            prm.data = torch.randn_like(prm) * 0.5 + 1
        for b in fn.buffers():
            if b.dtype.is_floating_point:
                b.data = torch.rand_like(b) + 0.5
    # the reference treats a cast as the identity (float64 throughout); torch rounds to bfloat16
    _check(fn, *args, **({"rtol": 2e-2, "atol": 2e-2} if name == "casts" else {}))


def test_parameters_named_by_qualified_names_inputs_by_argument_names():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.gemm = nn.Linear(8, 16)
            self.norm = nn.LayerNorm(16)
            self.register_buffer("scale", torch.full((16,), 0.5))

        def forward(self, hidden, residual):
            return self.norm(self.gemm(hidden) + residual) * self.scale

    m = Block().eval()
    p = _check(m, _r(4, 8), _r(4, 16))
    assert [t.name for t in p.inputs] == ["gemm_weight", "gemm_bias", "norm_weight", "norm_bias",
                                          "scale", "hidden", "residual"]
    assert p.torch_names == {"gemm_weight": "gemm.weight", "gemm_bias": "gemm.bias",
                             "norm_weight": "norm.weight", "norm_bias": "norm.bias",
                             "scale": "scale", "hidden": "hidden", "residual": "residual"}
    assert [(t.shape, t.dtype) for t in p.inputs][:2] == [((16, 8), "float32"),
                                                           ((16,), "float32")]
    assert [o.name for o in p.outputs] == ["out0"] and p.outputs[0].shape == (4, 16)
    assert p.capture_method == "export"


def test_nested_and_keyword_inputs_are_named_by_path():
    def f(x, pair, *, bias):
        return x * pair[0] + pair[1] + bias
    p = mp.from_torch(f, (_r(3), (_r(3, seed=1), _r(3, seed=2))), {"bias": _r(3, seed=3)})
    assert [t.name for t in p.inputs] == ["x", "pair_0", "pair_1", "bias"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_dtypes_come_from_the_examples(dtype):
    dt = getattr(torch, dtype)
    m = nn.Linear(8, 8).to(dt)
    p = mp.from_torch(m, (_r(2, 8).to(dt),))
    assert {t.dtype for t in p.inputs} == {dtype} and p.outputs[0].dtype == dtype


def test_unsupported_operator_raises_typed_error_naming_it():
    class Sorter(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            return torch.sort(self.proj(x), dim=-1).values * 2

    with pytest.raises(UnsupportedOperatorError) as info:
        mp.from_torch(Sorter(), (_r(4, 8),))
    e = info.value
    assert isinstance(e, MirageError)
    assert e.op == "aten.sort.default" and e.node == "sort"
    assert "test_torch_frontend.py" in e.location and "torch.sort" in e.location
    assert "aten.sort.default" in str(e) and "mp.compile" in str(e)


def test_unsupported_operator_in_a_submodule_names_the_module_path():
    class Inner(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, dim=-1)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x + 1)

    with pytest.raises(UnsupportedOperatorError) as info:
        mp.from_torch(Outer(), (_r(4, 8),))
    assert info.value.op.startswith("aten.cumsum") and info.value.module == "inner"
    assert "in inner" in str(info.value)


def test_data_dependent_condition_is_unsupported():
    with pytest.raises(UnsupportedOperatorError, match="aten.gt.Scalar.*aten.where.self"):
        mp.from_torch(lambda x: torch.where(x > 0, x, 0.1 * x), (_r(4, 8),))


def test_float64_examples_raise_a_typed_error():
    with pytest.raises(UnsupportedOperatorError, match="float64") as info:
        mp.from_torch(nn.Linear(8, 8).double(), (_r(2, 8).double(),))
    assert info.value.op == "aten.linear.default"
    assert ".float()" in str(info.value) or "float16, bfloat16 and float32" in str(info.value)


class _Settings:  # not a pytree type: torch.export refuses it as an input
    def __init__(self, scale):
        self.scale = scale


def test_make_fx_captures_where_export_cannot():
    class Scaled(nn.Module):
        def forward(self, x, settings):
            return torch.relu(x) * settings.scale

    x = _r(4, 8)
    p = mp.from_torch(Scaled(), (x, _Settings(3.0)))
    assert p.capture_method == "make_fx"
    assert {t.op for t in p.nodes()} >= {"relu", "mul"}
    got = p.evaluate({"x": x.numpy()})["out0"]
    np.testing.assert_allclose(got, (torch.relu(x) * 3).numpy(), rtol=1e-6)


def test_data_dependent_control_flow_is_a_capture_error():
    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # neither export nor make_fx may burn the branch in
                return torch.relu(x)
            return x - 1

    with pytest.raises(TorchCaptureError, match="export failed.*make_fx failed"):
        mp.from_torch(Branchy(), (_r(4, 8),))


def test_llama_rmsnorm_from_transformers():
    tr = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    assert tr.__version__
    m = LlamaRMSNorm(64, eps=1e-6)
    m.weight.data = torch.randn(64)
    p = _check(m, _r(2, 5, 64))
    ops = [t.op for t in p.nodes()]
    assert "sqrt" in ops and "sum" in ops and p.torch_names["weight"] == "weight"


def test_module_that_mutates_a_buffer_cannot_be_one_program():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(4))

        def forward(self, x):
            self.n.add_(1)
            return x * 2

    with pytest.raises(UnsupportedOperatorError, match="mutates"):
        mp.from_torch(Counter(), (_r(4),))


def test_bad_example_inputs_are_option_errors():
    with pytest.raises(mp.OptionError):
        mp.from_torch(nn.Linear(2, 2), 3.5)


def test_decomposition_table_keeps_the_operators_we_map_whole():
    from mirage_py.frontend_torch import decomposition_table
    table = decomposition_table()
    aten = torch.ops.aten
    for op in (aten.linear.default, aten.scaled_dot_product_attention.default,
               aten.layer_norm.default, aten.softmax.int, aten.silu.default):
        assert op not in table
    assert aten.addcmul.default in table  # everything else still decomposes to core aten


def test_import_mirage_py_does_not_import_torch():
    code = "import sys, mirage_py as mp; assert 'torch' not in sys.modules; " \
           "assert callable(mp.from_torch) and callable(mp.compile)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_mask_matching():
    from mirage_py.frontend_torch.aten import match_mask
    mask, inv = match_mask(torch.ones(4, 6, dtype=torch.bool).tril(2), (2, 4, 6))
    assert not inv and mask.attr("offset") == 2 and mask.attr("window") == 0
    band = torch.ones(5, 5, dtype=torch.bool).tril() & ~torch.ones(5, 5, dtype=torch.bool).tril(-3)
    mask, inv = match_mask(band, (5, 5))
    assert mask.attr("window") == 3 and mask.attr("offset") == 0
    mask, inv = match_mask(torch.ones(5, 5, dtype=torch.bool).triu(1), (5, 5))
    assert inv and mask.attr("offset") == 0
    assert match_mask(torch.tensor([[True, False], [True, True]]).repeat(1, 1), (2, 2))[0] \
        is not None
    checker = torch.tensor([[True, False, True], [False, True, False], [True, False, True]])
    assert match_mask(checker, (3, 3)) is None
    mask, inv = match_mask(torch.tensor([[False, True], [True, False]]), (2, 2))
    assert inv and mask.attr("window") == 1  # the complement of the diagonal
    assert match_mask(torch.ones(3, 3, dtype=torch.bool), (3, 3)) == (None, True)


def test_constant_tensors_become_inputs_the_program_keeps():
    def f(x):  # positions from arange: a constant that is no scalar or mask
        return x * torch.arange(8).float() + torch.linspace(0, 1, 8)
    p = _check(f, _r(4, 8))
    consts = [n for n, src in p.torch_names.items() if src == "<constant>"]
    assert consts and set(consts) == set(p.constants)
    assert all(tuple(p.constants[n].shape) == (8,) for n in consts)


def test_infinite_fill_becomes_finite():
    p = mp.from_torch(lambda s: s.masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1),
                                              float("-inf")), (_r(3, 3),))
    consts = [t.attr("value") for t in p.nodes() if t.op == "const"]
    assert consts and all(math.isfinite(c) for c in consts)


def test_a_convolution_that_is_not_a_patch_projection_is_named():
    conv = nn.Conv2d(3, 4, 3, padding=1).eval()
    with pytest.raises(UnsupportedOperatorError, match=r"convolution.*padding \(1, 1\).*stride"):
        mp.from_torch(conv, (_r(1, 3, 8, 8),))


class _GemmBatchNorm(nn.Module):
    """KernelBench level2/41's shape of model: Gemm, BatchNorm, GELU, ReLU."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.gemm = nn.Linear(n_in, n_out)
        self.batch_norm = nn.BatchNorm1d(n_out)

    def forward(self, x):
        return torch.relu(F.gelu(self.batch_norm(self.gemm(x))))


def _with_running_stats(m):
    g = torch.Generator().manual_seed(3)
    for bn in (x for x in m.modules() if isinstance(x, nn.modules.batchnorm._BatchNorm)):
        with torch.no_grad():
            bn.running_mean.copy_(torch.rand(bn.num_features, generator=g) - 0.5)
            bn.running_var.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
            bn.weight.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
            bn.bias.copy_(torch.rand(bn.num_features, generator=g) - 0.5)
    return m


@pytest.mark.parametrize("make, shape", [(lambda: nn.BatchNorm2d(4), (2, 4, 5, 6)),
                                         (lambda: _GemmBatchNorm(8, 6), (5, 8))],
                         ids=["batchnorm2d", "gemm_batchnorm_gelu_relu"])
def test_a_module_built_on_the_meta_device_is_captured(make, shape):
    """KernelBench's problems are captured from modules built under ``torch.device("meta")``
    (benchmarks/published_gpu.py): BatchNorm's integer buffer ``num_batches_tracked`` has no
    values there to fold as an index ("Cannot copy out of meta tensor" before); it stays out of
    the program, which computes what the module with real weights does in eval mode."""
    with torch.device("meta"):
        meta = make().eval()
        p = mp.from_torch(meta, (torch.empty(*shape),))
    torch.manual_seed(0)
    real = _with_running_stats(make()).eval()
    x = _r(*shape)
    with torch.no_grad():
        want = real(x)
    assert {t.name for t in p.inputs} == {t.name for t in mp.from_torch(real, (x,)).inputs}
    got = p.evaluate(p.bind(real, x))["out0"]
    np.testing.assert_allclose(got, want.double().numpy(), rtol=1e-4, atol=1e-4)
