"""The cost models against KernelBench's published GPU timings (issue 31).

KernelBench (https://github.com/ScalingIntelligence/KernelBench, MIT licence) publishes, in
``results/timing/``, the mean time of every level 1-3 problem under PyTorch eager and
``torch.compile`` (inductor, default mode) on several GPUs: PyTorch 2.5 / CUDA 12.4, float32,
the models in their default (training) mode under ``torch.no_grad()``, 3 warm-up calls and 100
timed ones with CUDA events around ``model(*inputs)``. The problems' sizes changed between
versions, so each timing file is paired with the problem files of the commit that produced it
(``SOURCES``).

Stages:

1. ``--kernelbench PATH --rebuild`` (a clone with its history, or a bare git directory; the
   first run with ``--kernelbench`` rebuilds anyway): every problem
   file of each source commit is traced at full size on the meta device
   (:func:`mirage_py.eager.trace_module`), its eager kernels listed, its capture by the torch
   frontend tried (``mp.from_torch`` on meta tensors), and the timings read. Writes
   ``results/published_programs.jsonl`` (one line per distinct problem file: kernels, data
   edges, captured) and ``results/published_measurements.json`` (every timing row).
   ``--ours`` (with ``--kernelbench``): superopt every captured problem at the H100 PCIe's
   sizes for the ``h100_pcie`` target (``--time-budget`` per search, each problem in a child
   killed after ``--limit``, held to ``MEMORY_LIMIT``), appended to
   ``results/published_ours.jsonl`` (``--retry``: search again those without an answer).
2. ``--select``: the learned models' hyper-parameters and feature sets cross-validated on the
   *training* half only (:mod:`mirage_py.learned.select`, the grids ``TREE_GRID`` and
   ``GRAPH_GRIDS``; ``--select gnn``: the graph grid only), written to
   ``results/published_cv.json``; the winners are the defaults
   of :mod:`mirage_py.learned.gbt` and :mod:`mirage_py.learned.gnn`.
3. From those committed files (no KernelBench checkout needed): the analytic model, the
   calibrated one and the learned ones scored on the held-out problems, and
   ``results/published_gpu.{json,md}`` written.

    python -m benchmarks.published_gpu --kernelbench ~/KernelBench --rebuild --ours  # all
    python -m benchmarks.published_gpu --select                         # stages 2 and 3
    python -m benchmarks.published_gpu                                  # stage 3 only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._results import RESULTS, table  # noqa: E402 -- after the path is set

PROGRAMS = RESULTS / "published_programs.jsonl"
MEASUREMENTS = RESULTS / "published_measurements.json"


@dataclass(frozen=True)
class Source:
    """One folder of KernelBench's ``results/timing`` at the commit that last wrote it."""

    folder: str
    commit: str  # the timing files' and the problem files' commit


SOURCES = (
    Source("H100_PCIe_LambdaLabs", "129232e"),  # July 2025, the v0.2 sizes
    Source("H100_Modal", "1f8d20f"),  # Dec 2025, v0.2 sizes
    Source("H100_together", "a6dea99"),  # Jan 2025, the v0.1 sizes (as below)
    Source("L40S_matx3", "01cad80"),
    Source("L40S_modal", "47f78d7"),
    Source("A100-80GB_modal", "47f78d7"),
    Source("A100_modal", "47f78d7"),
    Source("A10G_modal", "fcc5b17"),
    Source("L4_modal", "fcc5b17"),
    Source("T4_modal", "fcc5b17"),
)
# B200_together (Mar 2025) is left out: no B200 target (and CUDA 12.4 predates the part).
MAX_CALLS = 5000
KINDS = {"baseline_time_torch.json": "eager",
         "baseline_time_torch_compile_inductor_default.json": "compile"}
# each row names its GPU; one folder may mix parts (A10G_modal has A10 rows, A100_modal a few
# 80 GB rows)
HARDWARE = {"NVIDIA H100 PCIe": "h100_pcie", "NVIDIA H100 80GB HBM3": "h100",
            "NVIDIA L40S": "l40s", "NVIDIA A100-SXM4-80GB": "a100",
            "NVIDIA A100-SXM4-40GB": "a100_40gb", "NVIDIA A10G": "a10g", "NVIDIA A10": "a10",
            "NVIDIA L4": "l4", "Tesla T4": "t4"}


# ---- stage 1: traces and timings from a KernelBench clone ------------------------------------

def _git(repo: Path, *args: str) -> bytes:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], check=True,
                              capture_output=True).stdout
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"git {' '.join(args)} in {repo} failed: "
                         f"{e.stderr.decode(errors='replace').strip()}") from None


def read_timings(repo: Path) -> list[dict[str, Any]]:
    """Every timing row of ``SOURCES``: problem, kind, target, hardware, source, ms."""
    rows = []
    for src in SOURCES:
        for fname, kind in KINDS.items():
            path = f"results/timing/{src.folder}/{fname}"
            try:
                data = json.loads(_git(repo, "show", f"{src.commit}:{path}"))
            except SystemExit:
                continue  # this folder has no such file at that commit
            for level, probs in data.items():
                for file, stats in probs.items():
                    if not stats or stats.get("mean") is None:
                        continue
                    target = HARDWARE.get(stats.get("hardware", ""))
                    rows.append({"problem": f"{level}/{file.removesuffix('.py')}",
                                 "kind": kind, "target": target,
                                 "hardware": stats.get("hardware"),
                                 "source": f"{src.folder}@{src.commit}",
                                 "commit": src.commit, "ms": float(stats["mean"]),
                                 "std_ms": stats.get("std")})
    return rows


