"""The GPU session's measurements: compile-load, run, check and time what ``gpu_prepare`` stored.

No search happens here (a GPU machine's minutes are for measuring): every answer comes from
``gpu-bundle/`` (``benchmarks/gpu_prepare.py``), every module from its prebuilt cubin when one
is there. Each result is appended to ``$OUT/<step>.jsonl`` as soon as it exists, so a step cut
short by its time cap keeps what it measured; ``report`` turns the JSONL into tables::

    python -m benchmarks.gpu_measure warm --shard 3 --of 16   # torch.compile caches (background)
    python -m benchmarks.gpu_measure bench                    # nine benchmarks, bs 1 and 8
    python -m benchmarks.gpu_measure tuning                   # predicted vs measured schedules
    python -m benchmarks.gpu_measure kernelbench              # KernelBench level 2, files' sizes
    python -m benchmarks.gpu_measure report --out DIR         # DIR/*.jsonl -> DIR/gpu.md
    python -m benchmarks.gpu_measure bench --dry-run          # the same code path on the CPU

How it times (KernelBench's way): CUDA events around one call, the L2 cache flushed before each
timed call (a 256 MiB buffer written), warm-up first, the median of the runs. Every variant is
also timed as a CUDA graph replay ("graph" columns: launch overhead removed, for ours, eager and
torch.compile alike). Correctness: ours with NaN-poisoned outputs and workspace on fresh random
inputs, against PyTorch eager (``torch.allclose``, atol = rtol = 1e-2 as KernelBench) and
against a float64 evaluation (norm-wise relative error).

``--dry-run`` runs every step on the CPU -- PyTorch on CPU tensors, our answers on the μGraph
interpreter, wall-clock timing -- to check the script before spending device time on it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu_prepare import BUNDLE  # noqa: E402
from mirage_py.examples.measure import (Build, Device, MeasuredSystem, Ours,  # noqa: E402
                                       References, close, measure_baselines, measure_ours,
                                       random_inputs, references, time_graph, torch_inputs)
from mirage_py.examples.torch_baselines import copy_bandwidth, rel_err  # noqa: E402
from mirage_py.tuning import AnnotatedGraph  # noqa: E402


def out_dir() -> Path:
    d = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results" / "gpu-session")
    d.mkdir(parents=True, exist_ok=True)
    return d


def append(step: str, row: dict) -> None:
    with open(out_dir() / f"{step}.jsonl", "a") as f:
        f.write(json.dumps(row, default=_jsonable) + "\n")


def _jsonable(x: Any) -> Any:
    if hasattr(x, "to_json"):  # a Timing
        return x.to_json()
    if hasattr(x, "item"):
        return x.item()
    return str(x)


# ---- devices ---------------------------------------------------------------------------------

def device_target(dev: Device) -> str:
    """Our target of the device measured (H200 -> ``h200``, H100 PCIe -> ``h100_pcie``, any
    other H100 -> ``h100``): the model's predictions are made for it too."""
    if dev.dry:
        return "h100"
    import torch
    name = torch.cuda.get_device_name(0)
    return "h200" if "H200" in name else "h100_pcie" if "PCIe" in name else "h100"


def predict_on(graph: Any, target: str) -> float:
    from mirage_py.superopt import default_model
    return float(default_model().predict(graph, target))


# ---- step: the nine benchmarks ----------------------------------------------------------------

def measure_bench(dev: Device, only: list[str] | None) -> None:
    from benchmarks.programs import get_inputs
    from mirage_py.superopt.result import OptimizedProgram
    if not dev.dry:
        append("bench", {"copy_bandwidth": copy_bandwidth()})
    for f in sorted((BUNDLE / "bench").glob("*.json"), key=lambda f: (
            int(f.stem.rsplit("-bs", 1)[1]), f.stem)):
        if only and f.stem not in only and f.stem.rsplit("-bs", 1)[0] not in only:
            continue
        doc = json.loads(f.read_text())
        row = {k: doc[k] for k in ("name", "bs", "kernels_naive", "kernels", "predicted_us",
                                   "predicted_us_naive", "predicted_us_fixture",
                                   "bytes_moved", "search_seconds")}
        try:
            opt = OptimizedProgram.from_json(doc["opt"])
            row["device_target"] = device_target(dev)
            row["predicted_us_device"] = predict_on(opt.annotated, row["device_target"])
            p = opt.program
            x = get_inputs(doc["name"], doc["bs"], seed=1234)
            tx = torch_inputs(p, x, dev.torch_device)
            row.update(_bench_variants(dev, opt, p, doc["name"], tx,
                                       references(p, tx, x, dev)))
        except Exception as e:  # noqa: BLE001 -- a failure is a row
            row["error"] = f"{type(e).__name__}: {e}"[:800]
            row["traceback"] = traceback.format_exc()[-2000:]
        append("bench", row)
        print(_bench_line(row), flush=True)


