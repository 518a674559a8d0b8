"""superopt on Ray: search time of a multi-region program with 1 vs 2 Ray workers, and the
numbers behind docs/cluster.md's estimate of a 64-GPU measurement pool for a 7B model.

**Scaling** (default): a local Ray instance (``ray.init(num_cpus=2)``) superoptimises a decoder
block (``benchmarks/compositions.decoder_block``: rms_norm, q projection, attention over a KV
cache, output projection summed over heads, residual, rms_norm, SwiGLU MLP, residual; dozens of
regions) with ``executor="ray"`` and ``workers=1`` (one region search in flight) and then
``workers=2`` (two), in one process, and -- with ``--local`` -- with local worker processes too.
Every run must give the same answer; the script checks it. Wall times include the floor, the
cover solves and verification (on the driver or as tasks), not Ray's start-up.

**Estimate inputs** (``--estimate``): the distinct region structures of a Llama-7B-sized decoder
layer (d 4096, 32 heads of 128, MLP 11008, KV cache 4096) at batch sizes 1, 8, 64 and 512, and
the compile time of real kernels (the hand-built fused graphs of the nine benchmarks): NVRTC to
PTX for compute_90, what the GPU runner (CuPy) compiles with before timing a candidate, and,
where nvcc is installed, nvcc to an sm_90 cubin (PTX to SASS too, which the driver's JIT does
when CuPy loads the PTX; nvcc adds its own start-up).

    python -m benchmarks.ray_scaling                 # writes benchmarks/results/ray_scaling-cpu.*
    python -m benchmarks.ray_scaling --local         # also local processes, for comparison
    python -m benchmarks.ray_scaling --estimate      # writes benchmarks/results/ray_estimate-7b.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy: one BLAS thread per process

RESULTS = os.path.join(ROOT, "benchmarks", "results")
SIZES = dict(b=8, kv=256, d=256, heads=4, f=512)  # the decoder block of tests/test_regions.py
LLAMA_7B = dict(kv=4096, d=4096, heads=32, hd=128, f=11008)


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _run(program, **kw) -> dict:
    import mirage_py as mp
    t0 = time.perf_counter()
    opt = mp.superopt(program, progress=False, database=False, **kw)
    seconds = time.perf_counter() - t0
    part = opt.parts[0]
    return {"seconds": round(seconds, 2), "graph": opt.graph.structural_hash(),
            "estimated_us": opt.estimated_time_us, "kernels": opt.num_kernels,
            "naive_kernels": opt.naive_num_kernels, "regions": part.regions,
            "searched": part.searched, "candidates": part.candidates,
            "tune_evaluations": part.tune_evaluations, "load_after": _load()}


def scaling(local: bool) -> dict:
    import ray

    from benchmarks.compositions import decoder_block
    from mirage_py.superopt.executors import RayExecutor
    comp = decoder_block(**SIZES)
    out = {"program": comp.name, "sizes": SIZES, "machine": platform.machine(),
           "cpus": os.cpu_count(), "python": platform.python_version(),
           "ray": ray.__version__, "load_before": _load(), "runs": {}}
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    out["ray_init_seconds"] = round(time.perf_counter() - t0, 2)
    try:
        for w in (1, 2):
            ex = RayExecutor()
            r = _run(comp.program, executor=ex, workers=w)
            r["tasks"] = {k: sum(e["kind"] == k for e in ex.log)
                          for k in ("explore", "verify", "measure")}
            r["worker_pids"] = len({e["pid"] for e in ex.log})
            xs = [e for e in ex.log if e["kind"] == "explore"]
            r["search_task_seconds"] = round(sum(e["seconds"] for e in xs), 2)
            r["longest_search_task"] = round(max(e["seconds"] for e in xs), 2)
            out["runs"][f"ray_{w}"] = r
            print(f"ray, {w} worker(s): {r['seconds']} s, {r['searched']} regions searched, "
                  f"{r['estimated_us']:.2f} us, load {r['load_after']}", flush=True)
    finally:
        ray.shutdown()
    if local:
        for w in (1, 2):
            r = _run(comp.program, workers=w)
            out["runs"][f"local_{w}"] = r
            print(f"local, {w} process(es): {r['seconds']} s, {r['searched']} regions searched",
                  flush=True)
    runs = out["runs"]
    out["same_answer"] = len({(r["graph"], r["estimated_us"]) for r in runs.values()}) == 1
    out["ray_speedup_2_over_1"] = round(runs["ray_1"]["seconds"] / runs["ray_2"]["seconds"], 2)
    if local:
        out["local_speedup_2_over_1"] = round(runs["local_1"]["seconds"] /
                                              runs["local_2"]["seconds"], 2)
    return out


def write_scaling(res: dict) -> None:
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "ray_scaling-cpu.json"), "w") as f:
        json.dump(res, f, indent=1)
    rows = ["| run | seconds | regions searched | search tasks | seconds in search tasks "
            "(longest) | verify tasks | worker processes | predicted us | load after |",
            "|---|---|---|---|---|---|---|---|---|"]
    for k, r in res["runs"].items():
        t = r.get("tasks", {})
        busy = (f"{r['search_task_seconds']} ({r['longest_search_task']})"
                if "search_task_seconds" in r else "-")
        rows.append(f"| {k.replace('_', ', ')} | {r['seconds']} | {r['searched']} of "
                    f"{r['regions']} | {t.get('explore', '-')} | {busy} | {t.get('verify', '-')} "
                    f"| {r.get('worker_pids', '-')} | {r['estimated_us']:.2f} | "
                    f"{', '.join(map(str, r['load_after']))} |")
    text = [f"# superopt on Ray: {res['program']}, 1 vs 2 workers",
            "",
            f"`python -m benchmarks.ray_scaling` on {res['cpus']} CPU cores "
            f"({res['machine']}, Python {res['python']}, Ray {res['ray']}), a local Ray "
            f"instance with 2 CPUs (started in {res['ray_init_seconds']} s, not counted). "
            "**The machine has 2 cores shared with other work** (load averages before: "
            f"{', '.join(map(str, res['load_before']))}); 2 workers cannot be more than 2x "
            "one worker here, and the driver, Ray's own processes and the other jobs take "
            "from the same 2 cores.",
            "",
            *rows,
            "",
            f"Speed-up of 2 Ray workers over 1: **{res['ray_speedup_2_over_1']}x**"
            + (f" (local processes: {res['local_speedup_2_over_1']}x)."
               if "local_speedup_2_over_1" in res else "."),
            f"Same answer (graph, predicted time) in every run: {res['same_answer']}. With 2 "
            "workers the cover also searches regions it would want next (speculation), so more "
            "regions may be searched than with 1; the answer does not change. *Seconds in "
            "search tasks* adds up the tasks' own wall times: with 2 workers it exceeds the "
            "run's seconds when two searches overlap, and it grows over the 1-worker figure "
            "when the two share cores with each other, the driver and other jobs.",
            ""]
    with open(os.path.join(RESULTS, "ray_scaling-cpu.md"), "w") as f:
        f.write("\n".join(text))


def estimate() -> dict:
    from benchmarks.compositions import decoder_block
    from mirage_py.regions import PartDag, extract, floor_groups, search_regions
    from mirage_py.superopt.result import parts_of
    out = {"layer": LLAMA_7B, "batches": {}}
    every = set()
    for b in (1, 8, 64, 512):
        comp = decoder_block(b=b, **LLAMA_7B)
        keys, n = set(), 0
        for part in parts_of(comp.program):
            dag = PartDag(part)
            sets = search_regions(dag)
            n += len(set(sets) | {g for g in floor_groups(dag) if len(g) > 1})
            for ops in sets:
                r = extract(dag, ops)
                if r.program.verifiable:
                    keys.add(r.key)
        every |= keys
        out["batches"][b] = {"regions": n, "distinct_search_structures": len(keys)}
        print(f"b={b}: {n} regions, {len(keys)} distinct search structures", flush=True)
    out["distinct_search_structures_all_batches"] = len(every)
    try:
        from benchmarks.fixtures import hand_built
        from benchmarks.programs import NAMES
        from mirage_py.codegen_cuda import emit_cuda
        from mirage_py.codegen_cuda.nvrtc import compile_with_nvrtc, find_nvrtc
        from mirage_py.cost_model import AnalyticModel
        from mirage_py.targets import get_target
    except ImportError:
        return out
    if find_nvrtc() is None:
        return out
    import shutil

    from mirage_py.codegen_cuda.nvcc import find_nvcc
    from mirage_py.codegen_cuda.sass import compile_cubin
    times, kernel_us, cubin = {}, {}, {}
    for name in NAMES:
        g = hand_built(name, 1)
        code = emit_cuda(g).device_code()
        compile_with_nvrtc(code, "compute_90")  # warm the library
        t0 = time.perf_counter()
        compile_with_nvrtc(code, "compute_90")
        times[name] = round(time.perf_counter() - t0, 3)
        kernel_us[name] = round(AnalyticModel().predict(g, get_target("h100")), 1)
        if find_nvcc() is not None:  # to SASS as well (the driver's JIT does this at load)
            t0 = time.perf_counter()
            build = compile_cubin(code, "sm_90")
            cubin[name] = round(time.perf_counter() - t0, 3)
            shutil.rmtree(build.path.parent, ignore_errors=True)
        print(f"{name}: NVRTC {times[name]} s, nvcc to cubin {cubin.get(name)} s, "
              f"predicted {kernel_us[name]} us", flush=True)
    out["nvrtc_seconds"] = times
    out["nvcc_cubin_seconds"] = cubin
    out["predicted_us"] = kernel_us
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--local", action="store_true", help="also time local worker processes")
    ap.add_argument("--estimate", action="store_true",
                    help="count a 7B layer's regions and time NVRTC instead")
    args = ap.parse_args(argv)
    if args.estimate:
        res = estimate()
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, "ray_estimate-7b.json"), "w") as f:
            json.dump(res, f, indent=1)
        return 0
    res = scaling(args.local)
    write_scaling(res)
    print(f"2 over 1 Ray workers: {res['ray_speedup_2_over_1']}x; same answer: "
          f"{res['same_answer']}")
    return 0 if res["same_answer"] else 1


if __name__ == "__main__":
    sys.exit(main())
