"""A Llama-3-8B-size decode layer at real size (issue #28, item 5), beside the small one of
``benchmarks/whole_programs.py``: ``benchmarks.compositions.decoder_block`` with hidden 4096, 32
heads of 128, a 4096-token KV cache and SwiGLU 14336, float16, one token::

    python -m benchmarks.decode8b            # writes benchmarks/results/decode8b.{json,md}

Reports the kernels (naive -> found, and each kernel found), the predicted time (analytic cost
model, target h100) against the copy floor -- every input and output moved once at the
target's measured copy bandwidth (3.0 TB/s on an H100) --, the search time with the machine's
load average beside it (the search shares its cores), and the answer run on the CPU interpreter
in GPU precision against the float64 reference.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import time
from pathlib import Path

import numpy as np

import mirage_py as mp
from benchmarks._results import write_results
from benchmarks.compositions import decoder_block
from mirage_py.targets import get_target
from mirage_py.ugraph.graph import GraphKernel


def floor_us(program: mp.Program, target) -> float:
    """Every program input and output read or written once at the target's copy bandwidth."""
    nbytes = sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize
                 for t in list(program.inputs) + list(program.output_tensors.values()))
    return nbytes / target.mem_bw * 1e6


def kernel_rows(graph) -> list[str]:
    """One line per kernel: what it writes, and its grid and loop (graph-defined) or its
    operator (pre-defined)."""
    rows = []
    for op in graph.ops:
        outs = ", ".join(t.name for t in op.outputs)
        if isinstance(op, GraphKernel):
            b = op.block
            rows.append(f"graph kernel -> {outs}: grid {b.grid}, forloop {b.forloop}, "
                        f"{len(b.ops)} block ops")
        else:
            rows.append(f"{op.op} -> {outs}")
    return rows


def run(workers: int = 2, seed: int = 0, target: str = "h100") -> dict:
    c = decoder_block(b=1, kv=4096, d=4096, heads=32, hd=128, f=14336, name="llama8b_decode")
    p = c.program
    tgt = get_target(target)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    opt = mp.superopt(p, target=target, database=False, workers=workers, progress=False)
    seconds = time.perf_counter() - t0
    x = c.inputs(seed)
    ref = p.evaluate(x)["Y"]
    y = opt.run_numpy(x)["Y"]
    floor = floor_us(p, tgt)
    return {"program": p.name, "date": _dt.date.today().isoformat(), "target": target,
            "kernels_naive": opt.naive_num_kernels, "kernels": opt.num_kernels,
            "predicted_naive_us": round(opt.naive_estimated_time_us, 1),
            "predicted_us": round(opt.estimated_time_us, 1), "floor_us": round(floor, 1),
            "floor_ratio": round(floor / opt.estimated_time_us, 3),
            "search_s": round(seconds, 1), "workers": workers, "cpus": os.cpu_count(),
            "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
            "rel_err": float(np.linalg.norm(y - ref) / np.linalg.norm(ref)),
            "kernel_list": kernel_rows(opt.graph)}


def markdown(res: dict) -> str:
    lines = ["# A Llama-3-8B-size decode layer (float16), real size", "",
             f"`python -m benchmarks.decode8b`, {res['date']}: `{res['program']}` (hidden 4096, "
             "32 heads of 128, KV cache 4096, SwiGLU 14336, one token), target "
             f"{res['target']}, analytic cost model. The floor reads every input and writes "
             "every output once at the target's measured copy bandwidth.", "",
             "| kernels naive -> found | predicted us naive -> found | floor us | floor / "
             "predicted | search s | load (1 min) before / after | rel. error vs float64 |",
             "| --- | --- | --- | --- | --- | --- | --- |",
             f"| {res['kernels_naive']} -> {res['kernels']} | {res['predicted_naive_us']} -> "
             f"{res['predicted_us']} | {res['floor_us']} | {res['floor_ratio']:.1%} | "
             f"{res['search_s']} ({res['workers']} workers, {res['cpus']} cores) | "
             f"{res['load_before']} / {res['load_after']} | {res['rel_err']:.2e} |", "",
             "Kernels found:", ""]
    lines += [f"{i + 1}. `{k}`" for i, k in enumerate(res["kernel_list"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--target", default="h100")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "decode8b"))
    args = ap.parse_args(argv)
    print(write_results(args.out, run(args.workers, target=args.target), markdown))


if __name__ == "__main__":
    main()
