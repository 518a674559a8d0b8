"""The tuning table: for the nine benchmarks (bs 1 by default), predicted time of the naive
lowering vs the superoptimised graph, and what the annotation tuner adds over the untuned
structure (and over the old coordinate descent over part counts). With a GPU it also times every
candidate it can run and reports measured vs predicted and their Kendall tau.

    python -m benchmarks.tuning_table                  # all nine, bs 1, h100
    python -m benchmarks.tuning_table --names lora gqa --bs 8

Writes ``benchmarks/results/tuning-<target>-bs<bs>.{json,md}``. Predicted times come from the
analytic cost model (mirage_py/cost_model.py; docs/tuning.md).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

RESULTS = os.path.join(ROOT, "benchmarks", "results")


def coordinate_descent(part, target, ranked, top: int) -> float:
    """The generator's own tuner (Searcher.tune: part counts only) on the same structures."""
    from mirage_py.generator.kernel_search import Searcher
    from mirage_py.superopt import default_model
    s = Searcher(part, target)
    model = default_model()  # the model superopt tunes with
    cost = lambda g: model.predict(g, target)  # noqa: E731
    return min((cost(s.tune(c, cost).graph) for _, c in ranked[:top]), default=float("nan"))


def run_one(name: str, bs: int, target: str, workers: int, measure: bool) -> dict:
    import mirage_py as mp
    from benchmarks.programs import get_program
    from mirage_py.superopt import _parallel_search, _rank, default_model
    from mirage_py.targets import get_target
    from mirage_py.tuning import ModelRunner

    tgt = get_target(target)
    p = get_program(name, bs)
    t0 = time.perf_counter()
    opt = mp.superopt(p, target=target, workers=workers, progress=False, database=False,
                      runner=ModelRunner(default_model()))
    wall = time.perf_counter() - t0
    (part,) = opt.parts  # every benchmark is one verifiable part
    rec = {
        "name": name, "bs": bs, "target": target, "superopt_seconds": round(wall, 2),
        "kernels_naive": opt.naive_num_kernels, "kernels_found": opt.num_kernels,
        "source": part.source,
        "predicted_us_naive": opt.naive_estimated_time_us,
        "predicted_us_best_untuned": part.best_untuned_us,
        "predicted_us_chosen_untuned": part.untuned_us,
        "predicted_us_found": opt.estimated_time_us,
        "tune_rounds": part.tune_rounds, "tune_evaluations": part.tune_evaluations,
        "annotations": [{"grid": list(gk.block.grid), "forloop": gk.block.forloop,
                         "threads": gk.block.threads, "stages": s}
                        for gk, s in zip(part.graph.graph_kernels(), part.annotated.stages_full())],
        "verified": bool(part.verification and part.verification.equivalent),
    }
    found, _ = _parallel_search(part.program, tgt, 3, None, workers, lambda n: None)
    ranked = _rank(found, tgt)
    rec["predicted_us_coordinate_descent"] = coordinate_descent(part.program, tgt, ranked, 4)
    if measure:
        rec["measured"] = measure_candidates(part.program, tgt, ranked, opt)
    return rec


def measure_candidates(part, target, ranked, opt, dev=None) -> dict:
    """Time the naive graph, every candidate structure (generator annotations) and the chosen
    tuned graph on the GPU (``dev``: by default the GPU, 3 warm-up calls and 20 timed ones,
    the L2 cache not flushed; a dry ``Device`` times them on the CPU's interpreter), each on
    random inputs through the measuring core; Kendall tau between predicted and measured."""
    from mirage_py.examples.measure import Device, time_graph
    from mirage_py.tuning import AnnotatedGraph, kendall_tau
    dev = dev or Device(dry=False, budget_s=None, flush=False, warmup=3, repeat=20)
    rows = []
    graphs = [("naive", AnnotatedGraph(opt.parts[0].naive))]
    graphs += [(f"candidate{i}", AnnotatedGraph(c.graph)) for i, (_, c) in enumerate(ranked)]
    graphs.append(("chosen", opt.parts[0].annotated))
    for label, ag in graphs:
        m = time_graph(dev, ag, target, label)
        rows.append({"label": label, "predicted_us": opt.model.predict(ag, target),
                     "measured_us": m.call.us if m.error is None else None, "error": m.error})
    ok = [r for r in rows if r["measured_us"] is not None]
    tau = kendall_tau([r["predicted_us"] for r in ok], [r["measured_us"] for r in ok]) \
        if len(ok) >= 2 else float("nan")
    return {"rows": rows, "kendall_tau": tau, "measured": len(ok), "total": len(rows)}


