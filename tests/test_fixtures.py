"""Hand-built fused μGraphs: valid for h100 and equal to the program, at bs 1 and 8."""

import numpy as np
import pytest

from benchmarks.fixtures import hand_built
from benchmarks.programs import NAMES, get_inputs, get_program
from mirage_py.ugraph import GraphKernel, validate
from marks import sample

CASES = [(n, bs) for bs in (1, 8) for n in NAMES]


def _rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def references():
    cache = {}

    def get(name, bs):
        if (name, bs) not in cache:
            x = get_inputs(name, bs, seed=1)
            cache[(name, bs)] = (x, get_program(name, bs).evaluate(x))
        return cache[(name, bs)]
    return get


@pytest.mark.parametrize("name,bs", sample(CASES))
def test_fixture_matches_program(name, bs, references):
    g = hand_built(name, bs)
    validate(g, "h100")
    x, ref = references(name, bs)
    out64 = g.run(x)
    outgpu = g.run(x, precision="gpu")
    assert set(out64) == set(ref)
    for k in ref:
        assert np.abs(out64[k] - ref[k]).max() <= 1e-9 * np.abs(ref[k]).max(), k
        assert np.all(np.isfinite(outgpu[k]))
        assert _rel(outgpu[k], ref[k]) <= 2e-2, k


@pytest.mark.parametrize("name", NAMES)
def test_fixture_is_fused(name):
    """Each fixture uses fewer launches than the naive lowering and at least one graph kernel;
    the program's single-kernel fusions really are one kernel."""
    from mirage_py.ugraph import naive_lowering
    g = hand_built(name, 1)
    naive = naive_lowering(get_program(name, 1))
    assert g.num_kernels < naive.num_kernels
    assert all(isinstance(op, GraphKernel) for op in g.ops)
    if name in ("rmsnorm_linear", "lora", "gated_mlp", "ntrans"):
        assert g.num_kernels == 1


def test_fixture_grids_fill_the_gpu():
    """Split counts come from the shapes: attention grids reach at least one block per SM."""
    for name in ("gqa", "mha", "mqa", "qknorm_gqa"):
        for bs in (1, 8):
            assert hand_built(name, bs).ops[0].block.num_blocks >= 128, (name, bs)


def test_fixture_roundtrip_and_literal_execution():
    g = hand_built("lora", 1)
    from mirage_py.ugraph import KernelGraph
    assert KernelGraph.loads(g.dumps()) == g
    x = get_inputs("lora", 1)
    a = g.run(x)
    b = g.run(x, literal=True)
    assert np.array_equal(a["Y"], b["Y"])


def test_unknown_fixture():
    import mirage_py as mp
    with pytest.raises(mp.ProgramError, match="unknown benchmark"):
        hand_built("nope", 1)
