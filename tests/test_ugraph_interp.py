"""The CPU interpreter against NumPy, against itself run block by block, and in GPU precision."""

import numpy as np
import pytest

from benchmarks.programs import NAMES, get_inputs, get_program
from mirage_py.errors import MirageError, ProgramError, ShapeError
from mirage_py.lax.ops import storage_round
from mirage_py.ugraph import DTensor, KernelGraph, KernelOp, naive_lowering, run, validate
from ugraph_cases import CASES, inputs_for
from marks import sample


def close(y, ref, rtol):
    scale = max(float(np.max(np.abs(ref))), 1e-300)
    np.testing.assert_allclose(y, ref, rtol=rtol, atol=rtol * scale)


def normwise(y, ref) -> float:
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def as_f16_exactly(y: np.ndarray) -> bool:
    return bool(np.array_equal(y.astype(np.float16).astype(np.float32), y))


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    g, ref = CASES[request.param]()
    validate(g, "a100")
    x = inputs_for(g)
    return g, x, ref(x)


def test_float64_matches_numpy(case):
    g, x, ref = case
    y = run(g, x)
    assert list(y) == list(g.outputs)
    for name, r in ref.items():
        assert y[name].dtype == np.float64 and y[name].shape == r.shape
        close(y[name], r, 1e-12)


@pytest.mark.parametrize("precision", ["float64", "gpu"])
def test_batched_equals_literal_block_by_block(case, precision):
    g, x, _ = case
    y = run(g, x, precision=precision)
    lit = run(g, x, precision=precision, literal=True)
    for name in g.outputs:
        assert y[name].dtype == lit[name].dtype
        np.testing.assert_array_equal(y[name], lit[name])


def test_gpu_precision_rounds_outputs_to_float16(case):
    g, x, ref = case
    y = run(g, x, precision="gpu")
    for name, r in ref.items():
        assert y[name].dtype == np.float32
        assert as_f16_exactly(y[name]), name
        close(y[name], r, 1e-2)
        assert normwise(y[name], r) < 1e-2


def test_gpu_precision_is_not_float64():
    # the rounding is really there: inputs are rounded to float16 before use
    g, ref = CASES["bias_add"]()
    x = inputs_for(g)
    y = run(g, x, precision="gpu")["Y"]
    assert not np.array_equal(y, run(g, x)["Y"])
    exact = storage_round(storage_round(x["X"], "float16") + storage_round(x["b"], "float16"),
                          "float16")
    np.testing.assert_array_equal(y, exact)


def test_gpu_precision_bfloat16_graph():
    g, ref = CASES["tiled_matmul"]()
    bf = KernelGraph(g.name, tuple(DTensor(t.name, t.shape, "bfloat16") for t in g.inputs),
                     (type(g.ops[0])(g.ops[0].inputs,
                                     tuple(DTensor(t.name, t.shape, "bfloat16")
                                           for t in g.ops[0].outputs), g.ops[0].block),),
                     g.outputs)
    validate(bf)
    x = inputs_for(bf)
    y = run(bf, x, precision="gpu")["C"]
    assert y.dtype == np.float32
    assert not np.any(y.view(np.uint32) & 0xFFFF)  # representable in bfloat16
    r = ref(x)["C"]
    assert normwise(y, r) < 2e-2
    assert not as_f16_exactly(y) or normwise(y, r) > 1e-3


def test_literal_run_visits_each_block():
    # literal execution of a 2-D grid: every block writes exactly its own tile
    g, ref = CASES["bias_add"]()
    x = {"X": np.arange(64 * 128, dtype=float).reshape(64, 128), "b": np.zeros((1, 128))}
    np.testing.assert_array_equal(run(g, x, literal=True)["Y"], x["X"])


# -- storage rounding ----------------------------------------------------------------------------

