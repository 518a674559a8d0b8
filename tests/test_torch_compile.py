"""mp.compile and torch.compile(backend="mirage_py") on modules no one here wrote (transformers'
LlamaMLP, LlamaRMSNorm, LlamaAttention built from a small config with random weights, torch.nn
layers, F.scaled_dot_product_attention, F.softmax).

Examples are float16 unless a test says otherwise; the compiled module runs on the CPU (the μGraph
interpreter in GPU precision) and must equal eager PyTorch in float16 within
``|got - want| <= 2e-2 * max|want|``, and its regions must be fused (fewer kernels found than the
naive one kernel per operator). Each superopt is small (shapes of 8-64, one worker, a time budget;
the results database is a fresh file per test, see conftest.py).
"""

import functools
import sys
import tomllib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import mirage_py as mp  # noqa: E402
from mirage_py.errors import OptionError, UnsupportedOperatorError  # noqa: E402

OPTS = dict(workers=1, time_budget_s=15, progress=False)
F16 = torch.float16


def _rand(*shape, dtype=F16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _close(got, want, rel=2e-2):
    got, want = got.float(), want.float()
    assert got.shape == want.shape, (got.shape, want.shape)
    err = (got - want).abs().max().item()
    scale = want.abs().max().item()
    assert err <= rel * scale + 1e-3, f"max error {err:.3g} against max |want| {scale:.3g}"
    return err / scale


def _fused(cm, at_most=None):
    rows = cm.regions()
    assert rows and all(r["verified"] for r in rows), cm.report()
    naive = sum(r["kernels_naive"] for r in rows)
    found = sum(r["kernels"] for r in rows)
    assert found < naive, cm.report()
    if at_most is not None:
        assert found <= at_most, cm.report()
    return naive, found


def _llama_config(heads=4, kv_heads=2):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                   num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6)
    cfg._attn_implementation = "sdpa"
    return cfg


def _randomize(module, seed=0, scale=0.2):
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.data = (torch.randn(p.shape, generator=g) * scale).to(p.dtype)
    return module


# ---- torch.nn and torch.nn.functional -----------------------------------------------------

class LinearNormSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.gemm = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        return F.softmax(self.norm(self.gemm(x)) * 2.0, dim=-1)


def test_linear_layernorm_softmax():
    m = _randomize(LinearNormSoftmax()).to(F16).eval()
    for p in m.norm.parameters():
        p.data = p.data + 1 if p.dim() and p is m.norm.weight else p.data
    x = _rand(16, 64)
    cm = mp.compile(m, (x,), **OPTS)
    with torch.no_grad():
        _close(cm(x), m(x))
    naive, found = _fused(cm)
    assert found <= 3
    # parameters are program inputs named by their qualified names (weights transposed by torch)
    inputs = cm.regions()[0]["inputs"]
    assert {"gemm_weight_t", "gemm_bias", "norm_weight", "norm_bias", "x"} <= set(inputs)


def test_scaled_dot_product_attention_causal():
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    q, k, v = (_rand(2, 16, 16, seed=i) for i in range(3))
    cm = mp.compile(attention, (q, k, v), **OPTS)
    _close(cm(q, k, v), attention(q, k, v))
    # the transpose of k is a kernel of its own (block graphs hold no transposes), the rest fuses
    naive, found = _fused(cm, at_most=3)
    assert cm.regions()[0]["inputs"] == ["q", "k", "v"]


# ---- transformers' Llama modules ----------------------------------------------------------

def test_llama_mlp():
    from transformers.models.llama.modeling_llama import LlamaMLP
    m = _randomize(LlamaMLP(_llama_config())).to(F16).eval()
    x = _rand(1, 8, 64)
    cm = mp.compile(m, (x,), **OPTS)
    with torch.no_grad():
        _close(cm(x), m(x))
    assert _fused(cm) == (5, 1)  # gate, up, silu, product, down: one kernel