def _times(row: dict, m: MeasuredSystem) -> None:
    """``m``'s times into ``row["times"]`` (per call as its label, replay as ``<label>_graph``)
    and its failures into ``row["errors"]``."""
    if m.call is not None:
        row["times"][m.label] = m.call.to_json()
    if m.graph is not None:
        row["times"][m.label + "_graph"] = m.graph.to_json()
    if m.error is not None:
        row["errors"][m.label] = m.error[:400]
    if m.graph_error is not None:
        row["errors"][m.label + "_graph"] = m.graph_error[:400]


def _bench_variants(dev: Device, opt: Any, p: Any, name: str, tx: dict,
                    refs: References) -> dict:
    row: dict = {"times": {}, "errors": {}}
    for label, graph in (("ours", opt.annotated), ("ours_naive", opt.naive_graph)):
        m = measure_ours(dev, graph, opt.target, tx, refs, label)
        row[f"{label}_rel_err_vs_eager"] = m.check.rel_err_vs_eager
        row[f"{label}_rel_err_vs_float64"] = m.check.rel_err_vs_float64
        row[f"{label}_allclose_eager"] = m.check.allclose_eager
        row[f"{label}_finite"] = m.check.finite
        if not dev.dry:
            row[f"{label}_compile_s"] = round(m.compile_s, 3)
            row[f"{label}_built_for"] = m.built_for
            row[f"{label}_tma"] = m.tma
        _times(row, m)
        if m.graph_check is not None:
            row[f"{label}_graph_allclose_eager"] = m.graph_check.allclose_eager
    for m in measure_baselines(dev, name, p, tx, refs):
        if m.check is not None:
            key = {"eager": "eager", "torch_compile": "compile", "sdpa": "sdpa"}[m.label]
            if m.compile_s is not None:
                row["torch_compile_s"] = m.compile_s
            row[f"{key}_rel_err_vs_float64"] = m.check.rel_err_vs_float64
        _times(row, m)
    return row


def _bench_line(r: dict) -> str:
    if "error" in r:
        return f"{r['name']} bs={r['bs']}: ERROR {r['error'][:300]}"
    t = r["times"]
    cells = " ".join(f"{k}={v['us']:.1f}" for k, v in t.items())
    return (f"{r['name']} bs={r['bs']}: {cells} us; ours err {r['ours_rel_err_vs_float64']:.1e} "
            f"(eager {r['eager_rel_err_vs_float64']:.1e}) allclose {r['ours_allclose_eager']}")


# ---- step: predicted vs measured schedules ----------------------------------------------------

def measure_tuning(dev: Device, only: list[str] | None, bs: int | None = None) -> None:
    for f in sorted((BUNDLE / "tuning").glob("*.json")):
        doc = json.loads(f.read_text())
        if (only and doc["name"] not in only) or (bs is not None and doc["bs"] != bs):
            continue
        for r in doc["rows"]:
            row = {"name": doc["name"], "bs": doc["bs"], "label": r["label"],
                   "predicted_us": r["predicted_us"], "kernels": r["kernels"]}
            try:
                ag = AnnotatedGraph.from_json(r)
                row["device_target"] = device_target(dev)
                row["predicted_us_device"] = predict_on(ag, row["device_target"])
                m = time_graph(dev, ag, doc["target"], r["label"], warmup=3, repeat=20,
                               budget_s=1.0)
                if m.error is None:
                    row.update(m.call.to_json())
                    row["compile_s"] = round(m.compile_s, 3)
                else:
                    row["error"] = m.error[:600]
            except Exception as e:  # noqa: BLE001 -- a schedule that fails is a record too
                row["error"] = f"{type(e).__name__}: {e}"[:600]
            append("tuning", row)
            print(f"tuning {doc['name']} {r['label']}: predicted {r['predicted_us']:.1f} "
                  f"measured {row.get('us', float('nan')):.1f} us {row.get('error', '')[:200]}",
                  flush=True)


# ---- step: the measured best of the timed schedules, and build variants -----------------------

def _timed_rows(paths: list[Path]) -> dict[tuple, list[dict]]:
    rows: dict[tuple, list[dict]] = {}
    for p in paths:
        for r in read_jsonl(p):
            if "us" in r:
                rows.setdefault((r["name"], r["bs"]), []).append(r)
    return rows