def _bits_to_f32(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


BF16_CASES = [
    # (float32 bits in, bfloat16-rounded float32 bits out)
    (0x3F800000, 0x3F800000),  # 1.0 exact
    (0x3F808000, 0x3F800000),  # 1 + 2^-8: tie between 1.0 and 1 + 2^-7 -> even (1.0)
    (0x3F818000, 0x3F820000),  # 1 + 3*2^-8: tie -> even (1 + 2^-6)
    (0x3F808001, 0x3F810000),  # just above the tie -> up
    (0x3F807FFF, 0x3F800000),  # just below the tie -> down
    (0xBF808000, 0xBF800000),  # negative tie -> even
    (0xBF818000, 0xBF820000),
    (0x00008000, 0x00000000),  # subnormal tie -> even (zero)
    (0x00018000, 0x00020000),  # subnormal tie -> even
    (0x7F7F7FFF, 0x7F7F0000),  # below the largest tie -> largest finite bfloat16
    (0x7F7F8000, 0x7F800000),  # tie above the largest finite value -> even -> inf
    (0x7F800000, 0x7F800000),  # inf
    (0xFF800000, 0xFF800000),  # -inf
    (0x80000000, 0x80000000),  # -0.0 keeps its sign
]


def test_bfloat16_rounding_is_nearest_even():
    src = _bits_to_f32([a for a, _ in BF16_CASES])
    got = storage_round(src, "bfloat16")
    assert got.dtype == np.float32
    assert [hex(b) for b in got.view(np.uint32)] == [hex(b) for _, b in BF16_CASES]


def test_bfloat16_rounding_keeps_nan_and_matches_reference_rounding():
    nan = storage_round(_bits_to_f32([0x7FC00001, 0x7F800001, 0xFFFFFFFF]), "bfloat16")
    assert np.all(np.isnan(nan))
    # against an independent formulation: the nearest of the two bfloat16 neighbours, ties even
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 0x7F7F0000, 20000, dtype=np.uint32)
    x = bits.view(np.float32)
    lo = (bits & 0xFFFF0000).view(np.float32).astype(np.float64)
    hi = ((bits & 0xFFFF0000) + 0x10000).view(np.float32).astype(np.float64)
    d_lo, d_hi = x.astype(np.float64) - lo, hi - x.astype(np.float64)
    lo_even = ((bits >> 16) & 1) == 0
    want = np.where((d_lo < d_hi) | ((d_lo == d_hi) & lo_even), lo, hi).astype(np.float32)
    np.testing.assert_array_equal(storage_round(x, "bfloat16"), want)


def test_float16_rounding_is_nearest_even_and_from_float64():
    # ties to even; 65520 is the tie above the largest float16 (65504) -> inf; rounding straight
    # from float64 (1 + 2^-11 + 2^-40 is just above a tie, but rounds to the tie in float32)
    x = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 65520.0, 65519.99, 2.0**-25,
                  1 + 2.0**-11 + 2.0**-40])
    got = storage_round(x, "float16")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [1.0, 1 + 2.0**-9, np.inf, 65504.0, 0.0, 1 + 2.0**-10])


# -- naive lowering of every benchmark -----------------------------------------------------------

@pytest.mark.parametrize("name", sample(NAMES))
def test_naive_lowering_matches_program(name):
    p = get_program(name, 1)
    g = naive_lowering(p)
    validate(g, "h100")
    x = get_inputs(name, 1)
    ref = p.evaluate(x)
    y = run(g, x)
    yg = run(g, x, precision="gpu")
    for o in p.outputs:
        r = ref[o.name]
        assert y[o.name].shape == r.shape
        close(y[o.name], r, 1e-9)
        assert np.all(np.isfinite(yg[o.name])), f"{name}: {o.name} overflows in gpu precision"
        assert as_f16_exactly(yg[o.name])
        assert normwise(yg[o.name], r) < 2e-2, (name, normwise(yg[o.name], r))


# -- bad calls are typed errors ------------------------------------------------------------------

def test_bad_inputs_are_typed_errors():
    g, _ = CASES["tiled_matmul"]()
    x = inputs_for(g)
    with pytest.raises(ProgramError, match="missing input 'B'"):
        run(g, {"A": x["A"]})
    with pytest.raises(ProgramError, match="unknown input.*'Z'"):
        run(g, dict(x, Z=np.zeros(3)))
    with pytest.raises(ShapeError, match=r"input 'A' has shape \(128, 64\), declared \(64, 128\)"):
        run(g, dict(x, A=x["A"].T))
    with pytest.raises(ProgramError, match="precision 'fp8'"):
        run(g, x, precision="fp8")
    for bad in ({"A": x["A"]}, dict(x, Z=1), dict(x, A=x["A"].T)):
        with pytest.raises(MirageError):
            run(g, bad)


def test_run_does_not_modify_inputs():
    g, _ = CASES["concat_mm"]()
    x = inputs_for(g)
    before = {k: v.copy() for k, v in x.items()}
    run(g, x, precision="gpu")
    run(g, x, literal=True)
    for k in x:
        np.testing.assert_array_equal(x[k], before[k])


def test_kernel_op_graph_method_and_function_agree():
    g, _ = CASES["split_k"]()
    x = inputs_for(g)
    np.testing.assert_array_equal(g.run(x)["C"], run(g, x)["C"])
    assert isinstance(g.ops[2], KernelOp)
