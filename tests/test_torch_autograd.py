"""Issue #33 item 1: a compiled module never returns detached outputs when autograd needs them.

With grad mode on and an input or parameter requiring grad, ``mp.compile`` and the
``torch.compile`` backend with ``training="eager"`` run the module eagerly (one warning, a line
in ``report()``); the gradients then equal eager PyTorch's. Inference calls (``no_grad``,
nothing requiring grad) keep the superoptimised path. The default, ``training="superopt"``, is
tested in tests/test_torch_training.py."""
import functools
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import mirage_py as mp  # noqa: E402
from mirage_py.frontend_torch.autograd import GradFallbackWarning  # noqa: E402

OPTS = dict(workers=1, time_budget_s=15, progress=False)


class _MLP(nn.Module):
    def __init__(self, d=12, h=20):
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(d, h, bias=False)
        self.gate = nn.Linear(d, h, bias=False)
        self.down = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def _grads(m, x):
    x = x.clone().requires_grad_(True)
    out = m(x)
    loss = (out * out).sum()
    loss.backward()
    return out.detach(), x.grad, [p.grad.clone() for p in m.parameters()]


def test_compiled_module_gradients_equal_eager_with_one_warning():
    ref = _MLP()
    m = _MLP()
    cm = mp.compile(m, training="eager", **OPTS)
    x = torch.randn(3, 12, generator=torch.Generator().manual_seed(1))
    want_out, want_gx, want_gp = _grads(ref, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got_out, got_gx, got_gp = _grads(cm, x)
        for p in m.parameters():
            p.grad = None
        _grads(cm, x)  # second call: no second warning
    assert sum(isinstance(w.message, GradFallbackWarning) for w in caught) == 1
    torch.testing.assert_close(got_out, want_out)
    torch.testing.assert_close(got_gx, want_gx)
    for g, w in zip(got_gp, want_gp):
        torch.testing.assert_close(g, w)
    assert "2 call(s) ran eagerly" in cm.report()
    assert not cm.graphs  # nothing was captured for the training calls


def test_inference_calls_keep_the_superoptimised_path():
    m = _MLP()
    cm = mp.compile(m, **OPTS)
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = m(x)
        got = cm(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert cm.graphs and cm.regions()
    assert "ran eagerly" not in cm.report()


def test_parameters_without_grad_take_the_compiled_path():
    m = _MLP()
    for p in m.parameters():
        p.requires_grad_(False)
    cm = mp.compile(m, **OPTS)
    x = torch.randn(4, 12, generator=torch.Generator().manual_seed(3))
    got = cm(x)  # grad mode on, but nothing requires grad
    torch.testing.assert_close(got, m(x), rtol=1e-4, atol=1e-4)
    assert cm.graphs and not got.requires_grad


def test_dynamo_backend_is_differentiable():
    from mirage_py.frontend_torch import backend
    torch._dynamo.reset()
    ref = _MLP()
    m = _MLP()
    compiled = torch.compile(m, backend=functools.partial(backend.mirage_backend,
                                                          training="eager", **OPTS),
                             dynamic=False)
    x = torch.randn(3, 12, generator=torch.Generator().manual_seed(4))
    want_out, want_gx, want_gp = _grads(ref, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got_out, got_gx, got_gp = _grads(compiled, x)
    assert any(isinstance(w.message, GradFallbackWarning) for w in caught)
    assert got_out is not None
    torch.testing.assert_close(got_out, want_out)
    torch.testing.assert_close(got_gx, want_gx)
    for g, w in zip(got_gp, want_gp):
        torch.testing.assert_close(g, w)
    torch._dynamo.reset()