def test_llama_rmsnorm():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    m = LlamaRMSNorm(64, eps=1e-6).to(F16)
    m.weight.data = 1 + 0.1 * _rand(64, seed=3)
    x = _rand(2, 8, 64)
    cm = mp.compile(m, (x,), **OPTS)
    with torch.no_grad():
        _close(cm(x), m(x))
    _fused(cm, at_most=1)


class _Attention(nn.Module):
    """LlamaAttention called the way LlamaDecoderLayer calls it: rotary (cos, sin) from
    LlamaRotaryEmbedding, the cache given or not."""

    def __init__(self, cfg):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaAttention
        self.attn = LlamaAttention(cfg, layer_idx=0)
        self.cfg = cfg

    def forward(self, hidden, cos, sin, past_k=None, past_v=None):
        cache = None
        if past_k is not None:
            from transformers import DynamicCache
            cache = DynamicCache(config=self.cfg)
            cache.update(past_k, past_v, 0)
        return self.attn(hidden, (cos, sin), None, past_key_values=cache)[0]


def _rotary(cfg, positions, dtype=F16):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    rot = LlamaRotaryEmbedding(cfg)
    x = torch.zeros(1, len(positions), cfg.hidden_size)
    cos, sin = rot(x, torch.tensor([positions]))
    return cos.to(dtype), sin.to(dtype)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_llama_attention_prefill_causal_with_rotary():
    cfg = _llama_config(heads=4, kv_heads=2)
    m = _randomize(_Attention(cfg)).to(F16).eval()
    cos, sin = _rotary(cfg, list(range(8)))
    h = _rand(1, 8, 64)
    cm = mp.compile(m, (h, cos, sin), **OPTS)
    with torch.no_grad():
        _close(cm(h, cos, sin), m(h, cos, sin))
    _fused(cm)
    assert not cm.eager_ops()  # projections, rotary, causal SDPA (GQA) and o_proj: one region
    # the head split / merge live in the weights, laid out by torch (no transposes in between)
    inputs = cm.regions()[0]["inputs"]
    assert {"attn_q_proj_weight_t_heads", "attn_o_proj_weight_t_heads"} <= set(inputs)
    program = next(iter(cm.graphs.values())).regions[0].program
    assert sum(t.op == "transpose" for t in program.nodes()) == 1  # k transposed for q @ kT


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_llama_attention_decode_against_cached_positions():
    cfg = _llama_config(heads=4, kv_heads=2)
    m = _randomize(_Attention(cfg)).to(F16).eval()
    past = 5
    cos, sin = _rotary(cfg, [past])
    h = _rand(1, 1, 64)
    pk, pv = _rand(1, 2, past, 16, seed=1), _rand(1, 2, past, 16, seed=2)
    cm = mp.compile(m, (h, cos, sin, pk, pv), **OPTS)
    with torch.no_grad():
        _close(cm(h, cos, sin, pk, pv), m(h, cos, sin, pk, pv))
    _fused(cm)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_llama_for_causal_lm_captured_whole_embedding_included():
    from transformers import LlamaForCausalLM
    cfg = _llama_config(heads=4, kv_heads=2)
    cfg.vocab_size, cfg.num_hidden_layers = 128, 2
    lm = _randomize(LlamaForCausalLM(cfg)).to(F16).eval()

    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            return self.lm(input_ids=ids, use_cache=False).logits

    m = Logits()
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    cm = mp.compile(m, (ids,), **dict(OPTS, time_budget_s=30))
    with torch.no_grad():
        _close(cm(ids), m(ids))
    assert cm.eager_ops() == []  # the embedding lookup is a take of the token ids
    naive, found = _fused(cm)
    assert found * 2 < naive


