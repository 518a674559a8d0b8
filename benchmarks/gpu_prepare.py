"""Everything a GPU session needs that a CPU can do: the searches, stored; the kernels, built.

Device time is scarce (docs/gpu.md): the GPU machine must only compile-load, run and time. This
script fills ``gpu-bundle/`` (git-ignored; the device tool carries it with ``.whl/``), which
``benchmarks/gpu_measure.py`` reads on the GPU machine::

    python -m benchmarks.gpu_prepare bench              # the nine benchmarks, bs 1 and 8
    python -m benchmarks.gpu_prepare tuning             # timed schedules for predicted-vs-measured
    python -m benchmarks.gpu_prepare kernelbench ROOT   # KernelBench level 2 at its own sizes
    python -m benchmarks.gpu_prepare cubins             # sm_90a cubins of every graph above and
                                                        # of the GPU tests' graphs (nvcc, no GPU)

What lands in the bundle:

* ``bench/<name>-bs<bs>.json``: the superopt answer (``OptimizedProgram.to_json``: program,
  chosen μGraphs, pipeline stages, verification) and the search's numbers.
* ``tuning/<name>-bs<bs>.json``: the graphs whose measured time is compared with the cost
  model's prediction -- the naive lowering, the search's candidate structures (generator
  annotations), schedules of the best structure from the annotation tuner, and the chosen
  answer -- each with its predicted time. Measured, they become training records (docs/learned.md).
* ``kernelbench/<problem>.json``: a level-2 problem captured at the file's sizes (meta tensors,
  nothing allocated), its superopt answer within ``--time-budget`` and where each program input
  comes from in the PyTorch model (a parameter / buffer by qualified name, a forward argument by
  position), so the GPU machine binds the model's own CUDA tensors; ``kernelbench/src/`` holds
  the problem files.
* ``cache/``: ``module_<key>_sm90a.cubin`` per distinct module (``codegen_cuda.runtime.
  prebuild_cubin``); the GPU machine sets ``MIRAGE_PY_CACHE`` there and loads them.

Every step skips what the bundle already has (delete a file to redo it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mirage_py.tuning import AnnotatedGraph  # noqa: E402

BUNDLE = Path(os.environ.get("MIRAGE_PY_GPU_BUNDLE", ROOT / "gpu-bundle"))
# the searches' results database: beside the bundle, not in it (the bundle travels)
PREPARE_DB = Path(os.environ.get("MIRAGE_PY_GPU_PREPARE_DB",
                                 Path.home() / ".cache" / "mirage_py" / "gpu-prepare.sqlite"))
BENCH_BS = (1, 8)
# the tuning records: structures from the search and schedules of the best one, per benchmark
TUNING_STRUCTURES = 10
TUNING_SCHEDULES = 8


def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


# ---- the nine benchmarks ----------------------------------------------------------------------

def prepare_bench(names: list[str], bss: tuple[int, ...], workers: int, log=print) -> None:
    import mirage_py as mp
    from benchmarks.fixtures import hand_built
    from benchmarks.programs import get_program
    for bs in bss:
        for name in names:
            path = BUNDLE / "bench" / f"{name}-bs{bs}.json"
            if path.exists():
                continue
            p = get_program(name, bs)
            t0 = time.perf_counter()
            opt = mp.superopt(p, workers=workers, progress=False,
                              database=str(PREPARE_DB))
            fixture = hand_built(name, bs)
            _write(path, {
                "name": name, "bs": bs, "search_seconds": round(time.perf_counter() - t0, 2),
                "kernels_naive": opt.naive_num_kernels, "kernels": opt.num_kernels,
                "predicted_us": opt.estimated_time_us,
                "predicted_us_naive": opt.naive_estimated_time_us,
                "predicted_us_fixture": opt.model.predict(fixture, opt.target),
                "bytes_moved": _bytes(opt), "opt": opt.to_json()})
            log(f"bench {name} bs={bs}: {opt.naive_num_kernels} -> {opt.num_kernels} kernels, "
                f"{opt.estimated_time_us:.1f} us predicted ({time.perf_counter() - t0:.1f} s)")


def _bytes(opt: Any) -> int:
    from mirage_py.cost_model import bytes_moved
    return int(bytes_moved(opt.graph, opt.target))


def prepare_tuning(names: list[str], bs: int, workers: int, log=print) -> None:
    """Graphs to time per benchmark, each with the analytic model's prediction."""
    from mirage_py.superopt import default_model
    from mirage_py.superopt.result import OptimizedProgram
    from mirage_py.superopt.search import _parallel_search, _rank
    from mirage_py.targets import get_target
    from mirage_py.tuning.tuner import make_task
    model = default_model()
    for name in names:
        path = BUNDLE / "tuning" / f"{name}-bs{bs}.json"
        src = BUNDLE / "bench" / f"{name}-bs{bs}.json"
        if path.exists() or not src.exists():
            continue
        doc = json.loads(src.read_text())
        opt = OptimizedProgram.from_json(doc["opt"])
        tgt = get_target(opt.target)
        graphs = [("naive", AnnotatedGraph(opt.naive_graph))]
        for i, part in enumerate(opt.parts):
            found, _ = _parallel_search(part.program, tgt, 3, None, workers, lambda *a: None)
            ranked = _rank(found, tgt, model)
            graphs += [(f"part{i}-structure{j}", AnnotatedGraph(c.graph))
                       for j, (_, c) in enumerate(ranked[:TUNING_STRUCTURES])]
            if ranked:
                task = make_task(name, part.program, tgt, [ranked[0][1]], model)
                for _ in range(4):
                    task.step()
                evs = task.tuners[0].ranked()
                # spread over the tuner's range: best, worst and evenly between
                pick = sorted({round(k * (len(evs) - 1) / max(TUNING_SCHEDULES - 1, 1))
                               for k in range(TUNING_SCHEDULES)}) if evs else []
                graphs += [(f"part{i}-schedule{k}", evs[k].graph) for k in pick]
        graphs.append(("chosen", opt.annotated))
        if len(opt.parts) > 1:  # a part's graph alone is not the program: time whole graphs
            graphs = [g for g in graphs if not g[0].startswith("part")]
        rows = []
        for label, ag in graphs:
            rows.append({"label": label, "predicted_us": float(model.predict(ag, tgt)),
                         "kernels": ag.graph.num_kernels, **ag.to_json()})
        _write(path, {"name": name, "bs": bs, "target": opt.target, "rows": rows})
        log(f"tuning {name} bs={bs}: {len(rows)} graphs")


