"""The SASS table: what the machine code of every emitted kernel does, read on the CPU.

For each of the nine benchmarks (bs 1 by default) this takes a kernel graph -- superopt's answer
(``--graphs superopt``, default) or the hand-built fixture (``--graphs fixtures``) -- emits its
CUDA, compiles all benchmarks in one translation unit for one architecture (sm_90 by default) and
disassembles the cubin with ``cuobjdump -sass`` (mirage_py/codegen_cuda/sass.py). Per kernel it
records: the launch (grid x threads, dynamic shared memory), ptxas's registers and spills, whether
the kernel computes a tile matmul, and static instruction counts -- tensor-core MMAs (HMMA,
HGMMA), ldmatrix (LDSM), local memory (LDL/STL), 128-bit vs narrower global loads (LDG and
cp.async = LDGSTS) and stores (STG). A kernel with a matmul and no HMMA/HGMMA runs its matmul
on the CUDA cores; LDL/STL mean local memory; narrow loads mean more memory instructions per byte.

    python -m benchmarks.sass_table                        # superopt graphs, bs 1, sm_90
    python -m benchmarks.sass_table --graphs fixtures --names gqa lora

Writes ``benchmarks/results/sass-<arch>-bs<bs>[-fixtures].{json,md}`` (``--out``: another
directory) and
prints the markdown. Needs nvcc and cuobjdump (CUDA toolkit, or ``pip install mirage_py[test]``
for cuobjdump); no GPU.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

RESULTS = os.path.join(ROOT, "benchmarks", "results")


def get_graph(name: str, bs: int, source: str, target: str, workers: int, database) -> tuple:
    """(kernel graph, notes) of benchmark ``name`` from ``source`` ("fixtures" or "superopt")."""
    from benchmarks.programs import get_program

    if source == "fixtures":
        from benchmarks.fixtures import hand_built
        return hand_built(name, bs), {}
    import mirage_py as mp
    t0 = time.perf_counter()
    opt = mp.superopt(get_program(name, bs), target=target, workers=workers, progress=False,
                      database=database)
    return opt.graph, {"superopt_seconds": round(time.perf_counter() - t0, 2),
                       "sources": [p.source for p in opt.parts]}


def has_tile_matmul(graph, op_index: int) -> bool:
    """Whether kernel ``op_index`` of ``graph`` computes a matmul: a pre-defined matmul kernel,
    or a graph-defined kernel whose block graph has a matmul BlockOp."""
    from mirage_py.ugraph.graph import BlockOp, GraphKernel

    op = graph.ops[op_index]
    if isinstance(op, GraphKernel):
        return any(isinstance(b, BlockOp) and b.op == "matmul" for b in op.block.ops)
    return op.op == "matmul"


def build_records(sources: dict, arch: str) -> tuple[list[dict], float]:
    """Compile every benchmark's kernels in one translation unit for ``arch`` and read their SASS;
    one record per kernel, and nvcc's seconds."""
    from mirage_py.codegen_cuda.emit import translation_unit
    from mirage_py.codegen_cuda.sass import compile_cubin, count_sass, disassemble

    with tempfile.TemporaryDirectory() as tmp:
        build = compile_cubin(translation_unit(list(sources.values())), arch, out_dir=tmp,
                              name="sass_table")
        funcs = disassemble(build.path)
    records = []
    for name, src in sources.items():
        for spec in src.launches:
            if spec.kernel not in funcs:
                raise RuntimeError(f"{name}: kernel {spec.kernel} is missing from the cubin")
            res = build.nvcc.for_kernel(spec.kernel, arch)
            st = count_sass(spec.kernel, funcs[spec.kernel])
            records.append({
                "benchmark": name, "kernel": spec.kernel, "op_index": spec.op_index,
                "grid": list(spec.grid), "threads": spec.threads,
                "smem_dynamic": spec.smem_bytes, "smem_static": res.smem_static,
                "registers": res.registers, "spill_stores": res.spill_stores,
                "spill_loads": res.spill_loads, "stack_frame": res.stack_frame,
                "tile_matmul": has_tile_matmul(src.graph, spec.op_index),
                "sass": st.to_json()})
    return records, build.nvcc.seconds


def _grid(g: list[int]) -> str:
    return "(" + ", ".join(map(str, g)) + ")"