class _Logits(nn.Module):
    """A causal LM's logits for token ids, without a cache."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, use_cache=False).logits


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_gpt_neox_fuses_within_a_hand_written_layers_kernels():
    """GPT-NeoX (issue #28): one QKV projection with bias viewed as (B, S, heads, 3 * head_dim)
    and transposed *before* q, k, v are cut from each head's columns, a partial rotary
    (``rotary_pct`` 0.25: 4 of 16 features rotated, the rest concatenated back) and the
    parallel residual (attention and MLP both read the layer's input). The head split moves
    into the weight and bias; the layer fuses within the hand-written block's 8 kernels, plus
    the embedding, final norm and head, and equals eager. No time budget: the answer does not
    depend on the machine's load (about a minute)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, vocab_size=64,
                                     max_position_embeddings=32, use_cache=False)
    cfg._attn_implementation = "sdpa"
    assert cfg.use_parallel_residual and cfg.rope_parameters["partial_rotary_factor"] == 0.25
    m = _Logits(_randomize(transformers.GPTNeoXForCausalLM(cfg))).eval()
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    cm = mp.compile(m, (ids,), workers=1, progress=False)
    with torch.no_grad():
        want = m(ids)
        got = cm(ids)
    _close(got, want)
    assert ((got - want).norm() / want.norm()).item() <= 2e-2
    assert cm.eager_ops() == []
    _fused(cm, at_most=8 + 3)  # a layer's 8, plus the embedding, final norm and head
    inputs = set(cm.regions()[0]["inputs"])
    assert {"lm_gpt_neox_layers_0_attention_query_key_value_weight_t_heads",
            "lm_gpt_neox_layers_0_attention_query_key_value_bias_heads"} <= inputs, inputs


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_llama_decode_step_over_a_cache_captured_whole():
    """A causal LM's decode step (benchmarks/models.py ``--decode``): one token id over a cache
    of earlier keys and values passed in as tensors and filled into a ``DynamicCache`` inside the
    module. The cache's concatenation, the rotary angles at the token's position and attention
    of one query over the cache are one region with nothing eager, fused, equal to eager."""
    from transformers import DynamicCache, LlamaForCausalLM
    cfg = _llama_config(heads=4, kv_heads=2)
    cfg.vocab_size, cfg.num_hidden_layers = 64, 1
    lm = _randomize(LlamaForCausalLM(cfg)).eval()

    class Decode(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, ids, past_k, past_v):
            cache = DynamicCache(config=cfg)
            cache.update(past_k, past_v, 0)
            return self.lm(input_ids=ids, past_key_values=cache, use_cache=True).logits

    m = Decode()
    past = 6
    ids = torch.randint(0, 64, (1, 1), generator=torch.Generator().manual_seed(0))
    pk = _rand(1, 2, past, 16, dtype=torch.float32, seed=1)
    pv = _rand(1, 2, past, 16, dtype=torch.float32, seed=2)
    cm = mp.compile(m, (ids, pk, pv), **dict(OPTS, time_budget_s=30))
    with torch.no_grad():
        want = m(ids, pk, pv)
        got = cm(ids, pk, pv)
        _close(got, want)
        assert ((got - want).norm() / want.norm()).item() <= 2e-2
        # another cache: the same compiled graph, the values are inputs
        pk2, pv2 = pk.flip(2), pv * 2
        _close(cm(ids, pk2, pv2), m(ids, pk2, pv2))
    assert cm.eager_ops() == []
    assert len(cm.regions()) == 1
    _fused(cm)


class MinGPTAttention(nn.Module):
    """minGPT / nanoGPT causal self-attention: one fused QKV projection split in three, the
    causal mask a registered 0/1 buffer compared with 0 (written here after their pattern)."""

    def __init__(self, n_embd=64, n_head=4, max_seqlen=16):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(max_seqlen, max_seqlen))
                             .view(1, 1, max_seqlen, max_seqlen))
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def test_mask_buffer_and_fused_qkv_projection():
    m = _randomize(MinGPTAttention(n_embd=32, n_head=2)).to(F16).eval()
    x = _rand(2, 8, 32)
    p = mp.from_torch(m, (x,))  # the 0/1 buffer is a causal mask: one program
    assert "bias" not in [t.name for t in p.inputs]
    assert any(t.op == "mask" for t in p.nodes())
    cm = mp.compile(m, (x,), **dict(OPTS, time_budget_s=8))
    with torch.no_grad():
        _close(cm(x), m(x))
    _fused(cm)
    inputs = cm.regions()[0]["inputs"]  # q, k, v columns of c_attn, split into heads by torch
    assert {"c_attn_weight_t_cols0_heads", "c_attn_weight_t_cols32_heads",
            "c_attn_weight_t_cols64_heads"} <= set(inputs)
    with torch.no_grad():
        m.bias.fill_(1)  # the mask changed: captured again, no masking any more
        _close(cm(x), m(x))
    assert "mask" not in {t.op for g in cm.graphs.values() for r in g.regions if r.program
                          for t in r.program.nodes()}


