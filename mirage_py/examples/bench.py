"""The benchmark suite: superoptimise each benchmark program and record what happened.

For each of the nine benchmarks and each batch size (default 1, 8 and 16) this runs
``mp.superopt`` with default settings and records: search seconds, states visited, plans and
candidates, candidates verified, kernels naive -> found, bytes moved, predicted time naive vs
found vs the hand-built fixture (same cost model, same target), the verification bound, and the
interpreter's error against the float64 reference. With a GPU (CuPy and a device), it also times
our compiled graph and the baselines -- PyTorch eager, ``torch.compile`` and, for attention,
``scaled_dot_product_attention`` -- in one process with CUDA events after warm-up, on fresh inputs,
and checks their outputs against each other.

Writes ``<out>/<device>-<date>.json``, a markdown table next to it and, when matplotlib is
installed, a PNG bar chart of the speed-ups. ``mirage-py bench`` writes into ``./mirage-py-bench``
by default (from any directory, no checkout needed); ``python -m benchmarks.run`` in a checkout
writes into ``benchmarks/results``::

    mirage-py bench                               # everything
    mirage-py bench --names gqa lora --bs 1 --workers 2 --out results/
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time

DEFAULT_OUT = "mirage-py-bench"


def _gpu_name() -> str | None:
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        props = cupy.cuda.runtime.getDeviceProperties(0)
        return props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception:  # no CuPy, no driver, no device
        return None


def run_one(name: str, bs: int, target: str, workers: int | None, check: bool,
            database=False) -> dict:
    import numpy as np

    import mirage_py as mp
    from .fixtures import hand_built
    from .programs import get_inputs, get_program
    from mirage_py.cost_model import bytes_moved

    p = get_program(name, bs)
    t0 = time.perf_counter()
    # no results database by default: the numbers are those of a real search
    opt = mp.superopt(p, target=target, workers=workers, progress=False, database=database)
    wall = time.perf_counter() - t0
    fixture = hand_built(name, bs)
    rec = {
        "name": name, "bs": bs, "target": target,
        "search_seconds": round(wall, 3),
        "states": sum(pr.stats.states for pr in opt.parts),
        "pruned": sum(pr.stats.pruned for pr in opt.parts),
        "plans": sum(pr.stats.plans for pr in opt.parts),
        "candidates": sum(pr.candidates for pr in opt.parts),
        "verified": sum(pr.verified for pr in opt.parts),
        "timed_out": any(pr.stats.timed_out for pr in opt.parts),
        "kernels_naive": opt.naive_num_kernels, "kernels_found": opt.num_kernels,
        "kernels_fixture": fixture.num_kernels,
        "bytes_naive": bytes_moved(opt.naive_graph, target),
        "bytes_found": bytes_moved(opt.graph, target),
        "predicted_us_naive": round(opt.naive_estimated_time_us, 3),
        "predicted_us_found": round(opt.estimated_time_us, 3),
        "predicted_us_fixture": round(opt.model.predict(fixture, target), 3),
        "bound": max((v.bound for v in opt.verification if v is not None), default=None),
        "all_verified": all(v is not None and v.equivalent for v in opt.verification),
        "sources": [pr.source for pr in opt.parts],
    }
    rec["_opt"] = opt
    if check:
        x = get_inputs(name, bs)
        ref = p.evaluate(x)
        out = opt.run_numpy(x)
        rec["interp_rel_err"] = max(float(np.linalg.norm(out[k] - ref[k]) / np.linalg.norm(ref[k]))
                                    for k in ref)
    return rec


def measure_gpu(name: str, bs: int, opt, rec: dict, seed: int = 0, dev=None) -> None:
    """Median CUDA-event times (us) of ours and the PyTorch baselines, in this process, after
    warm-up, on fresh inputs, with every output checked against PyTorch eager (norm-wise
    relative error), through the measuring core (``measure.py``). ``dev``: by default the GPU,
    10 warm-up calls and 50 timed ones, the L2 cache not flushed; a dry ``Device`` runs the
    same path on the CPU (no copy bandwidth then)."""
    from .measure import (Build, Device, measure_baselines, measure_ours, references,
                          torch_inputs)
    from .programs import get_inputs, get_program
    from .torch_baselines import copy_bandwidth

    dev = dev or Device(dry=False, budget_s=None, flush=False, warmup=10, repeat=50)
    p = get_program(name, bs)
    x = get_inputs(name, bs, seed=seed)
    tx = torch_inputs(p, x, dev.torch_device)
    refs = references(p, tx, x, dev)
    ours = measure_ours(dev, opt.annotated, opt.target, tx, refs, graphs=False)
    rec["check_rel_err"] = {"ours": ours.check.rel_err_vs_eager}
    times = {"ours": ours.call.us}
    for m in measure_baselines(dev, name, p, tx, refs, graphs=False):
        if m.error is not None:  # a compiler failure is a result too
            rec["torch_compile_error"] = m.error[:300]
            continue
        if m.label != "eager":
            rec["check_rel_err"][m.label] = m.check.rel_err_vs_eager
        times["torch_eager" if m.label == "eager" else m.label] = m.call.us
    if ours.tma:  # the same kernels with every tile on cp.async: what TMA buys
        alt = measure_ours(dev, opt.annotated, opt.target, tx, refs, "ours_cp_async",
                           Build.NO_TMA, graphs=False)
        rec["check_rel_err"]["ours_cp_async"] = alt.check.rel_err_vs_eager
        times["ours_cp_async"] = alt.call.us
    rec["measured_us"] = times
    best = min(v for k, v in times.items() if not k.startswith("ours"))
    rec["speedup_vs_best_baseline"] = best / times["ours"]
    rec["speedup_vs_eager"] = times["torch_eager"] / times["ours"]
    if not dev.dry:
        bw = copy_bandwidth()
        rec["copy_bandwidth"] = bw
        rec["bandwidth_fraction"] = rec["bytes_found"] / (times["ours"] * 1e-6) / bw


def markdown(records: list[dict], device: str) -> str:
    lines = [f"Results on {device}. Predicted times come from mirage_py's analytic cost model "
             "(same model and target for naive, found and fixture).", "",
             "| benchmark | bs | search s | states | candidates | verified | kernels naive -> "
             "found (fixture) | predicted us naive -> found (fixture) | speed-up | bound |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    gpu_rows = [r for r in records if "measured_us" in r]
    for r in records:
        sp = r["predicted_us_naive"] / r["predicted_us_found"]
        bound = f"{r['bound']:.0e}" if r["bound"] is not None else "-"
        lines.append(
            f"| {r['name']} | {r['bs']} | {r['search_seconds']:.1f}"
            f"{' (budget hit)' if r['timed_out'] else ''} | {r['states']} | {r['candidates']} | "
            f"{r['verified']} | {r['kernels_naive']} -> {r['kernels_found']} "
            f"({r['kernels_fixture']}) | {r['predicted_us_naive']:.1f} -> "
            f"{r['predicted_us_found']:.1f} ({r['predicted_us_fixture']:.1f}) | {sp:.2f}x | "
            f"{bound} |")
    if gpu_rows:
        lines += ["", "Measured (CUDA events, median, us):", "",
                  "| benchmark | bs | ours | ours, cp.async only | torch eager | torch.compile | "
                  "sdpa | vs best | % of copy bandwidth |", "|---|---|---|---|---|---|---|---|---|"]
        for r in gpu_rows:
            m = r["measured_us"]
            cell = lambda k: f"{m[k]:.1f}" if k in m else "-"  # noqa: E731
            lines.append(f"| {r['name']} | {r['bs']} | {cell('ours')} | "
                         f"{cell('ours_cp_async')} | {cell('torch_eager')} | "
                         f"{cell('torch_compile')} | {cell('sdpa')} | "
                         f"{r['speedup_vs_best_baseline']:.2f}x | "
                         f"{100 * r['bandwidth_fraction']:.0f}% |")
    return "\n".join(lines) + "\n"


def chart(records: list[dict], path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r['name']}\nbs{r['bs']}" for r in records]
    sp = [r["predicted_us_naive"] / r["predicted_us_found"] for r in records]
    fig, ax = plt.subplots(figsize=(max(6, len(records) * 0.8), 4))
    ax.bar(range(len(sp)), sp)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(sp)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("predicted speed-up over naive")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None, prog: str = "mirage-py bench",
         default_out: str = DEFAULT_OUT) -> int:
    """Run the suite with command-line arguments ``argv``; ``prog`` and ``default_out`` are the
    program name in the help text and the output directory when ``--out`` is not given."""
    from .programs import NAMES

    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--names", nargs="+", default=list(NAMES), choices=NAMES)
    ap.add_argument("--bs", nargs="+", type=int, default=[1, 8, 16])
    ap.add_argument("--target", default="h100")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--no-check", action="store_true", help="skip the interpreter check")
    ap.add_argument("--out", default=default_out, metavar="DIR",
                    help=f"directory for the .json/.md/.png results (default {default_out})")
    ap.add_argument("--database", default=None, metavar="PATH",
                    help="use this results database (default: none, so every search runs)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)  # fail before the searches, not after
    gpu = _gpu_name()
    device = gpu or f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    records = []
    for bs in args.bs:
        for name in args.names:
            rec = run_one(name, bs, args.target, args.workers, not args.no_check,
                          args.database or False)
            opt = rec.pop("_opt")
            if gpu:
                try:
                    measure_gpu(name, bs, opt, rec)
                except Exception as e:  # record the failure, keep going
                    rec["gpu_error"] = f"{type(e).__name__}: {e}"[:500]
            records.append(rec)
            print(f"{name:15s} bs={bs:<3d} {rec['search_seconds']:6.1f}s  kernels "
                  f"{rec['kernels_naive']:>2d} -> {rec['kernels_found']}  predicted "
                  f"{rec['predicted_us_naive']:8.1f} -> {rec['predicted_us_found']:8.1f} us "
                  f"(fixture {rec['predicted_us_fixture']:.1f})  bound {rec['bound']}",
                  flush=True)
    stem = f"{'gpu' if gpu else 'cpu'}-{_dt.date.today().isoformat()}"
    doc = {"device": device, "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "python": platform.python_version(), "target": args.target, "records": records}
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(markdown(records, device))
    png = chart(records, os.path.join(args.out, stem + ".png"))
    print(f"wrote {os.path.join(args.out, stem)}.{{json,md{',png' if png else ''}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
