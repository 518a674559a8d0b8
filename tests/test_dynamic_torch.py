"""Shapes that vary in captured models: shape families generalised from two captures
(lax/generalize.py), ``mp.compile(dynamic=None | True | False)``, ``dynamic_shapes`` ranges, the
torch.compile backend over Dynamo's recompiles, and ``generate()``.

Every compiled answer is compared with eager PyTorch at each shape; searches are counted by the
compiled module (``searches()``), not timed."""

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import mirage_py as mp  # noqa: E402
from mirage_py.errors import OptionError  # noqa: E402
from mirage_py.frontend_torch.runtime import clear_cache  # noqa: E402
from mirage_py.lax.generalize import erased_key, generalize, instance_sizes  # noqa: E402

OPTS = dict(workers=1, time_budget_s=15, progress=False, database=False)


@pytest.fixture(autouse=True)
def _fresh_families():
    clear_cache()
    yield
    clear_cache()


# ---- generalize: the family two static programs belong to ------------------------------------

def _attention(s, t=None, heads=2, d=8):
    t = s if t is None else t
    p = mp.Program("att")
    q = p.input("q", (heads, t, d))
    k = p.input("k", (heads, d, s))
    v = p.input("v", (heads, s, d))
    scores = mp.where(mp.causal_mask(t, s, offset=s - t), mp.matmul(q, k) * d ** -0.5, -1e4)
    p.output(mp.matmul(mp.softmax(scores, axis=-1), v), name="o")
    return p


def test_generalize_finds_the_dim_and_binds_other_sizes():
    a, b = _attention(16), _attention(17)
    assert erased_key(a) == erased_key(b)
    fam = generalize(a, b)
    assert fam is not None and list(fam.dims) == ["q_1"]
    assert instance_sizes(fam, _attention(40)) == {"q_1": 40}
    # the family at 40 is the program at 40: same values, by the float64 reference
    rng = np.random.default_rng(0)
    want = _attention(40)
    ins = {t.name: rng.standard_normal(t.shape) for t in want.inputs}
    # (the family names inputs and outputs by position: two captures name them after nodes)
    assert [t.name for t in fam.inputs] == ["in0", "in1", "in2"]
    got = fam.evaluate({f"in{i}": ins[t.name] for i, t in enumerate(want.inputs)})["out0"]
    np.testing.assert_allclose(got, want.evaluate(ins)["o"], rtol=1e-12)


def test_generalize_writes_a_mask_offset_as_an_expression_of_dims():
    # decode-like: 4 queries over a growing cache; the causal diagonal sits at S - 4
    fam = generalize(_attention(16, 4), _attention(20, 4))
    assert fam is not None and list(fam.dims) == ["k_2"]
    assert instance_sizes(fam, _attention(33, 4)) == {"k_2": 33}
    assert instance_sizes(fam, _attention(33, 5)) is None  # another query count: not this family


def test_a_size_that_makes_the_mask_all_true_may_leave_it_out():
    """PyTorch drops the causal mask at one token: the capture there is still an instance (the
    mask keeps every position, so leaving it out changes no value); at two tokens it is not."""
    def unmasked(s, heads=2, d=8):
        p = mp.Program("att")
        q = p.input("q", (heads, s, d))
        k = p.input("k", (heads, d, s))
        v = p.input("v", (heads, s, d))
        p.output(mp.matmul(mp.softmax(mp.matmul(q, k) * d ** -0.5, axis=-1), v), name="o")
        return p
    fam = generalize(_attention(16), _attention(17))
    assert instance_sizes(fam, unmasked(1)) == {"q_1": 1}
    assert instance_sizes(fam, unmasked(2)) is None  # a 2 x 2 causal mask hides a score


def test_generalize_three_samples_two_dims():
    def mlp(b, s):
        p = mp.Program("mlp")
        x = p.input("x", (b, s, 16))
        w = p.input("w", (16, 8))
        p.output(mp.softmax(mp.matmul(x, w), axis=-1), name="y")
        return p
    assert generalize(mlp(1, 16), mlp(1, 17)).dims.keys() == {"x_1"}
    fam = generalize(mlp(1, 16), mlp(1, 17), mlp(2, 16))
    assert fam.dims.keys() == {"x_0", "x_1"}
    assert instance_sizes(fam, mlp(3, 29)) == {"x_0": 3, "x_1": 29}


