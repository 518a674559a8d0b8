"""The measuring core (mirage_py/examples/measure.py) on the CPU, the dry path every GPU
benchmark shares: the checks tell a right result from a wrong one, the baselines are checked
like ours, a failing graph or compiler is a result, and the callers (mirage-py bench's
measure_gpu, tuning_table's measure_candidates) write what they wrote before."""

import time
import types

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.examples.fixtures import hand_built
from mirage_py.examples.measure import (Build, Check, Device, References, check,
                                        measure_baselines, measure_ours, references, time_graph,
                                        torch_inputs)
from mirage_py.examples.programs import get_inputs, get_program
from mirage_py.ugraph.lower import naive_lowering

torch = pytest.importorskip("torch")

DRY = Device(dry=True, budget_s=0.01, warmup=1)


def _lora():
    p = get_program("lora", 1)
    x = get_inputs("lora", 1, seed=3)
    tx = torch_inputs(p, x, DRY.torch_device)
    return p, tx, references(p, tx, x, DRY)


def _lora_wrong_sign() -> mp.Program:
    """lora with the low-rank term subtracted: the same inputs and output, a wrong result."""
    p = mp.Program("lora_wrong")
    X = p.input("X", (16, 256), "float16")
    W = p.input("W", (256, 4096), "float16")
    A = p.input("A", (256, 16), "float16")
    B = p.input("B", (16, 4096), "float16")
    p.output(X @ W - (X @ A) @ B, name="Y")
    return p


def test_references_are_float64_and_eager_in_the_programs_dtype():
    p, tx, refs = _lora()
    assert refs.float64["Y"].dtype == torch.float64 and refs.eager["Y"].dtype == torch.float16
    x = get_inputs("lora", 1, seed=3)
    want = p.evaluate(x)["Y"]
    assert float((refs.float64["Y"] - torch.from_numpy(want)).abs().max()) < 1e-9


def test_ours_right_graph_small_error_wrong_graph_large():
    """The hand-built lora kernel agrees with eager and float64 to fp16 accuracy; a graph
    computing X@W - (X@A)@B on the same inputs is caught: relative error near
    ||2 XAB|| / ||XW + XAB|| (about 1.4 here), not allclose."""
    _, tx, refs = _lora()
    right = measure_ours(DRY, hand_built("lora", 1), "h100", tx, refs)
    assert right.error is None and right.check.finite and right.check.allclose_eager
    assert right.check.rel_err_vs_float64 < 2e-3 and right.check.rel_err_vs_eager < 2e-3
    assert right.call is not None and right.call.runs >= 5
    assert 0 < right.call.min_us <= right.call.us
    assert right.graph is None  # no CUDA graphs on the CPU
    wrong = measure_ours(DRY, naive_lowering(_lora_wrong_sign()), "h100", tx, refs, "wrong")
    assert wrong.label == "wrong" and not wrong.check.allclose_eager
    assert 0.8 < wrong.check.rel_err_vs_float64 < 2.5
    assert wrong.check.finite


def test_check_flags_non_finite_and_tolerates_no_float64():
    _, _, refs = _lora()
    y = refs.eager["Y"].clone()
    y[0, 0] = float("nan")
    c = check({"Y": y}, References(refs.eager))
    assert c == Check(c.rel_err_vs_eager, None, False, False)
    exact = check({"Y": refs.float64["Y"]}, refs)
    assert exact.rel_err_vs_float64 == 0.0 and exact.finite
    assert 0 < exact.rel_err_vs_eager < 1e-3  # eager's own fp16 rounding
    same = check({"Y": refs.eager["Y"].double()}, refs)
    assert same.rel_err_vs_eager == 0.0 and same.allclose_eager


def test_baselines_are_checked_like_ours(monkeypatch):
    """Eager's float64 error is its rounding; a 'compiler' that returns twice the result is
    flagged (relative error 1), one that raises is an error with nothing timed."""
    p, tx, refs = _lora()
    monkeypatch.setattr(torch, "compile",
                        lambda fn: lambda x: {k: 2 * v for k, v in fn(x).items()})
    eager, compiled = measure_baselines(DRY, "lora", p, tx, refs)
    assert (eager.label, compiled.label) == ("eager", "torch_compile")
    assert eager.check.rel_err_vs_eager == 0 and eager.check.rel_err_vs_float64 < 2e-3
    assert abs(compiled.check.rel_err_vs_eager - 1.0) < 1e-3
    assert not compiled.check.allclose_eager and compiled.call is not None

    def broken(fn):
        raise RuntimeError("no compiler")
    monkeypatch.setattr(torch, "compile", broken)
    _, failed = measure_baselines(DRY, "lora", p, tx, refs)
    assert failed.error == "RuntimeError: no compiler" and failed.call is None


def test_attention_baseline_includes_sdpa(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn: fn)  # the CPU's compile takes 10 s
    p = get_program("mqa", 1, kv=128)  # small: CPU float16 matmuls are slow
    rng = np.random.default_rng(0)
    x = {t.name: rng.standard_normal(t.shape) * 0.5 for t in p.inputs}
    tx = torch_inputs(p, x, "cpu")
    refs = references(p, tx, x, DRY)
    labels = {m.label: m for m in measure_baselines(DRY, "mqa", p, tx, refs)}
    assert set(labels) == {"eager", "torch_compile", "sdpa"}
    assert labels["sdpa"].check.rel_err_vs_float64 < 5e-3