def _export_problems(repo: Path, commit: str, into: Path) -> Path:
    tar = _git(repo, "archive", commit, "KernelBench")
    tmp = into / f"{commit}.tar"
    tmp.write_bytes(tar)
    with tarfile.open(tmp) as t:
        t.extractall(into / commit, filter="data")
    return into / commit / "KernelBench"


CPU_CAPTURE_BYTES = 1 << 30  # a problem whose state and inputs fit is captured on the CPU when
# meta tensors fail: a buffer's values (minGPT's causal `bias`, compared with 0 for
# `masked_fill`) make a position mask only when they are known


def problem_program(path: Path):
    """The problem's Program as ``mp.from_torch`` captures it (eval mode), with the model and
    inputs whose tensors the program's inputs name: on meta tensors (nothing allocated at the
    files' sizes); where that fails and the parameters, buffers and inputs take at most
    ``CPU_CAPTURE_BYTES``, on the CPU (seed 0)."""
    import torch

    import mirage_py as mp
    from benchmarks.kernelbench import load_problem
    from mirage_py.errors import MirageError
    prob = load_problem(path, 1)
    with torch.device("meta"):
        model = prob.Model(*prob.get_init_inputs()).eval()
        inputs = tuple(prob.get_inputs())
    try:
        return mp.from_torch(model, inputs), model, inputs
    except MirageError:
        tensors = [*model.parameters(), *model.buffers(),
                   *(x for x in inputs if isinstance(x, torch.Tensor))]
        if sum(t.numel() * t.element_size() for t in tensors) > CPU_CAPTURE_BYTES:
            raise
    torch.manual_seed(0)
    model = prob.Model(*prob.get_init_inputs()).eval()
    inputs = tuple(prob.get_inputs())
    return mp.from_torch(model, inputs), model, inputs


MEMORY_LIMIT = 6 << 30  # bytes of address space a child may take (superopt at full size
# checks numerics on full-size arrays: a 2048 x 1 M matrix-vector product and a 65536 x 16384
# scaling took 21 GB each before this cap)


def memory_stage(e: BaseException) -> str:
    """Where a ``MemoryError`` was raised: the innermost frame of ``mirage_py`` (its module
    and function, e.g. ``verifier/degree.py _div``), or of the whole traceback."""
    import traceback
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "/mirage_py/" in f.filename] or frames
    if not ours:
        return "unknown"
    f = ours[-1]
    path = f.filename.split("/mirage_py/")[-1] if "/mirage_py/" in f.filename else \
        Path(f.filename).name
    return f"{path} {f.name}"


def _in_child(fn, args: tuple, limit_s: float) -> dict[str, Any]:
    """``fn(*args)`` (a dict) in a forked child killed after ``limit_s`` (torch.export can loop
    for minutes on an LSTM; a search may overrun) and held to ``MEMORY_LIMIT``;
    ``{"status": why}`` when it gave none."""
    import multiprocessing as mpr
    import resource

    def child(conn) -> None:  # a pipe, not a queue: a queue's feeder thread needs memory
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        try:
            row = fn(*args)
        except MemoryError as e:
            row = {"status": f"over the memory limit ({MEMORY_LIMIT >> 30} GiB)",
                   "memory_stage": memory_stage(e)}
        except Exception as e:  # noqa: BLE001 - a row, not the end of the run
            if ("allocate" in str(e) and "memory" in str(e)) or \
                    "can't start new thread" in str(e):  # torch's allocator; a thread's stack
                row = {"status": f"over the memory limit ({MEMORY_LIMIT >> 30} GiB): "
                                 f"{str(e)[:120]}"}
            else:
                row = {"status": f"error: {type(e).__name__}: {str(e)[:200]}"}
        conn.send(row)
        conn.close()

    ctx = mpr.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=child, args=(send,))
    p.start()
    send.close()
    p.join(limit_s)
    if p.is_alive():
        p.kill()
        p.join()
        return {"status": f"over {limit_s:.0f} s"}
    return recv.recv() if recv.poll() else {"status": "child died"}


def _capture(path: Path, limit_s: int) -> dict[str, Any]:
    """Whether ``mp.from_torch`` captures the problem (eval mode, :func:`problem_program`)."""
    row = _in_child(lambda: {"captured": True,
                             "program_nodes": len(problem_program(path)[0].nodes())}, (), limit_s)
    if "status" in row:
        return {"captured": False, "capture_error": row["status"]}
    return row


