"""Records, calibration and the learned cost models (mirage_py.learned) on a committed sample of
KernelBench's published timings (tests/data/published_sample.jsonl: a few dozen problems on two
GPUs, made from benchmarks/results/published_*.{jsonl,json})."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

import mirage_py as mp
from mirage_py.eager import DEFAULT, EagerConstants, KernelClass
from mirage_py.errors import LearnedModelError
from mirage_py.learned import (LearnedCostModel, ModelKind, Split, calibrate, family_of,
                               from_export_row, load_records, predict_us, save_records, score,
                               split_of, top_k, train)
from mirage_py.learned.calibrate import Prepared
from mirage_py.targets import get_target

SAMPLE = Path(__file__).parent / "data" / "published_sample.jsonl"


@pytest.fixture(scope="module")
def sample():
    return load_records(SAMPLE)


def test_sample_records_round_trip(sample, tmp_path):
    assert len(sample) >= 40 and len({r.target for r in sample}) >= 2
    save_records(sample, tmp_path / "r.jsonl")
    again = load_records(tmp_path / "r.jsonl")
    assert again == sample
    with pytest.raises(LearnedModelError, match="not a training record"):
        from mirage_py.learned.records import record_from_json
        record_from_json({"problem": "x"})


def test_split_is_by_problem_with_a_fixed_seed(sample):
    """Every record of a problem (every GPU, every size) falls on the same side; the split is a
    hash of the problem and the seed, so it does not depend on which records exist."""
    sides = {}
    for r in sample:
        assert sides.setdefault(r.problem, r.split()) is r.split()
    names = [f"level1/{i}_Problem" for i in range(400)]
    test = [n for n in names if split_of(n) is Split.TEST]
    assert 160 < len(test) < 240
    assert [split_of(n) for n in names] == [split_of(n) for n in reversed(names)][::-1]
    assert [split_of(n, seed=1) for n in names] != [split_of(n) for n in names]
    assert Split.TRAIN in sides.values() and Split.TEST in sides.values()


def test_families():
    assert family_of("level2/12_Gemm_Multiply_LeakyReLU") == "matmul"
    assert family_of("level1/23_Softmax") == "softmax"
    assert family_of("level2/1_Conv2D_ReLU_BiasAdd") == "conv"
    assert family_of("level3/1_MLP") == "mlp"
    assert family_of("level3/43_MinGPTCausalAttention") == "attention"


def test_scores():
    s = score([1.0, 2.0, 3.0], [10.0, 20.0, 30.0])
    assert s.tau == 1.0 and s.median_log_error == pytest.approx(math.log(10))
    assert score([3.0, 2.0, 1.0], [1.0, 2.0, 3.0]).tau == -1.0
    k = top_k(["a", "a", "a", "b", "b"], [1, 2, 3, 2, 1], [3, 2, 1, 1, 2])
    assert (k.groups, k.top1, k.top5) == (2, 0.0, 1.0)


def test_calibration_recovers_known_constants(sample):
    """Records whose times the eager pricing made with known constants: the fit finds
    constants that reproduce them (within 2 %) and the well-determined ones themselves."""
    truth = EagerConstants(mem_eff=0.7, reduce_mem_eff=0.6, gemm_eff=0.45, conv_eff=0.5,
                           launch_scale=1.4, host_kernel_us=7.0, host_call_us=1.5,
                           target_mem_eff=(("l4", 0.8),), target_gemm_eff=(("h100_pcie", 1.2),))
    recs = [replace(r, measured_us=predict_us(r, truth)) for r in sample]
    # the fit's vectorised pricing is the stream simulation's
    assert Prepared(recs).predict(truth) == pytest.approx([r.measured_us for r in recs],
                                                          rel=1e-9)
    fit = calibrate(recs)
    for r in recs:
        assert predict_us(r, fit) == pytest.approx(r.measured_us, rel=0.02)
    assert fit.mem("l4") == pytest.approx(0.56, rel=0.05)
    assert fit.gemm("h100_pcie") == pytest.approx(0.54, rel=0.05)
    with pytest.raises(LearnedModelError, match="at least"):
        calibrate(sample[:3])


def _relabelled(sample):
    """Known truth the analytic model does not know: a record with a GEMM takes 4x what the
    analytic model says, and one with a softmax 3x."""
    out = []
    for r in sample:
        f = 1.0
        if any(k.kind is KernelClass.GEMM for k in r.kernels):
            f *= 4.0
        if any(k.kind is KernelClass.SOFTMAX for k in r.kernels):
            f *= 3.0
        out.append(replace(r, measured_us=predict_us(r, DEFAULT) * f))
    return out


@pytest.mark.parametrize("kind,kw", [
    (ModelKind.GBT, {"params": {"min_data_in_leaf": 3}, "rounds": 200}),
    (ModelKind.GNN, {"epochs": 300}),
    # the other settings the graph model's grid searches: depth, width, rate, ranking margin
    (ModelKind.GNN, {"epochs": 300, "layers": 2, "hidden": 32, "lr": 5e-3, "margin": 0.2}),
], ids=["gbt", "gnn", "gnn-2-layers-margin"])
def test_learned_models_learn_a_known_ordering(sample, kind, kw, tmp_path):
    """Trained on the training half of relabelled records, each learned model orders the held-out
    half better than the analytic model (which cannot know the factors) and comes within 25 %
    of the truth in the median; saved and loaded, it predicts the same."""
    recs = _relabelled(sample)
    tr = [r for r in recs if r.split() is Split.TRAIN]
    te = [r for r in recs if r.split() is Split.TEST]
    model = train(tr, kind, DEFAULT, **kw)
    pred = model.predict(te)
    meas = [r.measured_us for r in te]
    learned, analytic = score(pred, meas), score([predict_us(r) for r in te], meas)
    assert learned.tau > analytic.tau + 0.05
    assert learned.median_log_error < math.log(1.25) < analytic.median_log_error
    path = str(tmp_path / "model")
    model.save(path)
    loaded = mp.learned.load_model(path)
    assert loaded.predict_records(te) == pytest.approx(pred, rel=1e-6)


def test_training_needs_records_and_lightgbm_message():
    with pytest.raises(LearnedModelError, match="no records"):
        train([], ModelKind.GBT)


def test_one_pipeline_takes_our_measured_ugraphs_and_the_tuner_uses_the_model(tmp_path, sample):
    """The results database's export (our own measured μGraphs; here measured by the fake
    runner) becomes records with the operator graph's edges; a model trained on them and the
    published records ranks superopt's candidates (cost_model=...) and the answer is verified."""
    from mirage_py.tuning import FakeRunner, export_training_set
    p = mp.Program("small")
    x = p.input("X", (16, 256), dtype="float16")
    w = p.input("W", (256, 512), dtype="float16")
    p.output(mp.silu(mp.rms_norm(x) @ w), name="Y")
    db = tmp_path / "r.sqlite"
    mp.superopt(p, workers=1, progress=False, database=str(db), runner=FakeRunner(),
                measure_top=3)
    export_training_set(str(db), str(tmp_path / "t.jsonl"), measured_only=True)
    rows = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    ours = [from_export_row(r) for r in rows]
    assert ours and all(r.measured_us > 0 and r.kernels for r in ours)
    naive = max(ours, key=lambda r: len(r.kernels))
    assert len(naive.kernels) > 1 and any(k.sources for k in naive.kernels)
    model = train(sample + ours, ModelKind.GBT, DEFAULT, params={"min_data_in_leaf": 3},
                  rounds=20)
    cm = LearnedCostModel(model)
    opt = mp.superopt(p, workers=1, progress=False, database=False, cost_model=cm)
    assert all(v.equivalent for v in opt.verification)
    assert opt.estimated_time_us > 0 and math.isfinite(opt.estimated_time_us)
    with pytest.raises(LearnedModelError, match="no measured time"):
        from_export_row({"record_id": 1, "measured_us": None})