class Conv1DAttention(MinGPTAttention):
    """GPT-2's form of the same: the fused projection an ``addmm`` of the flattened rows with an
    untransposed weight (transformers' ``Conv1D``), viewed back to (B, T, 3C) before the split."""

    def __init__(self, n_embd=32, n_head=2, max_seqlen=16):
        super().__init__(n_embd, n_head, max_seqlen)
        self.w = nn.Parameter(torch.randn(n_embd, 3 * n_embd))
        self.b = nn.Parameter(torch.randn(3 * n_embd))

    def forward(self, x):
        B, T, C = x.size()
        y = torch.addmm(self.b, x.view(-1, C), self.w).view(B, T, 3 * C)
        q, k, v = y.split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def test_conv1d_qkv_projection_viewed_before_its_split_moves_into_the_weights():
    m = _randomize(Conv1DAttention()).to(F16).eval()
    x = _rand(2, 8, 32)
    cm = mp.compile(m, (x,), **dict(OPTS, time_budget_s=8))
    with torch.no_grad():
        _close(cm(x), m(x))
    _fused(cm)
    assert not cm.eager_ops()
    inputs = cm.regions()[0]["inputs"]  # the columns of w and b, split into heads by torch
    assert {"w_cols0_heads", "w_cols32_heads", "w_cols64_heads", "b_cols0_heads"} <= set(inputs)
    ops = {t.op for g in cm.graphs.values() for r in g.regions if r.program
           for t in r.program.nodes()}
    assert "slice" not in ops and "transpose" in ops  # k's transpose for q @ k^T only


class QKNormAttention(nn.Module):
    """Qwen3's form: an RMSNorm over each head's features between the head split and the
    transpose that moves heads before the rows."""

    def __init__(self, n_embd=32, n_head=2):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(n_embd, n_embd, bias=False)
                                          for _ in range(4))
        self.q_norm, self.k_norm = nn.RMSNorm(n_embd // n_head), nn.RMSNorm(n_embd // n_head)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        heads = (B, T, self.n_head, C // self.n_head)
        q = self.q_norm(self.q(x).view(heads)).transpose(1, 2)
        k = self.k_norm(self.k(x).view(heads)).transpose(1, 2)
        v = self.v(x).view(heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, C))


def test_per_head_norm_before_the_transpose_leaves_the_head_split_in_the_weights():
    m = _randomize(QKNormAttention()).eval()
    for nrm in (m.q_norm, m.k_norm):
        nrm.weight.data += 1.0
    x = _rand(2, 8, 32, dtype=torch.float32)
    cm = mp.compile(m, (x,), **dict(OPTS, time_budget_s=8))
    with torch.no_grad():
        _close(cm(x), m(x))
    _fused(cm)
    assert {"q_weight_t_heads", "k_weight_t_heads", "v_weight_t_heads"} <= \
        set(cm.regions()[0]["inputs"])
    transposes = [t for g in cm.graphs.values() for r in g.regions if r.program
                  for t in r.program.nodes() if t.op == "transpose"]
    assert len(transposes) == 1  # k's, for q @ k^T


