"""Massive activations: a Llama-3-8B-size decode layer in float16 with outlier features.

LLM residual streams carry a few features hundreds or thousands of times larger than the rest
("massive activations"). Their squares do not fit float16 (300^2 = 90000 > 65504), so an answer
that stores an RMSNorm's sum of squares in float16 between kernels loses the norm -- silently:
the MLP's contribution vanishes behind an infinite RMS and no inf or NaN reaches the output.
This script superoptimises the decode layer of ``benchmarks.compositions.decoder_block`` at
Llama-3-8B size (hidden 4096, 32 heads of 128, a 4096-token KV cache, SwiGLU 14336; float16) and
runs the answer on the CPU interpreter in GPU precision with four features of the input scaled
by 1 (none), 300 and 1000, against the float64 reference::

    python -m benchmarks.outliers            # writes benchmarks/results/outliers.{json,md}

It also reports which device tensors the answer stores between kernels and in which dtype.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import time
from pathlib import Path

import numpy as np

import mirage_py as mp
from benchmarks._results import write_results
from benchmarks.compositions import decoder_block

OUTLIERS = (1.0, 300.0, 1000.0)
FEATURES = (7, 1100, 2222, 4000)


def run(workers: int = 2, seed: int = 0) -> dict:
    c = decoder_block(b=1, kv=4096, d=4096, heads=32, hd=128, f=14336, name="llama8b_decode")
    p = c.program
    t0 = time.perf_counter()
    opt = mp.superopt(p, database=False, workers=workers, progress=False)
    seconds = time.perf_counter() - t0
    g = opt.graph
    produced = {t.name: t for op in g.ops for t in op.outputs}
    stored = sorted({(t.name, t.dtype) for n, t in produced.items() if n not in g.outputs})
    base = c.inputs(seed)
    rows = []
    for factor in OUTLIERS:
        x = dict(base)
        x["X"] = base["X"].copy()
        x["X"][..., list(FEATURES)] *= factor
        ref = p.evaluate(x)["Y"]
        y = opt.run_numpy(x)["Y"]
        rows.append({"outlier": factor, "finite": bool(np.isfinite(y).all()),
                     "rel_err": float(np.linalg.norm(y - ref) / np.linalg.norm(ref))})
    return {"program": p.name, "date": _dt.date.today().isoformat(),
            "kernels_naive": opt.naive_num_kernels, "kernels": opt.num_kernels,
            "predicted_us": round(opt.estimated_time_us, 1), "search_s": round(seconds, 1),
            "stored_between_kernels": [f"{n}: {d}" for n, d in stored], "rows": rows}


def markdown(res: dict) -> str:
    lines = ["# Outlier features in a Llama-3-8B-size decode layer (float16)", "",
             f"`python -m benchmarks.outliers`, {res['date']}: `{res['program']}` (hidden 4096, "
             "32 heads of 128, KV cache 4096, SwiGLU 14336), "
             f"{res['kernels_naive']} -> {res['kernels']} kernels, {res['predicted_us']} us "
             f"predicted (H100), search {res['search_s']} s. Features {list(FEATURES)} of the "
             "input X scaled; the answer run on the CPU interpreter in GPU precision against "
             "the float64 reference (norm-wise relative error).", "",
             "| outlier factor | finite | relative error |", "| --- | --- | --- |"]
    lines += [f"| {r['outlier']:g} | {'yes' if r['finite'] else 'NO'} | {r['rel_err']:.2e} |"
              for r in res["rows"]]
    lines += ["", "Tensors stored between kernels: " +
              ", ".join(f"`{s}`" for s in res["stored_between_kernels"]) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "outliers"))
    args = ap.parse_args(argv)
    res = run(args.workers)
    print(write_results(args.out, res, markdown))


if __name__ == "__main__":
    main()