# ---- KernelBench level 2 ----------------------------------------------------------------------

def captured_level2() -> list[str]:
    """The level-2 problems the frontend captures whole (benchmarks/published_gpu.py's
    traces of the H100 PCIe commit's files)."""
    from benchmarks.published_gpu import PROGRAMS
    out = []
    for line in PROGRAMS.read_text().splitlines():
        r = json.loads(line)
        if r.get("captured") and r["problem"].startswith("level2/"):
            out.append(r["problem"])
    return sorted(set(out), key=lambda p: int(p.split("/")[1].split("_")[0]))


def input_sources(program: Any, model: Any, inputs: tuple) -> list[dict]:
    """Where each program input comes from: ``{"name", "kind": "state" | "arg", "ref"}``
    (a parameter or buffer's qualified name, or a forward argument's position)."""
    from mirage_py.frontend_torch.capture import user_input_names
    args = user_input_names(model.forward, inputs, {})
    state = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    out = []
    for t in program.inputs:
        src = program.torch_names.get(t.name, t.name)
        if src in state:
            out.append({"name": t.name, "kind": "state", "ref": src, "dtype": t.dtype})
        elif src in args:
            out.append({"name": t.name, "kind": "arg", "ref": args.index(src), "dtype": t.dtype})
        else:
            raise ValueError(f"program input {t.name!r} ({src!r}) is neither a parameter, a "
                             "buffer nor an argument (a constant made at capture)")
    return out


def _kb_search(path: Path, budget_s: float) -> dict:
    """In a child: capture (meta tensors where they do), superopt within the budget, the answer
    as JSON."""
    import mirage_py as mp
    from benchmarks.published_gpu import problem_program
    program, model, inputs = problem_program(path)
    sources = input_sources(program, model, inputs)
    t0 = time.perf_counter()
    opt = mp.superopt(program, time_budget_s=budget_s, workers=1, progress=False,
                      database=str(PREPARE_DB))
    return {"status": "ok", "search_seconds": round(time.perf_counter() - t0, 1),
            "kernels_naive": opt.naive_num_kernels, "kernels": opt.num_kernels,
            "predicted_us": opt.estimated_time_us,
            "predicted_us_naive": opt.naive_estimated_time_us,
            "verified": all(v is not None and v.equivalent for v in opt.verification),
            "outputs": list(program.output_tensors), "sources": sources,
            "opt": opt.to_json()}


def prepare_kernelbench(root: Path, budget_s: float, limit_s: float, only: set[str] | None,
                        log=print) -> None:
    from benchmarks.published_gpu import _in_child
    for problem in captured_level2():
        if only and problem not in only:
            continue
        name = problem.replace("/", "__")
        path = BUNDLE / "kernelbench" / f"{name}.json"
        if path.exists():
            continue
        f = root / f"{problem}.py"
        if not f.exists():  # a problem of another KernelBench commit (renamed since)
            log(f"kernelbench {problem}: not in {root}")
            continue
        dst = BUNDLE / "kernelbench" / "src" / f.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dst)
        t0 = time.perf_counter()
        row = _in_child(_kb_search, (f, budget_s), limit_s)
        row.update(problem=problem, file=f"src/{f.name}", budget_s=budget_s)
        _write(path, row)
        log(f"kernelbench {problem}: {row['status']} {row.get('kernels_naive')} -> "
            f"{row.get('kernels')} kernels ({time.perf_counter() - t0:.0f} s)")


