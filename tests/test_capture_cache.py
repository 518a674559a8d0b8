"""The capture cache (frontend_torch/capture_cache.py): a module compiled before -- in this
process or another -- is not exported again, its graph comes from the results database.

What is checked: the key follows what the trace depends on (shapes, dtypes, mode, configuration
values, plain tensor attributes, the call's non-tensor arguments) and refuses what it cannot see
(hooks, unknown attribute types); a graph answered from the cache runs over the *live* module's
weights and buffers, equal to eager (so nothing of the first module's values is baked in); and a
second process compiling the same transformers module answers capture and search from the
database.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import mirage_py as mp  # noqa: E402
from mirage_py.frontend_torch import capture_cache as cc  # noqa: E402
from mirage_py.frontend_torch.capture import capture  # noqa: E402
from mirage_py.frontend_torch.runtime import clear_cache  # noqa: E402

OPTS = dict(workers=1, time_budget_s=15, progress=False)


class ScaledNorm(nn.Module):
    """RMSNorm times a non-persistent buffer, plus a configuration number."""

    def __init__(self, d=32, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d))
        self.register_buffer("scale", torch.full((d,), 2.0), persistent=False)
        self.eps = eps

    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(v + self.eps) * self.weight * self.scale


def _key(m, *args, **kwargs):
    return cc.capture_key(m, args, kwargs)


def test_key_follows_what_the_trace_depends_on():
    x = torch.randn(4, 32)
    m = ScaledNorm()
    k = _key(m, x)
    assert k == _key(m, x) == _key(ScaledNorm(), x)  # weights' values are not in the key
    assert _key(m, torch.randn(5, 32)) != k  # shape
    assert _key(m, x.double()) != k  # dtype
    m2 = ScaledNorm(eps=1e-5)
    assert _key(m2, x) != k  # a configuration number
    m.eval()
    assert _key(m, x) != k  # mode
    m.train()
    m3 = ScaledNorm()
    m3.table = torch.arange(4.0)  # a plain tensor attribute: keyed by value
    m4 = ScaledNorm()
    m4.table = torch.arange(4.0) + 1
    assert _key(m3, x) != _key(m4, x) != k
    assert _key(m, x, 3) != _key(m, x, 4)  # a non-tensor argument by value
    assert _key(m.half(), x.half()) != _key(ScaledNorm(), x.half())  # parameters' dtype


def test_key_refuses_what_it_cannot_see():
    x = torch.randn(4, 32)
    m = ScaledNorm()
    h = m.register_forward_hook(lambda mod, a, out: out * 2)
    with pytest.raises(cc.Uncacheable, match="hooks"):
        _key(m, x)
    h.remove()
    _key(m, x)
    m.other = object()  # an attribute the key cannot describe
    with pytest.raises(cc.Uncacheable, match="object"):
        _key(m, x)
    with pytest.raises(cc.Uncacheable, match="argument"):
        _key(ScaledNorm(), x, object())


def test_capture_from_the_cache_runs_the_live_weights(tmp_path):
    db = str(tmp_path / "r.sqlite")
    x = torch.randn(4, 32)
    first = capture(ScaledNorm(), (x,), {}, db)
    assert not first.cached
    m = ScaledNorm()  # other weights, another buffer value: nothing of the first is kept
    with torch.no_grad():
        m.scale.fill_(-0.5)
    again = capture(m, (x,), {}, db)
    assert again.cached
    assert [n.name for n in again.gm.graph.nodes] == [n.name for n in first.gm.graph.nodes]
    state = dict(m.named_parameters()) | dict(m.named_buffers())
    values = [state[r.name] if r.static else x for r in again.roles]
    got = again.gm(*values)[again.outputs[0]]
    torch.testing.assert_close(got, m(x))
    assert not capture(ScaledNorm(), (torch.randn(5, 32),), {}, db).cached  # new shape


def test_compile_from_the_cache_equals_eager(tmp_path):
    db = str(tmp_path / "r.sqlite")
    x = torch.randn(4, 32)
    cm = mp.compile(ScaledNorm(), (x,), database=db, **OPTS)
    assert not next(iter(cm.graphs.values())).cap.cached
    clear_cache()  # as a new process would: nothing in memory
    m = ScaledNorm()
    cm2 = mp.compile(m, (x,), database=db, **OPTS)
    g = next(iter(cm2.graphs.values()))
    assert g.cap.cached and cm2.searches() == 0, cm2.report()
    assert "kept graph from the results database" in cm2.report()
    with torch.no_grad():
        torch.testing.assert_close(cm2(x), m(x), rtol=1e-5, atol=1e-5)
    assert cm2.searches() == 0
    clear_cache()
    off = mp.compile(ScaledNorm(), (x,), database=db, capture_cache=False, **OPTS)
    assert not next(iter(off.graphs.values())).cap.cached


_SECOND = textwrap.dedent("""
    import json, sys, warnings
    warnings.filterwarnings("ignore")
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    import mirage_py as mp
    torch.manual_seed(1)  # other weights than the first process's
    m = LlamaRMSNorm(32, eps=1e-6).eval()
    m.weight.data.normal_()
    x = torch.randn(3, 32)
    cm = mp.compile(m, (x,), database=sys.argv[1], workers=1, time_budget_s=15, progress=False)
    g = next(iter(cm.graphs.values()))
    with torch.no_grad():  # inference (a call autograd needs captures its training graphs)
        err = (cm(x) - m(x)).abs().max().item()
    print(json.dumps({"cached": g.cap.cached, "searches": cm.searches(), "err": err}))
""")


def test_a_second_process_skips_export_and_search(tmp_path):
    modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
    db = str(tmp_path / "r.sqlite")
    m = modeling.LlamaRMSNorm(32, eps=1e-6).eval()
    cm = mp.compile(m, (torch.randn(3, 32),), database=db, **OPTS)
    assert not next(iter(cm.graphs.values())).cap.cached and cm.searches() >= 1
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", _SECOND, db], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    second = json.loads(out.stdout.strip().splitlines()[-1])
    assert second["cached"] and second["searches"] == 0, second
    assert second["err"] < 1e-5, second