def _checked_time(dev: Device, graph: Any, target: str, name: str, bs: int,
                  build: Build = Build.DEFAULT) -> dict:
    """Ours on a benchmark's own inputs: checked against eager and float64, timed per call
    and as a CUDA graph."""
    from benchmarks.programs import get_inputs, get_program
    p = get_program(name, bs)
    x = get_inputs(name, bs, seed=1234)
    tx = torch_inputs(p, x, dev.torch_device)
    m = measure_ours(dev, graph, target, tx, references(p, tx, x, dev), build=build)
    out = {"allclose_eager": m.check.allclose_eager,
           "rel_err_vs_float64": m.check.rel_err_vs_float64, "times": {}, "errors": {}}
    _times(out, m)
    if not dev.dry:
        out["built_for"], out["tma"] = m.built_for, m.tma
    return out


def measure_best(dev: Device, paths: list[Path], top: int = 3) -> None:
    """Per benchmark, the ``top`` fastest graphs of earlier tuning measurements (``paths``) and
    the model's choice, timed again side by side and checked: the choice a measuring runner
    makes (``superopt(runner=GpuRunner())`` picks the fastest measured of what it times)."""
    for (name, bs), rows in sorted(_timed_rows(paths).items()):
        doc = json.loads((BUNDLE / "tuning" / f"{name}-bs{bs}.json").read_text())
        by_label = {r["label"]: r for r in doc["rows"]}
        pick = sorted(rows, key=lambda r: r["us"])[:top]
        labels = list(dict.fromkeys(["chosen"] + [r["label"] for r in pick]))
        for label in labels:
            row = {"name": name, "bs": bs, "label": label,
                   "predicted_us": by_label[label]["predicted_us"],
                   "earlier_us": next((r["us"] for r in rows if r["label"] == label), None)}
            try:
                row.update(_checked_time(dev, AnnotatedGraph.from_json(by_label[label]),
                                         doc["target"], name, bs))
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:600]
            append("best", row)
            t = row.get("times", {})
            print(f"best {name} bs={bs} {label}: " + " ".join(f"{k}={v['us']:.1f}"
                                                             for k, v in t.items())
                  + f" ok={row.get('allclose_eager')} {row.get('error', '')[:200]}", flush=True)


def measure_variants(dev: Device, bs: int) -> None:
    """The model's choice of each benchmark built three ways -- as the runtime builds it (TMA
    and warpgroup MMA on an sm_90 GPU), with every tile by cp.async (``MIRAGE_PY_NO_TMA``) and
    with mma.sync instead of warpgroup MMA (``MIRAGE_PY_NO_WGMMA``) -- timed side by side."""
    from mirage_py.superopt.result import OptimizedProgram
    for f in sorted((BUNDLE / "bench").glob(f"*-bs{bs}.json")):
        doc = json.loads(f.read_text())
        opt = OptimizedProgram.from_json(doc["opt"])
        for build in Build:
            row = {"name": doc["name"], "bs": bs, "variant": build.value}
            try:
                row.update(_checked_time(dev, opt.annotated, opt.target, doc["name"], bs, build))
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:600]
            append("variants", row)
            t = row.get("times", {})
            print(f"variant {doc['name']} bs={bs} {build.value}: " + " ".join(
                f"{k}={v['us']:.1f}" for k, v in t.items()) + f" {row.get('built_for', '')}"
                  f" ok={row.get('allclose_eager')} {row.get('error', '')[:200]}", flush=True)


def profile_targets(dev: Device, names: list[str], bs: int) -> None:
    """Run the model's choice of each named benchmark a few times (for a profiler: ncu)."""
    from mirage_py.superopt.result import OptimizedProgram
    for name in names:
        doc = json.loads((BUNDLE / "bench" / f"{name}-bs{bs}.json").read_text())
        opt = OptimizedProgram.from_json(doc["opt"])
        ours = Ours(opt.annotated, opt.target, dev)
        call = ours.prepare(random_inputs(opt.annotated, dev))
        for _ in range(3):
            call()
        dev.sync()


# ---- step: KernelBench level 2 ----------------------------------------------------------------

def _kb_model(doc: dict, dev: Device):
    import torch

    from benchmarks.kernelbench import load_problem
    prob = load_problem(BUNDLE / "kernelbench" / doc["file"], 1)
    torch.manual_seed(0)
    model = prob.Model(*prob.get_init_inputs()).eval().to(dev.torch_device)
    torch.manual_seed(1)
    inputs = [x.to(dev.torch_device) if isinstance(x, torch.Tensor) else x
              for x in prob.get_inputs()]
    return model, inputs


