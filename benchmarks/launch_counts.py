"""Work a shape family's bucket does at a valid size inside it, with grids and loop trip counts
computed at launch (codegen_cuda/extents.py) against the bucket's whole grid and loop.

The decode attentions of the nine benchmarks (``gqa``, ``qknorm_gqa``, ``mha``, ``mqa``), KV
length ``S`` in 1024 .. 32768, one search at 4096 with power-of-two buckets (as
``benchmarks/dynamic.py``'s *pow2*), and the two small families of
``tests/test_codegen_rtgrid.py``: for each length, the bucket that serves it, and over the
graph-defined kernels the blocks launched and the loop iterations run (summed over blocks), as
a fraction of the bucket's. Counts, not times: no GPU has run them; pre-defined kernels (naive
lowerings) keep the bucket's grid and are not counted::

    python -m benchmarks.launch_counts            # writes benchmarks/results/launch_counts.*
    python -m benchmarks.launch_counts --quick    # gqa only, three lengths
"""

from __future__ import annotations

import argparse
import datetime as _dt
import time

import mirage_py as mp
from benchmarks._results import RESULTS, table, write_results
from mirage_py.codegen_cuda.extents import PaddedExtents, kernel_counts, launch_work
from mirage_py.examples.programs import ATTENTION, get_program
from mirage_py.lax.family import bucket_of
from mirage_py.ugraph.graph import GraphKernel

LENGTHS = (1024, 1500, 3072, 4096, 5000, 12288, 24576, 32768)


def _opts() -> dict:
    return dict(workers=1, database=False, progress=False)


def work(graph, extents: PaddedExtents, sizes: dict | None) -> tuple[int, int]:
    """(blocks, block-iterations) of ``graph``'s graph-defined kernels at ``sizes`` (None: the
    bucket's whole grids and loops)."""
    runs = launch_work(graph, extents, sizes).values()
    return sum(w.blocks for w in runs), sum(w.iterations for w in runs)


def family_rows(name: str, program, dim: str, representative: int,
                lengths: tuple[int, ...]) -> list[dict]:
    t0 = time.perf_counter()
    fam = mp.superopt(program, representative={dim: representative}, **_opts())
    search_s = time.perf_counter() - t0
    ext = PaddedExtents.of_program(program)
    rows = []
    for s in lengths:
        bucket = bucket_of(s, fam.buckets[dim], dim)
        graph = fam.instance({dim: bucket}).annotated.graph
        whole = work(graph, ext, None)
        run = work(graph, ext, {dim: s})
        rows.append({"program": name, "dim": dim, "length": s, "bucket": bucket,
                     "kernels": sum(isinstance(o, GraphKernel) for o in graph.ops),
                     "sized_at_launch": len(kernel_counts(graph, ext)),
                     "blocks": run[0], "bucket_blocks": whole[0],
                     "block_iterations": run[1], "bucket_block_iterations": whole[1],
                     "fraction": run[1] / whole[1], "padding": 1 - s / bucket,
                     "search_s": round(search_s, 1)})
    return rows


def _small_families() -> list[tuple[str, object, str, int, tuple[int, ...]]]:
    T = mp.dim("T", 1, 128)
    rms = mp.Program("rms_t")
    x, g, w = rms.input("X", (T, 64)), rms.input("G", (64,)), rms.input("W", (64, 64))
    rms.output(mp.rms_norm(x, g) @ w, name="Y")
    S = mp.dim("S", 1, 1024)
    kred = mp.Program("kred_s")
    x2, w2 = kred.input("X", (32, S)), kred.input("W", (S, 64))
    kred.output(mp.softmax(mp.exp(x2) @ w2, -1), name="Y")
    return [("rmsnorm @ W over tokens T", rms, "T", 64, (1, 17, 40, 64, 100)),
            ("exp(X) @ W over S", kred, "S", 512, (1, 100, 300, 512, 700))]


def run(names: tuple[str, ...], lengths: tuple[int, ...], small: bool = True,
        log=print) -> dict:
    rows = []
    for name in names:
        S = mp.dim("S", 1024, 32768)
        rows += family_rows(name, get_program(name, kv=S), "S", 4096, lengths)
        log(f"{name}: {[round(r['fraction'], 3) for r in rows if r['program'] == name]}")
    if small:
        for name, prog, dim, rep, ls in _small_families():
            rows += family_rows(name, prog, dim, rep, ls)
    return {"date": _dt.date.today().isoformat(), "target": "h100", "rows": rows}


def markdown(doc: dict) -> str:
    rows = ([r["program"], f"{r['dim']}={r['length']}", r["bucket"], f"{r['padding']:.0%}",
             f"{r['blocks']} / {r['bucket_blocks']}",
             f"{r['block_iterations']} / {r['bucket_block_iterations']}", f"{r['fraction']:.3f}"]
            for r in doc["rows"])
    lines = ["# Work at a length inside a bucket: counts computed at launch", "",
             "Graph-defined kernels only; blocks launched and loop iterations run (summed over "
             "blocks) at the valid length, against the bucket's whole grid and loop "
             "(`python -m benchmarks.launch_counts`). Counts, not GPU times.", ""]
    lines += table(["program", "length", "bucket", "padding", "blocks (run / bucket)",
                    "block-iterations (run / bucket)", "fraction"], rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "launch_counts"))
    a = ap.parse_args(argv)
    names = ("gqa",) if a.quick else ATTENTION
    lengths = (1500, 3072, 5000) if a.quick else LENGTHS
    doc = run(names, lengths, small=not a.quick)
    print(write_results(a.out, doc, markdown))


if __name__ == "__main__":
    main()