def trace_problem(path: Path, problem: str, capture: dict | None = None,
                  limit_s: int = 60) -> dict[str, Any]:
    """One problem file: its eager kernels at full size and whether the frontend captures it
    (``capture``: what an earlier build found for the same file)."""
    import torch

    from benchmarks.kernelbench import load_problem
    from mirage_py.eager import eager_kernels, trace_module
    from mirage_py.learned.records import KernelNode

    text = path.read_bytes()
    out: dict[str, Any] = {"problem": problem, "sha": hashlib.sha256(text).hexdigest()[:16]}
    try:
        prob = load_problem(path, 1)
        torch.manual_seed(0)
        with torch.device("meta"):
            model = prob.Model(*prob.get_init_inputs())
            inputs = list(prob.get_inputs())
        # training mode, as measured; past MAX_CALLS an RNN unrolled (cuDNN runs it whole)
        calls = trace_module(model, inputs, name=problem, max_calls=MAX_CALLS)
        kernels = eager_kernels(calls)
        out.update(calls=len(calls), kernels=[KernelNode.from_eager(k).to_json()
                                              for k in kernels],
                   ops=[k.op for k in kernels])
        out.update(capture if capture is not None else _capture(path, limit_s))
    except Exception as e:  # noqa: BLE001
        # the problem's name, not the temporary export's path: rebuilds give the same file
        msg = str(e).strip().replace(str(path), f"{problem}.py")
        out.update(error=f"{type(e).__name__}: {msg[:300]}")
    return out


def build(repo: Path, log=print) -> None:
    """Stage 1: write ``PROGRAMS`` and ``MEASUREMENTS`` from the clone at ``repo``."""
    warnings.filterwarnings("ignore")
    rows = read_timings(repo)
    commits = sorted({r["commit"] for r in rows})
    programs: dict[str, dict] = {}  # sha of the file -> trace
    # captures of an earlier build, by sha: capturing is the slow part. Only successes are
    # kept: a failure is tried again, the frontend (or problem_program) may capture it now
    known: dict[str, dict] = {}
    if PROGRAMS.exists():
        for line in PROGRAMS.read_text().splitlines():
            d = json.loads(line)
            if d.get("captured"):
                known[d["sha"]] = {k: d[k] for k in ("captured", "program_nodes",
                                                     "capture_error") if k in d}
    keys: dict[tuple[str, str], str] = {}  # (problem, commit) -> sha
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kb_") as tmp:
        for commit in commits:
            root = _export_problems(repo, commit, Path(tmp))
            for level in ("level1", "level2", "level3"):
                for f in sorted((root / level).glob("*.py")):
                    problem = f"{level}/{f.stem}"
                    sha = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
                    keys[(problem, commit)] = sha
                    if sha not in programs:
                        programs[sha] = trace_problem(f, problem, known.get(sha))
                        log(f"{time.perf_counter() - t0:7.1f}s {commit} {problem}: "
                            f"{len(programs[sha].get('kernels', []))} kernels, captured "
                            f"{programs[sha].get('captured')} {programs[sha].get('error', '')}")
    for r in rows:
        r["program"] = keys.get((r["problem"], r["commit"]))
    with open(PROGRAMS, "w") as f:
        for sha in sorted(programs):
            f.write(json.dumps(programs[sha], sort_keys=True) + "\n")
    MEASUREMENTS.write_text(json.dumps({
        "source": "https://github.com/ScalingIntelligence/KernelBench results/timing (MIT)",
        "sources": [f"{s.folder}@{s.commit}" for s in SOURCES], "rows": rows}, indent=0))
    log(f"{len(programs)} programs, {len(rows)} timing rows")




# ---- stage 1b: superopt's answers at full size (--ours) ---------------------------------------

OURS = RESULTS / "published_ours.jsonl"  # one line per problem, appended as each finishes
# what the rows' predictions depend on: a row made with other versions of these is re-run
PRICING_FILES = ("mirage_py/cost_model.py", "mirage_py/targets.py", "mirage_py/lax/precision.py")


def pricing_key() -> str:
    """A hash of the files that price an answer (``PRICING_FILES``): rows of ``OURS`` made
    under another key are stale (the first three rows priced float32 matmuls on float16
    tensor cores)."""
    h = hashlib.sha256()
    for f in PRICING_FILES:
        h.update((ROOT / f).read_bytes())
    return h.hexdigest()[:12]


