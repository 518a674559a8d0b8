"""benchmarks/kernelbench.py: KernelBench-format files through the PyTorch frontend.

The size scaling (divisibility kept, small constants untouched, the file never written), the
automatic factor on the meta device, the selection of the committed table's problems, and an
end-to-end run over three KernelBench-format files written for these tests
(tests/data/kernelbench/): two are captured, fused to one kernel, verified and equal to eager;
the third has a cumulative sum, which the table reports as not captured, naming the operator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import mirage_py as mp  # noqa: E402
from benchmarks import kernelbench as kb  # noqa: E402

DATA = Path(__file__).parent / "data" / "kernelbench"


def test_scale_values_keep_divisibility_and_small_constants():
    vals = [1, 8, 12, 768, 1024, 512, 4095, 128]
    m = kb.scale_values(vals, 16)
    assert m[1] == 1 and m[8] == 8 and m[12] == 12  # below the threshold: not sizes
    assert m[768] % m[12] == 0 and m[768] % m[8] == 0  # n_embd % n_head kept
    assert m[1024] % m[512] == 0 and m[512] % m[128] == 0
    assert m[4095] == 256 and m[128] == 8  # ~ v / 16, never below 8
    assert kb.scale_values(vals, 1) == {v: v for v in vals}
    with pytest.raises(mp.MirageError, match="scale factor"):
        kb.scale_values(vals, 0)


def test_load_problem_scales_the_module_not_the_file():
    path = DATA / "2_RowSoftmax_Residual.py"
    before = path.read_text()
    prob = kb.load_problem(path, 4)
    assert path.read_text() == before
    assert prob.constants == {"rows": (128, 32), "hidden": (384, 96)}  # heads = 12 stays
    assert prob.module.hidden % prob.module.heads == 0
    x, r = prob.get_inputs()
    assert tuple(x.shape) == (32, 96) and tuple(r.shape) == (32, 96)
    model = prob.Model(*prob.get_init_inputs())
    assert tuple(model.weight.shape) == (96, 96)


def test_lists_tuples_and_repeated_lists_scale_elementwise(tmp_path):
    f = tmp_path / "7_Lists.py"
    f.write_text("import torch\nimport torch.nn as nn\n"
                 "class Model(nn.Module):\n    def forward(self, x):\n        return x\n"
                 "sizes = [1024] * 3\nshape = (256, 64)\nreduce_dim = 1\n"
                 "def get_inputs():\n    return [torch.rand(*shape)]\n"
                 "def get_init_inputs():\n    return []\n")
    prob = kb.load_problem(f, 8)
    assert prob.module.sizes == [128, 128, 128]
    assert prob.module.shape == (32, 8) and prob.module.reduce_dim == 1


def test_auto_factor_meets_the_budgets_without_allocating():
    prob, elements, flops = kb.choose_factor(DATA / "1_Linear_GELU_Scale.py",
                                             max_elements=20_000, max_flops=1 << 40)
    assert elements <= 20_000 and prob.factor > 1
    assert flops is not None and flops > 0
    same, e1, _ = kb.choose_factor(DATA / "1_Linear_GELU_Scale.py", 1 << 30, 1 << 40)
    assert same.factor == 1 and e1 == 64 * 512 + 512 * 256 + 256


def test_bad_files_are_typed_errors(tmp_path):
    f = tmp_path / "1_NoModel.py"
    f.write_text("x = 1\n")
    with pytest.raises(kb.KernelBenchFileError, match="no Model defined"):
        kb.load_problem(f)
    f.write_text("def broken(:\n")
    with pytest.raises(kb.KernelBenchFileError, match="syntax error"):
        kb.load_problem(f)
    with pytest.raises(kb.KernelBenchFileError, match="no such file"):
        kb.select_files([str(tmp_path / "nothing")])


def test_issue_set_takes_levels_1_2_without_convolutions_and_the_level3_blocks(tmp_path):
    root = tmp_path / "KernelBench"
    for rel in ("level1/1_Square_matmul.py", "level1/50_conv_standard_2D.py",
                "level1/10_ReLU.py", "level2/9_Matmul_ReLU.py", "level2/1_Conv2D_ReLU.py",
                "level3/1_MLP.py", "level3/9_ResNet18.py", "level3/44_MiniGPTBlock.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    names = [f"{p.parent.name}/{p.name}" for p in kb.issue_set(tmp_path)]
    assert names == ["level1/1_Square_matmul.py", "level1/10_ReLU.py",
                     "level2/9_Matmul_ReLU.py", "level3/1_MLP.py",
                     "level3/44_MiniGPTBlock.py"]


@pytest.mark.slow
def test_end_to_end_on_three_files(tmp_path):
    if None in kb.frontend():
        pytest.skip("the PyTorch frontend (mp.from_torch, mp.compile) is not there yet")
    out = tmp_path / "kb"
    code = kb.main([str(DATA), "--time-budget", "20", "--workers", "1", "--scale", "auto",
                    "--max-elements", "65536", "--out", str(out)])
    assert code == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    rows = {r["file"]: r for r in doc["rows"]}
    assert len(rows) == 3
    for name in ("1_Linear_GELU_Scale.py", "2_RowSoftmax_Residual.py"):
        r = rows[name]
        assert r["captured"] and r["fused"] and r["verified"] and r["equal"], r
        assert r["kernels_found"] < r["kernels_naive"] and r["rel_err"] <= 1e-2, r
        assert r["why"] == "" and r["scale"] > 1, r
    assert rows["2_RowSoftmax_Residual.py"]["kernels_found"] == 1
    r = rows["3_Cumsum_Then_Relu.py"]
    assert not r["captured"] and "cumsum" in r["why"], r
    assert r["unsupported_op"].startswith("aten.cumsum"), r
    assert r["equal"] and "aten.cumsum" in " ".join(r["eager_ops"]), r  # eager in between
    text = out.with_suffix(".md").read_text()
    assert "**Goal: every problem below captured, fused, verified and equal to eager.**" in text
    assert "| **all** | **3** | **2** |" in text
    assert len(out.with_suffix(".jsonl").read_text().splitlines()) == 3
    # --resume keeps the rows already there and runs nothing again
    code = kb.main([str(DATA), "--out", str(out), "--resume"])
    assert code == 0
    assert json.loads(out.with_suffix(".json").read_text())["rows"] == doc["rows"]


def test_the_committed_table_covers_the_issue_set():
    """benchmarks/results/kernelbench_torch.{md,json}: 65 level-1 and 37 level-2 problems
    without convolutions, the 7 level-3 MLPs and attention blocks; every row says why it falls
    short of the goal, and the summary agrees with the rows."""
    results = kb.RESULTS
    doc = json.loads(results.with_suffix(".json").read_text())
    rows = doc["rows"]
    by_level = {lv: [r for r in rows if r["level"] == lv] for lv in ("1", "2", "3")}
    assert [len(by_level[lv]) for lv in ("1", "2", "3")] == [65, 37, 7]
    assert not any("conv" in r["file"].lower() for r in rows)
    assert sorted(r["file"][:-3] for r in by_level["3"]) == sorted(kb.LEVEL3_SET)
    assert doc["summary"] == kb.summary(rows)
    for r in rows:
        complete = all(r.get(k) for k in ("captured", "fused", "verified", "equal"))
        assert complete == (r["why"] == ""), r
    text = results.with_suffix(".md").read_text()
    assert "**Goal: every problem below captured, fused, verified and equal to eager.**" in text
    tot = {k: sum(s[k] for s in doc["summary"].values()) for k in ("problems", "captured")}
    assert f"| **all** | **{tot['problems']}** | **{tot['captured']}** |" in text


def test_the_reason_for_more_than_one_kernel_comes_from_a_one_kernel_search():
    """A row superoptimised into more than one kernel says why, from the generator's search of
    the whole program limited to one kernel: a row softmax has a one-kernel graph (its predicted
    time is kept), and the reason compares it with the answer's; without one it says whether
    the search ran to its end."""
    p = mp.Program("row_softmax")
    x = p.input("x", (64, 256))
    p.output(mp.softmax(x * 2.0, axis=-1), name="y")
    found = kb._one_kernel(p, "h100", 60.0)
    assert found["one_kernel_candidates"] >= 1 and found["one_kernel_complete"], found
    assert found["one_kernel_us"] > 0
    row = {"captured": True, "fused": True, "kernels_found": 2, **found}
    row["predicted_us_found"] = found["one_kernel_us"] / 2
    assert "exists" in kb.not_one_kernel(row) and "predicted slower" in kb.not_one_kernel(row)
    row["predicted_us_found"] = found["one_kernel_us"] * 2
    assert "did not choose it" in kb.not_one_kernel(row)
    none = dict(row, one_kernel_us=None, one_kernel_candidates=0)
    assert "no one-kernel graph in the generator's search space" in kb.not_one_kernel(none)
    none["one_kernel_complete"] = False
    assert "did not finish" in kb.not_one_kernel(none)
    assert kb.not_one_kernel(dict(row, kernels_found=1)) == ""
