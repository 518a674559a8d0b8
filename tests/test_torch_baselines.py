"""The PyTorch baseline evaluates every benchmark program like Program.evaluate (CPU torch)."""

import numpy as np
import pytest

from benchmarks.programs import NAMES, get_inputs, get_program

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("name", [n for n in NAMES if n != "exp_matmul"])
def test_torch_fn_matches_reference(name):
    from benchmarks.torch_baselines import sdpa_fn, torch_fn
    p = get_program(name, 1)
    x = get_inputs(name, 1)
    ref = p.evaluate(x)
    tx = {k: torch.from_numpy(v) for k, v in x.items()}
    got = torch_fn(p)(tx)
    for k in ref:
        np.testing.assert_allclose(got[k].numpy(), ref[k], rtol=1e-9, atol=1e-12)
    s = sdpa_fn(name)
    if s is not None:
        np.testing.assert_allclose(s(tx)["O"].numpy(), ref["O"], rtol=1e-7, atol=1e-9)