# ---- unsupported operators, weights, report, recompiles -----------------------------------

class WithSort(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x):
        y = torch.relu(self.proj(x))
        return torch.softmax(torch.sort(y, dim=-1).values, dim=-1) + y * 0.5


def test_unsupported_operator_runs_eager_between_regions():
    m = _randomize(WithSort()).to(F16).eval()
    x = _rand(8, 32)
    with pytest.raises(UnsupportedOperatorError, match="aten.sort"):
        mp.from_torch(m, (x,))
    cm = mp.compile(m, (x,), **OPTS)
    with torch.no_grad():
        _close(cm(x), m(x))
    eager = cm.eager_ops()
    assert [e["op"] for e in eager] == ["aten.sort.default"]
    assert "no mirage_py operator" in eager[0]["reason"]
    assert len(cm.regions()) == 2  # before the sort, after it
    _fused(cm)
    assert "eager: aten.sort.default (node sort)" in cm.report()


def test_changed_weight_is_used():
    m = _randomize(LinearNormSoftmax()).to(F16).eval()
    x = _rand(16, 64)
    cm = mp.compile(m, (x,), **OPTS)
    with torch.no_grad():
        before = cm(x)
        m.gemm.weight.mul_(-2)  # in place
        m.norm.bias = nn.Parameter(torch.full((64,), 0.5, dtype=F16))  # a new tensor
        after = cm(x)
        _close(after, m(x))
    assert (after - before).abs().max() > 1e-2
    assert len(cm.graphs) == 1  # same signature: nothing compiled again


def test_report_lists_regions_kernels_time_and_bounds():
    m = _randomize(WithSort()).to(F16).eval()
    x = _rand(8, 32)
    cm = mp.compile(m, (x,), **OPTS)
    text = cm.report()
    assert text.startswith("mirage_py compile: WithSort, 1 signature(s)")
    assert "(x: (8, 32) float16)" in text and "captured by export" in text
    assert "region 0:" in text and "region 1:" in text
    for row in cm.regions():
        assert f"kernels {row['kernels_naive']} naive -> {row['kernels']} found" in text
        assert row["us"] < row["naive_us"] and 0 <= row["bound"] <= 1e-9
    assert "verified, bound" in text and "us" in text and "inputs:" in text
    assert "proj_weight_t" in text and "proj_bias" in text


def test_new_shapes_recompile_and_identical_regions_come_from_memory():
    from mirage_py.frontend_torch import clear_cache
    clear_cache()
    m = _randomize(LinearNormSoftmax()).to(F16).eval()
    cm = mp.compile(m, (_rand(16, 64),), **OPTS)
    x8 = _rand(8, 64, seed=5)
    with torch.no_grad():
        _close(cm(x8), m(x8))
    assert len(cm.graphs) == 2
    again = mp.compile(m, (_rand(16, 64, seed=7),), **OPTS)
    assert all(r["cached"] for r in again.regions())
    assert "memory cache" in again.report()


def test_bad_options_are_option_errors():
    with pytest.raises(OptionError, match="unknown option"):
        mp.compile(nn.Linear(4, 4), (torch.randn(2, 4),), time_budget=3)
    with pytest.raises(OptionError):
        mp.compile(nn.Linear(4, 4), "not inputs")


def test_float32_examples_and_lazy_compilation():
    m = _randomize(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))).eval()
    cm = mp.compile(m, **OPTS)  # compiled at the first call
    assert not cm.graphs
    x = _rand(4, 32, dtype=torch.float32)
    with torch.no_grad():
        _close(cm(x), m(x), rel=1e-2)
    assert len(cm.graphs) == 1 and cm.regions()[0]["inputs"][0] == "input"
    _fused(cm)