# ---- cubins -----------------------------------------------------------------------------------

def bundle_graphs() -> list[tuple[str, Any]]:
    """Every graph the GPU session compiles: the bundle's answers, naive lowerings and tuning
    graphs, and the GPU tests' graphs (tests/test_codegen_gpu.py)."""
    from benchmarks.fixtures import hand_built
    from benchmarks.programs import NAMES, get_program
    from mirage_py.superopt.result import OptimizedProgram
    from mirage_py.ugraph import naive_lowering
    out = []
    for f in sorted((BUNDLE / "bench").glob("*.json")) + \
            sorted((BUNDLE / "kernelbench").glob("*.json")):
        doc = json.loads(f.read_text())
        if "opt" in doc:
            opt = OptimizedProgram.from_json(doc["opt"])
            out += [(f.stem, opt.annotated), (f.stem + ":naive", opt.naive_graph)]
    for f in sorted((BUNDLE / "tuning").glob("*.json")):
        for r in json.loads(f.read_text())["rows"]:
            out.append((f"{f.stem}:{r['label']}", AnnotatedGraph.from_json(r)))
    for bs in (1, 8):
        for n in NAMES:
            out += [(f"test:{n}-{bs}", hand_built(n, bs)),
                    (f"test:{n}-{bs}:naive", naive_lowering(get_program(n, bs)))]
    sys.path.insert(0, str(ROOT / "tests"))
    import codegen_cases as cc
    for g in (cc.small_rmsnorm_matmul(), cc.small_attention(), cc.mixed_block_ops(),
              naive_lowering(cc.kernel_ops_program())):
        out.append((f"test:{g.name}", g))
    from test_codegen_mma import WGMMA_CASES, block_matmul
    for c, a in WGMMA_CASES.items():
        out.append((f"test:{c}", block_matmul(c, *a)))
    return out


NO_TMA_TESTS = ("gqa", "rmsnorm_linear", "lora", "gated_mlp", "exp_matmul")  # test_tma_and_...


def prepare_cubins(log=print) -> None:
    from mirage_py.codegen_cuda.emit import emit_cuda
    from mirage_py.codegen_cuda.runtime import prebuild_cubin
    os.environ["MIRAGE_PY_CACHE"] = str(BUNDLE / "cache")
    built = found = failed = 0
    from benchmarks.fixtures import hand_built
    graphs = [(label, g, True) for label, g in bundle_graphs()]
    graphs += [(f"test:{n}-1:cp.async", hand_built(n, 1), False) for n in NO_TMA_TESTS]
    graphs += [(f"{label}:cp.async", g, False) for label, g, _ in graphs
               if label.endswith("-bs1")]  # gpu_measure variants: the MIRAGE_PY_NO_TMA build
    for label, g, tma in graphs:
        try:
            _, new = prebuild_cubin(emit_cuda(g, "h100"), tma)
            built += new
            found += not new
        except Exception as e:  # noqa: BLE001 -- the GPU machine compiles it then
            failed += 1
            log(f"cubin {label}: {type(e).__name__}: {str(e)[:300]}")
    size = sum(p.stat().st_size for p in (BUNDLE / "cache").glob("*.cubin"))
    log(f"cubins: {built} built, {found} there already, {failed} failed; "
        f"{size / 2**20:.1f} MiB in {BUNDLE / 'cache'}")


def main(argv: list[str] | None = None) -> int:
    from benchmarks.programs import NAMES
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_prepare",
                                 description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--names", nargs="+", default=list(NAMES), choices=NAMES)
    b.add_argument("--bs", nargs="+", type=int, default=list(BENCH_BS))
    b.add_argument("--workers", type=int, default=2)
    t = sub.add_parser("tuning")
    t.add_argument("--names", nargs="+", default=list(NAMES), choices=NAMES)
    t.add_argument("--bs", type=int, default=1)
    t.add_argument("--workers", type=int, default=1)
    k = sub.add_parser("kernelbench")
    k.add_argument("root", type=Path, help="a KernelBench checkout's KernelBench/ folder (the "
                   "H100 PCIe timing commit's files, benchmarks/published_gpu.py SOURCES)")
    k.add_argument("--time-budget", type=float, default=40.0)
    k.add_argument("--limit", type=float, default=240.0, help="seconds before a child is killed")
    k.add_argument("--only", nargs="+", default=None)
    sub.add_parser("cubins")
    args = ap.parse_args(argv)
    BUNDLE.mkdir(parents=True, exist_ok=True)
    if args.step == "bench":
        prepare_bench(args.names, tuple(args.bs), args.workers)
    elif args.step == "tuning":
        prepare_tuning(args.names, args.bs, args.workers)
    elif args.step == "kernelbench":
        prepare_kernelbench(args.root, args.time_budget, args.limit,
                            set(args.only) if args.only else None)
    else:
        prepare_cubins()
    return 0


if __name__ == "__main__":
    sys.exit(main())