def test_published_timings_are_paired_with_the_problem_files_of_their_commit():
    """The committed records: each timing file with the problem sizes of the commit that wrote
    it -- KernelBench's first problem (C = A @ B, square) is N = 4096 in the H100 PCIe's files
    (v0.2) and N = 2048 in January 2025's (v0.1) -- and every GPU's record of a problem on the
    same side of the split."""
    from benchmarks.published_gpu import published_records
    recs = [r for r in published_records() if r.problem == "level1/1_Square_matrix_multiplication_"]
    flops = {(r.target, r.source.split("@")[0]): r.kernels[0].flops for r in recs}
    assert flops[("h100_pcie", "H100_PCIe_LambdaLabs")] == 2.0 * 4096 ** 3
    assert flops[("h100", "H100_together")] == 2.0 * 2048 ** 3
    assert flops[("t4", "T4_modal")] == 2.0 * 2048 ** 3
    assert len({r.split() for r in recs}) == 1
    assert {r.target for r in recs} >= {"h100_pcie", "h100", "l40s", "a100", "l4", "t4"}


def test_gemm_features_are_the_shape_cublas_sees(sample):
    """A GEMM node carries its shape, layout and wave fill; other nodes and the host node
    zeros; the feature rows have every named column."""
    from mirage_py.learned.features import GEMM_NAMES, NODE_NAMES, node_features
    r = next(r for r in sample if r.problem == "level1/7_Matmul_with_small_K_dimension_"
             and r.target == "h100_pcie")
    f = node_features(r)
    assert f.shape == (len(r.kernels) + 1, len(NODE_NAMES))
    col = {n: i for i, n in enumerate(NODE_NAMES)}
    g = r.kernels[0].gemm
    assert (g.m, g.n, g.k) == (32768, 32768, 64)
    assert math.expm1(f[0, col["gemm_log_k"]]) == pytest.approx(64)
    assert 0 < f[0, col["gemm_wave_fill"]] <= 1
    t = get_target("h100_pcie")  # k = 64: 32 flops a byte, just compute-bound
    k = r.kernels[0]
    assert f[0, col["log_mem_over_compute"]] == pytest.approx(
        math.log((k.bytes / t.mem_bw) / (k.flops / t.fp32_flops)))
    assert f[0, col["log_mem_over_compute"]] < 0
    assert not f[-1, [col[n] for n in GEMM_NAMES]].any()
    linear = [k.gemm for r in sample for k in r.kernels
              if r.problem.startswith("level2/") and k.gemm is not None]
    assert linear and all(g.b_transposed and not g.a_transposed for g in linear)