def test_generalize_refuses_programs_that_differ_in_more_than_sizes():
    def f(n, op):
        p = mp.Program("f")
        x = p.input("x", (n, 8))
        p.output(op(x), name="y")
        return p
    assert generalize(f(4, mp.exp), f(5, mp.silu)) is None  # another operator
    assert generalize(f(4, mp.exp), f(4, mp.exp)) is None  # nothing varies

    def flat(n):  # (n, 8) -> (8n,): a product of a dim is not an expression of it
        p = mp.Program("flat")
        x = p.input("x", (n, 8))
        p.output(mp.exp(mp.reshape(x, (8 * n,))), name="y")
        return p
    assert generalize(flat(4), flat(5)) is None

    def scaled(n):  # a constant that depends on the size
        p = mp.Program("scaled")
        x = p.input("x", (n, 8))
        p.output(x * (1.0 / n), name="y")
        return p
    assert generalize(scaled(4), scaled(5)) is None


# ---- mp.compile(dynamic=...) ---------------------------------------------------------------

class ProjSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        return F.softmax(self.norm(self.proj(x)), dim=-1) * 2.0


def _model():
    torch.manual_seed(0)
    return ProjSoftmax().eval()


def _x(b, s, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, s, 32, generator=g)


def _check(cm, m, x):
    with torch.no_grad():
        got, want = cm(x), m(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_an_answer_from_the_results_database_is_no_search(tmp_path):
    """A second compile (another process: the memory cache cleared) answers from the database:
    the report says so and searches() counts nothing."""
    m, x = _model(), _x(2, 8)
    opts = {**OPTS, "database": str(tmp_path / "r.sqlite")}
    first = mp.compile(m, (x,), **opts)
    assert first.searches() == 1
    clear_cache()
    again = mp.compile(m, (x,), **opts)
    assert again.searches() == 0 and "results database" in again.report()
    _check(again, m, x)


def test_dynamic_none_searches_once_more_at_the_first_change_then_never():
    m = _model()
    cm = mp.compile(m, (_x(1, 16),), **OPTS)  # dynamic=None: static at first
    _check(cm, m, _x(1, 16))
    assert cm.searches() == 1
    _check(cm, m, _x(1, 17, seed=1))  # the first change: the family's search
    assert cm.searches() == 2
    for b, s in ((1, 23), (1, 40), (1, 5)):
        _check(cm, m, _x(b, s, seed=s))
    assert cm.searches() == 2, cm.report()
    report = cm.report()
    assert "shape family, no search" in report and "symbolic in" in report


def test_dynamic_true_searches_at_the_first_compile_only():
    m = _model()
    cm = mp.compile(m, (_x(2, 16),), dynamic=True, **OPTS)
    assert cm.searches() == 1
    for b, s in ((2, 17), (1, 23), (3, 9), (4, 40)):
        _check(cm, m, _x(b, s, seed=b * s))
    assert cm.searches() == 1, cm.report()


def test_dynamic_false_searches_every_shape():
    m = _model()
    cm = mp.compile(m, (_x(1, 16),), dynamic=False, **OPTS)
    _check(cm, m, _x(1, 17))
    assert cm.searches() == 2
    assert "dynamic=False" in cm.report()


def test_dynamic_shapes_range_and_outside_it():
    m = _model()
    cm = mp.compile(m, (_x(1, 16),), dynamic=True, dynamic_shapes={"x": {1: (8, 32)}}, **OPTS)
    assert cm.searches() == 1
    _check(cm, m, _x(1, 30))
    assert cm.searches() == 1
    _check(cm, m, _x(1, 33))  # outside 8 .. 32: compiled statically, and the report says so
    assert cm.searches() == 2
    assert "outside its range 8 .. 32" in cm.report()


def test_dynamic_options_are_checked():
    with pytest.raises(OptionError, match="dynamic must be"):
        mp.compile(_model(), (_x(1, 4),), dynamic="yes", **OPTS)
    with pytest.raises(OptionError, match="not a tensor argument"):
        mp.compile(_model(), (_x(1, 4),), dynamic=True, dynamic_shapes={"y": {0: None}}, **OPTS)
    with pytest.raises(OptionError, match="not an axis"):
        mp.compile(_model(), (_x(1, 4),), dynamic=True, dynamic_shapes={"x": {3: None}}, **OPTS)


def test_mark_dynamic_names_the_dim():
    m = _model()
    x = _x(1, 16)
    torch._dynamo.mark_dynamic(x, 1, min=2, max=64)
    cm = mp.compile(m, (x,), dynamic=True, **OPTS)
    _check(cm, m, _x(1, 50))
    assert cm.searches() == 1
    _check(cm, m, _x(1, 65))
    assert "outside its range 2 .. 64" in cm.report()


# ---- torch.compile(backend="mirage_py") over Dynamo's recompiles ------------------------------

def test_backend_serves_dynamos_symbolic_graph_from_a_family():
    from mirage_py.frontend_torch import mirage_backend
    torch._dynamo.reset()
    m = _model()
    compiled = torch.compile(m, backend=functools.partial(mirage_backend, **OPTS))
    import mirage_py.frontend_torch.backend as backend
    before = len(backend.COMPILED)
    with torch.no_grad():
        for s in (16, 17, 23, 40):  # Dynamo: static graph, then one symbolic graph
            x = _x(1, s, seed=s)
            torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-5)
    made = backend.COMPILED[before:]
    searches = sum(g.searches() for d in made for g in d.graphs.values())
    assert searches == 2, "\n".join(d.report() for d in made)
    torch._dynamo.reset()