def test_a_region_superopt_refuses_runs_eager(monkeypatch):
    import mirage_py.frontend_torch.runtime as runtime
    real = runtime.superopt_cached

    def refuse_relu(program, options, budget_s=None):
        if any(t.op == "relu" for t in program.nodes()):
            raise mp.ProgramError("refused for the test")
        return real(program, options, budget_s)
    monkeypatch.setattr(runtime, "superopt_cached", refuse_relu)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    x = _rand(4, 8, dtype=torch.float32)
    cm = mp.compile(m, (x,), **OPTS)
    with torch.no_grad():
        assert torch.allclose(cm(x), m(x))
    assert not cm.regions()
    assert all("superopt failed on its region: ProgramError: refused for the test" in e["reason"]
               for e in cm.eager_ops())


def test_float64_runs_eager_and_says_why():
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).double().eval()
    x = torch.randn(4, 8, dtype=torch.float64)
    cm = mp.compile(m, (x,), **OPTS)
    with torch.no_grad():
        assert torch.equal(cm(x), m(x))
    assert not cm.regions() and {e["op"] for e in cm.eager_ops()} == {"aten.linear.default",
                                                                     "aten.relu.default"}
    assert all("float64" in e["reason"] for e in cm.eager_ops())


def test_train_mode_is_part_of_the_signature():
    m = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5), nn.ReLU()).eval()
    x = _rand(4, 16, dtype=torch.float32)
    cm = mp.compile(m, (x,), **OPTS)
    m.train()
    torch.manual_seed(0)
    with torch.no_grad():
        y = cm(x)  # dropout in training mode: captured again, the dropout runs eagerly
    assert len(cm.graphs) == 2 and y.shape == (4, 16)
    assert any("dropout" in e["op"] for e in cm.eager_ops())


# ---- torch.compile(backend="mirage_py") ---------------------------------------------------

def test_torch_compile_backend():
    import mirage_py.frontend_torch.backend as backend
    torch._dynamo.reset()
    m = _randomize(WithSort()).to(F16).eval()
    x = _rand(8, 32)
    compiled = torch.compile(m, backend="mirage_py", dynamic=False)
    with torch.no_grad():
        _close(compiled(x), m(x))
    made = backend.COMPILED[-1]
    report = made.report()
    assert "aten.sort" in report and "region 0" in report
    assert "proj.weight" in report or "proj_weight" in report
    # a changed weight is read at the next call (Dynamo passes parameters as inputs)
    with torch.no_grad():
        m.proj.weight.mul_(0.5)
        _close(compiled(x), m(x))
    torch._dynamo.reset()


def test_torch_compile_backend_with_options_and_recompile():
    from mirage_py.frontend_torch import mirage_backend
    torch._dynamo.reset()
    m = _randomize(LinearNormSoftmax()).to(F16).eval()
    compiled = torch.compile(m, backend=functools.partial(mirage_backend, **OPTS),
                             dynamic=False)
    with torch.no_grad():
        for rows in (16, 8, 16):  # a guard failure compiles 8 rows; 16 again is cached
            x = _rand(rows, 64, seed=rows)
            _close(compiled(x), m(x))
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_torch_compile_backend_on_llama_attention():
    import mirage_py.frontend_torch.backend as backend
    torch._dynamo.reset()
    cfg = _llama_config(heads=4, kv_heads=2)
    m = _randomize(_Attention(cfg)).to(F16).eval()
    cos, sin = _rotary(cfg, list(range(8)))
    h = _rand(1, 8, 64)
    compiled = torch.compile(m, backend=functools.partial(backend.mirage_backend, **OPTS),
                             dynamic=False)
    with torch.no_grad():
        _close(compiled(h, cos, sin), m(h, cos, sin))
    graph = next(iter(backend.COMPILED[-1].graphs.values()))
    rows = graph.region_rows()
    assert not graph.eager_rows() and len(rows) == 1  # the flash-attention form is mapped too
    assert rows[0]["kernels"] < rows[0]["kernels_naive"] and rows[0]["verified"]
    torch._dynamo.reset()