def test_tree_ranking_loss_and_feature_exclusion(sample):
    """The trees' optional pairwise ranking term (same-GPU pairs) still learns the relabelled
    ordering; columns left out are left out of the model and of its saved form."""
    from mirage_py.learned.gbt import BoostedTrees
    recs = _relabelled(sample)
    tr = [r for r in recs if r.split() is Split.TRAIN]
    te = [r for r in recs if r.split() is Split.TEST]
    meas = [r.measured_us for r in te]
    m = BoostedTrees(DEFAULT, rounds=200, params={"min_data_in_leaf": 3}, rank_weight=1.0,
                     exclude=("gemm_",)).fit(tr)
    assert score(m.predict(te), meas).tau > score([predict_us(r) for r in te], meas).tau + 0.05
    assert m.booster.num_feature() == len(
        [n for n in __import__("mirage_py.learned.features", fromlist=["NODE_NAMES"]).NODE_NAMES
         if not n.startswith("gemm_")])
    assert BoostedTrees.from_json(m.to_json()).predict(te) == pytest.approx(m.predict(te))
    assert m.predict(te, rounds=10) != m.predict(te)


def test_cross_validation_sees_only_the_records_it_is_given(sample):
    """Folds are by problem (fixed-seed hash); cross_validate fits on the other folds and
    scores every candidate on out-of-fold predictions: a candidate that predicts the truth
    wins, one that predicts its reverse loses."""
    from mirage_py.learned.select import FOLDS, cross_validate, fold_of, select
    tr = [r for r in sample if r.split() is Split.TRAIN]
    folds = {}
    for r in tr:
        assert folds.setdefault(r.problem, fold_of(r.problem)) == fold_of(r.problem)
    assert set(folds.values()) <= set(range(FOLDS))
    seen = []

    def fp(train_recs, held, c):
        seen.append(({r.problem for r in train_recs}, {r.problem for r in held}))
        return {"truth": [r.measured_us for r in held],
                "reverse": [1.0 / r.measured_us for r in held]}
    res = cross_validate(tr, fp, constants=[DEFAULT] * FOLDS)
    assert all(not (a & b) for a, b in seen) and len(seen) == FOLDS
    best = select(res)
    assert best[0].candidate == "truth" and best[0].tau == pytest.approx(1.0)
    assert best[-1].tau == pytest.approx(-1.0)
    # one validation split: fold 0 held out, one fit, only its records scored
    seen.clear()
    res = cross_validate(tr, fp, constants=[DEFAULT] * FOLDS, held_folds=(0,))
    assert len(seen) == 1 and seen[0][1] == {p for p, f in folds.items() if f == 0}
    assert not (seen[0][0] & seen[0][1])
    assert select(res)[0].candidate == "truth"


def test_graph_grid_fits_once_per_setting_and_scores_every_epoch_count():
    from mirage_py.learned.select import GraphCandidate, GraphGrid
    grid = GraphGrid(epochs=(50, 100), hidden=(32, 64), layers=(2, 3), lr=(1e-3,),
                     margins=(0.0, 0.5))
    fits = grid.fits()
    assert len(fits) == 8 and len(set(fits)) == 8
    assert all(f.epochs == 100 for f in fits)
    assert GraphCandidate(100, 1.0, 32, 2, 1e-3, 0.5) in fits
    with pytest.raises(LearnedModelError, match="bad settings"):
        from mirage_py.learned.gnn import GraphSage
        GraphSage(DEFAULT, layers=2, margin=-1.0)