def test_timer_times_the_call():
    """The dry timer's median covers the call (a 2 ms sleep) and the budget caps the runs."""
    dev = Device(dry=True, budget_s=0.05, warmup=1, repeat=50)
    t = dev.timer(lambda: time.sleep(0.002))
    assert t.us >= 2000 and 5 <= t.runs < 50 and t.min_us <= t.us
    assert Device(dry=True, budget_s=None, warmup=0, repeat=7).timer(lambda: None).runs == 7


def test_time_graph_records_a_failure():
    m = time_graph(DRY, hand_built("lora", 1), "h100", inputs={"X": torch.zeros(3)})
    assert m.error is not None and m.call is None
    ok = time_graph(DRY, hand_built("lora", 1), "h100")
    assert ok.error is None and ok.call.us > 0


def test_builds_name_the_runtime_switches():
    assert [b.value for b in Build] == ["default", "no_tma", "no_wgmma"]
    assert Build.DEFAULT.env is None and Build.NO_TMA.env == "MIRAGE_PY_NO_TMA"


def test_bench_measure_gpu_dry_writes_its_columns(monkeypatch):
    """mirage-py bench's GPU measurement, run dry: the record holds the same keys as on a GPU
    (less the copy bandwidth), ours checked small, the broken 'compiler' large."""
    from mirage_py.examples.bench import markdown, measure_gpu
    monkeypatch.setattr(torch, "compile",
                        lambda fn: lambda x: {k: 2 * v for k, v in fn(x).items()})
    opt = types.SimpleNamespace(annotated=hand_built("lora", 1), target="h100")
    rec = {"name": "lora", "bs": 1, "bytes_found": 1}
    measure_gpu("lora", 1, opt, rec, dev=DRY)
    assert set(rec["check_rel_err"]) == {"ours", "torch_compile"}
    assert rec["check_rel_err"]["ours"] < 2e-3
    assert abs(rec["check_rel_err"]["torch_compile"] - 1.0) < 1e-3
    assert list(rec["measured_us"]) == ["ours", "torch_eager", "torch_compile"]
    t = rec["measured_us"]
    assert rec["speedup_vs_eager"] == t["torch_eager"] / t["ours"]
    assert rec["speedup_vs_best_baseline"] == min(t["torch_eager"], t["torch_compile"]) / t["ours"]
    assert "copy_bandwidth" not in rec
    rec.update({"predicted_us_naive": 2.0, "predicted_us_found": 1.0, "bound": None,
                "timed_out": False, "states": 1, "candidates": 1, "verified": 1,
                "search_seconds": 0.1, "kernels_naive": 4, "kernels_found": 1,
                "kernels_fixture": 1, "predicted_us_fixture": 1.0, "bandwidth_fraction": 0.5})
    md = markdown([rec], "cpu")
    assert (f"| lora | 1 | {t['ours']:.1f} | - | {t['torch_eager']:.1f} | "
            f"{t['torch_compile']:.1f} | - | ") in md  # no cp.async build, no sdpa


@pytest.mark.slow  # 9 s: two emulator builds
def test_ours_gpu_branch_on_fake_cupy(monkeypatch):
    """Ours' GPU branch (compiled graph, NaN-poisoned outputs and workspace, DLPack to torch)
    on the CPU stand-in for CuPy, whose kernels run in the emulator: the right graph checks
    small, the wrong-sign graph large."""
    fake_cupy = pytest.importorskip("fake_cupy")
    cp = fake_cupy.install(monkeypatch)
    cp.cuda.Device = lambda: types.SimpleNamespace(synchronize=lambda: None)
    try:
        from mirage_py.codegen_cuda.emulator import build_emulator_code  # noqa: F401
    except Exception as e:  # pragma: no cover
        pytest.skip(f"emulator unavailable: {e}")
    from mirage_py.examples.measure import Ours
    _, tx, refs = _lora()
    gpu = Device(dry=False)
    right = check(Ours(hand_built("lora", 1), "h100", gpu).check_call(tx), refs)
    assert right.finite and right.rel_err_vs_float64 < 2e-3
    wrong = check(Ours(naive_lowering(_lora_wrong_sign()), "h100", gpu).check_call(tx), refs)
    assert wrong.finite and wrong.rel_err_vs_float64 > 0.8 and not wrong.allclose_eager


def test_tuning_table_measure_candidates_dry():
    """tuning_table's measurement through the core, dry: every graph timed (the naive lowering,
    a candidate, the chosen graph), its prediction beside it, and the Kendall tau over them."""
    from benchmarks.tuning_table import measure_candidates
    from mirage_py.superopt import default_model
    from mirage_py.tuning import AnnotatedGraph
    fixture = hand_built("lora", 1)
    opt = types.SimpleNamespace(
        parts=[types.SimpleNamespace(naive=naive_lowering(get_program("lora", 1)),
                                     annotated=AnnotatedGraph(fixture))],
        model=default_model())
    ranked = [(0.0, types.SimpleNamespace(graph=fixture))]
    out = measure_candidates(None, "h100", ranked, opt, dev=DRY)
    assert [r["label"] for r in out["rows"]] == ["naive", "candidate0", "chosen"]
    assert out["measured"] == out["total"] == 3 and -1 <= out["kendall_tau"] <= 1
    for r in out["rows"]:
        assert r["predicted_us"] > 0 and r["measured_us"] > 0 and r["error"] is None