def bind(doc: dict, model: Any, inputs: list) -> dict:
    """The program's inputs from the model's own tensors (gpu_prepare.input_sources)."""
    import torch
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "int32": torch.int32, "int64": torch.int64}
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    out = {}
    for s in doc["sources"]:
        v = state[s["ref"]] if s["kind"] == "state" else inputs[s["ref"]]
        out[s["name"]] = v.detach().to(dt[s["dtype"]]).contiguous()
    return out


def warm_cases(dev: Device) -> list[tuple[str, Callable[[], None]]]:
    """Every torch.compile the measuring steps make, as (name, a call that compiles it)."""
    cases = []
    for f in sorted((BUNDLE / "bench").glob("*.json")):
        def compile_bench(f=f) -> None:
            import torch

            from benchmarks.programs import get_inputs
            from mirage_py.examples.torch_baselines import torch_fn
            from mirage_py.lax.program import Program
            doc = json.loads(f.read_text())
            p = Program.from_json(doc["opt"]["program"])
            tx = torch_inputs(p, get_inputs(doc["name"], doc["bs"], seed=1234), dev.torch_device)
            with torch.no_grad():
                torch.compile(torch_fn(p))(tx)
        cases.append((f.stem, compile_bench))
    for f in sorted((BUNDLE / "kernelbench").glob("*.json")):
        if json.loads(f.read_text()).get("status") != "ok":
            continue

        def compile_kb(f=f) -> None:
            import torch
            doc = json.loads(f.read_text())
            model, inputs = _kb_model(doc, dev)
            with torch.no_grad():
                torch.compile(model)(*inputs)
        cases.append((f.stem, compile_kb))
    return cases