def test_full_size_searches_run_in_a_child_held_to_the_memory_cap(tmp_path, monkeypatch):
    """superopt at KernelBench's sizes runs in a forked child: an allocation past the cap is a
    row saying so (not the machine's OOM killer), an error is a row, a result comes back; rows
    made under other pricing files are stale and searched again."""
    import numpy as np

    import benchmarks.published_gpu as pg
    big = lambda: {"n": np.ones(pg.MEMORY_LIMIT // 4, dtype=np.float64).size}  # noqa: E731
    row = pg._in_child(big, (), 60)
    assert row["status"].startswith("over the memory limit") and row["memory_stage"]

    def allocate():
        raise MemoryError("Unable to allocate 14.0 GiB")
    try:
        allocate()
    except MemoryError as e:
        assert pg.memory_stage(e) == "test_learned.py allocate"
    assert pg._in_child(lambda: 1 / 0, (), 60)["status"].startswith("error: ZeroDivisionError")
    assert pg._in_child(lambda x: {"status": "ok", "x": x}, (3,), 60) == {"status": "ok", "x": 3}
    ours = tmp_path / "ours.jsonl"
    ours.write_text(json.dumps({"problem": "a", "status": "ok", "pricing": "old"}) + "\n" +
                    json.dumps({"problem": "b", "status": "ok", "pricing": pg.pricing_key()}))
    monkeypatch.setattr(pg, "OURS", ours)
    assert set(pg._ours()) == {"b"} and set(pg._ours(stale=True)) == {"a", "b"}
    # the table: an answer of an older pricing is shown, marked; a memory failure names its
    # stage
    rec = sample_primary_record()
    old = {"status": "ok", "verified": True, "pricing": "old", "predicted_ms": 1.5}
    assert pg._ours_status(rec, old) == pg.OLDER_PRICING
    assert pg._ours_cell({"ours_status": pg.OLDER_PRICING, "ours_predicted_ms": 1.5}) == \
        "1.5 (older pricing)"
    assert pg._ours_status(rec, {**old, "pricing": pg.pricing_key()}) == "ok"
    naive = {"status": "ok", "kernels_naive": 3, "predicted_ms": 2.0, "naive_predicted_ms": 2.0}
    assert pg.naive_answer(naive) and not pg.naive_answer({**naive, "predicted_ms": 1.0})
    assert not pg.naive_answer({**naive, "kernels_naive": 1})  # one kernel: nothing to fuse
    mem = {"status": "over the memory limit (6 GiB)", "memory_stage": "verifier/degree.py _div"}
    st = pg._ours_status(rec, mem)
    assert pg._ours_cell({"ours_status": st}) == "over 6 GiB (verifier/degree.py _div)"


def sample_primary_record():
    """A captured record of the primary GPU from the H100 PCIe's problem files."""
    import benchmarks.published_gpu as pg
    from mirage_py.learned import Record
    return Record("level1/19_ReLU", "relu", pg.PRIMARY, (), 1, 1.0, "src", "p", True,
                  {"commit": pg._primary_commit()})


MINGPT_STYLE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Causal attention with its mask a buffer compared with 0 (minGPT's masked_fill)."""

    def __init__(self, d, max_len):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len))
                             .view(1, max_len, max_len))

    def forward(self, x):
        T = x.size(1)
        q, k, v = self.qkv(x).split(x.size(2), dim=2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / 4.0)
        att = att.masked_fill(self.bias[:, :T, :T] == 0, float("-inf"))
        return torch.softmax(att, dim=-1) @ v


batch_size = 2
seq_len = 8
d = 16
max_len = 16


def get_inputs():
    return [torch.randn(batch_size, seq_len, d)]


def get_init_inputs():
    return [d, max_len]
'''


def test_a_buffer_mask_is_captured_on_the_cpu_where_meta_tensors_fail(tmp_path):
    """KernelBench's minGPT problems (level3/43, 44, 50) mask with a buffer compared with 0:
    on meta tensors its values are unknown and the comparison has no operator, so the problem
    is captured on the CPU (it fits CPU_CAPTURE_BYTES), where the buffer is a constant causal
    mask; the program equals the model."""
    import numpy as np
    import torch

    import benchmarks.published_gpu as pg
    path = tmp_path / "1_MinGPTStyle.py"
    path.write_text(MINGPT_STYLE)
    program, model, inputs = pg.problem_program(path)
    assert next(model.parameters()).device.type == "cpu"
    assert any(t.op == "mask" for t in program.nodes())
    got = program.evaluate(program.bind(model, *inputs))
    (out,) = got.values()
    with torch.no_grad():
        want = model(*inputs).double().numpy()
    assert np.allclose(out, want, atol=1e-5)