def _search(path: Path, target: str, budget_s: float) -> dict[str, Any]:
    import resource

    import mirage_py as mp
    from mirage_py.superopt.search import calibrated_model
    program = problem_program(path)[0]
    # the program's tensors at float32 (the numerics check holds float64 references too)
    sizes = {"inputs_mb": round(sum(4 * math.prod(t.shape) for t in program.inputs) / 2**20),
             "largest_mb": round(max(4 * math.prod(t.shape) for t in program.nodes()) / 2**20)}
    t0 = time.perf_counter()
    try:
        opt = mp.superopt(program, target=target, time_budget_s=budget_s, workers=1,
                          progress=False, database=False)
    except MemoryError as e:
        return {"status": f"over the memory limit ({MEMORY_LIMIT >> 30} GiB)",
                "memory_error": str(e)[:160], "memory_stage": memory_stage(e), **sizes}
    return {"status": "ok", **sizes, "predicted_ms": round(opt.estimated_time_us / 1000, 5),
            "naive_predicted_ms": round(opt.naive_estimated_time_us / 1000, 5),
            "calibrated_predicted_ms": round(
                calibrated_model().predict(opt.annotated, target) / 1000, 5),
            "kernels_naive": opt.naive_num_kernels, "kernels": opt.num_kernels,
            "verified": all(v is not None and v.equivalent for v in opt.verification),
            "search_s": round(time.perf_counter() - t0, 1),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


def search_ours(repo: Path, budget_s: float, limit_s: float, log=print,
                only: set[str] | None = None, retry: bool = False) -> None:
    """superopt (``time_budget_s=budget_s``) of every captured problem of the primary GPU's
    sizes (or of ``only``), each in a forked child killed after ``limit_s`` and held to
    ``MEMORY_LIMIT``; rows appended to ``OURS``. Problems with a row under the current
    :func:`pricing_key` are skipped (with ``retry``, only those whose row is an answer), so an
    interrupted run resumes and a stale row is redone; problems never answered go first."""
    key = pricing_key()
    done = {p for p, r in _ours(stale=True).items()
            if r.get("pricing") == key and (not retry or r.get("status") == "ok")}
    # by the file's hash: a problem whose file changed between commits may capture in one
    # version and not in another (level3/33's RNN mutates a plain attribute in this one)
    captured = {json.loads(x)["sha"] for x in PROGRAMS.read_text().splitlines()
                if json.loads(x).get("captured")}
    src = next(s for s in SOURCES if s.folder.startswith("H100_PCIe"))
    answered = {p for p, r in _ours(stale=True).items() if r.get("status") == "ok"}
    with tempfile.TemporaryDirectory(prefix="kb_") as tmp:
        root = _export_problems(repo, src.commit, Path(tmp))
        todo = [(f"{level}/{f.stem}", f) for level in ("level1", "level2", "level3")
                for f in sorted((root / level).glob("*.py"),
                                key=lambda f: int(f.stem.split("_")[0]))]
        # those never answered (under any pricing) first: an interrupted run has spent its
        # time where the table has no answer rather than on redoing stale ones
        todo.sort(key=lambda pf: pf[0] in answered)
        for problem, f in todo:
            if problem in done or (only is not None and problem not in only) or \
                    hashlib.sha256(f.read_bytes()).hexdigest()[:16] not in captured:
                continue
            t0 = time.perf_counter()
            row = _in_child(_search, (f, PRIMARY, budget_s), limit_s)
            row.update(problem=problem, target=PRIMARY, budget_s=budget_s,
                       limit_s=limit_s, pricing=key,
                       wall_s=round(time.perf_counter() - t0, 1))
            with open(OURS, "a") as out:
                out.write(json.dumps(row, sort_keys=True) + "\n")
            log(f"{problem}: {row['status']} {row.get('predicted_ms')} "
                f"({row['wall_s']} s)")


# ---- stage 2: records, models, scores --------------------------------------------------------

GPU_NAMES = {"h100_pcie": "H100 PCIe", "h100": "H100 SXM", "l40s": "L40S", "a100": "A100 80GB",
             "a100_40gb": "A100 40GB", "a10g": "A10G", "a10": "A10", "l4": "L4", "t4": "T4"}
PRIMARY = "h100_pcie"


def published_records() -> list:
    """The committed traces and timings joined into records (one per problem, source and GPU
    with an eager time and a trace); the compile time, where the same GPU measured it, in
    ``extra``."""
    from mirage_py.learned import KernelNode, Record, family_of

    programs = {}
    with open(PROGRAMS) as f:
        for line in f:
            d = json.loads(line)
            programs[d["sha"]] = d
    rows = json.loads(MEASUREMENTS.read_text())["rows"]
    compile_ms = {(r["problem"], r["source"], r["target"]): r["ms"] for r in rows
                  if r["kind"] == "compile"}
    out = []
    for r in rows:
        p = programs.get(r.get("program") or "")
        if r["kind"] != "eager" or r["target"] is None or not p or "kernels" not in p:
            continue
        cms = compile_ms.get((r["problem"], r["source"], r["target"]))
        out.append(Record(
            r["problem"], family_of(r["problem"]), r["target"],
            tuple(KernelNode.from_json(k) for k in p["kernels"]), int(p["calls"]),
            1000.0 * r["ms"], r["source"], f"{r['problem']}@{r['commit']}",
            bool(p.get("captured")),
            {"compile_us": None if cms is None else 1000.0 * cms, "commit": r["commit"]}))
    return out


def _scores(recs: list, pred: list[float], by_level: bool = True) -> dict:
    from mirage_py.learned import score
    out = {"all": score(pred, [r.measured_us for r in recs]).as_dict()}
    if by_level:
        for level in ("level1", "level2", "level3"):
            idx = [i for i, r in enumerate(recs) if r.level == level]
            out[level] = score([pred[i] for i in idx],
                               [recs[i].measured_us for i in idx]).as_dict()
    return out


CV = RESULTS / "published_cv.json"
OLD_FEATURES = ("gemm_", "log_mem_over_compute")  # the columns this issue's second pass added
TREE_GRID = [  # (LightGBM parameters, round counts, feature columns left out, rank weights)
    ([{"num_leaves": nl, "min_data_in_leaf": md} for nl in (7, 15, 31) for md in (10, 40)],
     [100, 200, 300, 500, 800], [(), OLD_FEATURES], [0.0]),
    ([{"num_leaves": nl, "min_data_in_leaf": 40} for nl in (7, 31)],
     [200, 300, 500, 800], [(), OLD_FEATURES], [1.0, 4.0]),
]
# GraphSAGE settings (mirage_py.learned.select.GraphGrid; one fit per setting but the epochs):
# a fit over the training records takes ~0.6 s an epoch at width 64 on two busy cores, so the
# grid is scored on three of the five folds of the training half (GRAPH_FOLDS; each fold's
# models fitted on the other four). Fold 0 alone (30 captured records: 6 on two GPUs, 3 on
# the others, which the score skips) gave 26 settings only three distinct taus: too few.
GRAPH_GRIDS = (
    # the first pass's setting (5-fold cv chose 200 epochs of 100 / 200 / 400)
    dict(epochs=(100, 200), hidden=(64,), layers=(3,), lr=(3e-3,), margins=(0.0,)),
    dict(epochs=(100, 200, 300), hidden=(32,), layers=(3,), lr=(3e-3, 1e-2), margins=(0.5,)),
    dict(epochs=(100, 200, 300), hidden=(32,), layers=(2,), lr=(3e-3,), margins=(0.0,)),
)
GRAPH_FOLDS = (0, 1, 2)


def select_models(records: list, which: str = "all", log=print) -> dict:
    """Cross-validate ``TREE_GRID`` on the training half (5 folds by problem, each calibrated
    without its fold) and score ``GRAPH_GRIDS`` on its validation folds ``GRAPH_FOLDS``; write
    ``CV``: every candidate's out-of-fold score, best first. ``which``: "gbt" or "gnn" scores
    that model's grid only and keeps the other's from ``CV``."""
    from mirage_py.learned import Split
    from mirage_py.learned.calibrate import calibrate
    from mirage_py.learned.select import (FOLDS, GraphGrid, cross_validate, fold_constants,
                                          fold_of, graph_fit_predict, select,
                                          tree_fit_predict)
    train_recs = [r for r in records if r.split() is Split.TRAIN]
    doc = json.loads(CV.read_text()) if CV.exists() and which != "all" else {}
    doc.update(criterion="mean over GPUs of the Kendall tau of the out-of-fold predictions "
                         "of each GPU's captured training records (5 folds by problem)",
               records=len(train_recs))
    if which in ("all", "gbt"):
        consts = fold_constants(train_recs)
        trees: dict = {}
        for params, rounds, exclude, ranks in TREE_GRID:
            trees.update(cross_validate(train_recs, tree_fit_predict(params, rounds, exclude,
                                                                     ranks), consts))
            log(f"trees: {len(trees)} candidates scored")
        doc["gbt"] = [r.as_dict() for r in select(trees)]
    if which in ("all", "gnn"):
        folds = [fold_of(r.problem) for r in train_recs]
        consts = [calibrate([r for r, f in zip(train_recs, folds) if f != i])
                  if i in GRAPH_FOLDS else None for i in range(FOLDS)]
        graphs: dict = {}
        for grid in GRAPH_GRIDS:
            t0 = time.perf_counter()
            graphs.update(cross_validate(train_recs, graph_fit_predict(GraphGrid(**grid)),
                                         consts, held_folds=GRAPH_FOLDS))
            log(f"graphs: {len(graphs)} candidates scored ({time.perf_counter() - t0:.0f} s)")
        doc["gnn_criterion"] = (f"the same tau on the validation fold(s) {list(GRAPH_FOLDS)} "
                                f"of the training half only ({FOLDS} folds by problem), the "
                                "models fitted on the other folds")
        doc["gnn"] = [r.as_dict() for r in select(graphs)]
    CV.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def evaluate(records: list, log=print) -> dict:
    """Analytic, calibrated and learned predictions of every record, and their scores."""
    from mirage_py.eager import DEFAULT
    from mirage_py.learned import ModelKind, Split, calibrate, predict_us, top_k, train

    train_recs = [r for r in records if r.split() is Split.TRAIN]
    t0 = time.perf_counter()
    consts = calibrate(train_recs)
    log(f"calibrated on {len(train_recs)} records in {time.perf_counter() - t0:.1f} s: "
        f"{consts.as_dict()}")
    preds = {"analytic": [predict_us(r, DEFAULT) for r in records],
             "analytic_calibrated": [predict_us(r, consts) for r in records]}
    fit_s = {}
    for kind in (ModelKind.GBT, ModelKind.GNN):
        t0 = time.perf_counter()
        model = train(train_recs, kind, consts)
        fit_s[kind.value] = round(time.perf_counter() - t0, 1)
        preds[kind.value] = model.predict(records)
        log(f"{kind.value}: trained in {fit_s[kind.value]} s")
    scores: dict = {}
    for gpu in [None] + sorted({r.target for r in records}):
        for subset in ("captured", "traced"):
            for split in (Split.TRAIN, Split.TEST):
                idx = [i for i, r in enumerate(records)
                       if (gpu is None or r.target == gpu) and r.split() is split
                       and (subset == "traced" or r.captured)]
                if len(idx) < 2:
                    continue
                recs = [records[i] for i in idx]
                key = f"{gpu or 'all'}/{subset}/{split.value}"
                scores[key] = {}
                for name, p in preds.items():
                    pp = [p[i] for i in idx]
                    s = _scores(recs, pp)
                    s["top_k"] = top_k([f"{r.target}/{r.family}" for r in recs], pp,
                                       [r.measured_us for r in recs]).as_dict()
                    scores[key][name] = s
    return {"constants": consts.as_dict(), "predictions": preds, "scores": scores,
            "fit_seconds": fit_s}


def write_results(records: list, ev: dict) -> dict:
    from mirage_py.learned import Split
    preds = ev["predictions"]
    ours = _ours()
    older = _ours(stale=True)  # a row of an older pricing where none of the current one is
    best = _best_learned(ev)
    rows = []
    for i, r in enumerate(records):
        o = (ours.get(r.problem) or older.get(r.problem, {})) if r.target == PRIMARY and \
            r.extra.get("commit") == _primary_commit() else {}
        rows.append({
            "problem": r.problem, "gpu": GPU_NAMES.get(r.target, r.target), "target": r.target,
            "source": r.source, "split": r.split().value, "captured": r.captured,
            "family": r.family, "kernels": len(r.kernels),
            "measured_eager_ms": round(r.measured_us / 1000, 5),
            "measured_compile_ms": None if r.extra.get("compile_us") is None
            else round(r.extra["compile_us"] / 1000, 5),
            "analytic_ms": round(preds["analytic"][i] / 1000, 5),
            "analytic_calibrated_ms": round(preds["analytic_calibrated"][i] / 1000, 5),
            "learned_ms": round(preds[best][i] / 1000, 5),
            "gbt_ms": round(preds["gbt"][i] / 1000, 5),
            "gnn_ms": round(preds["gnn"][i] / 1000, 5),
            "ours_predicted_ms": o.get("predicted_ms"),
            "ours_calibrated_ms": o.get("calibrated_predicted_ms"),
            "ours_status": _ours_status(r, o),
            "ours_pricing": o.get("pricing"),
        })
    doc = {"source": json.loads(MEASUREMENTS.read_text())["source"],
           "split": {"unit": "problem", "seed": 31, "test": sum(
               r.split() is Split.TEST for r in records)},
           "learned_model": best, "calibrated_constants": ev["constants"],
           "fit_seconds": ev["fit_seconds"], "scores": ev["scores"], "records": rows}
    (RESULTS / "published_gpu.json").write_text(json.dumps(doc, indent=1))
    (RESULTS / "published_gpu.md").write_text(markdown(doc, {**older, **ours}))
    return doc


def _primary_commit() -> str:
    return next(s.commit for s in SOURCES if s.folder.startswith("H100_PCIe"))


def _ours(stale: bool = False) -> dict[str, dict]:
    """superopt's answers (``--ours``) by problem, the last row of each; rows of another
    :func:`pricing_key` only with ``stale``; {} before any ran."""
    if not OURS.exists():
        return {}
    key = pricing_key()
    rows = [json.loads(x) for x in OURS.read_text().splitlines() if x.strip()]
    return {r["problem"]: r for r in rows if stale or r.get("pricing") == key}


def _best_learned(ev: dict) -> str:
    """The learned model with the higher Kendall tau on the primary GPU's held-out captured
    problems."""
    s = ev["scores"].get(f"{PRIMARY}/captured/test", {})
    return max(("gbt", "gnn"), key=lambda k: s.get(k, {}).get("all", {}).get("kendall_tau",
                                                                             -2))



def _f(x, nd=3) -> str:
    return "-" if x is None or (isinstance(x, float) and x != x) else f"{x:.{nd}g}"


MODELS = (("analytic", "analytic"), ("analytic_calibrated", "calibrated"), ("gbt", "GBT"),
          ("gnn", "GraphSAGE"))


def _ours_status(r, o: dict) -> str | None:
    """Why a primary-GPU record has no answer of ours (None elsewhere and where it has one)."""
    if r.target != PRIMARY or r.extra.get("commit") != _primary_commit():
        return None
    if not r.captured:
        return "not captured by the torch frontend"
    if not o:
        return "not searched"
    if o.get("status") != "ok":
        return o["status"] + (f" in {o['memory_stage']}" if o.get("memory_stage") else "")
    if not o.get("verified"):
        return "answer not verified"
    return "ok" if o.get("pricing") == pricing_key() else OLDER_PRICING


def naive_answer(o: dict) -> bool:
    """An answer that is the naive lowering of a program of several kernels: the search found
    nothing cheaper within its budget at these sizes."""
    return o.get("status") == "ok" and o.get("kernels_naive", 1) > 1 and \
        o["predicted_ms"] >= o["naive_predicted_ms"]


OLDER_PRICING = "ok, priced by an older cost model"  # a row of another pricing_key, kept until
# --ours --retry searches the problem again


def _ours_cell(r: dict) -> str:
    st = r.get("ours_status")
    if st is None:
        return "-"
    if st == "ok":
        return f"{_f(r['ours_predicted_ms'])}"
    if st == OLDER_PRICING:
        return f"{_f(r['ours_predicted_ms'])} (older pricing)"
    if st.startswith("not captured"):
        return "not captured"
    if st.startswith("over the memory"):
        return f"over {MEMORY_LIMIT >> 30} GiB" + (
            f" ({st.split(' in ', 1)[1]})" if " in " in st else "")
    return st.split(":")[0]


def ours_summary(doc: dict, ours: dict[str, dict]) -> list[str]:
    """Item 5 of the issue: where superopt's answers would stand against torch.compile on the
    primary GPU (predicted, with the predictor's held-out error beside)."""
    rows = [r for r in doc["records"] if r["target"] == PRIMARY and r["ours_status"] is not None]
    held = doc["scores"].get(f"{PRIMARY}/captured/test", {})
    err = held.get("analytic", {}).get("all", {}).get("median_abs_log_ratio")
    ok = [r for r in rows if r["ours_status"] in ("ok", OLDER_PRICING)]
    n_older = sum(r["ours_status"] == OLDER_PRICING for r in ok)
    n_naive = sum(naive_answer(ours.get(r["problem"], {})) for r in ok)
    why = Counter(_ours_cell(r) for r in rows if r not in ok)
    ratio = sorted(r["ours_predicted_ms"] / r["measured_compile_ms"] for r in ok
                   if r["measured_compile_ms"])
    budgets = sorted({o.get("budget_s") for o in ours.values()})
    limits = sorted({o.get("limit_s") for o in ours.values()})
    out = [f"## Where superopt's answers would stand on the {GPU_NAMES[PRIMARY]} (predicted)", "",
           f"Every KernelBench problem at the {GPU_NAMES[PRIMARY]}'s sizes (v0.2); superopt "
           f"(target `{PRIMARY}`, float32 products as PyTorch computes them, time budget "
           f"{', '.join(f'{b:g}' for b in budgets)} s per search, one process, each problem in "
           f"a child held to {MEMORY_LIMIT >> 30} GiB of address space and "
           f"{', '.join(f'{x:g}' for x in limits)} s) on each problem the frontend captures. "
           f"**ours** is the analytic model's **predicted** time of the answer -- these "
           f"answers have not run on a GPU (the level-2 answers of a 90 s search did, on an "
           f"H200: `gpu-h200-2026-11-27/gpu.md`, correct, none faster than eager: our float32 "
           f"matmul ran at 3-10 TFLOP/s) -- against the **measured** `torch.compile` time. "
           f"The analytic model's "
           f"held-out error on this GPU (captured test problems, eager programs): median "
           f"|log(pred / measured)| {_f(err)}, a factor of "
           f"{math.exp(err) if err is not None else float('nan'):.2f}; its ratio on each "
           f"problem's eager program is in the table's *analytic / eager* column.", "",
           f"{len(rows)} problems: {len(ok)} answered" +
           (f" ({n_older} of them by a search under an older version of the files that price "
            f"an answer, `{'`, `'.join(PRICING_FILES)}`, marked *older pricing*; "
            f"`--ours --retry` searches them again)" if n_older else "") + ", " +
           ", ".join(f"{n} {k}" for k, n in why.most_common()) + "." +
           (f" Answered: predicted / measured compile time median {ratio[len(ratio) // 2]:.2f}"
            f" (range {ratio[0]:.2f} - {ratio[-1]:.2f})." if ratio else "") +
           (f" {n_naive} of the answers are the naive lowering of a program of several "
            f"kernels (nothing cheaper found within the budget at these sizes)."
            if n_naive else ""), ""]
    return out


def markdown(doc: dict, ours: dict[str, dict]) -> str:
    sc = doc["scores"]
    out = ["# Cost models against KernelBench's published GPU timings", "",
           "Made by `python -m benchmarks.published_gpu` from "
           "`published_programs.jsonl` and `published_measurements.json` (KernelBench "
           "`results/timing/`, MIT licence: PyTorch 2.5, CUDA 12.4, float32, models in training "
           "mode under `no_grad`, mean of 100 timed calls). Every predicted time here is a "
           "prediction of eager PyTorch from its kernels (`mirage_py.eager`); the split is by "
           f"problem (seed {doc['split']['seed']}): the calibration and the learned models saw "
           "only the training half. *captured*: problems the torch frontend captures as one "
           "Program; *traced*: every problem whose eager run traces on the meta device.", ""]
    for subset in ("captured", "traced"):
        out += [f"## {GPU_NAMES[PRIMARY]}, {subset} problems: Kendall tau / median "
                "|log(pred / measured)|", "",
                "| split | level | n | " + " | ".join(m for _, m in MODELS) + " |",
                "|---|---|---|" + "---|" * len(MODELS)]
        for split in ("test", "train"):
            s = sc.get(f"{PRIMARY}/{subset}/{split}", {})
            for level in ("all", "level1", "level2", "level3"):
                cells = [s.get(k, {}).get(level, {}) for k, _ in MODELS]
                if not cells or not cells[0].get("n"):
                    continue
                out.append(f"| {split} | {level} | {cells[0]['n']} | " + " | ".join(
                    f"{_f(c.get('kendall_tau'))} / {_f(c.get('median_abs_log_ratio'))}"
                    for c in cells) + " |")
        out.append("")
    out += ["## Every GPU, held-out problems (test split): Kendall tau, top-1 / top-5 per "
            "problem family", "",
            "| GPU | subset | n | " + " | ".join(m for _, m in MODELS) + " |",
            "|---|---|---|" + "---|" * len(MODELS)]
    for gpu in ["all"] + [g for g in GPU_NAMES if f"{g}/captured/test" in sc]:
        for subset in ("captured", "traced"):
            s = sc.get(f"{gpu}/{subset}/test")
            if not s:
                continue
            n = s["analytic"]["all"]["n"]
            out.append(f"| {GPU_NAMES.get(gpu, gpu)} | {subset} | {n} | " + " | ".join(
                f"{_f(s[k]['all']['kendall_tau'])} ({_f(s[k]['top_k']['top1'], 2)} / "
                f"{_f(s[k]['top_k']['top5'], 2)})" for k, _ in MODELS) + " |")
    c = doc["calibrated_constants"]
    glob = {k: v for k, v in c.items() if not isinstance(v, dict)}
    out += ["", "Calibrated constants (fitted on the training half of every GPU's records; "
            "the analytic model's: every efficiency and scale 1, host 5 us per launch and 1 us "
            "per call): " + ", ".join(f"{k} {v:.3g}" for k, v in glob.items()) + "; per GPU, "
            "bandwidth x " + ", ".join(f"{GPU_NAMES.get(k, k)} {v:.2f}" for k, v in
                                     c["target_mem_eff"].items()) +
            "; SGEMM x " + ", ".join(f"{GPU_NAMES.get(k, k)} {v:.2f}" for k, v in
                                     c["target_gemm_eff"].items()) +
            "; convolution x " + ", ".join(f"{GPU_NAMES.get(k, k)} {v:.2f}" for k, v in
                                           c["target_conv_eff"].items()) + ".", ""]
    out += ours_summary(doc, ours)
    out += [f"## Every problem on the {GPU_NAMES[PRIMARY]}", "",
            "Milliseconds; every model column is a **prediction** of eager PyTorch (*analytic / "
            "eager*: the analytic model's ratio to the measured eager time). *ours*: the "
            "analytic model's **predicted** time of superopt's answer for the problem at these "
            "sizes, or why there is none (`published_ours.jsonl` has each search's row); "
            "*ours / compile*: that prediction over the measured `torch.compile` time.",
            ""]
    rows = sorted((r for r in doc["records"] if r["target"] == PRIMARY),
                  key=lambda r: (r["problem"].split("/")[0],
                                 int(r["problem"].split("/")[1].split("_")[0])))
    out += table(["problem", "split", "captured", "eager measured", "compile measured",
                  "analytic", "calibrated", "learned", "analytic / eager", "ours (predicted)",
                  "ours / compile"],
                 ([r["problem"], r["split"], "yes" if r["captured"] else "no",
                   _f(r["measured_eager_ms"]), _f(r["measured_compile_ms"]), _f(r["analytic_ms"]),
                   _f(r["analytic_calibrated_ms"]), _f(r["learned_ms"]),
                   f"{r['analytic_ms'] / r['measured_eager_ms']:.2f}", _ours_cell(r),
                   "-" if not r["ours_predicted_ms"] or not r["measured_compile_ms"] else
                   f"{r['ours_predicted_ms'] / r['measured_compile_ms']:.2f}"] for r in rows))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.published_gpu",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernelbench", default=None, metavar="PATH",
                    help="a KernelBench clone with its history: rebuild the traces first")
    ap.add_argument("--rebuild", action="store_true",
                    help="with --kernelbench: trace the problems again (else only --ours)")
    ap.add_argument("--ours", action="store_true",
                    help="with --kernelbench: superopt every captured problem at full size")
    ap.add_argument("--select", nargs="?", const="all", choices=("all", "gbt", "gnn"),
                    help="cross-validate the learned models' settings on the training half "
                         "(gbt / gnn: that model's grid only)")
    ap.add_argument("--retry", action="store_true",
                    help="with --ours: search again the problems whose row is not an answer")
    ap.add_argument("--time-budget", type=float, default=20.0, help="seconds per search")
    ap.add_argument("--limit", type=float, default=300.0, help="seconds per problem")
    args = ap.parse_args(argv)
    if args.kernelbench and (args.rebuild or not PROGRAMS.exists()):
        build(Path(args.kernelbench))
    if args.kernelbench and args.ours:
        search_ours(Path(args.kernelbench), args.time_budget, args.limit, retry=args.retry)
    records = published_records()
    print(f"{len(records)} records, {len({r.problem for r in records})} problems, "
          f"{sum(r.captured for r in records)} captured")
    if args.select:
        cv = select_models(records, args.select)
        for kind in ("gbt", "gnn"):
            print(kind, "best:", cv[kind][0])
    ev = evaluate(records)
    doc = write_results(records, ev)
    from mirage_py.cost_model import CALIBRATION
    c = ev["constants"]
    CALIBRATION.write_text(json.dumps({
        "mem_eff": round(c["mem_eff"], 4), "launch_scale": round(c["launch_scale"], 4),
        "target_mem_eff": {k: round(v, 4) for k, v in c["target_mem_eff"].items()},
        "fitted_on": "KernelBench published eager timings, training half (seed 31), "
                     "benchmarks/published_gpu.py", "constants": c}, indent=1) + "\n")
    s = doc["scores"].get(f"{PRIMARY}/captured/test", {})
    for name, _ in MODELS:
        print(name, s.get(name, {}).get("all"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