# ---- generate() ------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_generate_greedy_equals_eager_with_a_fixed_number_of_searches():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=16, num_hidden_layers=1,
                                   vocab_size=64, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=12, do_sample=False)
    cm = mp.compile(model, (ids,), {"use_cache": False}, dynamic=True, **OPTS)
    searched = cm.searches()
    with torch.no_grad():
        got = cm.generate(ids, max_new_tokens=12, do_sample=False, use_cache=False)
    assert torch.equal(got, want)
    assert cm.searches() == searched  # twelve new lengths, no search
    assert len(cm.graphs) >= 12
    # one token: PyTorch leaves the causal mask out and our capture keeps the one position as
    # an input; still an instance of the family, run padded in its bucket of 2, no search
    one = torch.randint(0, 64, (1, 1))
    with torch.no_grad():
        torch.testing.assert_close(cm(one, use_cache=False).logits,
                                   model(one, use_cache=False).logits, rtol=1e-4, atol=1e-5)
    assert cm.searches() == searched


def _tiny_llama(layers=1):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=16, num_hidden_layers=layers,
                                   vocab_size=64, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_generate_with_the_default_kv_cache_searches_two_families_not_one_per_token():
    model = _tiny_llama()
    ids = torch.randint(0, 64, (1, 6))
    cm = mp.compile(model, dynamic=True, **{**OPTS, "time_budget_s": 8})  # nothing compiled yet
    searched = cm.searches()
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=7, do_sample=False)  # its DynamicCache
        got = cm.generate(ids, max_new_tokens=7, do_sample=False)
    assert torch.equal(got, want)
    # one prefill family and one decode family (the cache length), searched once each
    assert cm.searches() == searched + 2
    assert "decode step" in cm.report() and "shape family, no search" in cm.report()
    # another prompt length and more tokens: instances of the same two families
    ids = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=9, do_sample=False)
        got = cm.generate(ids, max_new_tokens=9, do_sample=False)
    assert torch.equal(got, want)
    assert cm.searches() == searched + 2


def test_cached_step_equals_the_model_over_its_own_cache():
    """One step of kv_cache.CachedStep (past laid in a buffer, placed by a 0/1 matrix, an
    additive mask with left padding) against the model over transformers' DynamicCache."""
    from transformers import DynamicCache
    from mirage_py.frontend_torch.kv_cache import CachedStep, step_inputs
    model = _tiny_llama(layers=2)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 64, (2, 7), generator=g)
    shown = torch.ones(2, 7, dtype=torch.long)
    shown[1, :3] = 0  # the second row is left-padded
    nxt = torch.randint(0, 64, (2, 1), generator=g)
    with torch.no_grad():
        pos = (shown.cumsum(-1) - 1).clamp(min=0)
        ref = model(prompt, attention_mask=shown, position_ids=pos, use_cache=True)
        cache = ref.cache if hasattr(ref, "cache") else ref.past_key_values
        mask2 = torch.cat([shown, torch.ones(2, 1, dtype=torch.long)], 1)
        x = step_inputs(cache, nxt, mask2, 2, (1, 16), torch.float32)
        got, *new = CachedStep(model)(*x)
        want = model(nxt, attention_mask=mask2, position_ids=x[1], use_cache=True,
                     **{"cache" if hasattr(ref, "cache") else "past_key_values": cache})
    torch.testing.assert_close(got[:, -1], want.logits[:, -1], rtol=1e-5, atol=1e-5)
    layer = (want.cache if hasattr(want, "cache") else want.past_key_values).layers[1]
    torch.testing.assert_close(new[3], layer.values[:, :, -1:], rtol=0, atol=0)


def test_generate_refuses_a_cache_it_cannot_serve():
    from transformers import DynamicCache
    from mirage_py.frontend_torch.kv_cache import step_inputs

    class Odd(DynamicCache):
        pass
    with pytest.raises(OptionError, match="DynamicCache of full layers"):
        step_inputs(Odd(), torch.zeros(1, 1, dtype=torch.long), None, 1, (1, 16), torch.float32)