def warm(dev: Device, shard: int, of: int, kinds: list[str] | None = None) -> None:
    """This shard's torch.compile calls; ``kinds``: "bench" and / or "kernelbench" (all)."""
    cases = [(n, fn) for n, fn in warm_cases(dev)
             if not kinds or ("kernelbench" if n.startswith("level") else "bench") in kinds]
    for i, (name, fn) in enumerate(cases):
        if i % of != shard:
            continue
        t0 = time.perf_counter()
        try:
            fn()
            print(f"warm {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001 -- the measuring step reports it
            print(f"warm {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)


def measure_kernelbench(dev: Device, only: list[str] | None) -> None:
    import torch

    from mirage_py.superopt.result import OptimizedProgram
    for f in sorted((BUNDLE / "kernelbench").glob("*.json"),
                    key=lambda f: int(f.stem.split("__")[1].split("_")[0])):
        doc = json.loads(f.read_text())
        if only and doc["problem"] not in only and f.stem not in only:
            continue
        row = {k: doc.get(k) for k in ("problem", "status", "kernels_naive", "kernels",
                                       "predicted_us", "predicted_us_naive", "search_seconds",
                                       "verified")}
        if doc.get("status") != "ok":
            append("kernelbench", row)
            continue
        row["times"], row["errors"] = {}, {}
        try:
            opt = OptimizedProgram.from_json(doc["opt"])
            row["device_target"] = device_target(dev)
            row["predicted_us_device"] = predict_on(opt.annotated, row["device_target"])
            model, inputs = _kb_model(doc, dev)
            with torch.no_grad():
                ref = model(*inputs)
                ins = bind(doc, model, inputs)
                ours = Ours(opt.annotated, opt.target, dev)
                (name,) = doc["outputs"]
                got = ours.check_call(ins)[name]
                row["rel_err"] = rel_err(got.reshape(ref.shape), ref)
                row["correct"] = close(got.reshape(ref.shape), ref)
                row["times"]["ours"] = dev.timer(ours.prepare(ins)).to_json()
                if not dev.dry:
                    row["ours_compile_s"] = round(ours.compile_s, 3)
                row["times"]["eager"] = dev.timer(lambda: model(*inputs)).to_json()
                try:
                    t0 = time.perf_counter()
                    cm = torch.compile(model)
                    out = cm(*inputs)
                    row["torch_compile_s"] = round(time.perf_counter() - t0, 2)
                    row["compile_correct"] = close(out, ref)
                    row["times"]["torch_compile"] = dev.timer(lambda: cm(*inputs)).to_json()
                except Exception as e:  # noqa: BLE001
                    row["errors"]["torch_compile"] = f"{type(e).__name__}: {e}"[:400]
        except Exception as e:  # noqa: BLE001 -- a failure is a row
            row["error"] = f"{type(e).__name__}: {e}"[:800]
            row["traceback"] = traceback.format_exc()[-2000:]
        append("kernelbench", row)
        t = row.get("times", {})
        print(f"{doc['problem']}: " + " ".join(f"{k}={v['us']:.1f}" for k, v in t.items())
              + f" us correct={row.get('correct')} {row.get('error', '')[:300]}", flush=True)


# ---- records: the measurements as training data -----------------------------------------------

def store_records(d: Path, db_path: str, export: str | None) -> int:
    """Every graph timed in ``d`` (the tuning step's schedules, the bench step's answers and
    naive lowerings) as a measured record in the results database ``db_path`` -- graph,
    pipeline stages, predicted and measured time, the device as the runner -- and, with
    ``export``, the database's measured records written as a training set
    (``mirage_py.tuning.export``, JSONL or CSV by suffix). Returns the records added."""
    from mirage_py.lax.program import Program
    from mirage_py.superopt.result import OptimizedProgram
    from mirage_py.tuning.database import ResultsDB, TuningRecord
    from mirage_py.tuning.export import export_training_set
    facts = (d / "machine.txt").read_text() if (d / "machine.txt").exists() else ""
    device = next((ln.split("device ", 1)[1] for ln in facts.splitlines()
                   if ln.startswith("torch cuda") and "device " in ln), "gpu")
    db = ResultsDB(db_path)
    added = 0
    by_bench: dict[tuple, list] = {}
    for r in read_jsonl(d / "tuning.jsonl"):
        if "us" not in r:
            continue
        doc = json.loads((BUNDLE / "tuning" / f"{r['name']}-bs{r['bs']}.json").read_text())
        row = next(x for x in doc["rows"] if x["label"] == r["label"])
        by_bench.setdefault((r["name"], r["bs"]), []).append((row, r))
    for r in read_jsonl(d / "bench.jsonl"):
        if "name" not in r or "times" not in r:
            continue
        doc = json.loads((BUNDLE / "bench" / f"{r['name']}-bs{r['bs']}.json").read_text())
        opt = OptimizedProgram.from_json(doc["opt"])
        for label, ag in (("ours", opt.annotated), ("ours_naive", opt.naive_graph)):
            if label in r["times"]:
                ag = ag if isinstance(ag, AnnotatedGraph) else AnnotatedGraph(ag)
                by_bench.setdefault((r["name"], r["bs"]), []).append(
                    ({"label": label, "predicted_us": r["predicted_us"], **ag.to_json()},
                     {"us": r["times"][label]["us"], "device_target": r.get("device_target"),
                      "predicted_us_device": r.get("predicted_us_device")}))
    for (name, bs), pairs in by_bench.items():
        doc = json.loads((BUNDLE / "bench" / f"{name}-bs{bs}.json").read_text())
        program = Program.from_json(doc["opt"]["program"])
        recs = []
        for row, m in pairs:
            ag = AnnotatedGraph.from_json(row)
            target = m.get("device_target") or "h100"
            recs.append(TuningRecord(
                graph=row["graph"], target=target, graph_hash=ag.graph.structural_hash(),
                annotations={"stages": list(ag.stages), "label": row["label"]},
                predicted_us=m.get("predicted_us_device") or row["predicted_us"],
                measured_us=m["us"], runner=f"gpu:{device}", chosen=row["label"] in
                ("chosen", "ours")))
        db.add(program, recs)
        added += len(recs)
    if export:
        export_training_set(db, export, measured_only=True)
    return added


# ---- calibration: the analytic model's figures fitted to the measurements ----------------------

def measured_graphs(d: Path) -> list[dict]:
    """Every timed graph of ``d`` with its benchmark, device target and measured time."""
    out = []
    for r in read_jsonl(d / "tuning.jsonl"):
        if "us" in r:
            doc = json.loads((BUNDLE / "tuning" / f"{r['name']}-bs{r['bs']}.json").read_text())
            row = next(x for x in doc["rows"] if x["label"] == r["label"])
            out.append({"name": r["name"], "bs": r["bs"], "label": r["label"],
                        "target": r.get("device_target", "h100"), "us": r["us"],
                        "graph": AnnotatedGraph.from_json(row)})
    return out


def calibrate(d: Path, seed: int = 0) -> dict:
    """The calibrated analytic model's two figures for the device's target -- its bandwidth
    efficiency and launch-cost scale (``cost_model.CalibratedModel``) -- fitted to the timed
    graphs of half the benchmarks (split by benchmark, ``seed``) by least squares on log time,
    and scored on the other half: median |log(predicted / measured)| and the Kendall tau per
    benchmark, before (the analytic model) and after."""
    import random

    import numpy as np
    from scipy.optimize import least_squares

    from mirage_py.cost_model import CalibratedModel
    from mirage_py.superopt import default_model
    from mirage_py.layout.plan import planned_shared_memory
    rows = measured_graphs(d)
    names = sorted({r["name"] for r in rows})
    random.Random(seed).shuffle(names)
    train = set(names[:len(names) // 2])

    def model(x):
        return CalibratedModel(smem_planner=planned_shared_memory, mem_eff=float(np.exp(x[0])),
                               launch_scale=float(np.exp(x[1])),
                               smem_eff=float(np.exp(x[2])) if len(x) > 2 else None)

    def residuals(x, subset):
        m = model(x)
        return np.array([math.log(m.predict(r["graph"], r["target"]) / r["us"]) for r in subset])

    tr = [r for r in rows if r["name"] in train]
    fit = least_squares(residuals, x0=np.zeros(2), args=(tr,), loss="soft_l1")
    # the same with the shared-memory term (docs/gpu.md: the kernels are bound by it)
    fit3 = least_squares(residuals, x0=np.zeros(3), args=(tr,), loss="soft_l1")
    analytic, fitted, fitted3 = default_model(), model(fit.x), model(fit3.x)

    def score_of(pred: list[float], subset: list[dict]) -> dict:
        by: dict[str, list] = {}
        for p, r in zip(pred, subset):
            by.setdefault(f"{r['name']} bs{r['bs']}", []).append((p, r["us"]))
        logs = sorted(abs(math.log(p / u)) for v in by.values() for p, u in v)
        best = {n: min(v, key=lambda pu: pu[0])[1] / min(u for _, u in v) for n, v in by.items()}
        return {"median_abs_log": logs[len(logs) // 2] if logs else float("nan"),
                "tau": {n: kendall([p for p, _ in v], [u for _, u in v]) for n, v in by.items()},
                # the measured time of the graph the model ranks first, over the fastest's
                "top1_slowdown": best}

    def score(m, subset) -> dict:
        return score_of([m.predict(r["graph"], r["target"]) for r in subset], subset)
    te = [r for r in rows if r["name"] not in train]
    out = {"train": sorted(train), "test": sorted(set(names) - train),
           "mem_eff": float(np.exp(fit.x[0])), "launch_scale": float(np.exp(fit.x[1])),
           "before": {"train": score(analytic, tr), "test": score(analytic, te)},
           "after": {"train": score(fitted, tr), "test": score(fitted, te)},
           "smem_term": {"mem_eff": float(np.exp(fit3.x[0])),
                         "launch_scale": float(np.exp(fit3.x[1])),
                         "smem_eff": float(np.exp(fit3.x[2])),
                         "train": score(fitted3, tr), "test": score(fitted3, te)}}
    try:  # the boosted trees of mirage_py.learned on the same split (needs lightgbm)
        out["learned_gbt"] = {"test": score_of(learned_predictions(tr, te), te)}
    except Exception as e:  # noqa: BLE001 -- no lightgbm: the analytic scores stand alone
        out["learned_gbt"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    return out


def learned_predictions(train: list[dict], test: list[dict]) -> list[float]:
    """mirage_py.learned's boosted trees (pairwise ranking within a program) fitted on the
    ``train`` graphs' measurements, predicting the ``test`` graphs."""
    from dataclasses import replace

    from mirage_py.learned.model import graph_record, train as fit

    def records(rows: list[dict]) -> list:
        return [replace(graph_record(r["graph"], r["target"]), measured_us=r["us"],
                        problem=f"ugraph/{r['name']}-bs{r['bs']}", family="ugraph")
                for r in rows]
    model = fit(records(train))
    return model.predict(records(test))


# ---- report -----------------------------------------------------------------------------------

def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def kendall(pred: list[float], meas: list[float]) -> float:
    from mirage_py.tuning import kendall_tau
    return kendall_tau(pred, meas) if len(pred) >= 2 else float("nan")


def times_of(row: dict) -> dict[str, float]:
    """A row's median times by variant (us)."""
    return {k: v["us"] for k, v in row.get("times", {}).items()}


def report(d: Path) -> str:
    lines = []
    facts = d / "machine.txt"
    if facts.exists():
        lines += ["## Machine", "", "```", facts.read_text().strip(), "```", ""]
    bench = read_jsonl(d / "bench.jsonl")
    bw = next((r["copy_bandwidth"] for r in bench if "copy_bandwidth" in r), None)
    rows = [r for r in bench if "name" in r]
    if rows:
        lines += ["## The nine benchmarks (us, median of CUDA-event times, L2 flushed)", "",
                  f"Copy bandwidth (1 GiB device-to-device, read + write): "
                  f"{bw / 1e12:.2f} TB/s." if bw else "", "",
                  "| benchmark | bs | kernels | ours | ours graph | naive | eager | eager graph "
                  "| torch.compile | compile graph | sdpa | vs best (call) | vs best (graph) "
                  "| vs eager | % copy bw | err vs fp64 (eager's) | predicted |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['name']} | {r['bs']} | {r['kernels']} | error: "
                             f"{r['error'][:120]} |" + " |" * 13)
                continue
            t = times_of(r)
            c = lambda k: f"{t[k]:.1f}" if k in t else "-"  # noqa: E731
            base = [t[k] for k in ("eager", "torch_compile", "sdpa") if k in t]
            gbase = [t[k] for k in ("eager_graph", "torch_compile_graph", "sdpa_graph")
                     if k in t]
            vs = min(base) / t["ours"]
            gvs = f"{min(gbase) / t['ours_graph']:.2f}x" if gbase and "ours_graph" in t \
                else "-"
            frac = f"{100 * r['bytes_moved'] / (t['ours'] * 1e-6) / bw:.0f}%" if bw else "-"
            lines.append(
                f"| {r['name']} | {r['bs']} | {r['kernels_naive']} -> {r['kernels']} | "
                f"{c('ours')} | {c('ours_graph')} | {c('ours_naive')} | {c('eager')} | "
                f"{c('eager_graph')} | {c('torch_compile')} | {c('torch_compile_graph')} | "
                f"{c('sdpa')} | {vs:.2f}x | {gvs} | {t['eager'] / t['ours']:.2f}x | {frac} | "
                f"{r['ours_rel_err_vs_float64']:.1e} ({r['eager_rel_err_vs_float64']:.1e}) | "
                f"{r.get('predicted_us_device', r['predicted_us']):.1f} |")
        ok = [r for r in rows if "error" not in r]
        if ok:
            g = math.exp(sum(math.log(r["times"]["eager"]["us"] / r["times"]["ours"]["us"])
                             for r in ok) / len(ok))
            lines += ["", f"Geometric mean speed-up over eager (per call): {g:.2f}x over "
                      f"{len(ok)} rows."]
        lines.append("")
    tuning = read_jsonl(d / "tuning.jsonl")
    if tuning:
        lines += ["## Predicted vs measured (analytic model, for the device's target)", "",
                  "| benchmark | bs | graphs timed | Kendall tau | median measured / predicted |",
                  "|---|---|---|---|---|"]
        for name, bs in dict.fromkeys((r["name"], r.get("bs", 1)) for r in tuning):
            mine = [r for r in tuning if r["name"] == name and r.get("bs", 1) == bs]
            rs = [r for r in mine if "us" in r]
            pred = [r.get("predicted_us_device", r["predicted_us"]) for r in rs]
            tau = kendall(pred, [r["us"] for r in rs])
            ratios = sorted(r["us"] / p for r, p in zip(rs, pred))
            med = ratios[len(ratios) // 2] if ratios else float("nan")
            lines.append(f"| {name} | {bs} | {len(rs)}/{len(mine)} | {tau:.2f} | {med:.2f} |")
        lines.append("")
    best = read_jsonl(d / "best.jsonl")
    if best:
        lines += ["## The model's choice against the fastest timed schedules (us)", "",
                  "Per benchmark, the graphs the tuning step timed fastest, timed again beside "
                  "the cost model's choice (per call and as a CUDA graph), each checked against "
                  "eager (allclose) -- what a measuring runner would pick.", "",
                  "| benchmark | bs | graph | predicted | earlier | ours | ours graph | "
                  "allclose |", "|---|---|---|---|---|---|---|---|"]
        for r in best:
            t = times_of(r)
            c = lambda k: f"{t[k]:.1f}" if k in t else "-"  # noqa: E731
            e = r.get("earlier_us")
            lines.append(f"| {r['name']} | {r['bs']} | {r['label']} | {r['predicted_us']:.1f} | "
                         f"{'-' if e is None else f'{e:.1f}'} | {c('ours')} | "
                         f"{c('ours_graph')} | {r.get('allclose_eager', r.get('error', ''))} |")
        lines.append("")
    variants = read_jsonl(d / "variants.jsonl")
    if variants:
        lines += ["## Build variants of the model's choice (us, per call / CUDA graph)", "",
                  "| benchmark | bs | default | every tile by cp.async (no TMA) | mma.sync "
                  "(no warpgroup MMA) |", "|---|---|---|---|---|"]
        cells: dict[tuple, dict] = {}
        for r in variants:
            t = times_of(r)
            cells.setdefault((r["name"], r["bs"]), {})[r["variant"]] = \
                f"{t['ours']:.1f} / {t.get('ours_graph', float('nan')):.1f}" if "ours" in t \
                else r.get("error", "-")[:60]
        for (n, b), c in cells.items():
            lines.append(f"| {n} | {b} | {c.get('default', '-')} | {c.get('no_tma', '-')} | "
                         f"{c.get('no_wgmma', '-')} |")
        lines.append("")
    kb = read_jsonl(d / "kernelbench.jsonl")
    if kb:
        lines += ["## KernelBench level 2 (files' sizes, float32; us)", "",
                  "| problem | kernels | ours | eager | torch.compile | correct | vs best | "
                  "predicted |", "|---|---|---|---|---|---|---|---|"]
        fast = n = 0
        for r in kb:
            t = times_of(r)
            if "ours" not in t:
                lines.append(f"| {r['problem']} | - | - | - | - | "
                             f"{r.get('error', r.get('status', ''))[:100]} | - | - |")
                continue
            n += 1
            best = min(t[k] for k in ("eager", "torch_compile") if k in t)
            fast += bool(r.get("correct")) and t["ours"] < best
            lines.append(f"| {r['problem']} | {r['kernels_naive']} -> {r['kernels']} | "
                         f"{t['ours']:.1f} | {t.get('eager', float('nan')):.1f} | "
                         f"{t.get('torch_compile', float('nan')):.1f} | {r.get('correct')} | "
                         f"{best / t['ours']:.2f}x | "
                         f"{r.get('predicted_us_device', r['predicted_us']):.1f} |")
        lines += ["", f"fast_1 (correct and faster than min(eager, torch.compile)): {fast} of "
                  f"{n} measured ({len(kb)} problems)." if n else "", ""]
    return "\n".join(lines) + "\n"


def facts() -> str:
    import importlib
    out = [f"python {platform.python_version()}"]
    for m in ("numpy", "scipy", "cupy", "torch", "triton", "networkx", "mirage_py"):
        try:
            out.append(f"{m} {getattr(importlib.import_module(m), '__version__', '?')}")
        except Exception as e:  # noqa: BLE001 -- report, do not stop
            out.append(f"{m} missing: {type(e).__name__}: {e}")
    try:
        import torch
        out.append(f"torch cuda {torch.version.cuda}, device "
                   f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
    except Exception as e:  # noqa: BLE001
        out.append(f"torch cuda: {e}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_measure",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=("facts", "warm", "bench", "tuning", "kernelbench",
                                     "report", "records", "calibrate", "best",
                                     "variants", "profile"))
    ap.add_argument("--bs", type=int, default=None, help="tuning / variants / profile: this "
                    "batch size only")
    ap.add_argument("--earlier", nargs="*", default=[],
                    help="best: tuning.jsonl files of earlier measurements (and $OUT's)")
    ap.add_argument("--db", default=None, help="records: the results database to add to")
    ap.add_argument("--export", default=None, help="records: write the training set here")
    ap.add_argument("--dry-run", action="store_true", help="on the CPU (checks the script)")
    ap.add_argument("--only", nargs="+", default=None)
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--of", type=int, default=1)
    ap.add_argument("--out", default=None, help="the results folder (default $OUT)")
    ap.add_argument("--budget", type=float, default=3.0,
                    help="seconds of timed calls per variant at most (default 3)")
    args = ap.parse_args(argv)
    if args.out:
        os.environ["OUT"] = args.out
    os.environ.setdefault("MIRAGE_PY_CACHE", str(BUNDLE / "cache"))
    dev = Device(args.dry_run, args.budget)
    if args.step == "facts":
        print(facts())
    elif args.step == "warm":
        warm(dev, args.shard, args.of, args.only)
    elif args.step == "bench":
        measure_bench(dev, args.only)
    elif args.step == "tuning":
        measure_tuning(dev, args.only, args.bs)
    elif args.step == "best":
        measure_best(dev, [Path(p) for p in args.earlier] + [out_dir() / "tuning.jsonl"])
    elif args.step == "variants":
        measure_variants(dev, args.bs or 1)
    elif args.step == "profile":
        profile_targets(dev, args.only or ["rmsnorm_linear", "gqa", "gated_mlp"], args.bs or 1)
    elif args.step == "kernelbench":
        measure_kernelbench(dev, args.only)
    elif args.step == "calibrate":
        res = calibrate(out_dir())
        (out_dir() / "calibration.json").write_text(json.dumps(res, indent=1))
        print(json.dumps(res, indent=1))
    elif args.step == "records":
        n = store_records(out_dir(), args.db or str(out_dir() / "records.sqlite"), args.export)
        print(f"{n} measured records added")
    if args.step in ("bench", "tuning", "kernelbench", "report", "best", "variants"):
        (out_dir() / "gpu.md").write_text(report(out_dir()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