def test_backend_is_registered_and_declared_as_entry_point():
    import mirage_py.frontend_torch  # noqa: F401 -- registers on import
    from torch._dynamo.backends.registry import lookup_backend
    fn = lookup_backend("mirage_py")
    assert callable(fn)
    root = Path(__file__).resolve().parents[1]
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    eps = meta["project"]["entry-points"]["torch_dynamo_backends"]
    assert eps == {"mirage_py": "mirage_py.frontend_torch.backend:mirage_backend"}
    assert any(d.startswith("transformers") for d in meta["project"]["optional-dependencies"]
               ["test"])


def test_installed_entry_point_and_registration_on_import_do_not_collide(monkeypatch):
    from importlib.metadata import EntryPoint
    from torch._dynamo.backends import registry
    import mirage_py.frontend_torch.backend as backend
    ep = EntryPoint(name="mirage_py", value="mirage_py.frontend_torch.backend:mirage_backend",
                    group="torch_dynamo_backends")
    monkeypatch.setitem(registry._BACKENDS, "mirage_py", ep)  # as if pip had installed it
    monkeypatch.delitem(registry._COMPILER_FNS, "mirage_py", raising=False)
    backend.register()  # an import with the entry point installed leaves it to Dynamo
    assert "mirage_py" not in registry._COMPILER_FNS
    assert registry.lookup_backend("mirage_py") is backend.mirage_backend  # Dynamo loads it


# ---- CUDA -----------------------------------------------------------------------------------

@pytest.mark.gpu
def test_cuda_tensors_run_the_generated_kernels():
    pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to PyTorch")
    class SwiGLU(nn.Module):  # Llama's MLP, without transformers (GPU machines lack it)
        def __init__(self, d=64, f=128):
            super().__init__()
            self.gate_proj = nn.Linear(d, f, bias=False)
            self.up_proj = nn.Linear(d, f, bias=False)
            self.down_proj = nn.Linear(f, d, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    m = _randomize(SwiGLU()).to(F16).eval()
    x = _rand(1, 8, 64)
    cm = mp.compile(m, (x,), **OPTS)
    m.cuda()
    xc = x.cuda()
    with torch.no_grad():
        got = cm(xc)
        assert got.is_cuda and got.dtype == F16
        _close(got.cpu(), m(xc).cpu())
        m.down_proj.weight.mul_(2)  # the transposed weight copy is refreshed
        _close(cm(xc).cpu(), m(xc).cpu())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_gemm_batchnorm_compiled_equals_eager_in_eval_and_training_mode(mode):
    """KernelBench level2/41 (Gemm, BatchNorm1d, GELU, ReLU) as KernelBench times it: the module
    in training mode under ``no_grad`` (batch statistics; the running ones updated), and in eval
    mode (the running statistics). Compiled output and buffers equal eager's."""
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.gemm = nn.Linear(8, 6)
            self.bn = nn.BatchNorm1d(6)

        def forward(self, x):
            return torch.relu(F.gelu(self.bn(self.gemm(x))))

    torch.manual_seed(0)
    ref = Model()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        ref.bn.running_mean.copy_(torch.rand(6, generator=g) - 0.5)
        ref.bn.running_var.copy_(torch.rand(6, generator=g) + 0.5)
        ref.bn.weight.copy_(torch.rand(6, generator=g) + 0.5)
        ref.bn.bias.copy_(torch.rand(6, generator=g) - 0.5)
    m = Model()
    m.load_state_dict(ref.state_dict())
    for mm in (ref, m):
        getattr(mm, mode)()
    x = _rand(5, 8, dtype=torch.float32)
    cm = mp.compile(m, (x,), **{**OPTS, "time_budget_s": 2})
    with torch.no_grad():
        got, want = cm(x), ref(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(m.bn, name), getattr(ref.bn, name), rtol=1e-5,
                                   atol=1e-6)
    assert m.bn.num_batches_tracked.item() == (mode == "train")