def markdown(doc: dict) -> str:
    lines = [
        f"# SASS of the emitted kernels ({doc['arch']}, bs {doc['bs']}, graphs: {doc['graphs']})",
        "",
        f"cuobjdump -sass of one cubin with every benchmark's kernels ({doc['cuobjdump']}; nvcc "
        f"{doc['nvcc_seconds']:.1f} s); {doc['device']}; {doc['date']}. Counts are static "
        "(instructions in the code, not executed). *matmul*: the kernel computes a tile matmul "
        "(graph-defined with a matmul block op, or a pre-defined matmul). *HMMA / HGMMA*: "
        "tensor-core instructions (mma.sync / warpgroup MMA, sm_90a only). *LDL/STL*: local-memory loads/stores. *ld 128/narrow*: 128-bit "
        "global reads (LDG.128 + LDGSTS.128) / narrower ones. *TMA*: bulk tensor copies "
        "(UTMALDG: pipelined tiles fetched by TMA, sm_90+). *st 128/narrow*: the same for "
        "STG. *spills*: ptxas's spill stores/loads in bytes.", "",
        "| benchmark | kernel | grid | threads | dyn smem | regs | spills | matmul | HMMA / HGMMA | LDSM "
        "| LDL/STL | ld 128/narrow | TMA | st 128/narrow | instrs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["records"]:
        s = r["sass"]
        kernel = r["kernel"]
        lines.append(
            f"| {r['benchmark']} | `{kernel}` | {_grid(r['grid'])} | {r['threads']} | "
            f"{r['smem_dynamic']} | {r['registers']} | {r['spill_stores']}/{r['spill_loads']} | "
            f"{'yes' if r['tile_matmul'] else '-'} | {s['hmma']} / {s['hgmma']} | {s['ldsm']} | "
            f"{s['ldl']}/{s['stl']} | {s['global_loads_128']}/{s['global_loads_narrow']} | "
            f"{s.get('tma', 0)} | "
            f"{s['global_stores_128']}/{s['global_stores_narrow']} | {s['instructions']} |")
    mm = [r for r in doc["records"] if r["tile_matmul"]]
    tc = [r for r in mm if r["sass"]["hmma"] + r["sass"]["hgmma"] > 0]
    local = [r for r in doc["records"] if r["sass"]["ldl"] + r["sass"]["stl"] > 0]
    wg = [r for r in mm if r["sass"]["hgmma"] > 0]
    tma = [r for r in doc["records"] if r["sass"].get("tma", 0) > 0]
    lines += ["", f"Kernels: {len(doc['records'])}; with a tile matmul: {len(mm)}, of which on "
              f"tensor cores: {len(tc)} ({len(wg)} with warpgroup MMA); using local memory: "
              f"{len(local)}; with TMA copies: {len(tma)}."]
    return "\n".join(lines) + "\n"


def _cuobjdump_version() -> str:
    import subprocess

    from mirage_py.codegen_cuda.sass import find_cuobjdump
    tool = find_cuobjdump()
    if tool is None:
        return "cuobjdump"
    out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    rel = [ln for ln in out.splitlines() if "release" in ln]
    return "cuobjdump " + (rel[0].split("release", 1)[1].strip() if rel else "(version unknown)")


def main(argv: list[str] | None = None) -> int:
    from benchmarks.programs import NAMES
    from mirage_py.codegen_cuda import emit_cuda
    from mirage_py.codegen_cuda.nvcc import ARCH_TARGET

    ap = argparse.ArgumentParser(prog="python -m benchmarks.sass_table",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--names", nargs="+", default=list(NAMES), choices=NAMES)
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--graphs", choices=("superopt", "fixtures"), default="superopt",
                    help="superopt's answer (default) or the hand-built fixtures")
    ap.add_argument("--arch", choices=sorted(ARCH_TARGET), default="sm_90",
                    help="architecture to compile for (the target follows: sm_90 -> h100)")
    ap.add_argument("--workers", type=int, default=2, help="superopt's search processes")
    ap.add_argument("--database", default=None, metavar="PATH",
                    help="superopt's results database (default: none, so every search runs)")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    target = ARCH_TARGET[args.arch]
    sources, notes = {}, {}
    for name in args.names:
        graph, notes[name] = get_graph(name, args.bs, args.graphs, target, args.workers,
                                       args.database or False)
        sources[name] = emit_cuda(graph, target, prefix=f"{name}_bs{args.bs}")
        print(f"{name:15s} {graph.num_kernels} kernel(s)"
              + (f"  superopt {notes[name]['superopt_seconds']:.1f} s" if notes[name] else ""),
              file=sys.stderr, flush=True)
    records, nvcc_seconds = build_records(sources, args.arch)
    device = f"cpu ({platform.machine()}, {os.cpu_count()} cores), no GPU needed"
    doc = {"arch": args.arch, "target": target, "bs": args.bs, "graphs": args.graphs,
           "device": device, "date": _dt.date.today().isoformat(),
           "python": platform.python_version(), "cuobjdump": _cuobjdump_version(),
           "nvcc_seconds": round(nvcc_seconds, 2),
           "benchmarks": {n: {"kernels": sources[n].graph.num_kernels, **notes[n]}
                          for n in args.names},
           "records": records}
    os.makedirs(args.out, exist_ok=True)
    which = "" if args.graphs == "superopt" else f"-{args.graphs}"
    stem = os.path.join(args.out, f"sass-{args.arch.replace('_', '')}-bs{args.bs}{which}")
    text = markdown(doc)
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {stem}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