def _f(x, nd=1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(doc: dict) -> str:
    recs = doc["records"]
    lines = [
        f"# Tuning table ({doc['target']}, bs {doc['bs']})", "",
        f"Predicted times (us) from the analytic cost model; {doc['device']}; {doc['date']}.",
        "*naive*: one library kernel per operator. *best untuned*: the search's best candidate "
        "with the generator's annotations (tiles of up to 64, 128 threads, float32 "
        "intermediates) and the model's default of 2 pipeline stages. *chosen untuned*: "
        "the structure superopt finally picked, before tuning. *coord. descent*: the generator's "
        "part-count tuner on the top 4 structures. *found*: superopt's verified answer after the "
        "evolutionary annotation tuner (8 generations x 8 schedules x 4 structures). *tuner "
        "gain*: chosen untuned (or best untuned) / found. Annotations: grid, loop iterations F, "
        "threads T, pipeline stages S of each graph-defined kernel.", "",
        "| benchmark | kernels | naive | best untuned | chosen untuned | coord. descent | found "
        "(tuned) | speed-up vs naive | tuner gain vs chosen untuned | tuner gain vs best "
        "untuned | annotations (grid, loop, threads, stages) |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        ann = "; ".join(f"{tuple(a['grid'])} F{a['forloop']} T{a['threads']} S{a['stages']}"
                        for a in r["annotations"]) or "naive"
        cu, bu = r["predicted_us_chosen_untuned"], r["predicted_us_best_untuned"]
        fd = r["predicted_us_found"]
        lines.append(
            f"| {r['name']} | {r['kernels_naive']} -> {r['kernels_found']} | "
            f"{_f(r['predicted_us_naive'])} | {_f(bu)} | {_f(cu)} | "
            f"{_f(r['predicted_us_coordinate_descent'])} | {_f(fd)} | "
            f"{r['predicted_us_naive'] / fd:.2f}x | "
            f"{'-' if cu is None else f'{cu / fd:.2f}x'} | "
            f"{'-' if bu is None else f'{bu / fd:.2f}x'} | {ann} |")
    if any("measured" in r for r in recs):
        lines += ["", "## Measured vs predicted", "",
                  "| benchmark | candidates timed | Kendall tau |", "|---|---|---|"]
        for r in recs:
            m = r.get("measured")
            if m:
                lines.append(f"| {r['name']} | {m['measured']}/{m['total']} | "
                             f"{m['kendall_tau']:.2f} |")
    else:
        lines += ["", "No GPU in this run: measured-vs-predicted columns and the Kendall tau need "
                  "one (`python -m benchmarks.tuning_table` on a machine with CuPy and a GPU)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.programs import NAMES
    from mirage_py.tuning import gpu_present

    ap = argparse.ArgumentParser(prog="python -m benchmarks.tuning_table",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--names", nargs="+", default=list(NAMES), choices=NAMES)
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--target", default="h100")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    gpu = gpu_present()
    device = "GPU" if gpu else f"cpu ({platform.machine()}, {os.cpu_count()} cores), no GPU"
    records = []
    for name in args.names:
        r = run_one(name, args.bs, args.target, args.workers, gpu)
        records.append(r)
        print(f"{name:15s} naive {r['predicted_us_naive']:8.1f}  best untuned "
              f"{_f(r['predicted_us_best_untuned']):>8s}  chosen untuned "
              f"{_f(r['predicted_us_chosen_untuned']):>8s}  coord "
              f"{r['predicted_us_coordinate_descent']:8.1f}  found {r['predicted_us_found']:8.1f} us  ({r['superopt_seconds']:.0f} s)",
              flush=True)
    doc = {"device": device, "date": _dt.date.today().isoformat(), "target": args.target,
           "bs": args.bs, "python": platform.python_version(), "records": records}
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"tuning-{args.target}-bs{args.bs}")
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(markdown(doc))
    print(f"wrote {stem}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
